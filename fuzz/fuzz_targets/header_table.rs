//! A header table of arbitrary bytes, delivered in a real basic.deliver +
//! content header + body, through the frame filter's table walker, lapin's
//! parser, the engine's header conversion (transport/amqp/fields.rs) and a
//! dead-letter copy of it.
//!
//! Checks: lapin parses everything the filter passes (the filter repairs
//! what it could not read, and marks it); a marked message is never
//! decoded; reading one header agrees with converting them all; a copy that
//! passes the engine's limits encodes within frame_max and parses again.
#![no_main]

use acemq::fuzzing::{self, Payload, RawDelivery, MALFORMED_HEADER};
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let mut props = (common::CONTENT_TYPE | common::HEADERS).to_be_bytes().to_vec();
    props.extend(common::short(b"application/json"));
    props.extend(common::long(data));
    let stream = common::delivery(&props, b"{}");
    let out = fuzzing::filter(&stream, &[], 1 << 17, 0);
    let frames = common::parse_all(&out);
    let received = common::properties_of(&frames);
    let marked = received.headers().as_ref().is_some_and(|h| h.inner().contains_key(MALFORMED_HEADER));
    assert_eq!(out == stream, !marked, "the filter changes a message only to repair it, and marks it when it does");

    let props = fuzzing::from_basic_properties(received);
    let all = props.headers_except(&[]);
    for (name, value) in &all {
        assert_eq!(props.header(name).as_deref(), Some(value), "header {name:?} one at a time");
    }
    let raw = RawDelivery { tag: 1, exchange: String::new(), routing_key: "q".into(), redelivered: false, body: b"{}".to_vec(), props };
    let decoded = fuzzing::decode_as("q", &raw, Payload::Parsed);
    if marked {
        assert!(decoded.is_err(), "a repaired message is dead-lettered, not handled");
    }
    common_copy(raw.props);
});

/// What the consumer does to dead-letter it: its reason added, fitted to
/// one frame, sent by lapin.
fn common_copy(mut props: fuzzing::Props) {
    props.headers_mut().insert("x-acemq-reason".into(), serde_json::Value::from("fuzzed"));
    fuzzing::copy_props(&mut props);
    if acemq::limits::properties(&props).is_ok() {
        let bytes = common::encoded_header(fuzzing::to_basic_properties(&props));
        assert!(bytes.len() <= acemq::limits::FRAME_MAX as usize, "a copy within the limits is {} bytes", bytes.len());
        common::parse_all(&bytes);
    }
}
