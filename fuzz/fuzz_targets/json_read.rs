//! core's JSON reader (core/src/json_read.rs), which the Ruby consumer
//! builds every payload with before serde_json.
//!
//! Checks: no panic; whatever `read` builds, serde_json builds too, and the
//! same value (floats bit for bit, as serde_json writes them back); what
//! serde_json refuses, `read` refuses.
#![no_main]

use acemq::json_read::{read, Values};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let ours = read(text, &mut Values);
    let theirs = serde_json::from_str::<serde_json::Value>(text);
    match (ours, theirs) {
        (Some(v), Ok(w)) => {
            assert_eq!(v, w, "{text:?}");
            assert_eq!(v.to_string(), w.to_string(), "{text:?}");
        }
        (Some(v), Err(e)) => panic!("read built {v} from {text:?}, which serde_json refuses: {e}"),
        (None, _) => {}
    }
});
