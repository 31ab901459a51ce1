//! The guard wrapped around a Rust async handler: `Patterns.idempotent` for
//! Rust services.

use super::guard::{hold_limit, next_hold_poll, Before, Guard};
use super::store::AsyncIdempotencyStore;
use crate::ack::{Guarded, Outcome};
use crate::message::Message;
use crate::Handler;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Finds a message's idempotency key; `None` (or an empty string) means it
/// has none, which rejects the message as fatal.
pub type KeyFn = Arc<dyn Fn(&Message) -> Option<String> + Send + Sync>;

/// The default key: the envelope id, carried unchanged through every retry
/// and rung queue. Right for "the same message arrived twice"; for "the same
/// thing happened twice" give a key function, and prefix its keys, because
/// the table is shared by every consumer.
///
/// A message from a foreign publisher without a message id has an empty id,
/// so it has no key.
pub fn default_key(message: &Message) -> Option<String> {
    Some(message.envelope.id.clone()).filter(|id| !id.is_empty())
}

/// A handler that runs at most once per key while the store remembers it.
/// It is a [`Handler`] itself: hand it to `consume` as it is, or name it in
/// a struct field (`Idempotent<AsyncSqlIdempotencyStore<PgConnection>, Charge>`)
/// when the handler it wraps is a type of your own.
///
/// The store is any [`AsyncIdempotencyStore`]: an
/// [`AsyncSqlIdempotencyStore`](super::AsyncSqlIdempotencyStore) (PostgreSQL,
/// or SQLite on tokio's blocking pool) is awaited without blocking the task
/// that handles the message; a blocking store (every
/// [`IdempotencyStore`](super::IdempotencyStore), such as the in-memory one or
/// a [`SqlIdempotencyStore`](super::SqlIdempotencyStore)) is called on that
/// task, a short blocking write per message for a local SQLite file.
pub struct Idempotent<S, H> {
    store: S,
    key: KeyFn,
    handler: H,
    guard: Arc<Guard>,
    keep_order: bool,
}

/// Wrap `handler` in the guard: `key` finds the key (default: the envelope id).
pub fn idempotent<S, H>(store: S, key: Option<KeyFn>, handler: H) -> Idempotent<S, H>
where
    S: AsyncIdempotencyStore,
    H: Handler,
{
    let wrapped = Idempotent::new(store, handler);
    match key {
        Some(key) => Idempotent { key, ..wrapped },
        None => wrapped,
    }
}

impl<S, H> Idempotent<S, H>
where
    S: AsyncIdempotencyStore,
    H: Handler,
{
    /// Wrap `handler`, keyed by the envelope id.
    pub fn new(store: S, handler: H) -> Self {
        Idempotent { store, key: Arc::new(default_key), handler, guard: Arc::new(Guard::new()), keep_order: false }
    }

    /// Key messages with `key` instead of the envelope id.
    pub fn with_key(mut self, key: impl Fn(&Message) -> Option<String> + Send + Sync + 'static) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// Count into `guard` (e.g. one shared with a metrics exporter).
    pub fn with_guard(mut self, guard: Arc<Guard>) -> Self {
        self.guard = guard;
        self
    }

    /// For a consumer whose order matters (a partition, a single active
    /// consumer with `keep_order`): a message whose key another worker
    /// holds a live claim on waits here, in place, polling the store
    /// ([`Guard::recheck_async`]), until the claim is confirmed (a
    /// duplicate: accepted unrun), forgotten or expired (it runs), for at
    /// most [`hold_limit`] of the claim timeout. Without it the message
    /// would go round the retry ladder and run after later messages of its
    /// key. The partition stalls meanwhile, which is what its order asks.
    /// A claim whose worker has provably exited is taken over by the store
    /// at once, so the usual hold after a kill is one look.
    pub fn keep_order(mut self) -> Self {
        self.keep_order = true;
        self
    }

    /// The guard and its counters.
    pub fn guard(&self) -> &Arc<Guard> {
        &self.guard
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Handle one message: claim its key, run the handler the first time,
    /// then confirm the key on accept or forget it otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that matters: if this future is dropped, or
    /// the handler panics, while the handler runs, the claim is forgotten
    /// (the message was not settled and will be redelivered, and that
    /// delivery must run): at once by a blocking store, by a spawned task by
    /// the async SQL store (see [`Guard::abandon_now_or_later`]).
    pub async fn handle(&self, message: Message) -> Outcome {
        self.handle_guarded(message).await.outcome
    }

    /// [`handle`](Self::handle), with the guard's verdict beside the
    /// outcome for a message it settled unrun (what the consumer settles).
    pub async fn handle_guarded(&self, message: Message) -> Guarded {
        let key = (self.key)(&message);
        let mut before = self.guard.before_async(&self.store, key.as_deref()).await;
        if let (true, Before::InProgress { wait: Some(lease), .. }, Some(key)) = (self.keep_order, &before, key.as_deref()) {
            before = self.hold(key, *lease, before).await;
        }
        let key = match before {
            Before::Run { key } => key,
            other => return other.guarded_without_running().expect("only Run runs the handler"),
        };
        let mut pending = Pending { guard: &self.guard, store: &self.store, key: Some(key) };
        let guarded: Guarded = self.handler.handle(message).await.into();
        let key = pending.key.take().expect("the key is taken once");
        // An error here is counted by the guard; the outcome stands (see Guard::after).
        let _ = self.guard.after_async(&self.store, &key, &guarded.outcome).await;
        guarded
    }
}

impl<S, H> Idempotent<S, H>
where
    S: AsyncIdempotencyStore,
    H: Handler,
{
    /// Hold a delivery whose key is claimed elsewhere (see
    /// [`keep_order`](Self::keep_order)): what the store answers once the
    /// claim is resolved, or `held` unchanged past [`hold_limit`].
    async fn hold(&self, key: &str, lease: Duration, held: Before) -> Before {
        self.guard.hold_started(key);
        let until = tokio::time::Instant::now() + hold_limit(lease);
        let mut poll = None;
        loop {
            let wait = next_hold_poll(poll);
            poll = Some(wait);
            if tokio::time::Instant::now() + wait > until {
                return held;
            }
            tokio::time::sleep(wait).await;
            let now = self.guard.recheck_async(&self.store, key).await;
            if !matches!(now, Before::InProgress { .. }) {
                return now;
            }
        }
    }
}

/// The guard is a handler: `mq.consume(queue, options, guarded)` runs it
/// for every message, shared by the consumer's workers (no `Arc` or
/// cloning closure), and lowers the handler deadline to the store's claim
/// timeout when that is shorter.
impl<S, H> Handler for Idempotent<S, H>
where
    S: AsyncIdempotencyStore + Send + Sync + 'static,
    H: Handler,
{
    type Output = Outcome;

    fn handle(&self, message: Message) -> impl Future<Output = Outcome> + Send {
        Idempotent::handle(self, message)
    }

    fn handle_guarded(&self, message: Message) -> impl Future<Output = Guarded> + Send {
        Idempotent::handle_guarded(self, message)
    }

    fn claim_timeout(&self) -> Option<Duration> {
        self.store.claim_expiry()
    }
}

/// Forgets the claim if the handler never finishes: dropped mid-await or
/// unwinding from a panic.
struct Pending<'a, S: AsyncIdempotencyStore> {
    guard: &'a Guard,
    store: &'a S,
    key: Option<String>,
}

impl<S: AsyncIdempotencyStore> Drop for Pending<'_, S> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.guard.abandon_now_or_later(self.store, key);
        }
    }
}
