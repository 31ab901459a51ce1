//! A dead letter as the store keeps it: what ingest makes of a delivery off
//! `{queue}.dlq`, and a row read back.

use super::hash::content_hash;
use crate::headers::Headers;
use crate::replay::{original_route, reason_of};
use crate::wire::{envelope_of, Props, RawDelivery, ERROR_CLASS_HEADER, FAILED_AT_HEADER, HISTORY_HEADER};
use serde_json::{Map, Value};

/// The header the failure's first frames travel in: frames joined by "\n".
pub const BACKTRACE_HEADER: &str = "x-acemq-backtrace";

/// Headers that change each time the broker hands the same message out
/// again (a quorum queue's delivery counters) or that a queue-mode read adds
/// when it puts a copy back: left out of what is stored and hashed, so the
/// same dead letter delivered twice is one row.
const VOLATILE: [&str; 3] = ["x-delivery-count", "x-acquired-count", crate::replay::REFRESHED_BY_HEADER];

/// The short text columns (queue, message id, type, error class, exchange,
/// routing key) hold at most this many characters: enough for any AMQP
/// short string, small enough for every database's index. The headers
/// column keeps the whole value.
pub(crate) const SHORT: usize = 255;

/// The reason column holds at most this many characters (its index shares
/// MySQL's 3,072 bytes with the queue and the error class).
pub(crate) const REASON: usize = 250;

/// A dead letter taken off a DLQ, ready to be inserted.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDeadLetter {
    /// The work queue (not its `.dlq`).
    pub queue: String,
    /// The message id (`message_id`, else `x-acemq-id`; may be empty for a
    /// foreign message without one).
    pub message_id: String,
    /// 32 hex digits of 128-bit FNV-1a over the body, headers and
    /// properties: with the queue and the message id, what makes a row unique.
    pub content_hash: String,
    /// The body, byte for byte.
    pub body: Vec<u8>,
    /// Every header but the broker's delivery counters.
    pub headers: Headers,
    /// The AMQP properties that were set (`content_type`, `correlation_id`,
    /// `reply_to`, `type`, `app_id`, `priority`, `timestamp`, ...).
    pub properties: Map<String, Value>,
    /// The message type.
    pub kind: Option<String>,
    /// Why it was dead-lettered: AceMQ's reason, else the broker's.
    pub reason: Option<String>,
    /// The error class, when an exception put it there.
    pub error_class: Option<String>,
    /// Attempts made before it was dead-lettered.
    pub attempt: u32,
    /// The exchange it was first published to, when known.
    pub exchange: Option<String>,
    /// Its routing key there, when known.
    pub routing_key: Option<String>,
    /// When it failed, seconds since the epoch (when it was ingested, for
    /// a dead letter that does not say).
    pub failed_at: i64,
    /// `x-acemq-history` as it came, whatever its shape.
    pub history: Option<Value>,
    /// `x-acemq-backtrace`: the failure's first frames.
    pub backtrace: Option<String>,
}

/// A dead letter in the store: the letter as ingested, its row id and
/// when it was ingested. What a row holds cut to its column (the reason's
/// first 250 characters, the short texts' 255) the headers keep whole.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredDeadLetter {
    /// The row id: newest rows have the highest.
    pub id: i64,
    /// When it was ingested, seconds since the epoch.
    pub ingested_at: i64,
    /// The dead letter.
    pub letter: NewDeadLetter,
}

impl NewDeadLetter {
    /// What `raw`, read off `queue`'s DLQ at `now` (seconds), is stored as.
    pub(crate) fn from_delivery(queue: &str, raw: &RawDelivery, now: i64) -> NewDeadLetter {
        let mut headers = raw.props.headers().clone();
        for h in VOLATILE {
            headers.remove(h);
        }
        let properties = properties_of(&raw.props);
        let hash = content_hash(&raw.body, &Value::Object(headers.clone()), &Value::Object(properties.clone()));
        let envelope = envelope_of(&raw.props);
        let text = |k: &str| headers.get(k).and_then(Value::as_str).map(str::to_owned);
        let (exchange, routing_key) = original_route(&headers);
        let backtrace = headers.get(BACKTRACE_HEADER).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        let failed_at = headers
            .get(FAILED_AT_HEADER)
            .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)).or_else(|| v.as_str().and_then(|s| s.parse().ok())))
            .filter(|t| *t > 0)
            .unwrap_or(now);
        NewDeadLetter {
            queue: queue.to_owned(),
            message_id: envelope.id,
            content_hash: hash,
            body: raw.body.clone(),
            kind: raw.props.kind.clone(),
            reason: reason_of(&headers),
            error_class: text(ERROR_CLASS_HEADER),
            attempt: envelope.attempt,
            exchange,
            routing_key,
            failed_at,
            history: headers.get(HISTORY_HEADER).cloned(),
            backtrace,
            headers,
            properties,
        }
    }
}

/// The properties a faithful replay needs, those that were set.
fn properties_of(p: &Props) -> Map<String, Value> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.to_owned(), v);
        }
    };
    put("content_type", p.content_type.clone().map(Value::from));
    put("content_encoding", p.content_encoding.clone().map(Value::from));
    put("delivery_mode", p.delivery_mode.map(Value::from));
    put("priority", p.priority.map(Value::from));
    put("correlation_id", p.correlation_id.clone().map(Value::from));
    put("reply_to", p.reply_to.clone().map(Value::from));
    put("expiration", p.expiration.clone().map(Value::from));
    put("message_id", p.message_id.clone().map(Value::from));
    put("timestamp", p.timestamp.map(Value::from));
    put("type", p.kind.clone().map(Value::from));
    put("user_id", p.user_id.clone().map(Value::from));
    put("app_id", p.app_id.clone().map(Value::from));
    put("cluster_id", p.cluster_id.clone().map(Value::from));
    m
}

/// The properties of a copy of a stored dead letter (headers not set).
pub(crate) fn props_from(m: &Map<String, Value>) -> Props {
    let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_owned);
    let byte = |k: &str| m.get(k).and_then(Value::as_u64).and_then(|n| u8::try_from(n).ok());
    let mut p = Props::default();
    p.content_type = s("content_type");
    p.content_encoding = s("content_encoding");
    p.delivery_mode = byte("delivery_mode");
    p.priority = byte("priority");
    p.correlation_id = s("correlation_id");
    p.reply_to = s("reply_to");
    p.expiration = s("expiration");
    p.message_id = s("message_id");
    p.timestamp = m.get("timestamp").and_then(Value::as_u64);
    p.kind = s("type");
    p.user_id = s("user_id");
    p.app_id = s("app_id");
    p.cluster_id = s("cluster_id");
    p
}

/// Text as a column can hold it: NUL (which PostgreSQL's TEXT refuses) as
/// U+FFFD. Only the derived columns; the headers column keeps it, escaped.
pub(crate) fn column_text(s: &str) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{fffd}")
    } else {
        s.to_owned()
    }
}

/// At most [`SHORT`] characters of `s`, for a short column.
pub(crate) fn short(s: &str) -> String {
    cut(s, SHORT)
}

/// At most `n` characters of `s`, NUL replaced.
pub(crate) fn cut(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => column_text(&s[..i]),
        None => column_text(s),
    }
}

/// The body as the TEXT column holds it, and its encoding: UTF-8 as it is
/// (without NUL, which PostgreSQL's TEXT refuses), anything else base64.
pub(crate) fn body_text(body: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(body) {
        Ok(s) if !s.contains('\0') => (s.to_owned(), "utf8"),
        _ => (base64_encode(body), "base64"),
    }
}

/// The body back from its column.
pub(crate) fn body_bytes(text: String, encoding: &str) -> crate::error::Result<Vec<u8>> {
    match encoding {
        "utf8" => Ok(text.into_bytes()),
        "base64" => base64_decode(&text)
            .ok_or_else(|| crate::error::Error::store("a dead letter's body_encoding says base64 but the body is not: was the row edited by hand?")),
        other => Err(crate::error::Error::store(format!("a dead letter's body_encoding is {other:?}: it must be utf8 or base64"))),
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_round_trip_whatever_their_bytes() {
        for body in [&b""[..], b"a", b"ab", b"abc", b"{\"x\":1}", b"\xff\xfe\x00\x01", b"nul\0inside", "é✓".as_bytes()] {
            let (text, enc) = body_text(body);
            assert_eq!(body_bytes(text, enc).unwrap(), body, "{body:?}");
        }
        assert_eq!(body_text(b"hi").1, "utf8");
        assert_eq!(body_text(b"\xff").1, "base64");
        assert_eq!(body_text(b"a\0").1, "base64");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
    }

    #[test]
    fn short_columns_keep_whole_characters() {
        let long = "é".repeat(300);
        assert_eq!(short(&long).chars().count(), SHORT);
        assert_eq!(short("a\0b"), "a\u{fffd}b");
    }
}
