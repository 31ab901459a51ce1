//! Where the stores get "now" from, so tests can move time instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in epoch milliseconds.
///
/// The SQL store writes this worker's clock into the table (not the
/// database's), like the seed's `Time.now.utc`: workers whose clocks disagree
/// by more than a few seconds shift when a stale claim can be taken over by
/// that much, so keep them on NTP.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
    }
}

/// A clock that only moves when told to: for tests of windows and claim
/// timeouts. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock reading `start_millis`.
    pub fn new(start_millis: i64) -> Self {
        Self { now: Arc::new(AtomicI64::new(start_millis)) }
    }

    /// Move time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        // An arbitrary, realistic epoch time (2026) rather than zero, so that
        // "now minus the claim timeout" is never negative in a test.
        Self::new(1_790_000_000_000)
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}
