//! The consumer's side of its circuit breaker (the state machine is
//! consumer/breaker.rs): what each settlement tells it, whether a delivery
//! may be handed out, and the task that applies its transitions: its part of
//! `impl Consumer`.

use super::super::Consumer;
use super::super::breaker::{Breaker, BreakerState, Failed, Reading, Transition};
use crate::ack::{Outcome, Settlement};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Consumer {
    /// Its circuit breaker's state, when it has one.
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.flow.breaker.as_ref().map(Breaker::state)
    }

    /// The breaker's transition: an event (and so a metric), and the task
    /// that applies it woken.
    fn breaker_moved(&self, t: Transition) {
        crate::events::subscription(
            match t.to {
                BreakerState::Open => "circuit_open",
                BreakerState::HalfOpen => "circuit_half_open",
                BreakerState::Trying => "circuit_trial",
                BreakerState::Closed => "circuit_closed",
            },
            &self.queue,
            Some(format!("{}: {}", self.name(), t.reason)),
        );
        self.flow.wake.notify_one();
    }

    /// A delivery settled: what the breaker counts. `failed`: its failure,
    /// None when it was not one (an accept, a reject; see [`Failed::of`]);
    /// `told`: whether it counts, when the handler's side decided that
    /// (see [`CircuitBreaker::counts`](crate::consumer::CircuitBreaker::counts)).
    /// True when it was the breaker's trial and failed in a way that counts.
    pub(in crate::consumer) fn flow_settled(&self, id: u64, failed: Option<&Failed<'_>>, told: Option<bool>) -> bool {
        let Some(b) = self.flow.breaker.as_ref() else { return false };
        self.flow_read(id, b.reading(failed, told))
    }

    fn flow_read(&self, id: u64, reading: Reading) -> bool {
        let Some(b) = self.flow.breaker.as_ref() else { return false };
        let Some(t) = b.settled(id, reading, Instant::now()) else { return false };
        let trial_failed = t.trial_failed;
        self.breaker_moved(t);
        trial_failed
    }

    /// [`Consumer::flow_settled`] for a handler's outcome, and the
    /// settlement it comes to: a failed trial's retry becomes a wait, the
    /// ladder without an attempt spent (the downstream is down, the message
    /// is not at fault), for as long as the outage lasts.
    pub(in crate::consumer) fn flow_settle_outcome(&self, id: u64, outcome: Outcome, told: Option<bool>) -> Settlement {
        let trial_failed = match &outcome {
            // Not now (a database away, a claim held), or a handler that
            // returned something else than an Ack: nothing about the
            // downstream either way (a trial's says the next message tries).
            Outcome::Wait { .. } | Outcome::NotAnAck { .. } => self.flow_read(id, Reading::Other),
            _ => self.flow_settled(id, Failed::of(&outcome).as_ref(), told),
        };
        match outcome.settlement() {
            Settlement::Retry { reason, .. } if trial_failed => Settlement::Wait {
                reason: format!("{reason} (the circuit breaker's trial: the downstream is still down, so no attempt is spent)"),
                up_to: Duration::MAX,
            },
            settlement => settlement,
        }
    }

    /// Whether delivery `id` may be handed out: not while the breaker is
    /// open or its trial is out (the caller gives it back, unspent).
    pub(in crate::consumer) fn flow_admits(&self, id: u64) -> bool {
        let Some(b) = &self.flow.breaker else { return true };
        let (admitted, moved) = b.admit(id);
        if let Some(t) = moved {
            self.breaker_moved(t);
        }
        admitted
    }

    /// The task that applies the breaker's decisions (pause when it opens
    /// or a trial is out, resume when it is half-open or closed) and ends its
    /// pauses. Started with the deadline watch; ends with the consumer.
    pub(in crate::consumer) fn watch_flow(self: &Arc<Self>) {
        if self.flow.breaker.is_none() || self.flow.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let wake = self.flow.wake.clone();
        crate::runtime::handle().spawn(async move {
            loop {
                let until = {
                    let Some(this) = weak.upgrade() else { return };
                    this.flow.breaker.as_ref().and_then(Breaker::open_until)
                };
                // notify_one keeps a permit when nobody waits: a transition
                // between the look above and this wait is not missed.
                let until = until.map_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1), tokio::time::Instant::from_std);
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep_until(until) => {}
                }
                let Some(this) = weak.upgrade() else { return };
                if this.watchlist.closed.load(Ordering::Acquire) || this.stopped.load(Ordering::Acquire) {
                    return;
                }
                if let Some(t) = this.flow.breaker.as_ref().and_then(|b| b.tick(Instant::now())) {
                    this.breaker_moved(t);
                }
                if let Err(e) = this.apply_flow().await {
                    this.background.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                    this.background.has_errors.store(true, Ordering::Release);
                    // Tried again on the next turn.
                    drop(this);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
    }
}
