//! How a handler's outcome becomes a settlement: accept, or a copy in the background, counted and reported.
//! Its part of `impl Consumer`: settling (`settle`, `settle_later`,
//! `accept`), and the background tasks and the errors they keep.

use crate::ack::{Guarded, Outcome, Settlement, Verdict};
use crate::backtrace::Backtrace;
use crate::error::{Error, Result};
use crate::events::{self, Event, ProcessOutcome};
use crate::wire::RawDelivery;
use super::Consumer;
use super::deadline::Watched;
use super::delivery::{not_ours, Settler};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a delivery was out before its settlement was decided, and
/// whether its deadline decided it, or the idempotency guard (its verdict
/// came with the outcome: `Guarded`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Turnaround {
    out: Duration,
    deadline: bool,
    verdict: Option<Verdict>,
}

/// What the `process` event needs of a delivery, taken before the
/// settlement consumes it (only when somebody listens).
struct ProcessFacts {
    message_id: String,
    routing_key: String,
    attempt: u32,
    reason: Option<String>,
    error_class: Option<String>,
}

impl ProcessFacts {
    fn of(raw: &RawDelivery, attempt: u32, settlement: &Settlement) -> ProcessFacts {
        let (reason, error_class) = match settlement {
            Settlement::Accept => (None, None),
            Settlement::Retry { reason, error_class } | Settlement::Reject { reason, error_class } => {
                (Some(reason.clone()), error_class.clone())
            }
            Settlement::Wait { reason, .. } => (Some(reason.clone()), None),
        };
        ProcessFacts {
            message_id: crate::wire::envelope_of(&raw.props).id,
            routing_key: raw.routing_key.clone(),
            attempt,
            reason,
            error_class,
        }
    }
}

/// The delivery's process span with what its settlement is recorded on it.
fn settled_span(span: &tracing::Span, settlement: &Settlement) -> tracing::Span {
    span.record("acemq.outcome", match settlement {
        Settlement::Accept => "accepted",
        Settlement::Retry { .. } => "retried",
        Settlement::Reject { .. } => "dead_lettered",
        Settlement::Wait { .. } => "waiting",
    });
    span.clone()
}

/// A backtrace is a failure's: beside an outcome that is not
/// [`Outcome::Raised`] it is dropped, so a retry asked for with an `Ack`
/// never carries one.
fn raised_backtrace(outcome: &Outcome, backtrace: Option<Backtrace>) -> Option<Backtrace> {
    backtrace.filter(|_| matches!(outcome, Outcome::Raised { .. }))
}

/// Settlements running on the runtime (see [`Consumer::settle_later`]):
/// how many, and the errors they met, for the caller to collect.
#[derive(Default)]
pub(super) struct Background {
    pub(super) running: std::sync::atomic::AtomicUsize,
    pub(super) idle: tokio::sync::Notify,
    pub(super) has_errors: AtomicBool,
    pub(super) errors: std::sync::Mutex<Vec<Error>>,
}

impl Consumer {
    /// Settle a delivery with what its handler produced: accept acknowledges;
    /// retry copies to the next rung (or the DLQ past `max_attempts`); reject
    /// copies to the DLQ. A copy is confirmed by the broker before the
    /// original is acknowledged, so a crash in between duplicates and never
    /// loses. If the copy cannot be made the original goes back to the queue
    /// and the error is returned.
    ///
    /// A delivery its deadline has settled already (see
    /// [`ConsumeOptions::timeout`](super::ConsumeOptions::timeout)) is not settled again: the outcome is
    /// discarded and counted as `abandoned`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the delivery is claimed when this is first polled,
    /// so a dropped settle leaves it unsettled (and uncounted) until the
    /// subscription closes, when the broker redelivers it. A copy already
    /// confirmed is not taken back: that is a duplicate, never a loss. Use
    /// [`Consumer::settle_later`] to settle without awaiting.
    pub async fn settle(&self, delivery: impl Into<Settler>, outcome: Outcome) -> Result<()> {
        self.settle_guarded(delivery, outcome.into()).await
    }

    /// [`Consumer::settle`] with the idempotency guard's verdict beside the
    /// outcome ([`Before::guarded_without_running`](crate::idempotency::Before::guarded_without_running)):
    /// the same settlement, reported as `duplicate` or `in_progress`.
    ///
    /// # Cancel safety
    ///
    /// As [`Consumer::settle`].
    pub async fn settle_guarded(&self, delivery: impl Into<Settler>, guarded: Guarded) -> Result<()> {
        let Guarded { outcome, verdict, counts, backtrace } = guarded;
        let backtrace = raised_backtrace(&outcome, backtrace);
        let settler = delivery.into();
        if !self.owns(&settler) {
            return Err(not_ours(&settler));
        }
        if !self.claim(&settler) {
            return Ok(());
        }
        let attempt = settler.attempt;
        let settlement = self.flow_settle_outcome(settler.watch.id, outcome, counts);
        let span = settled_span(&settler.span, &settlement);
        let turnaround = Turnaround { verdict, ..self.turnaround(&settler.watch, false) };
        tracing::Instrument::instrument(self.settle_raw(settler.raw, attempt, settlement, turnaround, backtrace), span).await
    }

    /// The settlement's rules, for a delivery already claimed by whoever
    /// settles it (its handler, or its deadline).
    /// `backtrace` goes on a retry's or reject's copy (`x-acemq-backtrace`),
    /// replacing the one a previous failure left there.
    pub(super) async fn settle_raw(
        &self,
        raw: Arc<RawDelivery>,
        attempt: u32,
        settlement: Settlement,
        turnaround: Turnaround,
        backtrace: Option<Backtrace>,
    ) -> Result<()> {
        let facts = crate::events::enabled().then(|| ProcessFacts::of(&raw, attempt, &settlement));
        // A request whose handler failed is answered (or dropped, past its
        // deadline) rather than copied: requests.rs.
        let fate = self.request_fate(&raw, attempt, &settlement, turnaround.verdict);
        let settled = match settlement {
            settlement if fate.is_some() => {
                let fate = fate.expect("checked in the guard");
                self.end_request(Arc::unwrap_or_clone(raw), fate, settlement, backtrace.as_ref()).await
            }
            Settlement::Accept => {
                self.link.ack(raw.tag);
                self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                Ok(ProcessOutcome::Accepted)
            }
            // A copy is made of it: the watch has let go of its share by
            // now (claimed), so this takes the delivery without copying.
            Settlement::Retry { reason, error_class } => {
                self.retry_or_exhaust(Arc::unwrap_or_clone(raw), attempt, &reason, error_class.as_deref(), backtrace.as_ref()).await
            }
            Settlement::Reject { reason, error_class } => self
                .dead_letter(Arc::unwrap_or_clone(raw), &reason, error_class.as_deref(), backtrace.as_ref())
                .await
                .map(|()| ProcessOutcome::DeadLettered),
            Settlement::Wait { reason, up_to } => self.wait(Arc::unwrap_or_clone(raw), attempt, &reason, up_to).await,
        };
        if let Some(facts) = facts {
            self.processed(facts, turnaround, settled.as_ref().ok().copied());
        }
        settled.map(|_| ())
    }

    /// How long the delivery behind `watch` has been out, and whether its
    /// deadline is what settles it.
    pub(super) fn turnaround(&self, watch: &Watched, deadline: bool) -> Turnaround {
        let out = watch.handed_out.elapsed();
        Turnaround { out, deadline, verdict: None }
    }

    /// The `process` event for a settlement (`settled` None: it failed).
    #[cold]
    fn processed(&self, facts: ProcessFacts, turnaround: Turnaround, settled: Option<ProcessOutcome>) {
        let outcome = match (settled, turnaround.verdict) {
            (None, _) => ProcessOutcome::Failed,
            (Some(ProcessOutcome::Retried), _) if turnaround.deadline => ProcessOutcome::TimedOut,
            (Some(ProcessOutcome::Accepted), Some(Verdict::Duplicate)) => ProcessOutcome::Duplicate,
            (Some(ProcessOutcome::Retried), Some(Verdict::InProgress)) => ProcessOutcome::InProgress,
            (Some(o), _) => o,
        };
        crate::events::emit(|| Event::Process(events::Process {
            consumer: self.options.name.clone().unwrap_or_else(|| self.queue.clone()),
            queue: self.queue.clone(),
            routing_key: facts.routing_key,
            message_id: facts.message_id,
            attempt: facts.attempt,
            duration: turnaround.out,
            outcome,
            reason: facts.reason,
            error_class: facts.error_class,
        }));
    }

    /// Settle without waiting: an accept is queued at once, a retry or reject
    /// (a copy to publish and have confirmed before the original is
    /// acknowledged) runs on the runtime while the caller goes on to the next
    /// delivery. That is what keeps a handler thread that retries from running
    /// at one broker round trip per message: the copies of many deliveries
    /// are in flight together, bounded by the prefetch. What goes wrong is
    /// collected for [`Consumer::take_errors`]; the rule is unchanged (a copy
    /// that cannot be made puts the original back on the queue).
    /// [`Consumer::close`] waits for them.
    ///
    /// A settler of another consumer's delivery settles nothing here: its
    /// error is collected as the others are.
    pub fn settle_later(self: &Arc<Self>, delivery: impl Into<Settler>, outcome: Outcome) {
        self.settle_later_guarded(delivery, outcome.into());
    }

    /// [`Consumer::settle_later`] with the idempotency guard's verdict
    /// beside the outcome (see [`Consumer::settle_guarded`]).
    pub fn settle_later_guarded(self: &Arc<Self>, delivery: impl Into<Settler>, guarded: Guarded) {
        let Guarded { outcome, verdict, counts, backtrace } = guarded;
        let backtrace = raised_backtrace(&outcome, backtrace);
        let settler = delivery.into();
        if matches!(outcome, Outcome::Ack(crate::ack::Ack::Accept)) {
            self.accept_as(settler, verdict);
            return;
        }
        if !self.owns(&settler) {
            self.keep_error(not_ours(&settler));
            return;
        }
        if !self.claim(&settler) {
            return;
        }
        let attempt = settler.attempt;
        let settlement = self.flow_settle_outcome(settler.watch.id, outcome, counts);
        let span = settled_span(&settler.span, &settlement);
        let turnaround = Turnaround { verdict, ..self.turnaround(&settler.watch, false) };
        self.in_background(move |this| {
            tracing::Instrument::instrument(async move { this.settle_raw(settler.raw, attempt, settlement, turnaround, backtrace).await }, span)
        });
    }

    /// Run a settlement on the runtime, counted (close waits for it) and
    /// with its error kept for take_errors.
    pub(super) fn in_background<F, Fut>(self: &Arc<Self>, work: F)
    where
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.background.running.fetch_add(1, Ordering::AcqRel);
        let this = self.clone();
        crate::runtime::handle().spawn(async move {
            if let Err(e) = work(this.clone()).await {
                this.keep_error(e);
            }
            if this.background.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                this.background.idle.notify_waiters();
            }
        });
    }

    /// Keep `e` for [`Consumer::take_errors`].
    fn keep_error(&self, e: Error) {
        self.background.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        self.background.has_errors.store(true, Ordering::Release);
    }

    /// Errors met by [`Consumer::settle_later`] since the last call. Each
    /// one's message went back to its queue.
    pub fn take_errors(&self) -> Vec<Error> {
        if !self.background.has_errors.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.background.errors.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(super) async fn background_idle(&self) {
        loop {
            let idle = self.background.idle.notified();
            if self.background.running.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Accept without waiting for anything: the acknowledgement is queued and
    /// coalesced with its neighbours. The same as settling with
    /// `Outcome::Ack(Ack::Accept)`, callable from outside the runtime.
    ///
    /// A settler of another consumer's delivery accepts nothing here: its
    /// error is collected for [`Consumer::take_errors`].
    pub fn accept(&self, delivery: impl Into<Settler>) {
        self.accept_as(delivery.into(), None);
    }

    /// `accept`, reported as the guard's verdict says (a duplicate).
    fn accept_as(&self, settler: Settler, verdict: Option<Verdict>) {
        if !self.owns(&settler) {
            self.keep_error(not_ours(&settler));
            return;
        }
        if !self.claim(&settler) {
            return;
        }
        settler.span.record("acemq.outcome", "accepted");
        self.flow_settled(settler.watch.id, None, None);
        self.link.ack(settler.raw.tag);
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        if crate::events::enabled() {
            let facts = ProcessFacts::of(&settler.raw, settler.attempt, &Settlement::Accept);
            self.processed(facts, Turnaround { verdict, ..self.turnaround(&settler.watch, false) }, Some(ProcessOutcome::Accepted));
        }
    }
}
