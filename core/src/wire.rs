//! The wire format: how an envelope maps onto AMQP properties and headers,
//! the names AceMQ gives its headers, and a delivery as it arrives (what
//! [`decode`](crate::decode) turns into a message).

use crate::envelope::{Envelope, ATTEMPT_HEADER, ID_HEADER, ORIGIN_HEADER};
use crate::headers::Headers;
use serde_json::Value;

/// The content type every AceMQ message carries.
pub const CONTENT_TYPE: &str = "application/json";

/// Headers added to a dead-lettered or retried copy.
pub const REASON_HEADER: &str = "x-acemq-reason";
/// The error class that caused the retry or reject, when there was one.
pub const ERROR_CLASS_HEADER: &str = "x-acemq-error-class";
/// Where that error happened, when it says ([`crate::Backtrace`]): the
/// newest failure's, replacing the one before; the history keeps reasons
/// only.
pub const BACKTRACE_HEADER: &str = "x-acemq-backtrace";
/// When it failed (seconds since the epoch).
pub const FAILED_AT_HEADER: &str = "x-acemq-failed-at";
/// The exchange the message was first published to.
pub const ORIGINAL_EXCHANGE_HEADER: &str = "x-acemq-original-exchange";
/// The routing key it was first published with.
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "x-acemq-original-routing-key";
/// The queue it was being consumed from when it failed.
pub const QUEUE_HEADER: &str = "x-acemq-queue";
/// Earlier reasons, oldest first, kept when a message is replayed.
pub const HISTORY_HEADER: &str = "x-acemq-history";
/// Set on arrival, by the AMQP transport's frame filter, on a message whose
/// properties or headers no AMQP client could parse as they came (a header
/// table nested deeper than [`crate::limits::MAX_HEADER_DEPTH`], a short
/// string or header name that is not UTF-8, a field type that does not
/// exist): it says what was repaired to make the message readable. A
/// message carrying it is dead-lettered, never handled (see [`decode`]).
pub const MALFORMED_HEADER: &str = "x-acemq-malformed";
/// Beside [`MALFORMED_HEADER`]: the raw bytes of headers (or properties)
/// the filter could not read at all, as a long string.
pub const MALFORMED_RAW_HEADER: &str = "x-acemq-malformed-raw";

/// On a copy (retry, dead letter, replay): the original's `expiration`,
/// which the copy does not carry (see `limits::copy_props`).
pub const ORIGINAL_EXPIRATION_HEADER: &str = "x-acemq-original-expiration";
/// On a copy sent through RabbitMQ as another user than the one who
/// published: the original's `user_id`, which RabbitMQ would refuse on the
/// copy (see `limits::copy_props`).
pub const ORIGINAL_USER_ID_HEADER: &str = "x-acemq-original-user-id";

/// AMQP basic properties: every one of the fourteen, as a delivery carried
/// them (`message.delivery.properties`) and as a copy sends them again.
///
/// A retry, dead-letter or replay copy keeps every property of the original
/// but three, each for a reason (see `limits::copy_props` and docs/retries.md):
/// it is persistent whatever the original was, it carries no `expiration`
/// (kept in [`ORIGINAL_EXPIRATION_HEADER`]), and on RabbitMQ a `user_id`
/// that is not the copying connection's user moves to
/// [`ORIGINAL_USER_ID_HEADER`].
#[derive(Debug, Clone, Default)]
pub struct Props {
    /// `content_type`.
    pub content_type: Option<String>,
    /// `content_encoding`: `gzip` and `deflate` bodies are decompressed
    /// before they are read as JSON ([`decoded_body`]); copies keep the
    /// body compressed, as it arrived, and this with it.
    pub content_encoding: Option<String>,
    /// `delivery_mode`: 2 persistent, 1 (or unset) transient.
    pub delivery_mode: Option<u8>,
    /// `priority`, 0 to 9 on a priority queue (any octet on the wire).
    pub priority: Option<u8>,
    /// `correlation_id`.
    pub correlation_id: Option<String>,
    /// `reply_to`.
    pub reply_to: Option<String>,
    /// `expiration`: the per-message TTL in milliseconds, as text.
    pub expiration: Option<String>,
    /// `message_id`.
    pub message_id: Option<String>,
    /// `timestamp`, seconds since the epoch; None when the publisher set
    /// none (never 0 for "unknown").
    pub timestamp: Option<u64>,
    /// `type`.
    pub kind: Option<String>,
    /// `user_id`: RabbitMQ checks it against the publishing connection's
    /// user, so on a delivery it names who published.
    pub user_id: Option<String>,
    /// `app_id`.
    pub app_id: Option<String>,
    /// `cluster_id` (deprecated by AMQP 0-9-1, still carried).
    pub cluster_id: Option<String>,
    /// `headers`, all of them, `x-acemq-*` included: read with
    /// [`Props::header`] or [`Props::headers`], changed through
    /// [`Props::headers_mut`]. Unset while they are still only the table in
    /// [`Props::received`]: most deliveries are accepted with no more of
    /// their headers read than the envelope's, each converted alone, and
    /// converting the whole table into a map (then freeing both) would be
    /// work done for every message and read for few.
    headers: std::sync::OnceLock<Headers>,
    /// The header table exactly as it arrived, when it came off RabbitMQ.
    /// A copy (a retry, a dead letter, a replay) sends every header the
    /// engine did not change from here, so its bytes and its AMQP types
    /// (a string that is not UTF-8, a 16-bit integer, a timestamp) are
    /// what the publisher wrote, not what JSON can say of them.
    pub received: Received,
}

impl Props {
    /// Whether `delivery_mode` is 2: the broker writes it to disk on a
    /// durable queue.
    pub fn persistent(&self) -> bool {
        self.delivery_mode == Some(2)
    }

    /// The raw bytes of one header whose AMQP type is a byte array (`x`)
    /// or a long string (`S`, which AMQP does not require to be UTF-8), as
    /// the publisher wrote them. [`Props::header`] gives JSON, where a byte
    /// array that is not UTF-8 can only be text with U+FFFD in it; this
    /// loses nothing. None for a header of another type, or absent, or one
    /// set by the engine rather than received.
    pub fn header_bytes(&self, name: &str) -> Option<Vec<u8>> {
        self.received.header_bytes(name)
    }

    /// The names of the received headers whose AMQP type is a byte array
    /// (`x`), top level only: what an adapter hands its language as
    /// binary strings rather than text.
    pub fn byte_array_headers(&self) -> Vec<String> {
        self.received.byte_array_headers()
    }

    /// Properties with `headers` set.
    pub fn with_headers(mut self, headers: Headers) -> Props {
        self.headers = std::sync::OnceLock::from(headers);
        self
    }

    /// Every header, converted from the table as it arrived the first time
    /// they are asked for.
    pub fn headers(&self) -> &Headers {
        self.headers.get_or_init(|| self.received.headers_except(&[]))
    }

    /// Every header, to change.
    pub fn headers_mut(&mut self) -> &mut Headers {
        self.headers();
        self.headers.get_mut().expect("headers() has just set them")
    }

    /// One header, without converting the others while they are still the
    /// table as it arrived.
    pub fn header(&self, name: &str) -> Option<std::borrow::Cow<'_, Value>> {
        match self.headers.get() {
            Some(h) => h.get(name).map(std::borrow::Cow::Borrowed),
            None => self.received.header(name).map(std::borrow::Cow::Owned),
        }
    }

    /// Every header but those named in `skip`, converted, without converting
    /// the skipped ones while they are still the table as it arrived.
    pub fn headers_except(&self, skip: &[&str]) -> Headers {
        match self.headers.get() {
            Some(h) => h.iter().filter(|(k, _)| !skip.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect(),
            None => self.received.headers_except(skip),
        }
    }
}

impl PartialEq for Props {
    fn eq(&self, other: &Props) -> bool {
        self.content_type == other.content_type
            && self.content_encoding == other.content_encoding
            && self.delivery_mode == other.delivery_mode
            && self.priority == other.priority
            && self.correlation_id == other.correlation_id
            && self.reply_to == other.reply_to
            && self.expiration == other.expiration
            && self.message_id == other.message_id
            && self.timestamp == other.timestamp
            && self.kind == other.kind
            && self.user_id == other.user_id
            && self.app_id == other.app_id
            && self.cluster_id == other.cluster_id
            && self.headers() == other.headers()
            && self.received == other.received
    }
}

/// What [`Props::received`] holds: opaque, set only by the AMQP transport
/// (the properties as they arrived, moved there rather than copied; only
/// their headers are read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Received(pub(crate) Option<std::sync::Arc<lapin::BasicProperties>>);

/// One message as it came off a queue, before it is understood.
#[derive(Debug, Clone)]
pub struct RawDelivery {
    /// The delivery tag on its channel.
    pub tag: u64,
    /// The exchange it was published to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// Delivered before.
    pub redelivered: bool,
    /// The body, byte for byte.
    pub body: Vec<u8>,
    /// Its properties.
    pub props: Props,
}

/// A delivery's body, shared with the delivery ([`Delivery::shared_body`](crate::Delivery::shared_body)).
#[derive(Clone)]
pub struct Body(pub(crate) std::sync::Arc<RawDelivery>);

impl AsRef<[u8]> for Body {
    fn as_ref(&self) -> &[u8] {
        &self.0.body
    }
}

impl Body {
    /// The body as text. A delivery is handed out only once its body has
    /// been checked to be JSON, and so UTF-8: this is that text, without
    /// the check repeated byte by byte when it is ASCII.
    pub fn text(&self) -> Option<&str> {
        utf8(&self.0.body).ok()
    }

    /// The body of a message no consumer delivered (a reply: `crate::request`).
    pub(crate) fn of(raw: RawDelivery) -> Body {
        Body(std::sync::Arc::new(raw))
    }

    /// The exchange its message was published to (empty: the default one).
    pub fn exchange(&self) -> &str {
        &self.0.exchange
    }

    /// The routing key its message was published with.
    pub fn routing_key(&self) -> &str {
        &self.0.routing_key
    }

    /// Whether the broker had delivered it before.
    pub fn redelivered(&self) -> bool {
        self.0.redelivered
    }

    /// Every AMQP property it arrived with, as
    /// [`DeliveryInfo::properties`](crate::DeliveryInfo::properties) has
    /// them: what a caller of [`Consumer::admit_lean`](crate::Consumer::admit_lean) reads.
    pub fn properties(&self) -> &Props {
        &self.0.props
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Body({} bytes)", self.0.body.len())
    }
}

/// RabbitMQ's direct reply-to pseudo-queue.
pub const REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// The most a compressed body may grow to when it is read: RabbitMQ 3.x's
/// default `max_message_size` (4.x's is 16 MiB), so a real message fits,
/// and a few hundred kilobytes of gzip that expand to gigabytes (a
/// compression bomb) are refused instead of filling memory.
pub const MAX_DECOMPRESSED: usize = 128 << 20;

/// The compression a `content_encoding` names, when acemq reads it: `gzip`
/// (also `x-gzip`) or `deflate` (zlib, RFC 1950, as HTTP means it; a raw
/// RFC 1951 stream is accepted too). Anything else (`identity`, `utf-8`,
/// which some clients put there, or unset) is not compression.
fn compression(encoding: Option<&str>) -> Option<&'static str> {
    match encoding?.trim().to_ascii_lowercase().as_str() {
        "gzip" | "x-gzip" => Some("gzip"),
        "deflate" => Some("deflate"),
        _ => None,
    }
}

/// The body as JSON is read from it: `body` itself, or decompressed when
/// `content_encoding` is `gzip` or `deflate`. Err says why it cannot be
/// read (corrupt, or larger than [`MAX_DECOMPRESSED`]). What an adapter
/// calls to parse a body itself ([`Payload::Checked`](crate::Payload::Checked)); a copy always keeps
/// the body as it arrived.
pub fn decoded_body<'a>(props: &Props, body: &'a [u8]) -> std::result::Result<std::borrow::Cow<'a, [u8]>, String> {
    use std::io::Read;
    let Some(kind) = compression(props.content_encoding.as_deref()) else { return Ok(std::borrow::Cow::Borrowed(body)) };
    let mut out = Vec::new();
    let limit = MAX_DECOMPRESSED as u64 + 1;
    let read = match kind {
        "gzip" => flate2::read::MultiGzDecoder::new(body).take(limit).read_to_end(&mut out),
        _ => match flate2::read::ZlibDecoder::new(body).take(limit).read_to_end(&mut out) {
            Ok(n) => Ok(n),
            Err(_) => {
                out.clear();
                flate2::read::DeflateDecoder::new(body).take(limit).read_to_end(&mut out)
            }
        },
    };
    match read {
        Err(e) => Err(format!("content_encoding {kind} but the body does not decompress ({e})")),
        Ok(n) if n > MAX_DECOMPRESSED => {
            Err(format!("content_encoding {kind}: the body decompresses to more than {MAX_DECOMPRESSED} bytes"))
        }
        Ok(_) => Ok(std::borrow::Cow::Owned(out)),
    }
}

/// `body` gzip-compressed.
#[cfg(test)]
pub(crate) fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 3 + 32), flate2::Compression::default());
    e.write_all(body).expect("writing to a Vec cannot fail");
    e.finish().expect("writing to a Vec cannot fail")
}

/// The properties for publishing `envelope`.
pub fn props_for(envelope: &Envelope) -> Props {
    let mut headers = envelope.headers.clone();
    headers.insert(ID_HEADER.into(), Value::from(envelope.id.clone()));
    headers.insert(ATTEMPT_HEADER.into(), Value::from(envelope.attempt));
    if let Some(origin) = &envelope.origin {
        headers.insert(ORIGIN_HEADER.into(), Value::from(origin.clone()));
    }
    Props {
        content_type: Some(CONTENT_TYPE.into()),
        message_id: if envelope.id.is_empty() { None } else { Some(envelope.id.clone()) },
        kind: envelope.kind.clone(),
        app_id: envelope.origin.clone(),
        timestamp: envelope.timestamp,
        delivery_mode: Some(2),
        headers: std::sync::OnceLock::from(headers),
        ..Props::default()
    }
}

/// The envelope a delivery carries. A foreign message (published by Bunny, a
/// Java service) has whatever it has: the id is `message_id`, else the
/// `x-acemq-id` header, else empty — and an empty id is not a key the
/// idempotent consumer will guess at (see docs/idempotency.md).
pub fn envelope_of(props: &Props) -> Envelope {
    let text = |name: &str| props.header(name).and_then(|v| v.as_str().map(str::to_owned));
    let attempt = props
        .header(ATTEMPT_HEADER)
        .and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
        .unwrap_or(1)
        .clamp(1, u32::MAX as u64) as u32;
    // The application's headers: all but the envelope's own, converted one
    // by one (a message that carries only the envelope's converts nothing).
    // `CC` is routing, not application data (the delay cascade sets it to
    // reach an exchange with the message's own key): an envelope forwarded
    // with it would be routed by it again.
    let headers = props.headers_except(&[ID_HEADER, ORIGIN_HEADER, ATTEMPT_HEADER, "CC"]);
    Envelope {
        id: props.message_id.clone().filter(|s| !s.is_empty()).or_else(|| text(ID_HEADER)).unwrap_or_default(),
        kind: props.kind.clone(),
        origin: props.app_id.clone().or_else(|| text(ORIGIN_HEADER)),
        timestamp: props.timestamp,
        attempt,
        headers,
    }
}

/// `bytes` as text when they are UTF-8. Bodies are nearly always ASCII,
/// which is told a machine word at a time; `str::from_utf8` checks byte by
/// byte, on every body decoded.
pub(crate) fn utf8(bytes: &[u8]) -> std::result::Result<&str, std::str::Utf8Error> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::*;
    use crate::limits::copy_props;

    fn raw(body: &str, ct: Option<&str>) -> RawDelivery {
        RawDelivery {
            tag: 1,
            exchange: "".into(),
            routing_key: "q".into(),
            redelivered: false,
            body: body.as_bytes().to_vec(),
            props: Props { content_type: ct.map(Into::into), ..Props::default() },
        }
    }

    #[test]
    fn envelope_round_trips_through_props() {
        let env = Envelope::new().with_type("payment.requested.v1").with_header("tenant", "acme");
        let mut env = env;
        env.origin = Some("billing".into());
        let back = envelope_of(&props_for(&env));
        assert_eq!(back, env);
    }

    #[test]
    fn foreign_message_without_id_has_empty_id_and_attempt_one() {
        let m = decode("q", &raw("{\"a\":1}", None)).unwrap();
        assert_eq!(m.envelope.id, "");
        assert_eq!(m.envelope.attempt, 1);
    }

    #[test]
    fn non_json_and_foreign_content_types_are_undecodable() {
        assert!(decode("q", &raw("not json", Some("application/json"))).unwrap_err().reason.contains("not JSON"));
        assert!(decode("q", &raw("{}", Some("text/plain"))).unwrap_err().reason.contains("text/plain"));
        assert!(decode("q", &raw("{}", Some("application/vnd.acme+json"))).is_ok());
        assert!(decode("q", &raw("{}", Some("application/json; charset=utf-8"))).is_ok());
        assert!(decode("q", &raw("{}", Some("application/octet-stream"))).is_ok());
        assert!(decode("q", &raw("nope", Some("application/octet-stream"))).is_err());
        // Without case, around spaces and parameters; a suffix or prefix is
        // not the type.
        for ct in ["APPLICATION/JSON ; x", " Application/Vnd.Acme+JSON", "application/OCTET-stream;q=1", "application/+json"] {
            assert!(json_content_type(ct), "{ct}");
        }
        for ct in ["application/jsonx", "xapplication/json", "text/json", "application/json+", "+json", "application/", "applicatio"] {
            assert!(!json_content_type(ct), "{ct}");
        }
    }

    #[test]
    fn checked_refuses_numbers_out_of_range_and_nesting_past_the_limit_as_parsed_does() {
        // Found by the body fuzz target (fuzz/, issue 30): IgnoredAny took
        // 1e400, which Parsed and the Ruby adapter's payload refuse.
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        for body in ["1e400", "[1, -1e309]", "{\"a\": 1e400}", deep.as_str()] {
            let r = raw(body, Some("application/json"));
            let parsed = decode("q", &r).unwrap_err().reason;
            let checked = decode_as("q", &r, Payload::Checked).unwrap_err().reason;
            assert_eq!(parsed, checked, "{body}");
            assert!(checked.contains("not JSON"), "{checked}");
        }
        for body in ["1e308", "-0.0", "18446744073709551615", "-9223372036854775808", "{\"a\":[\"\\u00e9\",null,true]}"] {
            assert!(decode_as("q", &raw(body, Some("application/json")), Payload::Checked).is_ok(), "{body}");
        }
    }

    #[test]
    fn checked_refuses_what_parsed_refuses_and_builds_nothing() {
        for body in ["{\"a\":1}", "not json", "{\"a\":", "[1,2]", "\"s\"", "{} trailing"] {
            let r = raw(body, Some("application/json"));
            let parsed = decode("q", &r);
            let checked = decode_as("q", &r, Payload::Checked);
            assert_eq!(parsed.is_ok(), checked.is_ok(), "{body}");
            if let Ok(m) = checked {
                assert_eq!(m.payload, Value::Null);
            }
        }
        let mut bad = raw("", Some("application/json"));
        bad.body = b"{\"a\":\"\xff\"}".to_vec();
        assert!(decode("q", &bad).is_err());
        assert!(decode_as("q", &bad, Payload::Checked).unwrap_err().reason.contains("not JSON"));
    }

    #[test]
    fn gzip_and_deflate_bodies_are_read_and_corrupt_ones_dead_lettered() {
        use std::io::Write;
        let json = br#"{"order":"A-1","amount":4200}"#;
        let mut gz = raw("", Some("application/json"));
        gz.body = gzip(json);
        gz.props.content_encoding = Some("gzip".into());
        assert_eq!(decode("q", &gz).unwrap().payload["amount"], 4200);
        assert_eq!(decoded_body(&gz.props, &gz.body).unwrap().as_ref(), json);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(json).unwrap();
        let mut deflate = raw("", None);
        deflate.body = z.finish().unwrap();
        deflate.props.content_encoding = Some("deflate".into());
        assert_eq!(decode("q", &deflate).unwrap().payload["order"], "A-1");
        // Raw RFC 1951, which some clients send as "deflate".
        let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        d.write_all(json).unwrap();
        deflate.body = d.finish().unwrap();
        assert_eq!(decode_as("q", &deflate, Payload::Checked).unwrap().payload, Value::Null);
        // Not compression: read as it is.
        let mut plain = raw(std::str::from_utf8(json).unwrap(), None);
        plain.props.content_encoding = Some("utf-8".into());
        assert!(decode("q", &plain).is_ok());
        // Said gzip, is not.
        let mut liar = raw("{}", None);
        liar.props.content_encoding = Some("gzip".into());
        let reason = decode("q", &liar).unwrap_err().reason;
        assert!(reason.contains("does not decompress") && reason.contains("compressed"), "{reason}");
    }

    #[test]
    fn a_compression_bomb_is_refused_not_expanded() {
        // 200 MiB of zeros is about 200 KB of gzip.
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..200 {
            e.write_all(&zeros).unwrap();
        }
        let mut bomb = raw("", None);
        bomb.body = e.finish().unwrap();
        bomb.props.content_encoding = Some("gzip".into());
        assert!(decode("q", &bomb).unwrap_err().reason.contains("more than"));
    }

    #[test]
    fn a_copy_is_persistent_keeps_its_properties_and_carries_no_expiration() {
        let mut p = Props {
            content_type: Some("application/json".into()),
            content_encoding: Some("gzip".into()),
            delivery_mode: Some(1),
            priority: Some(7),
            correlation_id: Some("c-1".into()),
            reply_to: Some("amq.rabbitmq.reply-to".into()),
            expiration: Some("60000".into()),
            user_id: Some("alice".into()),
            app_id: Some("py".into()),
            cluster_id: Some("c".into()),
            ..Props::default()
        };
        let before = p.clone();
        copy_props(&mut p);
        assert!(p.persistent());
        assert_eq!(p.expiration, None);
        assert_eq!(p.header(ORIGINAL_EXPIRATION_HEADER).as_deref(), Some(&Value::from("60000")));
        assert_eq!(
            (p.content_encoding.as_deref(), p.priority, p.correlation_id.as_deref(), p.reply_to.as_deref()),
            (Some("gzip"), Some(7), Some("c-1"), Some("amq.rabbitmq.reply-to"))
        );
        assert_eq!((&p.user_id, &p.app_id, &p.cluster_id), (&before.user_id, &before.app_id, &before.cluster_id));
        // A copy of a copy keeps the first expiration it recorded.
        p.expiration = Some("5".into());
        copy_props(&mut p);
        assert_eq!(p.header(ORIGINAL_EXPIRATION_HEADER).as_deref(), Some(&Value::from("60000")));
    }

    #[test]
    fn no_timestamp_reads_as_none() {
        let m = decode("q", &raw("{}", None)).unwrap();
        assert_eq!(m.envelope.timestamp, None);
        assert_eq!(m.delivery.properties.timestamp, None);
        let env = Envelope::new();
        assert!(env.timestamp.is_some());
        assert_eq!(envelope_of(&props_for(&env)).timestamp, env.timestamp);
    }

    #[test]
    fn a_repaired_message_is_undecodable_with_what_was_repaired() {
        let mut r = raw("{}", Some("application/json"));
        r.props.headers_mut().insert(MALFORMED_HEADER.into(), Value::from("message_id: not UTF-8, was \"id-\\xff\""));
        let reason = decode("q", &r).unwrap_err().reason;
        assert!(reason.contains("message_id: not UTF-8") && reason.contains("repaired"), "{reason}");
        assert!(reason.contains("not the original bytes"), "{reason}");
    }
}
