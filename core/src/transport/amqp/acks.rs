//! Acknowledgements coalesced: acceptances settled in order go out as one
//! `multiple` ack per batch (or after a short delay), not a frame each.

use super::supervisor::AmqpConsumer;
use lapin::options::BasicAckOptions;
use lapin::Channel;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The longest an acceptance waits before it is acknowledged on the wire,
/// when fewer than a batch are pending (a slow or idle consumer). Short
/// enough that a crash duplicates little; long enough that a busy consumer
/// sends one `multiple` ack per batch instead of one frame per message, which
/// on a small machine is what the broker, lapin's I/O thread and the handler
/// threads would otherwise spend their CPU on.
pub(super) const MAX_ACK_DELAY: Duration = Duration::from_millis(10);

#[derive(Default)]
pub(super) struct AckInner {
    /// Every tag at or below this is settled.
    pub(super) floor: u64,
    /// Settled tags above the floor.
    pub(super) settled: BTreeSet<u64>,
    /// Settled by acceptance and not yet acknowledged on the wire.
    pub(super) pending: BTreeSet<u64>,
    pub(super) closing: bool,
}

pub(super) struct AckState {
    pub(super) inner: Mutex<AckInner>,
    pub(super) notify: Notify,
    /// Pending acceptances that are flushed at once: half the prefetch, so
    /// the broker always has room to send the next half while this one is
    /// handled (at most `prefetch` unacknowledged means it never stalls:
    /// once every delivery it sent is settled, `pending` is at least this).
    pub(super) batch: usize,
}

impl AckState {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, AckInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What to send now: a `multiple` ack up to the contiguous settled run,
    /// and single acks for settled tags beyond a gap (a slow handler on
    /// another thread must not hold back everyone else's acks).
    pub(super) fn take(&self) -> (Option<u64>, Vec<u64>) {
        let mut g = self.lock();
        while g.settled.first() == Some(&(g.floor + 1)) {
            let next = g.floor + 1;
            g.settled.remove(&next);
            g.floor = next;
        }
        let floor = g.floor;
        let below: Vec<u64> = g.pending.range(..=floor).copied().collect();
        let multiple = below.last().copied();
        for t in &below {
            g.pending.remove(t);
        }
        let singles: Vec<u64> = g.pending.iter().copied().collect();
        g.pending.clear();
        (multiple, singles)
    }
}

pub(super) fn spawn_flusher(ch: Channel, acks: Arc<AckState>) -> tokio::task::JoinHandle<()> {
    crate::runtime::handle().spawn(async move {
        loop {
            let notified = acks.notify.notified();
            let (pending, closing) = {
                let g = acks.lock();
                (g.pending.len(), g.closing)
            };
            if pending == 0 {
                if closing {
                    return;
                }
                notified.await;
                continue;
            }
            if pending < acks.batch && !closing {
                // A partial batch: wait for the rest, at most MAX_ACK_DELAY.
                tokio::pin!(notified);
                let timer = tokio::time::sleep(MAX_ACK_DELAY);
                tokio::select! {
                    _ = &mut notified => continue,
                    _ = timer => {}
                }
            }
            let (multiple, singles) = acks.take();
            if let Some(tag) = multiple {
                let _ = ch.basic_ack(tag, BasicAckOptions { multiple: true }).await;
            }
            for tag in singles {
                let _ = ch.basic_ack(tag, BasicAckOptions { multiple: false }).await;
            }
        }
    })
}

impl AmqpConsumer {
    /// The delivery is done with: acknowledge it (coalesced). A delivery from
    /// a channel that has since been lost is not acknowledged anywhere: the
    /// broker has put it back already.
    pub(crate) fn ack(&self, tag: u64) {
        let Some((g, tag)) = self.live(tag) else { return };
        let pending = {
            let mut a = g.acks.lock();
            a.settled.insert(tag);
            a.pending.insert(tag);
            a.pending.len()
        };
        // Wake the flusher for the first of a batch (it starts the
        // MAX_ACK_DELAY clock) and when the batch is full; not in between.
        if pending == 1 || pending >= g.acks.batch {
            g.acks.notify.notify_one();
        }
    }
}
