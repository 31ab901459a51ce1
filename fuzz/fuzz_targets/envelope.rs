//! Arbitrary basic properties (the flag word and whatever follows it) in a
//! real delivery, through the frame filter, lapin's parser, the engine's
//! properties and envelope (core/src/wire.rs, core/src/envelope.rs), and a
//! retry copy.
//!
//! Checks: lapin parses what the filter passes; a marked message is never
//! decoded; the envelope is well formed; a copy that passes the engine's
//! limits encodes within frame_max, parses again and carries the same
//! properties and envelope; an envelope republished through props_for never reaches
//! lapin's encoder past the limits.
#![no_main]

use acemq::fuzzing::{self, Payload, RawDelivery, MALFORMED_HEADER};
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    // The flag word at least: RabbitMQ always writes one, and the filter
    // leaves the class, weight, body size and a header too short to hold
    // it to lapin (only what follows the flags comes from the publisher).
    if data.len() < 2 {
        return;
    }
    let stream = common::delivery(data, b"{}");
    let out = fuzzing::filter(&stream, &[], 1 << 17, 0);
    let frames = common::parse_all(&out);
    let received = common::properties_of(&frames);
    let marked = received.headers().as_ref().is_some_and(|h| h.inner().contains_key(MALFORMED_HEADER));
    let props = fuzzing::from_basic_properties(received);
    let raw = RawDelivery { tag: 1, exchange: String::new(), routing_key: "q".into(), redelivered: false, body: b"{}".to_vec(), props };
    let decoded = fuzzing::decode_as("q", &raw, Payload::Parsed);
    if marked {
        assert!(decoded.is_err(), "a repaired message is dead-lettered, not handled");
    }
    let envelope = fuzzing::envelope_of(&raw.props);
    assert!(envelope.attempt >= 1);
    if let Ok(m) = &decoded {
        assert_eq!(m.envelope, envelope);
    }

    // A retry copy, as the consumer makes it.
    let mut props = raw.props.clone();
    props.headers_mut().insert("x-acemq-reason".into(), serde_json::Value::from("fuzzed"));
    props.headers_mut().insert("x-acemq-attempt".into(), serde_json::Value::from(envelope.attempt.saturating_add(1)));
    fuzzing::copy_props(&mut props);
    if acemq::limits::properties(&props).is_ok() {
        let bytes = common::encoded_header(fuzzing::to_basic_properties(&props));
        assert!(bytes.len() <= acemq::limits::FRAME_MAX as usize, "a copy within the limits is {} bytes", bytes.len());
        let again = fuzzing::from_basic_properties(common::properties_of(&common::parse_all(&bytes)));
        // Every property but delivery_mode (2) and expiration (moved to a
        // header) as it arrived (issue 30 part 2, docs/retries.md).
        let o = &raw.props;
        assert_eq!(again.delivery_mode, Some(2));
        assert_eq!(again.expiration, None);
        assert_eq!(
            (&again.content_type, &again.content_encoding, &again.priority, &again.correlation_id, &again.reply_to),
            (&o.content_type, &o.content_encoding, &o.priority, &o.correlation_id, &o.reply_to)
        );
        assert_eq!(
            (&again.message_id, &again.timestamp, &again.kind, &again.user_id, &again.app_id, &again.cluster_id),
            (&o.message_id, &o.timestamp, &o.kind, &o.user_id, &o.app_id, &o.cluster_id)
        );
        let copy = fuzzing::envelope_of(&again);
        assert_eq!((&copy.id, &copy.kind, &copy.origin, &copy.timestamp), (&envelope.id, &envelope.kind, &envelope.origin, &envelope.timestamp));
        assert_eq!(copy.attempt, envelope.attempt.saturating_add(1).min(u32::MAX));
    }

    // The envelope published again as a new message.
    let republished = fuzzing::props_for(&envelope);
    if acemq::limits::properties(&republished).is_ok() {
        common::encoded_header(fuzzing::to_basic_properties(&republished));
    }
});
