//! How a delivery becomes a [`Message`], or the reason it cannot be one.

use crate::message::{DeliveryInfo, Message};
use crate::wire::{decoded_body, envelope_of, utf8, RawDelivery, CONTENT_TYPE, MALFORMED_HEADER};
use serde_json::Value;

/// Why a delivery could not become a message. It is dead-lettered with this
/// as the reason, the body kept byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// What was wrong, and what to do.
    pub reason: String,
}

/// Accept `application/json`, `application/json; charset=utf-8` and
/// `application/*+json`. A message with no content type, or with
/// `application/octet-stream` (Bunny's default, which means "nobody said"),
/// is tried as JSON: most clients publish that way unless told otherwise.
pub(crate) fn json_content_type(ct: &str) -> bool {
    // Compared without case and without a lowercased copy: this runs for
    // every delivery.
    let base = ct.split(';').next().unwrap_or("").trim().as_bytes();
    let is = |s: &str| base.eq_ignore_ascii_case(s.as_bytes());
    let starts = |s: &str| base.len() >= s.len() && base[..s.len()].eq_ignore_ascii_case(s.as_bytes());
    let ends = |s: &str| base.len() >= s.len() && base[base.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes());
    is(CONTENT_TYPE) || is("application/octet-stream") || (starts("application/") && ends("+json"))
}

/// How a delivery's JSON body is read when it becomes a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Payload {
    /// Parsed into [`Message::payload`]. What a Rust handler wants.
    #[default]
    Parsed,
    /// Checked to be JSON (the same deliveries are refused as with
    /// `Parsed`, for the same reasons) but not built: `Message::payload` is
    /// `Null`, and the caller builds its own values from the body, once. For
    /// an adapter whose handlers want their own objects: the Ruby extension
    /// builds Ruby objects straight from the bytes, only when the handler
    /// reads the payload, instead of from a `Value` built and dropped for it.
    Checked,
}

/// A JSON document read through to the end and dropped: what
/// [`Payload::Checked`] parses. Not `serde::de::IgnoredAny`, which skips a
/// number's digits without reading its value: `1e400` passed it, while a
/// `Value` refuses it (out of range), and so does the adapter that builds
/// the payload later. Each value is read as a `Value` would read it
/// (`deserialize_any`), so the same bodies are refused for the same reasons,
/// nesting included; nothing is built (strings are borrowed where they can be).
pub(crate) struct Syntax;

impl<'de> serde::Deserialize<'de> for Syntax {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Syntax, D::Error> {
        d.deserialize_any(Syntax)
    }
}

impl<'de> serde::de::Visitor<'de> for Syntax {
    type Value = Syntax;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<Syntax, E> {
        Ok(Syntax)
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<Syntax, E> {
        Ok(Syntax)
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<Syntax, E> {
        Ok(Syntax)
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<Syntax, E> {
        Ok(Syntax)
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<Syntax, E> {
        Ok(Syntax)
    }

    fn visit_unit<E>(self) -> std::result::Result<Syntax, E> {
        Ok(Syntax)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Syntax, A::Error> {
        while seq.next_element::<Syntax>()?.is_some() {}
        Ok(Syntax)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Syntax, A::Error> {
        while map.next_entry::<Syntax, Syntax>()?.is_some() {}
        Ok(Syntax)
    }
}

/// Turn a delivery from `queue` into a message, or say why it cannot be one.
pub fn decode(queue: &str, raw: &RawDelivery) -> Result<Message, Undecodable> {
    decode_as(queue, raw, Payload::Parsed)
}

/// [`decode`], reading the payload as `payload` says.
pub fn decode_as(queue: &str, raw: &RawDelivery, payload: Payload) -> Result<Message, Undecodable> {
    let (mut message, value) = decode_then(queue, raw, |text| match payload {
        Payload::Parsed => serde_json::from_str::<Value>(&text).map_err(|e| not_json(&e)),
        Payload::Checked => {
            // The syntax, without building anything, and every number in
            // range, as Parsed reads them.
            serde_json::from_str::<Syntax>(&text).map_err(|e| not_json(&e))?;
            Ok(Value::Null)
        }
    })?;
    message.payload = value;
    Ok(message)
}

/// Why a body that is not JSON cannot be a message: `why` is what the
/// parser said. The one wording, whoever parsed it (core, or an adapter
/// that builds its own values from the body: `Consumer::refuse`).
pub fn not_json(why: &dyn std::fmt::Display) -> Undecodable {
    Undecodable { reason: format!("body is not JSON ({why}); the body is kept byte for byte on the dead-letter queue") }
}

/// A delivery into a message whose payload is still `Null`, after every
/// check but the JSON one (its properties, content type, compression and
/// UTF-8), and `read` of its body's text: what the JSON is, or why it is
/// not. The text is borrowed from the body, or owned when the body came
/// compressed.
pub(crate) fn decode_then<T>(
    queue: &str,
    raw: &RawDelivery,
    read: impl FnOnce(std::borrow::Cow<'_, str>) -> Result<T, Undecodable>,
) -> Result<(Message, T), Undecodable> {
    let (mut message, read) = decode_bare(raw, read)?;
    message.delivery = delivery_info(queue, raw);
    Ok((message, read))
}

/// Where `raw` came from, as a message carries it: copies of its names and
/// properties (the delivery keeps its own, for the copies settling makes).
pub(crate) fn delivery_info(queue: &str, raw: &RawDelivery) -> DeliveryInfo {
    DeliveryInfo {
        queue: queue.to_owned(),
        exchange: raw.exchange.clone(),
        routing_key: raw.routing_key.clone(),
        redelivered: raw.redelivered,
        properties: raw.props.clone(),
    }
}

/// [`decode_then`] leaving the message's `delivery` empty (default): for a
/// caller that reads it off the delivery itself, or fills it in later
/// ([`delivery_info`]).
pub(crate) fn decode_bare<T>(
    raw: &RawDelivery,
    read: impl FnOnce(std::borrow::Cow<'_, str>) -> Result<T, Undecodable>,
) -> Result<(Message, T), Undecodable> {
    if let Some(what) = raw.props.header(MALFORMED_HEADER) {
        // Its values are not what the publisher sent: handling it as if
        // they were would key the idempotent consumer on a repaired id, and
        // route on a repaired type.
        let what = what.as_str().map_or_else(|| what.to_string(), str::to_owned);
        return Err(Undecodable {
            reason: format!(
                "the message arrived with properties or headers that AMQP clients cannot parse ({what}); \
                 acemq repaired them to be readable and did not handle it. This copy carries the repaired values, \
                 not the original bytes: fix the publisher"
            ),
        });
    }
    if let Some(ct) = &raw.props.content_type {
        if !ct.is_empty() && !json_content_type(ct) {
            return Err(Undecodable {
                reason: format!(
                    "content type {ct:?} is not application/json: acemq consumers read JSON; publish JSON, or consume this queue with another client"
                ),
            });
        }
    }
    let body = decoded_body(&raw.props, &raw.body).map_err(|e| Undecodable {
        reason: format!("{e}; the body is kept byte for byte, compressed, on the dead-letter queue"),
    })?;
    // JSON text is UTF-8 (RFC 8259), and a Value's strings must be: checked
    // over the whole body at once, so that the parser does not check each
    // string again.
    let invalid = |e: std::str::Utf8Error| not_json(&format_args!("invalid UTF-8: {e}"));
    let text = match body {
        std::borrow::Cow::Borrowed(b) => std::borrow::Cow::Borrowed(utf8(b).map_err(invalid)?),
        std::borrow::Cow::Owned(b) => {
            utf8(&b).map_err(invalid)?;
            // SAFETY: checked just above.
            std::borrow::Cow::Owned(unsafe { String::from_utf8_unchecked(b) })
        }
    };
    let read = read(text)?;
    let message = Message { payload: Value::Null, envelope: envelope_of(&raw.props), delivery: DeliveryInfo::default() };
    Ok((message, read))
}
