//! The basic properties and the broker's methods, as far as the filter reads them.

/// The basic properties in flag order (bit 15 down to bit 2).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Prop {
    Short,
    Table,
    Octet,
    Timestamp,
}

pub(super) const PROPERTIES: [(&str, Prop); 14] = [
    ("content_type", Prop::Short),
    ("content_encoding", Prop::Short),
    ("headers", Prop::Table),
    ("delivery_mode", Prop::Octet),
    ("priority", Prop::Octet),
    ("correlation_id", Prop::Short),
    ("reply_to", Prop::Short),
    ("expiration", Prop::Short),
    ("message_id", Prop::Short),
    ("timestamp", Prop::Timestamp),
    ("type", Prop::Short),
    ("user_id", Prop::Short),
    ("app_id", Prop::Short),
    ("cluster_id", Prop::Short),
];

/// A method argument, as far as the filter needs to know it.
#[derive(Clone, Copy)]
pub(super) enum Field {
    /// Octets, shorts, longs, bits: skipped.
    Fixed(usize),
    Short(&'static str),
    Table(&'static str),
}

/// The methods a broker sends that carry short strings or tables, and where.
/// Bits sharing an octet are one `Fixed(1)`; what follows the last string or
/// table is not listed.
pub(super) fn server_method(class: u16, method: u16) -> Option<(&'static str, &'static [Field])> {
    use Field::*;
    Some(match (class, method) {
        (10, 10) => ("connection.start", &[Fixed(2), Table("server property")]),
        (10, 41) => ("connection.open-ok", &[Short("reserved")]),
        (10, 50) => ("connection.close", &[Fixed(2), Short("reply text")]),
        (10, 60) => ("connection.blocked", &[Short("reason")]),
        (20, 40) => ("channel.close", &[Fixed(2), Short("reply text")]),
        (50, 11) => ("queue.declare-ok", &[Short("queue")]),
        (60, 21) => ("basic.consume-ok", &[Short("consumer tag")]),
        (60, 30) => ("basic.cancel", &[Short("consumer tag")]),
        (60, 31) => ("basic.cancel-ok", &[Short("consumer tag")]),
        (60, 50) => ("basic.return", &[Fixed(2), Short("reply text"), Short("exchange"), Short("routing key")]),
        (60, 60) => ("basic.deliver", &[Short("consumer tag"), Fixed(9), Short("exchange"), Short("routing key")]),
        (60, 71) => ("basic.get-ok", &[Fixed(9), Short("exchange"), Short("routing key")]),
        (60, 72) => ("basic.get-empty", &[Short("reserved")]),
        _ => return None,
    })
}
