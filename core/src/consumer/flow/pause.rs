//! The operator's pause of a consumer, and how a pause (the operator's or
//! the breaker's) reaches the link: a cancel, or for a queue whose order
//! matters, the channel closed once its handlers have settled. That is its
//! part of `impl Consumer`.

use super::super::Consumer;
use super::super::breaker::Breaker;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Consumer {
    /// Take no deliveries until [`Consumer::resume`]: the subscription is
    /// cancelled on the broker and every delivery it had sent and no handler
    /// has taken goes back to the queue, with no attempt counted (AceMQ's
    /// attempt header is untouched; the broker marks it redelivered, and on
    /// RabbitMQ 4.x a quorum queue counts the return toward its delivery
    /// limit). Deliveries already in handlers finish and settle as usual.
    /// The consumer stays subscribed in every other sense: it is paused, not
    /// down, and a lost channel is recovered paused.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the pause is recorded when first polled; a drop may
    /// leave buffered deliveries held until the next pause or resume.
    pub async fn pause(&self) {
        if !self.flow.operator.swap(true, Ordering::AcqRel) {
            crate::events::subscription("paused", &self.queue, Some(format!("{} paused", self.name())));
        }
        // Pausing cannot fail: only resuming asks the broker for something.
        let _ = self.apply_flow().await;
    }

    /// Take deliveries again after [`Consumer::pause`] (unless its circuit
    /// breaker is open: then when it closes).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Consumer::pause`].
    pub async fn resume(&self) -> crate::Result<()> {
        if self.flow.operator.swap(false, Ordering::AcqRel) {
            crate::events::subscription("resumed", &self.queue, Some(format!("{} resumed", self.name())));
        }
        self.apply_flow().await
    }

    /// Paused by [`Consumer::pause`].
    pub fn is_paused(&self) -> bool {
        self.flow.operator.load(Ordering::Acquire)
    }

    /// Pause or resume the link as the operator and the breaker want.
    pub(super) async fn apply_flow(&self) -> crate::Result<()> {
        let want = self.flow.operator.load(Ordering::Acquire) || self.flow.breaker.as_ref().is_some_and(Breaker::holds);
        let mut applied = self.flow.applied.lock().await;
        if want && !*applied {
            if self.options.keep_order {
                self.pause_in_order().await;
            } else {
                self.link.pause().await;
            }
            *applied = true;
        } else if !want && *applied {
            self.link.resume().await?;
            *applied = false;
        }
        Ok(())
    }

    /// A pause of a single-active-consumer queue whose order matters: a
    /// cancel would make a standby consumer active at once, and it would take
    /// the messages behind the ones given back. So nothing more is handed
    /// out, what handlers hold settles on this channel (closed under them,
    /// their acknowledgements would be lost and the messages run twice), and
    /// then the channel closes: the broker puts back what it held at the
    /// head, in order, before the next consumer takes the queue. The
    /// subscription comes back paused (it takes nothing while a standby is
    /// active, and gives back what it is sent when none is).
    async fn pause_in_order(&self) {
        self.link.hold();
        let until = Instant::now() + self.options.timeout.min(Duration::from_secs(60));
        while Instant::now() < until
            && (!self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
                || self.background.running.load(Ordering::Acquire) > 0)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.link.pause_closing().await;
    }
}
