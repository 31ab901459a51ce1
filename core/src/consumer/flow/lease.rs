//! A throttle's lease of tokens from a store shared across processes
//! ([`crate::throttle`]).

use crate::throttle::Throttle;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A throttle's leases from a store shared across processes
/// ([`crate::throttle`]): the tokens this process may still hand out in the
/// current window.
pub(crate) struct Shared {
    store: Arc<dyn crate::throttle::ThrottleStore>,
    name: String,
    throttle: Throttle,
    queue: String,
    /// (tokens left, until epoch ms, spent: the store granted none).
    lease: Mutex<(u32, i64, bool)>,
    /// One lease asked for at a time, per consumer.
    asking: Mutex<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("name", &self.name).field("lease", &self.lease).finish()
    }
}

impl Shared {
    pub(super) fn new(store: Arc<dyn crate::throttle::ThrottleStore>, name: String, throttle: Throttle, queue: &str) -> Shared {
        Shared { store, name, throttle, queue: queue.to_owned(), lease: Mutex::new((0, 0, false)), asking: Mutex::new(()) }
    }

    /// Take a token of the lease, asking the store for the next lease when
    /// this one is used up or has lapsed; or say how long to wait: until the
    /// window ends when the store granted none, [`STORE_RETRY`] when it
    /// failed (the failure is a `throttle_store_failed` event).
    ///
    /// [`STORE_RETRY`]: crate::throttle::STORE_RETRY
    pub(crate) fn take(&self) -> Result<(), Duration> {
        let now = crate::throttle::now_ms();
        let wait = |until: i64| Duration::from_millis(u64::try_from(until - now).unwrap_or(0).max(1));
        {
            let mut l = self.lease.lock().unwrap_or_else(|p| p.into_inner());
            if now < l.1 {
                if l.0 > 0 {
                    l.0 -= 1;
                    return Ok(());
                }
                if l.2 {
                    return Err(wait(l.1));
                }
            }
        }
        let Ok(_asking) = self.asking.try_lock() else { return Err(Duration::from_millis(2)) };
        match self.store.lease(&self.name, self.throttle, crate::throttle::lease_size(self.throttle.limit)) {
            Ok(lease) => {
                let mut l = self.lease.lock().unwrap_or_else(|p| p.into_inner());
                *l = (lease.tokens, lease.until_ms, lease.tokens == 0);
                if l.0 > 0 {
                    l.0 -= 1;
                    Ok(())
                } else {
                    Err(wait(lease.until_ms))
                }
            }
            Err(e) => {
                // Every handler thread waits out the retry, not only this one.
                let retry = i64::try_from(crate::throttle::STORE_RETRY.as_millis()).unwrap_or(i64::MAX);
                *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = (0, now.saturating_add(retry), true);
                crate::events::subscription(
                    "throttle_store_failed",
                    &self.queue,
                    Some(format!("{}: {e}; handing nothing out, asking again in {}s", self.name, crate::throttle::STORE_RETRY.as_secs())),
                );
                Err(crate::throttle::STORE_RETRY)
            }
        }
    }

    /// Give a token back to the lease (a delivery that did not come).
    pub(super) fn refund(&self) {
        let mut l = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if crate::throttle::now_ms() < l.1 {
            l.0 += 1;
        }
    }
}
