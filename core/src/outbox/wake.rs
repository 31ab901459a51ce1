//! The process-local wake-up: an `add` on SQLite tells the relays of its
//! table in this process that a row is on its way, so they sweep now rather
//! than an `interval` later.
//!
//! A counter per table name, bumped after every SQLite insert. A relay reads
//! it before a sweep and, after the sweep, waits for it to move past what it
//! read (or for `interval`): an add made during the sweep is not missed.
//!
//! The row is not committed when the counter moves (the add runs inside the
//! caller's transaction), and that is fine on SQLite: the insert holds the
//! database's write lock until the commit, and the relay's claim is a write
//! that waits on that lock (busy timeout), so the claim runs right after the
//! commit and sees the row. PostgreSQL's equivalent is `NOTIFY`, sent by the
//! insert itself and delivered at commit to every listening process (see
//! `Statements::insert`); a woken claim there would only find nothing, so
//! PostgreSQL adds do not bump the counter: the relay's `LISTEN` does, on
//! every notification, once the row is committed (`AsyncConnectionSource::listen`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

fn tables() -> &'static Mutex<HashMap<String, watch::Sender<u64>>> {
    static TABLES: OnceLock<Mutex<HashMap<String, watch::Sender<u64>>>> = OnceLock::new();
    TABLES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The wake-up of one outbox table in this process: what a relay waits on
/// between sweeps besides its `interval`. Get it from a store's
/// `local_wake()`.
#[derive(Debug, Clone)]
pub struct LocalWake {
    tx: watch::Sender<u64>,
}

impl LocalWake {
    /// The wake-up of `table` (one per table name per process).
    pub(crate) fn of(table: &str) -> Self {
        let mut map = tables().lock().unwrap_or_else(|p| p.into_inner());
        LocalWake { tx: map.entry(table.to_owned()).or_insert_with(|| watch::channel(0).0).clone() }
    }

    /// A row was added in this process, or a PostgreSQL `NOTIFY` said rows
    /// were committed (the relay's `LISTEN`: core's for the Rust relay, the
    /// application's libpq for the Ruby one, through the extension).
    pub fn rows_added(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The counter now: read it before a sweep, wait past it after.
    pub fn seen(&self) -> u64 {
        *self.tx.borrow()
    }

    /// Wait until an add in this process has moved the counter past `seen`,
    /// or `timeout` has passed; whether an add did. Returns at once when one
    /// already has.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads the counter. A dropped wait misses
    /// nothing, since the next one starts from the `seen` the caller holds.
    pub async fn wait_past(&self, seen: u64, timeout: Duration) -> bool {
        let mut rx = self.tx.subscribe();
        if *rx.borrow_and_update() != seen {
            return true;
        }
        // The sender lives in the map for the life of the process, so
        // changed() never fails; the timeout is the fallback poll.
        matches!(tokio::time::timeout(timeout, rx.changed()).await, Ok(Ok(())))
    }

    /// What a relay waits for between two sweeps, written once for the Rust
    /// relay and the Ruby one: this wake-up moving past `seen` (`None` for
    /// a relay that is not woken by it), `stop` turning true (the relay is
    /// closing; a dropped sender counts too), or `interval`, the fallback
    /// poll. Whether the wake-up moved.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`wait_past`](Self::wait_past).
    pub async fn between_sweeps(&self, seen: Option<u64>, interval: Duration, stop: &mut watch::Receiver<bool>) -> bool {
        let woken = async {
            match seen {
                Some(seen) => self.wait_past(seen, interval).await,
                None => {
                    tokio::time::sleep(interval).await;
                    false
                }
            }
        };
        tokio::select! {
            woken = woken => woken,
            () = stopped(stop) => false,
        }
    }
}

/// Until `stop` is true or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_relay_waits_for_the_wake_up_the_stop_or_the_interval() {
        let wake = LocalWake::of("wake_between_sweeps_test");
        let (tx, mut stop) = watch::channel(false);
        let long = Duration::from_secs(30);
        let seen = wake.seen();
        wake.rows_added();
        assert!(wake.between_sweeps(Some(seen), long, &mut stop).await, "moved already: at once");
        let t = std::time::Instant::now();
        assert!(!wake.between_sweeps(None, Duration::from_millis(50), &mut stop).await);
        assert!(t.elapsed() >= Duration::from_millis(50), "not woken by a wake-up it does not watch: the interval");
        tx.send_replace(true);
        let t = std::time::Instant::now();
        assert!(!wake.between_sweeps(Some(wake.seen()), long, &mut stop).await);
        assert!(!wake.between_sweeps(None, long, &mut stop).await, "a stop stays seen");
        assert!(t.elapsed() < Duration::from_secs(5), "stopped at once");
        drop(tx);
        let (_, mut gone) = { let (tx, rx) = watch::channel(false); drop(tx); (0, rx) };
        assert!(!wake.between_sweeps(None, long, &mut gone).await, "a dropped sender stops it too");
    }
}
