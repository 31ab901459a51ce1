//! Who settles a delivery whose handler overruns its deadline: the watch, as a retry.
//! Its part of `impl Consumer`: the watch (started, its tick, a delivery
//! expired) and the claim that lets a delivery be settled only once.

use crate::ack::Settlement;
use crate::wire::RawDelivery;
use super::Consumer;
use super::delivery::Settler;
use super::settle::Turnaround;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The error class a delivery settled by its deadline carries
/// (`x-acemq-error-class`).
pub const TIMEOUT_CLASS: &str = "HandlerTimeout";

/// A delivery handed out and not settled yet, as its deadline watch sees it.
#[derive(Debug)]
pub(super) struct Watched {
    pub(super) id: u64,
    /// When it was handed out.
    pub(super) handed_out: Instant,
    /// Its deadline, in milliseconds after `handed_out`: moved on once by
    /// [`Settler::restart_deadline`](super::Settler::restart_deadline) (a
    /// delivery held in place before its handler claimed it).
    pub(super) deadline_ms: AtomicU64,
    /// The consumer's handler deadline.
    timeout: Duration,
    /// Set by whoever settles it first: its handler, the deadline, or the
    /// consumer closing.
    pub(super) settled: AtomicBool,
    /// Set when it is the deadline that settled it: its handler is overdue.
    pub(super) timed_out: AtomicBool,
}

impl Watched {
    pub(super) fn new(id: u64, timeout: Duration) -> Self {
        Watched {
            id,
            handed_out: Instant::now(),
            deadline_ms: AtomicU64::new(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            timeout,
            settled: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
        }
    }

    /// When its deadline passes.
    pub(super) fn deadline(&self) -> Instant {
        let after = Duration::from_millis(self.deadline_ms.load(Ordering::Acquire));
        self.handed_out.checked_add(after).unwrap_or(self.handed_out + Duration::from_secs(86_400 * 365))
    }

    /// Its deadline the consumer's timeout from now.
    pub(super) fn restart(&self) {
        let at = self.handed_out.elapsed().saturating_add(self.timeout);
        self.deadline_ms.store(u64::try_from(at.as_millis()).unwrap_or(u64::MAX), Ordering::Release);
    }
}

/// The deliveries handed out, each with a copy of what the deadline needs
/// to settle it without its handler.
#[derive(Default)]
pub(super) struct Watchlist {
    pub(super) next_id: AtomicU64,
    pub(super) watched: Mutex<WatchedMap>,
    watching: AtomicBool,
    pub(super) closed: AtomicBool,
}

/// Each delivery handed out, by its watch's id.
pub(super) type WatchedMap = HashMap<u64, (Arc<Watched>, Arc<RawDelivery>), Ids>;

/// The watchlist's hasher. Its keys are this process's own sequence
/// numbers, never a peer's, so a hash that resists chosen keys (std's
/// SipHash) buys nothing: one multiplication spreads consecutive ids over
/// the table's buckets (the high bits, which hashbrown's control bytes
/// read, differ from one id to the next). Every delivery is inserted once
/// and removed once, on the handler's thread, so the hash is paid twice a
/// message.
#[derive(Default, Clone, Copy)]
pub(super) struct Ids;

impl std::hash::BuildHasher for Ids {
    type Hasher = IdHash;
    fn build_hasher(&self) -> IdHash {
        IdHash(0)
    }
}

/// See [`Ids`].
pub(super) struct IdHash(u64);

impl std::hash::Hasher for IdHash {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Consumer {
    /// Take the right to settle `settler`'s delivery: false when its
    /// deadline settled it already (or the consumer closed), and then what
    /// its handler produced is discarded.
    pub(super) fn claim(&self, settler: &Settler) -> bool {
        if settler.watch.settled.swap(true, Ordering::AcqRel) {
            self.counters.abandoned.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner()).remove(&settler.watch.id);
        true
    }

    /// Keep the handler deadline ([`ConsumeOptions::timeout`](super::ConsumeOptions::timeout)): a task on
    /// the runtime settles, as a retry, every delivery handed out longer
    /// ago than that. Started by the first delivery a shared consumer hands
    /// out (a [`ConsumerHandle`](super::ConsumerHandle), [`Consumer::next_blocking`]); a pull
    /// consumer used through [`Consumer::next`] starts it by calling this.
    /// It ends when the consumer is closed or dropped.
    pub fn watch_deadlines(self: &Arc<Self>) {
        self.watch_flow();
        if self.watchlist.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let tick = self.deadline_tick();
        crate::runtime::handle().spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(this) = weak.upgrade() else { return };
                if this.watchlist.closed.load(Ordering::Acquire) {
                    return;
                }
                this.expire(Instant::now());
            }
        });
    }

    /// How often the deadline watch looks: a delivery is settled by its
    /// deadline within this much after it passed ([`Settler::is_overdue`]
    /// turns true then), so whoever asks about overdue handlers need not
    /// ask more often.
    pub fn deadline_tick(&self) -> Duration {
        (self.options.timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Settle, as retries, the deliveries whose deadline has passed.
    fn expire(self: &Arc<Self>, now: Instant) {
        let expired: Vec<(Arc<RawDelivery>, Turnaround, u64)> = {
            let mut watched = self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner());
            let due: Vec<u64> = watched.iter().filter(|(_, (w, _))| w.deadline() <= now).map(|(id, _)| *id).collect();
            due.into_iter()
                .filter_map(|id| watched.remove(&id))
                .filter(|(w, _)| !w.settled.swap(true, Ordering::AcqRel))
                .inspect(|(w, _)| w.timed_out.store(true, Ordering::Release))
                .map(|(w, raw)| (raw, self.turnaround(&w, true), w.id))
                .collect()
        };
        for (raw, turnaround, id) in expired {
            self.flow_settled(id, Some(&super::breaker::Failed::Timeout), None);
            self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
            let attempt = crate::wire::envelope_of(&raw.props).attempt;
            let reason = format!(
                "the handler did not finish within its timeout of {}: settled as a retry; what it returns later is discarded",
                crate::checks::human(self.options.timeout)
            );
            let settlement = Settlement::Retry { reason, error_class: Some(TIMEOUT_CLASS.into()) };
            self.in_background(move |this| async move { this.settle_raw(raw, attempt, settlement, turnaround, None).await });
        }
    }
}
