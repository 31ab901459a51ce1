//! The options' defaults and the rules that refuse what cannot work, in
//! core, so a Rust service and the Ruby stores (which pass nil for what the
//! user left out) get the same ones.

use crate::idempotency::{
    InMemoryIdempotencyOptions, InMemoryIdempotencyStore, SqlIdempotencyOptions, DEFAULT_CLAIM_TIMEOUT,
    DEFAULT_RETENTION, DEFAULT_TABLE, DEFAULT_WINDOW,
};
use crate::idempotency::IdempotencyStore;
use std::time::Duration;

#[test]
fn left_out_means_the_default() {
    let o = SqlIdempotencyOptions::with(None, None, None, None);
    assert_eq!(o, SqlIdempotencyOptions::default());
    assert_eq!((o.table.as_str(), o.retention, o.claim_timeout), (DEFAULT_TABLE, DEFAULT_RETENTION, DEFAULT_CLAIM_TIMEOUT));
    let o = SqlIdempotencyOptions::with(Some("t".into()), None, Some(Duration::from_secs(5)), Some("w".into()));
    assert_eq!((o.table.as_str(), o.retention, o.claim_timeout, o.worker.as_deref()), ("t", DEFAULT_RETENTION, Duration::from_secs(5), Some("w")));
    let m = InMemoryIdempotencyOptions::with(None, Some(Duration::from_secs(7)));
    assert_eq!((m.window, m.claim_timeout), (DEFAULT_WINDOW, Duration::from_secs(7)));
}

#[test]
fn the_memory_store_refuses_a_zero_window_or_claim_timeout() {
    for (w, c) in [(Duration::ZERO, DEFAULT_CLAIM_TIMEOUT), (DEFAULT_WINDOW, Duration::ZERO)] {
        let e = InMemoryIdempotencyStore::with_options(InMemoryIdempotencyOptions { window: w, claim_timeout: c }).err().unwrap();
        assert!(e.is_invalid_argument(), "{e}");
        assert!(e.message().contains("must be longer than zero seconds"), "{e}");
    }
    let s = InMemoryIdempotencyStore::with_options(InMemoryIdempotencyOptions::with(None, Some(Duration::from_secs(9)))).unwrap();
    assert_eq!(s.claim_timeout(), Some(Duration::from_secs(9)));
}

#[test]
#[should_panic(expected = "must be longer than zero seconds")]
fn new_with_a_zero_window_panics_with_the_rule() {
    let _ = InMemoryIdempotencyStore::new(Duration::ZERO);
}
