//! Flow: what decides whether a consumer takes deliveries now. An operator's
//! pause, a circuit breaker that pauses a consumer whose handlers keep
//! failing, and a throttle (messages per period). The consumer applies the
//! decision (consumer.rs): a paused consumer cancels its subscription on the
//! broker and gives back what it had buffered, unspent.

use super::breaker::{Breaker, BreakerState, Failed, Reading, Transition};
use crate::ack::{Outcome, Settlement};
use super::Consumer;
use crate::throttle::Throttle;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A throttle's bucket.
#[derive(Debug)]
pub(crate) struct Bucket {
    throttle: Throttle,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub(crate) fn new(throttle: Throttle) -> Self {
        Bucket { throttle, state: Mutex::new((f64::from(throttle.limit), Instant::now())) }
    }

    /// Take a token, or say how long until one is there.
    pub(crate) fn take(&self, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(self.throttle.limit) / self.throttle.per.as_secs_f64();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = *st;
        let tokens = (tokens + now.saturating_duration_since(at).as_secs_f64() * rate).min(f64::from(self.throttle.limit));
        if tokens >= 1.0 {
            *st = (tokens - 1.0, now);
            Ok(())
        } else {
            *st = (tokens, now);
            Err(Duration::from_secs_f64((1.0 - tokens) / rate))
        }
    }

    /// Give a token back (it was taken for a delivery that did not come).
    pub(crate) fn refund(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.0 = (st.0 + 1.0).min(f64::from(self.throttle.limit));
    }
}

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
    fn refund(&self) {
        let mut l = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if crate::throttle::now_ms() < l.1 {
            l.0 += 1;
        }
    }
}

/// A consumer's flow state: what pauses it and what paces it.
#[derive(Debug, Default)]
pub(super) struct Flow {
    /// Paused by an operator ([`Consumer::pause`]).
    operator: AtomicBool,
    /// Whether the link is paused now; the lock orders the changes.
    applied: tokio::sync::Mutex<bool>,
    breaker: Option<Breaker>,
    bucket: Option<Bucket>,
    shared: Option<Arc<Shared>>,
    watching: AtomicBool,
    wake: Arc<Notify>,
}

impl Flow {
    pub(super) fn new(queue: &str, options: &super::ConsumeOptions) -> crate::Result<Flow> {
        if let Some(b) = &options.circuit_breaker {
            b.validate()?;
        }
        if let Some(t) = &options.throttle {
            t.validate()?;
        }
        Ok(Flow {
            breaker: options.circuit_breaker.clone().map(Breaker::new),
            bucket: options.throttle.map(Bucket::new),
            shared: match (&options.throttle, &options.throttle_store) {
                (Some(t), Some(store)) => Some(Arc::new(Shared {
                    store: store.0.clone(),
                    name: options.name.clone().unwrap_or_else(|| queue.to_owned()),
                    throttle: *t,
                    queue: queue.to_owned(),
                    lease: Mutex::new((0, 0, false)),
                    asking: Mutex::new(()),
                })),
                (None, Some(_)) => {
                    return Err(crate::Error::invalid("a throttle store needs a throttle: give the limit and period it shares"))
                }
                _ => None,
            },
            ..Flow::default()
        })
    }
}

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

    /// Its circuit breaker's state, when it has one.
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.flow.breaker.as_ref().map(Breaker::state)
    }

    fn name(&self) -> String {
        self.options.name.clone().unwrap_or_else(|| self.queue.clone())
    }

    /// Pause or resume the link as the operator and the breaker want.
    async fn apply_flow(&self) -> crate::Result<()> {
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
    /// (see [`CircuitBreaker::counts`](super::CircuitBreaker::counts)).
    /// True when it was the breaker's trial and failed in a way that counts.
    pub(super) fn flow_settled(&self, id: u64, failed: Option<&Failed<'_>>, told: Option<bool>) -> bool {
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
    pub(super) fn flow_settle_outcome(&self, id: u64, outcome: Outcome, told: Option<bool>) -> Settlement {
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
    pub(super) fn flow_admits(&self, id: u64) -> bool {
        let Some(b) = &self.flow.breaker else { return true };
        let (admitted, moved) = b.admit(id);
        if let Some(t) = moved {
            self.breaker_moved(t);
        }
        admitted
    }

    /// Wait, on a thread outside the runtime, for the throttle's next token,
    /// at most `timeout`: false when none came.
    pub(super) fn flow_token_blocking(&self, timeout: Duration) -> bool {
        let Some(bucket) = &self.flow.bucket else { return true };
        let until = Instant::now() + timeout;
        loop {
            match bucket.take(Instant::now()).and_then(|()| self.take_shared(bucket)) {
                Ok(()) => return true,
                Err(wait) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    std::thread::sleep(wait.min(left));
                }
            }
        }
    }

    /// The throttle's next token, awaited.
    pub(super) async fn flow_token(&self) {
        let Some(bucket) = &self.flow.bucket else { return };
        loop {
            let wait = match bucket.take(Instant::now()) {
                Err(wait) => wait,
                Ok(()) => match self.flow.shared.clone() {
                    None => return,
                    // The store's round trip off the runtime's workers.
                    Some(shared) => match crate::sql::blocking::off_runtime(move || Ok(shared.take())).await {
                        Ok(Ok(())) => return,
                        Ok(Err(wait)) => {
                            bucket.refund();
                            wait
                        }
                        Err(_) => {
                            bucket.refund();
                            crate::throttle::STORE_RETRY
                        }
                    },
                },
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// After the local bucket's token, a token of the shared lease (when
    /// there is a store); without one, the local token goes back.
    fn take_shared(&self, bucket: &Bucket) -> Result<(), Duration> {
        let Some(shared) = &self.flow.shared else { return Ok(()) };
        shared.take().inspect_err(|_| bucket.refund())
    }

    /// A token taken for a delivery that did not come.
    pub(super) fn flow_refund(&self) {
        if let Some(bucket) = &self.flow.bucket {
            bucket.refund();
        }
        if let Some(shared) = &self.flow.shared {
            shared.refund();
        }
    }

    /// The task that applies the breaker's decisions (pause when it opens
    /// or a trial is out, resume when it is half-open or closed) and ends its
    /// pauses. Started with the deadline watch; ends with the consumer.
    pub(super) fn watch_flow(self: &Arc<Self>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused_with_what_to_give() {
        assert!(Throttle::new(0, Duration::from_secs(1)).validate().is_err());
        assert!(Throttle::new(1, Duration::from_secs(1)).validate().is_ok());
    }

    #[test]
    fn a_bucket_lets_its_limit_through_then_one_per_interval() {
        let b = Bucket::new(Throttle::new(10, Duration::from_secs(1)));
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        b.refund();
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        assert!(b.take(t0 + Duration::from_millis(100)).is_err());
    }
}
