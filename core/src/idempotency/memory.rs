//! The in-process store: a sliding window of keys in memory.

use super::clock::{Clock, SystemClock};
use super::options::{InMemoryIdempotencyOptions, DEFAULT_WINDOW};
use super::store::IdempotencyStore;
use crate::error::Result;
use crate::sql::time::millis;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Claimed,
    Confirmed,
}

#[derive(Debug)]
struct Entry {
    state: State,
    recorded_at: i64,
    expires_at: i64,
}

#[derive(Debug, Default)]
struct Keys {
    entries: HashMap<String, Entry>,
    // Keys ordered by expiry, so pruning looks only at the keys that leave.
    by_expiry: BTreeSet<(i64, String)>,
}

impl Keys {
    fn prune(&mut self, now: i64) {
        while let Some((expires_at, _)) = self.by_expiry.first() {
            if *expires_at > now {
                break;
            }
            let (_, key) = self.by_expiry.pop_first().expect("first exists");
            self.entries.remove(&key);
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(entry) = self.entries.remove(key) {
            self.by_expiry.remove(&(entry.expires_at, key.to_string()));
        }
    }
}

/// Keys remembered in this process for a sliding window.
///
/// Correct for one process and wrong for two — two consumer processes each
/// with their own memory is exactly the case the pattern exists for — so it
/// is right for a spec or development and wrong for production.
///
/// Same states as the SQL store: a claim (a handler is working on it) that
/// can be taken over once older than the claim timeout, and a confirmed key
/// that cannot. Unlike the SQL store, nothing has to be scheduled: expired
/// keys are removed on every call, so memory holds at most the keys claimed
/// within one window.
pub struct InMemoryIdempotencyStore {
    keys: Mutex<Keys>,
    window: i64,
    claim_timeout: i64,
    clock: Arc<dyn Clock>,
}

impl Default for InMemoryIdempotencyStore {
    fn default() -> Self {
        Self::new(DEFAULT_WINDOW)
    }
}

impl InMemoryIdempotencyStore {
    /// A store built from `options`; refuses a zero window or claim timeout.
    pub fn with_options(options: InMemoryIdempotencyOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            keys: Mutex::new(Keys::default()),
            window: millis(options.window),
            claim_timeout: millis(options.claim_timeout),
            clock: Arc::new(SystemClock),
        })
    }

    /// A store remembering each key for `window` after it was claimed.
    ///
    /// # Panics
    ///
    /// When `window` is zero (nothing would be remembered);
    /// [`with_options`](Self::with_options) returns the error instead.
    pub fn new(window: Duration) -> Self {
        let options = InMemoryIdempotencyOptions { window, ..Default::default() };
        Self::with_options(options).unwrap_or_else(|e| panic!("InMemoryIdempotencyStore::new: {e}"))
    }

    /// Honour an unfinished claim for `timeout` instead of five minutes.
    ///
    /// # Panics
    ///
    /// When `timeout` is zero (every claim would be stale at once);
    /// [`with_options`](Self::with_options) returns the error instead.
    pub fn with_claim_timeout(mut self, timeout: Duration) -> Self {
        if timeout.is_zero() {
            panic!("InMemoryIdempotencyStore::with_claim_timeout: a zero claim timeout lets two consumers run one message at once");
        }
        self.claim_timeout = millis(timeout);
        self
    }

    /// Read time from `clock` (a [`ManualClock`](super::ManualClock) in tests).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How many keys are remembered now (expired keys are removed first).
    pub fn len(&self) -> usize {
        self.lock_pruned().entries.len()
    }

    /// No keys remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every key.
    pub fn clear(&self) {
        *self.lock() = Keys::default();
    }

    fn lock(&self) -> MutexGuard<'_, Keys> {
        // A panic elsewhere while holding the lock leaves the maps consistent
        // (every mutation is a single insert or remove pair), so carry on.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_pruned(&self) -> MutexGuard<'_, Keys> {
        let mut keys = self.lock();
        keys.prune(self.clock.now_millis());
        keys
    }
}

impl IdempotencyStore for InMemoryIdempotencyStore {
    fn claim_timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(u64::try_from(self.claim_timeout).unwrap_or(0)))
    }

    fn first_time(&self, key: &str) -> Result<bool> {
        let now = self.clock.now_millis();
        let mut keys = self.lock();
        keys.prune(now);
        let expires_at = now.saturating_add(self.window);
        match keys.entries.get(key) {
            None => {}
            // A stale claim: its handler died. Take it over, as the SQL store does.
            Some(e) if e.state == State::Claimed && e.recorded_at < now - self.claim_timeout => {
                keys.remove(key);
            }
            Some(_) => return Ok(false),
        }
        keys.entries.insert(key.to_string(), Entry { state: State::Claimed, recorded_at: now, expires_at });
        keys.by_expiry.insert((expires_at, key.to_string()));
        Ok(true)
    }

    fn confirm(&self, key: &str) -> Result<()> {
        if let Some(e) = self.lock_pruned().entries.get_mut(key) {
            e.state = State::Confirmed;
        }
        Ok(())
    }

    fn forget(&self, key: &str) -> Result<()> {
        let mut keys = self.lock_pruned();
        if keys.entries.get(key).is_some_and(|e| e.state == State::Claimed) {
            keys.remove(key);
        }
        Ok(())
    }

    fn confirmed(&self, key: &str) -> Result<bool> {
        Ok(self.lock_pruned().entries.get(key).is_some_and(|e| e.state == State::Confirmed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::ManualClock;

    fn store(window: u64) -> (InMemoryIdempotencyStore, ManualClock) {
        let clock = ManualClock::default();
        let s = InMemoryIdempotencyStore::new(Duration::from_secs(window))
            .with_claim_timeout(Duration::from_secs(10))
            .with_clock(clock.clone());
        (s, clock)
    }

    #[test]
    fn first_time_once_then_duplicate() {
        let (s, _) = store(60);
        assert!(s.first_time("k").unwrap());
        assert!(!s.first_time("k").unwrap());
        assert!(s.first_time("other").unwrap());
    }

    #[test]
    fn window_expiry_removes_keys_and_they_run_again() {
        let (s, clock) = store(60);
        s.first_time("a").unwrap();
        s.confirm("a").unwrap();
        clock.advance(Duration::from_secs(30));
        s.first_time("b").unwrap();
        assert_eq!(s.len(), 2);
        clock.advance(Duration::from_secs(31));
        assert_eq!(s.len(), 1, "a left after its window, b stays");
        assert!(!s.confirmed("a").unwrap());
        assert!(s.first_time("a").unwrap(), "an expired key is seen for the first time again");
    }

    #[test]
    fn memory_is_bounded_by_the_window() {
        let (s, clock) = store(10);
        for i in 0..10_000 {
            s.first_time(&format!("k{i}")).unwrap();
            clock.advance(Duration::from_millis(10));
        }
        // Ten seconds of keys at one per 10ms, whatever has gone before.
        assert!(s.len() <= 1000, "{}", s.len());
        clock.advance(Duration::from_secs(11));
        assert_eq!(s.len(), 0);
        assert!(s.lock().by_expiry.is_empty());
    }

    #[test]
    fn stale_claim_taken_over_after_claim_timeout_and_not_before() {
        let (s, clock) = store(3600);
        assert!(s.first_time("k").unwrap());
        clock.advance(Duration::from_secs(10));
        assert!(!s.first_time("k").unwrap(), "exactly the timeout is not stale yet");
        clock.advance(Duration::from_millis(1));
        assert!(s.first_time("k").unwrap());
        assert!(!s.first_time("k").unwrap(), "the takeover is a fresh claim");
    }

    #[test]
    fn confirmed_never_taken_over_nor_forgotten() {
        let (s, clock) = store(3600);
        s.first_time("k").unwrap();
        s.confirm("k").unwrap();
        s.confirm("k").unwrap();
        s.forget("k").unwrap();
        clock.advance(Duration::from_secs(600));
        assert!(!s.first_time("k").unwrap());
        assert!(s.confirmed("k").unwrap());
    }

    #[test]
    fn forget_lets_the_key_run_again() {
        let (s, _) = store(60);
        s.first_time("k").unwrap();
        s.forget("k").unwrap();
        assert_eq!(s.len(), 0);
        assert!(s.first_time("k").unwrap());
    }

    #[test]
    fn threads_race_one_winner() {
        let s = Arc::new(InMemoryIdempotencyStore::new(Duration::from_secs(60)));
        for i in 0..200 {
            let key = format!("race-{i}");
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (s, key) = (s.clone(), key.clone());
                    std::thread::spawn(move || s.first_time(&key).unwrap())
                })
                .collect();
            let wins = handles.into_iter().map(|h| h.join().unwrap()).filter(|w| *w).count();
            assert_eq!(wins, 1, "{key}");
        }
    }
}
