//! The ingester: `{queue}.dlq` into the store, commit then ack.

use super::{AsyncSqlDeadLetterStore, DeadLetterFeed, IngestOptions};
use crate::connection::Connection;
use crate::error::Result;
use crate::retry::dlq_name;
use crate::sql::AsyncConnectionSource;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Who prunes, in the audit table.
pub const RETENTION_ACTOR: &str = "acemq retention";

/// What [`ingest_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestReport {
    /// Deliveries taken off the DLQ, committed and acknowledged.
    pub received: u64,
    /// Rows the database reported inserted (a delivery already stored, a
    /// redelivery after a kill between commit and ack, inserts none).
    pub inserted: u64,
}

/// Take what `{queue}.dlq` holds into the store, until no delivery comes
/// for `options.idle`; then close. Each batch is committed, then
/// acknowledged. Fails when another ingester has the DLQ
/// ([`DeadLetterFeed::is_taken`]).
pub async fn ingest_once<S: AsyncConnectionSource>(
    mq: &Connection,
    store: &AsyncSqlDeadLetterStore<S>,
    queue: &str,
    options: &IngestOptions,
) -> Result<IngestReport> {
    let feed = DeadLetterFeed::open(mq, queue, options.prefetch).await?;
    let mut report = IngestReport::default();
    let result: Result<()> = async {
        loop {
            let batch = feed.next_batch(options.batch, options.linger, options.idle).await?;
            if batch.is_empty() {
                return Ok(());
            }
            report.inserted += store.insert(&batch.letters).await?;
            feed.ack(&batch);
            report.received += batch.len() as u64;
        }
    }
    .await;
    feed.close().await;
    result.map(|()| report)
}

#[derive(Default)]
struct Status {
    active: AtomicBool,
    received: AtomicU64,
    inserted: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A running ingester ([`Ingester::start`]).
pub struct Ingester {
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    status: Arc<Status>,
    queue: String,
}

impl Ingester {
    /// Ingest `{queue}.dlq` into `store` until stopped, on the runtime.
    ///
    /// It consumes the DLQ exclusively: while another ingester (in any
    /// process, on any host) has it, this one stands by, asks again every
    /// `options.retry`, and says so with a `subscription` event (state
    /// `standby`); it emits `ingesting` when it has the DLQ. Each batch is
    /// inserted in one transaction, committed, then acknowledged: a kill
    /// before the commit leaves the deliveries in the DLQ, one after it
    /// makes the broker deliver them again and the insert finds their rows.
    /// A database failure closes the subscription (what it held goes back)
    /// and the ingester tries again after `options.retry`. Rows past
    /// `options.retention` are pruned every `options.prune_every`.
    pub fn start<S: AsyncConnectionSource + 'static>(
        mq: &Connection,
        store: AsyncSqlDeadLetterStore<S>,
        queue: &str,
        options: IngestOptions,
    ) -> Result<Ingester> {
        if queue.is_empty() {
            return Err(crate::error::Error::invalid("an ingester needs the work queue whose DLQ to read (\"payments\" reads payments.dlq)"));
        }
        crate::limits::queue(queue)?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let status = Arc::new(Status::default());
        let task = crate::runtime::handle().spawn(run(mq.clone(), store, queue.to_owned(), options, stopped, status.clone()));
        Ok(Ingester { stop, task: Some(task), status, queue: queue.to_owned() })
    }

    /// Whether it has the DLQ now (false while on standby or retrying).
    pub fn is_active(&self) -> bool {
        self.status.active.load(Ordering::Acquire)
    }

    /// Deliveries committed and acknowledged so far.
    pub fn received(&self) -> u64 {
        self.status.received.load(Ordering::Relaxed)
    }

    /// Rows inserted so far.
    pub fn inserted(&self) -> u64 {
        self.status.inserted.load(Ordering::Relaxed)
    }

    /// Why it last could not ingest (another ingester has the DLQ, the
    /// database failed), if it could not.
    pub fn last_error(&self) -> Option<String> {
        self.status.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The work queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Stop: a batch being inserted is committed and acknowledged first;
    /// deliveries not yet in a batch go back to the DLQ.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Ingester {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn pause(d: Duration, stopped: &mut tokio::sync::watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(d) => {}
        _ = stopped.wait_for(|s| *s) => {}
    }
}

async fn run<S: AsyncConnectionSource>(
    mq: Connection,
    store: AsyncSqlDeadLetterStore<S>,
    queue: String,
    options: IngestOptions,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    status: Arc<Status>,
) {
    let dlq = dlq_name(&queue);
    let note = |e: &crate::error::Error| *status.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    let mut standby_said = false;
    let mut last_prune: Option<Instant> = None;
    while !*stopped.borrow() {
        let feed = match DeadLetterFeed::open(&mq, &queue, options.prefetch).await {
            Ok(feed) => feed,
            Err(e) => {
                note(&e);
                let taken = DeadLetterFeed::is_taken(&e);
                // Said once per stand-by, not every few seconds.
                if !taken || !standby_said {
                    let reason = if taken {
                        format!("another ingester consumes {dlq} exclusively; asking again every {}s", options.retry.as_secs_f64())
                    } else {
                        format!("{e}; trying again in {}s", options.retry.as_secs_f64())
                    };
                    crate::events::subscription(if taken { "standby" } else { "failed" }, &dlq, Some(reason));
                }
                standby_said = taken;
                pause(options.retry, &mut stopped).await;
                continue;
            }
        };
        standby_said = false;
        status.active.store(true, Ordering::Release);
        crate::events::subscription("ingesting", &dlq, None);
        let mut failed = false;
        loop {
            if last_prune.is_none_or(|t| t.elapsed() >= options.prune_every) && !options.retention.is_off() {
                last_prune = Some(Instant::now());
                if let Err(e) = store.prune(Some(&queue), &options.retention, RETENTION_ACTOR).await {
                    note(&e);
                }
            }
            let batch = tokio::select! {
                b = feed.next_batch(options.batch, options.linger, Duration::from_millis(500)) => b,
                _ = stopped.wait_for(|s| *s) => break,
            };
            let batch = match batch {
                Ok(b) if b.is_empty() => continue,
                Ok(b) => b,
                Err(e) => {
                    note(&e);
                    break;
                }
            };
            // Not raced with the stop: a batch being inserted is committed
            // and acknowledged, never left half known.
            match store.insert(&batch.letters).await {
                Ok(n) => {
                    feed.ack(&batch);
                    status.received.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    status.inserted.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    // Not acknowledged: back to the DLQ when the feed
                    // closes, and ingested when the database is back.
                    note(&e);
                    crate::events::subscription("failed", &dlq, Some(format!("storing dead letters: {e}; trying again in {}s", options.retry.as_secs_f64())));
                    failed = true;
                    break;
                }
            }
        }
        status.active.store(false, Ordering::Release);
        feed.close().await;
        if failed {
            pause(options.retry, &mut stopped).await;
        }
    }
}
