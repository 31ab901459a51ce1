//! AMQP basic properties and field tables to and from the engine's
//! [`Props`] and [`Headers`], bounded in depth.

use crate::headers::Headers;
use crate::wire::Props;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use serde_json::{Number, Value};
use std::sync::Arc;

pub(crate) fn to_basic_properties(p: &Props) -> BasicProperties {
    let short = |v: &str| ShortString::from(v);
    let mut b = BasicProperties::default();
    if let Some(v) = &p.content_type {
        b = b.with_content_type(short(v));
    }
    if let Some(v) = &p.content_encoding {
        b = b.with_content_encoding(short(v));
    }
    if !p.headers().is_empty() {
        b = b.with_headers(to_field_table_keeping(p.headers(), p.received.table()));
    }
    if let Some(v) = p.delivery_mode {
        b = b.with_delivery_mode(v);
    }
    if let Some(v) = p.priority {
        b = b.with_priority(v);
    }
    if let Some(v) = &p.correlation_id {
        b = b.with_correlation_id(short(v));
    }
    if let Some(v) = &p.reply_to {
        b = b.with_reply_to(short(v));
    }
    if let Some(v) = &p.expiration {
        b = b.with_expiration(short(v));
    }
    if let Some(v) = &p.message_id {
        b = b.with_message_id(short(v));
    }
    if let Some(v) = p.timestamp {
        b = b.with_timestamp(v);
    }
    if let Some(v) = &p.kind {
        b = b.with_type(short(v));
    }
    if let Some(v) = &p.user_id {
        b = b.with_user_id(short(v));
    }
    if let Some(v) = &p.app_id {
        b = b.with_app_id(short(v));
    }
    if let Some(v) = &p.cluster_id {
        b = b.with_cluster_id(short(v));
    }
    b
}

/// [`to_basic_properties`] for a publish on a connection authenticated as
/// `user`. RabbitMQ refuses (406, closing the channel) a publish whose
/// `user_id` is not the connection's user unless that user has the
/// `impersonator` tag; a copy of a message another user published carries
/// that user's id. So a `user_id` that is not `user` goes in
/// [`crate::wire::ORIGINAL_USER_ID_HEADER`] instead, where it can still be
/// read, and the copy is accepted. One that is `user` is kept.
pub(crate) fn to_basic_properties_as(p: &Props, user: &str) -> BasicProperties {
    match &p.user_id {
        Some(id) if id != user => {
            let mut p = p.clone();
            p.user_id = None;
            let h = p.headers_mut();
            if !h.contains_key(crate::wire::ORIGINAL_USER_ID_HEADER) {
                h.insert(crate::wire::ORIGINAL_USER_ID_HEADER.into(), Value::from(id.clone()));
            }
            to_basic_properties(&p)
        }
        _ => to_basic_properties(p),
    }
}

/// The engine's properties for what arrived. The header table is not
/// converted here: it goes with them as it arrived, moved rather than
/// copied, and [`Props::header`] converts what is read of it.
pub(crate) fn from_basic_properties(b: BasicProperties) -> Props {
    let s = |v: &Option<ShortString>| v.as_ref().map(|x| x.as_str().to_owned());
    let mut p = Props::default();
    p.content_type = s(b.content_type());
    p.content_encoding = s(b.content_encoding());
    p.delivery_mode = *b.delivery_mode();
    p.priority = *b.priority();
    p.correlation_id = s(b.correlation_id());
    p.reply_to = s(b.reply_to());
    p.expiration = s(b.expiration());
    p.message_id = s(b.message_id());
    p.timestamp = *b.timestamp();
    p.kind = s(b.kind());
    p.user_id = s(b.user_id());
    p.app_id = s(b.app_id());
    p.cluster_id = s(b.cluster_id());
    p.received = crate::wire::Received(b.headers().is_some().then(|| Arc::new(b)));
    p
}

impl crate::wire::Received {
    fn table(&self) -> Option<&FieldTable> {
        self.0.as_deref().and_then(|b| b.headers().as_ref())
    }

    /// One header of the table as it arrived, converted.
    pub(crate) fn header(&self, name: &str) -> Option<Value> {
        self.table()?.inner().get(name).map(from_amqp)
    }

    /// One header's bytes, when it arrived as a byte array or a long string.
    pub(crate) fn header_bytes(&self, name: &str) -> Option<Vec<u8>> {
        match self.table()?.inner().get(name)? {
            AMQPValue::ByteArray(b) => Some(b.as_slice().to_vec()),
            AMQPValue::LongString(s) => Some(s.as_bytes().to_vec()),
            _ => None,
        }
    }

    /// The names of the top-level headers that arrived as byte arrays.
    pub(crate) fn byte_array_headers(&self) -> Vec<String> {
        let Some(t) = self.table() else { return Vec::new() };
        t.inner().iter().filter(|(_, v)| matches!(v, AMQPValue::ByteArray(_))).map(|(k, _)| k.as_str().to_owned()).collect()
    }

    /// Every header of the table as it arrived but those in `skip`, converted.
    pub(crate) fn headers_except(&self, skip: &[&str]) -> Headers {
        let Some(t) = self.table() else { return Headers::new() };
        // A message that carries only the envelope's headers (every
        // AceMQ publish without headers of its own) builds nothing: even
        // an empty collect allocates and walks the table, once a delivery.
        let mut kept = t.inner().iter().filter(|(k, _)| !skip.contains(&k.as_str())).peekable();
        if kept.peek().is_none() {
            return Headers::new();
        }
        kept.map(|(k, v)| (k.as_str().to_owned(), from_amqp(v))).collect()
    }
}

/// The table for `h`, taking from `received` every value that `h` still
/// has unchanged, as it arrived (see [`Props::received`]).
pub(super) fn to_field_table_keeping(h: &Headers, received: Option<&FieldTable>) -> FieldTable {
    let Some(received) = received else { return to_field_table(h) };
    let mut t = FieldTable::default();
    for (k, v) in h {
        let kept = received.inner().get(k.as_str()).filter(|orig| from_amqp(orig) == *v);
        t.insert(ShortString::from(k.as_str()), kept.cloned().unwrap_or_else(|| to_amqp(v)));
    }
    t
}

pub(crate) fn to_field_table(h: &Headers) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in h {
        t.insert(ShortString::from(k.as_str()), to_amqp(v));
    }
    t
}

pub(super) fn to_amqp(v: &Value) -> AMQPValue {
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                AMQPValue::LongLongInt(i)
            } else if let Some(u) = n.as_u64() {
                AMQPValue::LongLongInt(u.min(i64::MAX as u64) as i64)
            } else {
                AMQPValue::Double(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(a.iter().map(to_amqp).collect::<Vec<_>>())),
        Value::Object(o) => AMQPValue::FieldTable(to_field_table(o)),
    }
}

/// `t`, a table `depth` levels down. Bounded like what the engine sends
/// ([`crate::limits::MAX_HEADER_DEPTH`]): the frame filter already cuts
/// deeper tables into long strings before lapin parses them, and this keeps
/// the conversion from recursing without end should one get here anyway.
pub(super) fn table_at(t: &FieldTable, depth: usize) -> Headers {
    t.inner().iter().map(|(k, v)| (k.as_str().to_owned(), value_at(v, depth))).collect()
}

pub(super) fn from_amqp(v: &AMQPValue) -> Value {
    value_at(v, 1)
}

/// `v`, found in a table or array `depth` levels down.
pub(super) fn value_at(v: &AMQPValue, depth: usize) -> Value {
    if matches!(v, AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_)) && depth >= crate::limits::MAX_HEADER_DEPTH {
        return Value::from(format!("[nested deeper than {} levels]", crate::limits::MAX_HEADER_DEPTH));
    }
    match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(i) => Value::from(*i),
        AMQPValue::ShortShortUInt(i) => Value::from(*i),
        AMQPValue::ShortInt(i) => Value::from(*i),
        AMQPValue::ShortUInt(i) => Value::from(*i),
        AMQPValue::LongInt(i) => Value::from(*i),
        AMQPValue::LongUInt(i) => Value::from(*i),
        AMQPValue::LongLongInt(i) => Value::from(*i),
        AMQPValue::Float(f) => Number::from_f64(*f as f64).map_or(Value::Null, Value::Number),
        AMQPValue::Double(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        AMQPValue::DecimalValue(d) => {
            Number::from_f64(d.value as f64 / 10f64.powi(d.scale as i32)).map_or(Value::Null, Value::Number)
        }
        AMQPValue::ShortString(s) => Value::from(s.as_str()),
        AMQPValue::LongString(s) => Value::from(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(|x| value_at(x, depth + 1)).collect()),
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::FieldTable(t) => Value::Object(table_at(t, depth + 1)),
        AMQPValue::ByteArray(b) => Value::from(String::from_utf8_lossy(b.as_slice()).into_owned()),
        AMQPValue::Void => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_off_the_wire_are_converted_as_they_are_read() {
        let mut t = FieldTable::default();
        t.insert(ShortString::from("x-acemq-attempt"), AMQPValue::ShortInt(3));
        t.insert(ShortString::from("tenant"), AMQPValue::LongString(LongString::from("acme")));
        let p = from_basic_properties(BasicProperties::default().with_headers(t));
        assert_eq!(p.header("x-acemq-attempt").as_deref(), Some(&Value::from(3)));
        assert_eq!(p.header("absent"), None);
        assert_eq!(Value::Object(p.headers_except(&["x-acemq-attempt"])), serde_json::json!({"tenant": "acme"}));
        assert_eq!(crate::wire::envelope_of(&p).attempt, 3);
        // Sent again unchanged: every value as it arrived, the 16-bit integer too.
        let sent = to_basic_properties(&p);
        assert_eq!(sent.headers().as_ref().unwrap().inner().get("x-acemq-attempt"), Some(&AMQPValue::ShortInt(3)));
        // Changed: the change is read and sent, the rest still as it arrived.
        let mut q = p.clone();
        q.headers_mut().insert("x-acemq-attempt".into(), Value::from(4));
        assert_eq!(q.header("x-acemq-attempt").as_deref(), Some(&Value::from(4)));
        assert_eq!(q.headers()["tenant"], "acme");
        let sent = to_basic_properties(&q);
        let h = sent.headers().as_ref().unwrap().inner();
        assert_eq!(h.get("x-acemq-attempt"), Some(&AMQPValue::LongLongInt(4)));
        assert_eq!(h.get("tenant"), Some(&AMQPValue::LongString(LongString::from("acme"))));
        assert_ne!(p, q);
        assert_eq!(p, p.clone().with_headers(p.headers().clone()), "equal whether converted or not");
    }

    #[test]
    fn every_property_survives_the_round_trip() {
        let mut t = FieldTable::default();
        t.insert(ShortString::from("sig"), AMQPValue::ByteArray(vec![0xff, 0x00, 0xfe, b'a'].into()));
        t.insert(ShortString::from("text"), AMQPValue::LongString(LongString::from("plain")));
        let b = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(t)
            .with_delivery_mode(1)
            .with_priority(5)
            .with_correlation_id("corr".into())
            .with_reply_to("replies".into())
            .with_expiration("60000".into())
            .with_message_id("m-1".into())
            .with_timestamp(1_700_000_000)
            .with_type("t.v1".into())
            .with_user_id("guest".into())
            .with_app_id("py".into())
            .with_cluster_id("cl".into());
        let p = from_basic_properties(b.clone());
        assert_eq!(p.priority, Some(5));
        assert_eq!(p.reply_to.as_deref(), Some("replies"));
        assert_eq!(p.cluster_id.as_deref(), Some("cl"));
        assert!(!p.persistent());
        assert_eq!(to_basic_properties(&p), b, "sent again exactly as received");
        assert_eq!(to_basic_properties_as(&p, "guest"), b, "its own user's id is kept");
        // Byte arrays: the bytes, not U+FFFD; sent back as a byte array.
        assert_eq!(p.header_bytes("sig"), Some(vec![0xff, 0x00, 0xfe, b'a']));
        assert_eq!(p.header_bytes("text"), Some(b"plain".to_vec()));
        assert_eq!(p.byte_array_headers(), vec!["sig".to_owned()]);
        let mut copy = p.clone();
        crate::limits::copy_props(&mut copy);
        let sent = to_basic_properties_as(&copy, "acemq");
        assert_eq!(*sent.user_id(), None, "another user's id would be refused");
        let h = sent.headers().as_ref().unwrap().inner();
        assert_eq!(h.get("sig"), Some(&AMQPValue::ByteArray(vec![0xff, 0x00, 0xfe, b'a'].into())));
        assert_eq!(h.get(crate::wire::ORIGINAL_USER_ID_HEADER), Some(&AMQPValue::LongString("guest".into())));
        assert_eq!(h.get(crate::wire::ORIGINAL_EXPIRATION_HEADER), Some(&AMQPValue::LongString("60000".into())));
        assert_eq!(*sent.delivery_mode(), Some(2));
        assert_eq!(*sent.expiration(), None);
        assert_eq!((sent.priority(), sent.content_encoding()), (&Some(5), &Some("gzip".into())));
    }

    #[test]
    fn converting_headers_is_bounded_in_depth() {
        // Deeper than the frame filter lets through, built bottom up.
        let mut v = AMQPValue::LongLongInt(1);
        for _ in 0..100 {
            let mut t = FieldTable::default();
            t.insert(ShortString::from("a"), v);
            v = AMQPValue::FieldTable(t);
        }
        let AMQPValue::FieldTable(top) = v else { unreachable!() };
        let mut h = Value::Object(table_at(&top, 1));
        let mut levels = 1;
        while let Some(inner) = h.get("a").filter(|x| x.is_object()).cloned() {
            h = inner;
            levels += 1;
        }
        assert_eq!(levels, crate::limits::MAX_HEADER_DEPTH);
        assert_eq!(h["a"], Value::from("[nested deeper than 32 levels]"));
        let p = Props::default().with_headers(table_at(&top, 1));
        assert!(crate::limits::properties(&p).is_ok(), "what it converts to can be sent again");
    }
}
