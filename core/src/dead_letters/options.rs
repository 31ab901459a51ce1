//! The store's tables, the ingester's pace and the replay's.

use std::time::Duration;

/// Options of a dead-letter store.
#[derive(Debug, Clone)]
pub struct DeadLetterStoreOptions {
    /// The dead letters' table, a plain identifier. Default `acemq_dead_letters`.
    pub table: String,
    /// The audit table. Default `acemq_dead_letter_audit`.
    pub audit_table: String,
}

impl Default for DeadLetterStoreOptions {
    fn default() -> Self {
        DeadLetterStoreOptions { table: "acemq_dead_letters".into(), audit_table: "acemq_dead_letter_audit".into() }
    }
}

/// How long dead letters are kept: rows past either limit are deleted by
/// [`prune`](crate::dead_letters::SqlDeadLetterStore::prune). Both off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Rows that failed longer ago than this.
    pub max_age: Option<Duration>,
    /// Beyond this many rows of a queue (of all queues when none is named),
    /// the oldest.
    pub max_count: Option<u64>,
}

impl Retention {
    /// Whether neither limit is set.
    pub fn is_off(&self) -> bool {
        self.max_age.is_none() && self.max_count.is_none()
    }
}

/// How an ingester takes dead letters off `{queue}.dlq`.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Deliveries the broker may hand out before they are acknowledged.
    /// Default 200.
    pub prefetch: u16,
    /// The most rows inserted in one transaction. Default 100.
    pub batch: usize,
    /// How long a batch waits for more after its first delivery. Default 20 ms.
    pub linger: Duration,
    /// How often an ingester on standby (another one has the DLQ) asks
    /// again, and how long it waits after a failure. Default 5 s.
    pub retry: Duration,
    /// Kept by the ingester every `prune_every`. Default off.
    pub retention: Retention,
    /// Default 60 s.
    pub prune_every: Duration,
    /// `ingest_once` stops when no delivery came for this long. Default 500 ms.
    pub idle: Duration,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            prefetch: 200,
            batch: 100,
            linger: Duration::from_millis(20),
            retry: Duration::from_secs(5),
            retention: Retention::default(),
            prune_every: Duration::from_secs(60),
            idle: Duration::from_millis(500),
        }
    }
}

/// Where a replayed copy is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReplayRoute {
    /// Straight to its work queue, through the default exchange (the
    /// default). Sent through the exchange it was first published to, a
    /// copy would reach every other queue bound there too, whose consumers
    /// handled it the first time.
    #[default]
    Queue,
    /// To the exchange and routing key it was first published with, when
    /// the store knows them (the queue, as `Queue`, when it does not).
    Original,
}

/// How a replay sends.
#[derive(Debug, Clone)]
pub struct StoreReplayOptions {
    /// Messages a second. Default 50: a handler that still fails sees its
    /// failures spread out, and the rest of the queue's traffic goes on.
    pub rate: f64,
    /// Where each copy goes.
    pub route: ReplayRoute,
    /// Who asked, for the audit table. No default: a replay with none is
    /// refused (the default was "unknown", which an audit cannot use).
    pub actor: String,
    /// How long a replay holds the rows it is sending against another
    /// replay of the same rows (a crashed replay's rows are free again
    /// after it). Default 5 minutes.
    pub lease: Duration,
}

/// The slowest pace a replay takes: one message every 1,000 s.
pub const MIN_REPLAY_RATE: f64 = 0.001;
/// The fastest: past it the pace is the broker's confirms anyway.
pub const MAX_REPLAY_RATE: f64 = 1_000_000.0;

impl StoreReplayOptions {
    /// Whether `rate` is a pace a replay can keep: a number of messages a
    /// second from [`MIN_REPLAY_RATE`] to [`MAX_REPLAY_RATE`]. A rate
    /// nearer zero would be a wait no clock can hold (1e-300 a second
    /// once panicked the process that asked).
    pub fn check_rate(rate: f64) -> crate::Result<()> {
        if rate.is_finite() && (MIN_REPLAY_RATE..=MAX_REPLAY_RATE).contains(&rate) {
            return Ok(());
        }
        Err(crate::error::Error::invalid(format!(
            "replay rate must be a positive number of messages a second, from {MIN_REPLAY_RATE} to {MAX_REPLAY_RATE} \
             (it is {rate}); 50 is the default"
        )))
    }
}

impl Default for StoreReplayOptions {
    fn default() -> Self {
        StoreReplayOptions { rate: 50.0, route: ReplayRoute::Queue, actor: String::new(), lease: Duration::from_secs(300) }
    }
}
