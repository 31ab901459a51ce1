//! Acknowledgements coalesced: acceptances settled in order go out as one
//! `multiple` ack per batch (or after a short delay), not a frame each.
//!
//! The thread that settles the delivery which fills a batch, or finds the
//! oldest pending acceptance MAX_ACK_DELAY old, puts the ack on the wire
//! itself; a task on the runtime only keeps the clock for a batch that does
//! not fill while nothing else is settled. A flusher task that sent every batch cost two or
//! three wake-ups of a runtime thread per batch (the first acceptance, the
//! full batch, lapin's answer), each a context switch on a machine whose
//! cores the broker needs (bench/README.md has the figures).

use super::supervisor::AmqpConsumer;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::Channel;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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
    /// Settled by acceptance and not yet acknowledged on the wire, below
    /// or at the floor when accepted: the highest of them (0: none). In
    /// order, the common case, every acceptance lands here, and one
    /// `multiple` ack up to it covers them all, with no set to insert each
    /// tag into and pop it from again.
    pub(super) run: u64,
    /// Settled by acceptance beyond a gap, not yet acknowledged.
    pub(super) pending: BTreeSet<u64>,
    /// How many acceptances wait: those up to `run` and those in `pending`.
    count: usize,
    pub(super) closing: bool,
    /// The flusher's clock is running: whatever is pending when it runs out
    /// goes on the wire then, so an acceptance need not wake it.
    armed: bool,
    /// When the oldest acceptance still pending was made (None: nothing
    /// pending). The clock runs from here, not from the moment the flusher
    /// task gets to run, which on a busy machine is later and would stretch
    /// what a lost connection repeats past [`MAX_ACK_DELAY`].
    oldest: Option<Instant>,
}

impl AckInner {
    /// `tag` is settled (accepted, or put back on the queue): the floor
    /// moves past it and past whatever it was holding back. In order, the
    /// common case, that is the floor alone; a tag beyond a gap waits in
    /// `settled` until the gap is settled.
    fn settle(&mut self, tag: u64) {
        if tag != self.floor + 1 {
            self.settled.insert(tag);
            return;
        }
        self.floor = tag;
        while self.settled.first() == Some(&(self.floor + 1)) {
            self.settled.pop_first();
            self.floor += 1;
        }
    }

    /// `tag` is settled by acceptance, to be acknowledged.
    fn accepted(&mut self, tag: u64) {
        self.settle(tag);
        if tag <= self.floor {
            self.run = self.run.max(tag);
        } else {
            self.pending.insert(tag);
        }
        self.count += 1;
    }

    /// What goes on the wire now: the `multiple` ack (the highest pending
    /// tag at or below the floor) and single acks for those beyond a gap.
    /// Nothing is pending afterwards.
    fn take_due(&mut self) -> (Option<u64>, BTreeSet<u64>) {
        self.oldest = None;
        self.count = 0;
        let mut multiple = std::mem::take(&mut self.run);
        while let Some(&t) = self.pending.first() {
            if t > self.floor {
                break;
            }
            self.pending.pop_first();
            multiple = multiple.max(t);
        }
        ((multiple > 0).then_some(multiple), std::mem::take(&mut self.pending))
    }
}

pub(super) struct AckState {
    pub(super) inner: Mutex<AckInner>,
    pub(super) notify: Notify,
    channel: Channel,
    /// Pending acceptances that are flushed at once: half the prefetch, so
    /// the broker always has room to send the next half while this one is
    /// handled (at most `prefetch` unacknowledged means it never stalls:
    /// once every delivery it sent is settled, `pending` is at least this).
    batch: usize,
}

/// Put a lapin frame on the wire without waiting for it: lapin queues the
/// frame and wakes its I/O thread in the first poll, and what is left to
/// await is only its report that the frame was written (errors included,
/// which nobody acts on for an ack: a lost channel's deliveries go back to
/// the queue whatever is sent). One poll, on whichever thread settles.
fn send_now<F: Future>(frame: F) {
    let mut frame = std::pin::pin!(frame);
    let _ = frame.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
}

impl AckState {
    pub(super) fn new(channel: Channel, prefetch: u16) -> AckState {
        AckState {
            inner: Mutex::new(AckInner::default()),
            notify: Notify::new(),
            channel,
            batch: (usize::from(prefetch.max(1)) / 2).max(1),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, AckInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send what is pending: a `multiple` ack up to the contiguous settled
    /// run, and single acks for settled tags beyond a gap (a slow handler
    /// on another thread must not hold back everyone else's acks).
    ///
    /// Called with the lock held, and the frames are queued before it is
    /// released: two threads flushing at once must not reorder their
    /// frames, since a `multiple` ack below one already sent names a tag
    /// the broker no longer knows, and it closes the channel for that.
    fn flush(&self, g: &mut AckInner) {
        let (multiple, singles) = g.take_due();
        if let Some(tag) = multiple {
            send_now(self.channel.basic_ack(tag, BasicAckOptions { multiple: true }));
        }
        for tag in singles {
            send_now(self.channel.basic_ack(tag, BasicAckOptions { multiple: false }));
        }
    }

    /// Settle `tag` by acceptance: on the wire now when it fills a batch
    /// or the oldest pending one is [`MAX_ACK_DELAY`] old, else within
    /// that. The acceptances look at the clock themselves: while handlers
    /// keep settling, the delay holds even when the flusher task is late
    /// (a runtime starved of CPU).
    pub(super) fn accept(&self, tag: u64) {
        let mut g = self.lock();
        if g.closing {
            return;
        }
        g.accepted(tag);
        let now = Instant::now();
        let oldest = *g.oldest.get_or_insert(now);
        if g.count >= self.batch || now.duration_since(oldest) >= MAX_ACK_DELAY {
            self.flush(&mut g);
        } else if !g.armed {
            // The first of a batch starts the clock; the rest find it running.
            g.armed = true;
            drop(g);
            self.notify.notify_one();
        }
    }

    /// Put `tag` back on the queue. Queued under the lock, as acks are: a
    /// `multiple` ack covering it must not reach the broker before it.
    pub(super) fn requeue(&self, tag: u64) {
        let mut g = self.lock();
        g.settle(tag);
        send_now(self.channel.basic_nack(tag, BasicNackOptions { multiple: false, requeue: true }));
    }

    /// The channel is gone: nothing it delivered can be acknowledged any
    /// more, and the flusher stops.
    pub(super) fn retire(&self) {
        let mut g = self.lock();
        g.closing = true;
        g.pending.clear();
        g.run = 0;
        g.count = 0;
        drop(g);
        self.notify.notify_one();
    }

    /// Send what is pending and stop the flusher (the subscription closes).
    pub(super) fn finish(&self) {
        let mut g = self.lock();
        if !g.closing {
            self.flush(&mut g);
            g.closing = true;
        }
        drop(g);
        self.notify.notify_one();
    }
}

/// The clock for a batch that does not fill: started by the first pending
/// acceptance, it sends whatever is pending when [`MAX_ACK_DELAY`] is up.
/// Closing stops it at once, clock running or not: the subscription's close
/// waits for it.
pub(super) fn spawn_flusher(acks: Arc<AckState>) -> tokio::task::JoinHandle<()> {
    crate::runtime::handle().spawn(async move {
        loop {
            let notified = acks.notify.notified();
            let (armed, closing, oldest) = {
                let g = acks.lock();
                (g.armed, g.closing, g.oldest)
            };
            if closing {
                return;
            }
            if !armed {
                notified.await;
                continue;
            }
            let until = tokio::time::Instant::from_std(oldest.unwrap_or_else(Instant::now) + MAX_ACK_DELAY);
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                // Closing, or the wake-up that started the clock: look again.
                () = notified => continue,
            }
            let mut g = acks.lock();
            if g.closing {
                return;
            }
            // An acceptance flushed what was due meanwhile and the clock
            // runs for younger ones: wait for theirs.
            if g.oldest.is_some_and(|t| t.elapsed() < MAX_ACK_DELAY) {
                continue;
            }
            // Disarmed under the same lock the acceptances look at it
            // under: one arriving after this starts the clock again.
            g.armed = false;
            acks.flush(&mut g);
        }
    })
}

impl AmqpConsumer {
    /// The delivery is done with: acknowledge it (coalesced). A delivery from
    /// a channel that has since been lost is not acknowledged anywhere: the
    /// broker has put it back already.
    pub(crate) fn ack(&self, tag: u64) {
        if let Some((g, tag)) = self.live(tag) {
            g.acks.accept(tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AckInner;

    #[test]
    fn the_floor_moves_past_every_tag_settled_in_order_and_waits_at_a_gap() {
        let mut g = AckInner::default();
        g.settle(1);
        g.settle(2);
        assert_eq!((g.floor, g.settled.len()), (2, 0));
        g.settle(4);
        assert_eq!((g.floor, g.settled.iter().copied().collect::<Vec<_>>()), (2, vec![4]));
        // Settling the gap moves the floor past what it held back.
        g.settle(3);
        assert_eq!((g.floor, g.settled.len()), (4, 0));
    }

    #[test]
    fn acceptances_in_order_go_out_as_one_multiple_ack() {
        let mut g = AckInner::default();
        for tag in 1..=50 {
            g.accepted(tag);
        }
        assert_eq!(g.count, 50);
        assert!(g.pending.is_empty(), "in order, nothing is kept tag by tag");
        assert_eq!(g.take_due(), (Some(50), Default::default()));
        assert_eq!((g.count, g.run), (0, 0));
        assert_eq!(g.take_due(), (None, Default::default()), "nothing twice");
    }

    #[test]
    fn an_acceptance_beyond_a_gap_is_acknowledged_alone_until_the_gap_is_settled() {
        let mut g = AckInner::default();
        g.accepted(1);
        g.accepted(3); // 2 is still with its handler
        assert_eq!(g.take_due(), (Some(1), [3].into()), "3 alone: a multiple ack would take 2 with it");
        // 2 is put back on the queue (settled, not accepted): the floor
        // moves past 3, already acknowledged, and nothing is due.
        g.settle(2);
        assert_eq!(g.floor, 3);
        assert_eq!(g.take_due(), (None, Default::default()));
        // A tag held back by a gap that is then accepted, before a flush:
        // one multiple ack covers both once the floor reaches them.
        g.accepted(5);
        g.accepted(4);
        assert_eq!(g.count, 2);
        assert_eq!(g.take_due(), (Some(5), Default::default()));
    }

    #[test]
    fn a_requeued_tag_below_the_run_is_covered_by_nothing_new() {
        // 1 accepted, 2 requeued (nack sent at once), 3 accepted: the
        // multiple ack names 3, and 2, already nacked, is no longer the
        // broker's to acknowledge.
        let mut g = AckInner::default();
        g.accepted(1);
        g.settle(2);
        g.accepted(3);
        assert_eq!(g.take_due(), (Some(3), Default::default()));
    }
}
