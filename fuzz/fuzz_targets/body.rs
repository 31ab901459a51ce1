//! The body check and JSON parse of a delivery (core/src/wire.rs:
//! decode_as), for each kind of content type.
//!
//! Checks: no panic; Checked refuses exactly what Parsed refuses; what
//! Parsed builds is what serde_json makes of the bytes; the ASCII fast path
//! agrees with std's UTF-8 check.
#![no_main]

use acemq::fuzzing::{self, Payload, Props, RawDelivery};
use libfuzzer_sys::fuzz_target;

const CONTENT_TYPES: [Option<&str>; 8] = [
    None,
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some("application/octet-stream"),
    Some("application/vnd.acme+json"),
    Some("text/plain"),
    Some(""),
    Some("APPLICATION/JSON ; x"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let ct = CONTENT_TYPES[pick as usize % CONTENT_TYPES.len()];
    assert_eq!(fuzzing::utf8(body).is_ok(), std::str::from_utf8(body).is_ok());
    let mut props = Props::default();
    props.content_type = ct.map(str::to_owned);
    let raw = RawDelivery { tag: 1, exchange: String::new(), routing_key: "q".into(), redelivered: false, body: body.to_vec(), props };
    let parsed = fuzzing::decode_as("q", &raw, Payload::Parsed);
    let checked = fuzzing::decode_as("q", &raw, Payload::Checked);
    assert_eq!(parsed.is_ok(), checked.is_ok(), "Checked and Parsed disagree");
    if let Err(e) = &parsed {
        assert!(!e.reason.is_empty());
    }
    let json_type = matches!(pick as usize % CONTENT_TYPES.len(), 0..=4 | 6);
    match (serde_json::from_slice::<serde_json::Value>(body), &parsed) {
        (Ok(v), Ok(m)) => assert_eq!(v, m.payload),
        (Ok(_), Err(e)) => assert!(!json_type, "JSON refused: {}", e.reason),
        (Err(_), Ok(_)) => panic!("not JSON, yet decoded"),
        (Err(_), Err(_)) => {}
    }
});
