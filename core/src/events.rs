//! What the engine did, as events: one contract for Rust services, the Ruby
//! gem (ActiveSupport::Notifications or `AceMQ.subscribe`) and the metrics
//! (see [`crate::metrics`]).
//!
//! ```no_run
//! use acemq::events::{self, Event};
//!
//! let id = events::subscribe(|event: &Event| {
//!     if let Event::Process(p) = event {
//!         eprintln!("{} {} {} in {:.3}s", p.queue, p.message_id, p.outcome.as_str(), p.duration.as_secs_f64());
//!     }
//! });
//! // ...
//! events::unsubscribe(id);
//! ```
//!
//! Rules. A subscriber is called on the thread that produced the event (a
//! tokio worker, or the thread that settled a delivery), never with an
//! engine lock held, so it may call back into the engine; it should be
//! quick, because the engine waits for it. A subscriber that panics is
//! caught and does not affect the message. When nobody is subscribed an
//! emission point costs one atomic load: the event is not even built.

use serde::Serialize;
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// One thing the engine did. The payload keys are the fields, as
/// [`Event::payload`] gives them (durations in seconds).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum Event {
    /// A publish was confirmed, refused or timed out.
    Publish(Publish),
    /// A delivery was settled (by its handler's outcome or its deadline).
    Process(Process),
    /// A delivery was copied to a rung of its retry ladder.
    Retry(Retry),
    /// A delivery was copied to its queue's DLQ.
    DeadLetter(DeadLetter),
    /// The idempotency guard decided something other than "run".
    Idempotency(Idempotency),
    /// The outbox relay swept.
    Outbox(Outbox),
    /// The connection was lost, dialled again, blocked or unblocked.
    Connection(ConnectionChange),
    /// A subscription failed, was cancelled by the broker, or came back.
    Subscription(SubscriptionChange),
    /// The runner changed state.
    Runner(RunnerChange),
}

impl Event {
    /// The event's name: `publish`, `process`, `retry`, `dead_letter`,
    /// `idempotency`, `outbox`, `connection`, `subscription`, `runner`. Ruby
    /// adds `.acemq` (`process.acemq`).
    pub fn name(&self) -> &'static str {
        match self {
            Event::Publish(_) => "publish",
            Event::Process(_) => "process",
            Event::Retry(_) => "retry",
            Event::DeadLetter(_) => "dead_letter",
            Event::Idempotency(_) => "idempotency",
            Event::Outbox(_) => "outbox",
            Event::Connection(_) => "connection",
            Event::Subscription(_) => "subscription",
            Event::Runner(_) => "runner",
        }
    }

    /// The payload as a JSON object (durations as seconds, absent values
    /// null): what the Ruby gem hands its subscribers, key for key.
    pub fn payload(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn opt_seconds<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// `publish`: one message sent and its confirm awaited.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Publish {
    /// The exchange, `""` for the default exchange.
    pub exchange: String,
    /// The routing key (the queue, on the default exchange).
    pub routing_key: String,
    /// The message id (`x-acemq-id`).
    pub message_id: String,
    /// From sending to the broker's answer.
    #[serde(serialize_with = "seconds")]
    pub duration: Duration,
    /// `confirmed`, or `failed` (nacked, unroutable, timed out, closed).
    pub outcome: &'static str,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProcessOutcome {
    /// Acknowledged.
    Accepted,
    /// Copied to the next rung, an attempt spent.
    Retried,
    /// Copied to the DLQ (rejected, retries exhausted, or undecodable).
    DeadLettered,
    /// Accepted without running the handler: the idempotency key was
    /// confirmed already.
    Duplicate,
    /// Retried without running the handler because another handler holds
    /// the key, where waiting was not possible (no claim timeout, no rungs).
    InProgress,
    /// Copied to a rung without spending an attempt: the key is claimed by
    /// another handler ([`crate::Outcome::Wait`]).
    Waited,
    /// Settled as a retry by the handler deadline; what the handler returns
    /// later is discarded.
    TimedOut,
    /// The settlement could not be made (the copy was refused): the message
    /// went back to its queue.
    Failed,
    /// A request dropped because its deadline had passed (on arrival,
    /// unhandled, or when its handler failed): nobody waited for it.
    Expired,
    /// A request whose handler failed, answered with an error reply and
    /// acknowledged instead of being retried or dead-lettered.
    ErrorReplied,
}

impl ProcessOutcome {
    /// The snake_case name, as in the payload and the metrics' `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessOutcome::Accepted => "accepted",
            ProcessOutcome::Retried => "retried",
            ProcessOutcome::DeadLettered => "dead_lettered",
            ProcessOutcome::Duplicate => "duplicate",
            ProcessOutcome::InProgress => "in_progress",
            ProcessOutcome::Waited => "waited",
            ProcessOutcome::TimedOut => "timed_out",
            ProcessOutcome::Failed => "failed",
            ProcessOutcome::Expired => "expired",
            ProcessOutcome::ErrorReplied => "error_replied",
        }
    }
}

/// `process`: a delivery settled.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Process {
    /// The consumer's name (its queue unless named).
    pub consumer: String,
    /// The queue it was consumed from.
    pub queue: String,
    /// The routing key it arrived with.
    pub routing_key: String,
    /// The message id.
    pub message_id: String,
    /// Its attempt (1 the first time).
    pub attempt: u32,
    /// From handing the delivery out to its settlement being decided (the
    /// handler's time, and for `timed_out` the deadline).
    #[serde(serialize_with = "seconds")]
    pub duration: Duration,
    /// What became of it.
    pub outcome: ProcessOutcome,
    /// The reason given, for anything but an acceptance.
    pub reason: Option<String>,
    /// The error class, for a handler that raised (or `HandlerTimeout`).
    pub error_class: Option<String>,
}

/// `retry`: a copy on the next rung.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Retry {
    /// The queue the delivery came from.
    pub queue: String,
    /// The message id.
    pub message_id: String,
    /// The attempt that failed (the copy carries this plus one).
    pub attempt: u32,
    /// The rung queue the copy went to.
    pub rung: String,
    /// Why.
    pub reason: String,
    /// The error class, when a handler raised.
    pub error_class: Option<String>,
}

/// `dead_letter`: a copy in the DLQ.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The queue the delivery came from.
    pub queue: String,
    /// The message id (empty for an undecodable delivery without one).
    pub message_id: String,
    /// The attempt it was on.
    pub attempt: u32,
    /// The DLQ (`{queue}.dlq`).
    pub dlq: String,
    /// Why.
    pub reason: String,
    /// The error class, when a handler raised.
    pub error_class: Option<String>,
}

/// `idempotency`: a decision other than "run the handler".
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Idempotency {
    /// `duplicate`, `in_progress`, `missing_key`, `store_error`,
    /// `confirm_failed` or `forget_failed`.
    pub verdict: &'static str,
    /// The key (None for `missing_key`).
    pub key: Option<String>,
    /// What failed, for the failures.
    pub error: Option<String>,
}

/// A destination the relay could not publish to in a sweep.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxFailure {
    /// The exchange.
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// Why.
    pub error: String,
}

/// `outbox`: one sweep of the relay that found rows.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Outbox {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows confirmed by the broker and deleted.
    pub published: usize,
    /// Rows that failed (backed off, tried again later).
    pub failed: usize,
    /// Rows waiting after the sweep, when the store was asked.
    pub backlog: Option<u64>,
    /// The oldest waiting row's age, when the store was asked.
    #[serde(serialize_with = "opt_seconds")]
    pub oldest_age: Option<Duration>,
    /// What failed, per row.
    pub errors: Vec<OutboxFailure>,
}

/// `connection`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ConnectionChange {
    /// `lost`, `recovered`, `replaced` (the client could not open a channel
    /// for a reason of its own and dialled a new connection), `blocked` or
    /// `unblocked`.
    pub state: &'static str,
    /// The broker's address (no credentials).
    pub endpoint: String,
    /// Why, when known.
    pub reason: Option<String>,
}

/// `subscription`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SubscriptionChange {
    /// `failed` (its channel went, or subscribing failed), `cancelled` (the
    /// broker cancelled it: queue deleted) or `resubscribed`; for a
    /// dead-letter ingester, `ingesting` (it has the DLQ) or `standby`
    /// (another ingester has it).
    pub state: &'static str,
    /// The queue.
    pub queue: String,
    /// Why, when known.
    pub reason: Option<String>,
}

/// `runner`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RunnerChange {
    /// `running` (started), `quiet`, `stopping`, `stopped` or `failed`.
    pub state: &'static str,
    /// Why, for `failed`.
    pub reason: Option<String>,
}

type Callback = Arc<dyn Fn(&Event) + Send + Sync>;

/// Names a subscription, for [`unsubscribe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubscriberId(u64);

static LISTENING: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
// Replaced, never mutated in place: emit clones the Arc and lets go of the
// lock before calling anyone.
static SUBSCRIBERS: RwLock<Vec<(u64, Callback)>> = RwLock::new(Vec::new());
static SNAPSHOT: once_cell::sync::Lazy<RwLock<Arc<Vec<Callback>>>> =
    once_cell::sync::Lazy::new(|| RwLock::new(Arc::new(Vec::new())));

/// Call `f` with every event from now on, on the thread that produced it.
pub fn subscribe<F: Fn(&Event) + Send + Sync + 'static>(f: F) -> SubscriberId {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut subs = SUBSCRIBERS.write().unwrap_or_else(|p| p.into_inner());
    subs.push((id, Arc::new(f)));
    publish_snapshot(&subs);
    SubscriberId(id)
}

/// Stop calling a subscriber. True when it was subscribed.
pub fn unsubscribe(id: SubscriberId) -> bool {
    let mut subs = SUBSCRIBERS.write().unwrap_or_else(|p| p.into_inner());
    let before = subs.len();
    subs.retain(|(i, _)| *i != id.0);
    publish_snapshot(&subs);
    before != subs.len()
}

fn publish_snapshot(subs: &[(u64, Callback)]) {
    *SNAPSHOT.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(subs.iter().map(|(_, c)| c.clone()).collect());
    LISTENING.store(subs.len(), Ordering::Release);
}

/// Whether anybody listens: the one atomic load an emission point pays when
/// nobody does.
#[inline]
pub fn enabled() -> bool {
    LISTENING.load(Ordering::Relaxed) != 0
}

/// Build the event with `make` and hand it to every subscriber, if any.
#[inline]
pub fn emit(make: impl FnOnce() -> Event) {
    if enabled() {
        dispatch(&make());
    }
}

#[cold]
fn dispatch(event: &Event) {
    let subs = SNAPSHOT.read().unwrap_or_else(|p| p.into_inner()).clone();
    for s in subs.iter() {
        // A subscriber that panics must not take the settlement with it.
        let _ = catch_unwind(AssertUnwindSafe(|| s(event)));
    }
}

/// The idempotency event for `verdict`: core's guard is its one emitter,
/// for Rust subscribers, the metrics and the Ruby gem alike (the gem's
/// bridge hands it to the Ruby thread whose guard call emitted it). What the
/// guard decided for the settlement travels with the outcome (`Guarded`).
pub(crate) fn idempotency(verdict: &'static str, key: Option<&str>, error: Option<String>) {
    emit(|| Event::Idempotency(Idempotency { verdict, key: key.map(str::to_owned), error }));
}

/// The runner changed state (see [`crate::runner::Supervisor`]).
pub(crate) fn runner(state: &'static str, reason: Option<&str>) {
    emit(|| Event::Runner(RunnerChange { state, reason: reason.map(str::to_owned) }));
}

/// A connection changed state.
pub(crate) fn connection(state: &'static str, endpoint: &str, reason: Option<String>) {
    emit(|| Event::Connection(ConnectionChange { state, endpoint: endpoint.to_owned(), reason }));
}

/// A subscription changed state.
pub(crate) fn subscription(state: &'static str, queue: &str, reason: Option<String>) {
    emit(|| Event::Subscription(SubscriptionChange { state, queue: queue.to_owned(), reason }));
}

/// A subscription's delivery stream ended without being asked to: `failed`
/// with the error it recorded, or `cancelled` when the broker simply ended it
/// (a `basic.cancel`: the queue was deleted).
pub(crate) fn subscription_ended(queue: &str, failure: &Mutex<Option<crate::error::Error>>) {
    if !enabled() {
        return;
    }
    let reason = failure.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|e| e.to_string());
    subscription(if reason.is_some() { "failed" } else { "cancelled" }, queue, reason);
}

/// What [`outbox_failures`] reads of one outcome of a sweep:
/// [`outbox::Completion`](crate::outbox::Completion) is one. A trait, so
/// that events, which the outbox emits into, need nothing of the outbox.
pub trait OutboxOutcome {
    /// Where the record was going: (exchange, routing key).
    fn destination(&self) -> (&str, &str);
    /// Why it was not published, or None once the broker confirmed it.
    fn error(&self) -> Option<&str>;
}

/// The failures among a sweep's completions, for [`outbox_swept`] (nothing
/// is copied while nobody listens).
pub fn outbox_failures<C: OutboxOutcome>(completions: &[C]) -> Vec<OutboxFailure> {
    if !enabled() {
        return Vec::new();
    }
    completions
        .iter()
        .filter_map(|c| {
            c.error().map(|e| {
                let (exchange, routing_key) = c.destination();
                OutboxFailure { exchange: exchange.to_owned(), routing_key: routing_key.to_owned(), error: e.to_owned() }
            })
        })
        .collect()
}

/// One sweep of an outbox relay, with the backlog when it was asked for.
/// Called by core's relay and by the Ruby gem's sweep alike.
pub fn outbox_swept(claimed: usize, published: usize, errors: Vec<OutboxFailure>, backlog: Option<(u64, Option<Duration>)>) {
    emit(|| Event::Outbox(Outbox {
        claimed,
        published,
        failed: errors.len(),
        backlog: backlog.map(|b| b.0),
        oldest_age: backlog.and_then(|b| b.1),
        errors,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn subscribers_get_events_and_a_panicking_one_changes_nothing() {
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let bad = subscribe(|_| panic!("a subscriber that raises"));
        let good = subscribe(move |e| {
            if let Event::Runner(r) = e {
                if r.state == "quiet" {
                    s.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        runner("quiet", None);
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert!(unsubscribe(good));
        assert!(unsubscribe(bad));
        assert!(!unsubscribe(bad));
        runner("quiet", None);
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn payloads_name_every_key() {
        let e = Event::Process(Process {
            consumer: "c".into(),
            queue: "q".into(),
            routing_key: "q".into(),
            message_id: "m".into(),
            attempt: 2,
            duration: Duration::from_millis(1500),
            outcome: ProcessOutcome::DeadLettered,
            reason: Some("r".into()),
            error_class: None,
        });
        assert_eq!(e.name(), "process");
        let p = e.payload();
        assert_eq!(p["outcome"], "dead_lettered");
        assert_eq!(p["duration"], 1.5);
        assert_eq!(p["attempt"], 2);
        assert!(p["error_class"].is_null());
    }

    #[test]
    fn nobody_listening_costs_an_atomic_load() {
        // Not a benchmark: the emission must not build the event.
        let mut built = false;
        if !enabled() {
            emit(|| {
                built = true;
                Event::Runner(RunnerChange { state: "x", reason: None })
            });
            assert!(!built || enabled());
        }
    }
}
