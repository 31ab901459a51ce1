//! The relay for Rust services: claim, publish, complete, on a tokio task.

use super::{Action, AsyncSqlOutboxStore, Backlog, Completion, Confirms, Cycle, Input, LocalWake, OutboxPublisher, OutboxRecord, SqlOutboxStore, Swept};
use crate::error::{Error, Result};
use crate::sql::blocking::off_runtime;
use crate::sql::{AsyncConnectionSource, ConnectionSource};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Called for every record that could not be published, with its exchange
/// and routing key, and for a sweep that failed as a whole (the database is
/// unreachable), with both empty.
pub type OnError = Box<dyn Fn(&Error, &str, &str) + Send + Sync>;

/// Options of an [`OutboxRelay`] (and of the Ruby `OutboxRelay`, which
/// builds one of these from its keywords, so the defaults and the checks are
/// these).
pub struct RelayOptions {
    /// The longest wait between sweeps that found less than a full batch: a
    /// relay also wakes as soon as a row is added in this process (SQLite)
    /// or committed by any process (PostgreSQL through `LISTEN`, where the
    /// store's source can: `PgConnection::connect` (feature `postgres`)
    /// and the Ruby relay), so this is the fallback poll. Default 1 second.
    pub interval: Duration,
    /// Rows claimed and published per sweep. Default 100.
    pub batch_size: usize,
    /// Told about every failure. Without it, a relay whose publishes all fail
    /// is an outbox filling up with nothing to show for it but messages that
    /// never arrive; [`SqlOutboxStore::stuck`] shows the same afterwards.
    pub on_error: Option<OnError>,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions { interval: Self::DEFAULT_INTERVAL, batch_size: Self::DEFAULT_BATCH_SIZE, on_error: None }
    }
}

impl RelayOptions {
    /// The default interval.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
    /// The default batch size.
    pub const DEFAULT_BATCH_SIZE: usize = 100;

    /// Refuse what cannot work: a zero interval (a relay polling in a busy
    /// loop) or a zero batch (a relay that never publishes anything).
    pub fn validate(&self) -> Result<()> {
        if self.interval.is_zero() {
            return Err(Error::invalid(
                "outbox relay interval must be more than zero: it is the longest wait between sweeps (default 1 s)",
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::invalid(
                "outbox relay batch size must be at least 1: it is how many rows one sweep publishes (default 100)",
            ));
        }
        Ok(())
    }
}

impl std::fmt::Debug for RelayOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayOptions")
            .field("interval", &self.interval)
            .field("batch_size", &self.batch_size)
            .field("on_error", &self.on_error.as_ref().map(|_| "Fn"))
            .finish()
    }
}

/// The two database steps of a sweep, as the relay awaits them: implemented
/// by [`SqlOutboxStore`] (its blocking SQL on tokio's blocking pool) and by
/// [`AsyncSqlOutboxStore`] (awaited on the runtime). The sweep itself (claim,
/// publish, complete after the confirms) is core's [`Cycle`], written once
/// for this relay and the Ruby one.
pub trait RelayStore: Send + Sync + 'static {
    /// [`SqlOutboxStore::claim`]. Never called: the relay claims with
    /// [`delete_then_claim_for_relay`](Self::delete_then_claim_for_relay)
    /// (no ids to delete on its first claim). Kept, deprecated, for one
    /// release, since a store outside the crate implements it.
    #[deprecated(
        note = "the relay never calls it (it claims with delete_then_claim_for_relay); implementations may leave it out once it is removed"
    )]
    fn claim_for_relay(self: Arc<Self>, batch_size: usize) -> impl Future<Output = Result<Vec<OutboxRecord>>> + Send;
    /// [`SqlOutboxStore::complete`].
    fn complete_for_relay(self: Arc<Self>, completions: Vec<Completion>) -> impl Future<Output = Result<usize>> + Send;
    /// [`SqlOutboxStore::local_wake`].
    fn wake_for_relay(&self) -> &LocalWake;
    /// [`SqlOutboxStore::delete_then_claim`].
    fn delete_then_claim_for_relay(
        self: Arc<Self>,
        done: Vec<i64>,
        batch_size: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRecord>>> + Send;
    /// [`SqlOutboxStore::delete_confirmed`].
    fn delete_for_relay(self: Arc<Self>, ids: Vec<i64>) -> impl Future<Output = Result<usize>> + Send;
    /// Move [`wake_for_relay`](Self::wake_for_relay) whenever rows are
    /// committed by any process, until `stop`: PostgreSQL's `LISTEN`, where
    /// the store's source can ([`AsyncConnectionSource::listen`]). The
    /// default listens to nothing.
    fn listen_for_relay(&self, stop: watch::Receiver<bool>) -> bool {
        let _ = stop;
        false
    }
    /// [`SqlOutboxStore::backlog`], for the `outbox` event a sweep emits
    /// while somebody listens (the same event the Ruby relay emits); `None`
    /// when it cannot be read, which the event says by leaving it out. The
    /// default reads nothing.
    fn backlog_for_relay(self: Arc<Self>) -> impl Future<Output = Option<Backlog>> + Send {
        async { None }
    }
}

/// The blocking store's SQL runs on tokio's blocking pool (`spawn_blocking`)
/// rather than stalling a runtime worker while SQLite waits for a lock, so its
/// source must be `Send + Sync`; [`SqliteConnection`](crate::sql::SqliteConnection) is.
impl<S: ConnectionSource + Send + Sync + 'static> RelayStore for SqlOutboxStore<S> {
    fn claim_for_relay(self: Arc<Self>, batch_size: usize) -> impl Future<Output = Result<Vec<OutboxRecord>>> + Send {
        off_runtime(move || self.claim(batch_size))
    }
    fn complete_for_relay(self: Arc<Self>, completions: Vec<Completion>) -> impl Future<Output = Result<usize>> + Send {
        off_runtime(move || self.complete(&completions))
    }
    fn wake_for_relay(&self) -> &LocalWake {
        self.local_wake()
    }
    fn delete_then_claim_for_relay(
        self: Arc<Self>,
        done: Vec<i64>,
        batch_size: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRecord>>> + Send {
        off_runtime(move || self.delete_then_claim(&done, batch_size))
    }
    fn delete_for_relay(self: Arc<Self>, ids: Vec<i64>) -> impl Future<Output = Result<usize>> + Send {
        off_runtime(move || self.delete_confirmed(&ids))
    }
    fn backlog_for_relay(self: Arc<Self>) -> impl Future<Output = Option<Backlog>> + Send {
        async move { off_runtime(move || self.backlog()).await.ok() }
    }
}

impl<S: AsyncConnectionSource + 'static> RelayStore for AsyncSqlOutboxStore<S> {
    fn claim_for_relay(self: Arc<Self>, batch_size: usize) -> impl Future<Output = Result<Vec<OutboxRecord>>> + Send {
        async move { self.claim(batch_size).await }
    }
    fn complete_for_relay(self: Arc<Self>, completions: Vec<Completion>) -> impl Future<Output = Result<usize>> + Send {
        async move { self.complete(&completions).await }
    }
    fn wake_for_relay(&self) -> &LocalWake {
        self.local_wake()
    }
    fn delete_then_claim_for_relay(
        self: Arc<Self>,
        done: Vec<i64>,
        batch_size: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRecord>>> + Send {
        async move { self.delete_then_claim(&done, batch_size).await }
    }
    fn delete_for_relay(self: Arc<Self>, ids: Vec<i64>) -> impl Future<Output = Result<usize>> + Send {
        async move { self.delete_confirmed(&ids).await }
    }
    fn backlog_for_relay(self: Arc<Self>) -> impl Future<Output = Option<Backlog>> + Send {
        async move { self.backlog().await.ok() }
    }
    fn listen_for_relay(&self, stop: watch::Receiver<bool>) -> bool {
        let wake = self.local_wake().clone();
        self.listen_for_rows(Arc::new(move || wake.rows_added()), stop)
    }
}

/// Publishes what the outbox holds: claims a batch, publishes it and awaits
/// the confirms together, deletes what was confirmed and backs off what was
/// not.
///
/// The store is an [`AsyncSqlOutboxStore`] (PostgreSQL, or SQLite on the
/// blocking pool) or a [`SqlOutboxStore`] whose connection source is
/// `Send + Sync`: its blocking SQL then runs on tokio's blocking pool
/// (`spawn_blocking`) rather than stalling a runtime worker while SQLite
/// waits for a lock. A connection that
/// cannot leave its thread (a Ruby driver object) drives the same [`Cycle`]
/// on that thread instead, as the Ruby extension does.
///
/// Several relays, in one process or many, can run against one table: a
/// claimed row is leased to one of them.
///
/// ```no_run
/// # use acemq::outbox::*;
/// # use acemq::sql::SqliteConnection;
/// # async fn run(mq: acemq::Connection) -> acemq::Result<()> {
/// let store = SqlOutboxStore::new(SqliteConnection::open("app.db")?, OutboxStoreOptions::default())?;
/// store.create_schema()?;
/// let relay = OutboxRelay::new(mq.clone(), store, RelayOptions {
///     on_error: Some(Box::new(|error: &acemq::Error, exchange: &str, routing_key: &str| {
///         eprintln!("outbox stuck on {exchange}/{routing_key}: {error}");
///     })),
///     ..RelayOptions::default()
/// });
/// relay.start()?;
/// // ... and at shutdown:
/// relay.close().await;
/// # Ok(()) }
/// ```
pub struct OutboxRelay<T: RelayStore> {
    inner: Arc<Inner<T>>,
    task: Mutex<Option<JoinHandle<()>>>,
    stop: watch::Sender<bool>,
}

struct Inner<T: RelayStore> {
    publisher: Arc<dyn OutboxPublisher>,
    store: Arc<T>,
    options: RelayOptions,
}

impl<T: RelayStore> OutboxRelay<T> {
    /// A relay publishing `store`'s rows through `publisher`: a
    /// [`Connection`](crate::Connection) (a clone shares the connection), or
    /// any `Arc` of one. Nothing runs until [`start`](Self::start) or
    /// [`sweep`](Self::sweep).
    pub fn new(publisher: impl OutboxPublisher + 'static, store: T, options: RelayOptions) -> Self {
        let (stop, _) = watch::channel(false);
        OutboxRelay {
            inner: Arc::new(Inner { publisher: Arc::new(publisher), store: Arc::new(store), options }),
            task: Mutex::new(None),
            stop,
        }
    }

    /// The store it relays from (for its `backlog` and `stuck`).
    pub fn store(&self) -> &T {
        &self.inner.store
    }

    /// Publish one batch now; how many the broker confirmed.
    ///
    /// What a test calls instead of waiting for a tick, and what an
    /// application calls to flush its outbox at the end of a request. Each
    /// record that fails is reported to `on_error` and retried after its
    /// backoff; an error is returned only when the database step failed.
    ///
    /// Fails when the options are invalid (see [`RelayOptions::validate`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in that nothing is lost: rows claimed by a sweep that is
    /// dropped stay leased until the lease runs out and are published then
    /// (possibly a second time).
    pub async fn sweep(&self) -> Result<usize> {
        self.inner.options.validate()?;
        self.inner.sweep().await.map(|s| s.confirmed)
    }

    /// Sweep on a tokio task until [`close`](Self::close): again at once
    /// after a full batch that all went out, as soon as a row is added to
    /// the table in this process (SQLite; see [`LocalWake`]) or committed by
    /// any process (PostgreSQL, where the store's source listens:
    /// [`AsyncConnectionSource::listen`]), and otherwise every `interval`. Must be called within a tokio runtime; fails when
    /// the options are invalid. Starting a started relay does nothing.
    pub fn start(&self) -> Result<()> {
        self.inner.options.validate()?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::invalid("the outbox relay starts a tokio task: call start from within a tokio runtime")
        })?;
        if *self.stop.borrow() {
            return Err(Error::closed("this outbox relay is closed; build a new one to start again"));
        }
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_none() {
            let inner = self.inner.clone();
            let stop = self.stop.subscribe();
            *task = Some(handle.spawn(inner.run(stop)));
        }
        Ok(())
    }

    /// Stop sweeping: the sweep in progress finishes (its confirmed rows are
    /// deleted, its failures recorded), then the task ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the relay is stopped as soon as this is first called.
    pub async fn close(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            // A panic in on_error ended the task already; nothing is left to stop.
            let _ = task.await;
        }
    }
}

impl<T: RelayStore> Drop for OutboxRelay<T> {
    /// A dropped relay stops after its current sweep rather than sweeping on
    /// with nobody holding it.
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl<T: RelayStore + std::fmt::Debug> std::fmt::Debug for OutboxRelay<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxRelay").field("store", &self.inner.store).field("options", &self.inner.options).finish()
    }
}

impl<T: RelayStore> Inner<T> {
    async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        // Rows committed by any process wake it too, where the store can
        // listen (PostgreSQL); it stops listening when the relay stops.
        self.store.listen_for_relay(stop.clone());
        let bs = self.options.batch_size;
        // Errors are reported as they come; a started cycle finishes with none.
        let _ = self.drive(Cycle::started(bs), Some(&mut stop)).await;
    }

    async fn sweep(&self) -> Result<Swept> {
        self.drive(Cycle::once(self.options.batch_size), None).await
    }

    /// The tokio driver of core's [`Cycle`]: the store's SQL awaited (on
    /// the blocking pool for a blocking store), the publish and its
    /// confirms awaited, waits between sweeps on the wake-up, the interval
    /// or `stop`. A one-off sweep has no `stop` and never waits.
    async fn drive(&self, mut cycle: Cycle, mut stop: Option<&mut watch::Receiver<bool>>) -> Result<Swept> {
        let wake = self.store.wake_for_relay().clone();
        let mut seen = wake.seen();
        // The confirms of the batch sent last, until the cycle settles it.
        let mut confirms: Option<Confirms> = None;
        let mut input = next(&stop);
        loop {
            input = match cycle.step(input) {
                Action::Claim { done, batch_size } => {
                    // Read before the sweep: an add made while it runs moves
                    // the counter past this, and the wait returns at once.
                    seen = wake.seen();
                    Input::Claimed(self.store.clone().delete_then_claim_for_relay(done, batch_size).await)
                }
                Action::Send(records) => {
                    confirms = Some(self.publisher.send_batch(&records).await);
                    Input::Sent(records)
                }
                // None only after a driver bug; no result is a failure, retried.
                Action::Settle => Input::Confirmed(match confirms.take() {
                    Some(c) => c.await,
                    None => Vec::new(),
                }),
                Action::Complete(completions) => Input::Completed(self.store.clone().complete_for_relay(completions).await),
                Action::Delete(ids) => Input::Deleted(self.store.clone().delete_for_relay(ids).await),
                Action::Woken => Input::Woken(wake.seen() != seen),
                Action::Report(mut report) => {
                    for f in &report.failures {
                        self.report(&f.error, f.exchange.as_deref().unwrap_or(""), f.routing_key.as_deref().unwrap_or(""));
                    }
                    // The backlog as it is now, as the Ruby relay's event
                    // carries it: read only when the event goes to somebody.
                    let backlog = if report.has_event() && crate::events::enabled() {
                        self.store.clone().backlog_for_relay().await.map(|b| (b.count, b.oldest_age))
                    } else {
                        None
                    };
                    report.emit(backlog);
                    Input::Next
                }
                Action::Again => {
                    // More is waiting: sweep again now rather than an
                    // interval later, but let the runtime breathe between batches.
                    tokio::task::yield_now().await;
                    next(&stop)
                }
                Action::Wait => {
                    if let Some(stop) = stop.as_deref_mut() {
                        wake.between_sweeps(Some(seen), self.options.interval, stop).await;
                    }
                    next(&stop)
                }
                Action::Finished(result) => return result,
            };
        }
    }

    fn report(&self, error: &Error, exchange: &str, routing_key: &str) {
        if let Some(on_error) = &self.options.on_error {
            on_error(error, exchange, routing_key);
        }
    }
}

/// The answer between sweeps: [`Input::Stop`] once the relay is closing.
fn next(stop: &Option<&mut watch::Receiver<bool>>) -> Input {
    match stop {
        Some(stop) if *stop.borrow() => Input::Stop,
        _ => Input::Next,
    }
}
