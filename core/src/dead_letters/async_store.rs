//! The dead-letter store for async Rust services: the same tables and rules
//! as [`SqlDeadLetterStore`](super::SqlDeadLetterStore) over the async seam
//! (PostgreSQL, MySQL, SQLite on tokio's blocking pool), with the ingester
//! and replay that run on the runtime.

use super::replay::{Replay, StoreReplayReport};
use super::rules::Rules;
use super::store::{check_actor, check_purge_filter};
use super::{AuditEntry, Counts, DeadLetterStoreOptions, Filter, NewDeadLetter, Page, Retention, Selection, StoreReplayOptions, StoredDeadLetter};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::sql::{AsyncConnectionSource, Dialect};
use std::sync::Arc;

/// Dead letters in SQL tables, for async code. Clones share one source.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(mq: acemq::Connection) -> acemq::Result<()> {
/// use acemq::dead_letters::{AsyncSqlDeadLetterStore, DeadLetterStoreOptions, IngestOptions, Ingester, Selection, Filter, StoreReplayOptions};
/// use acemq::sql::PgConnection;
///
/// let store = AsyncSqlDeadLetterStore::new(PgConnection::connect("postgres://postgres@127.0.0.1/app").await?, DeadLetterStoreOptions::default())?;
/// store.create_schema().await?;
/// let ingester = Ingester::start(&mq, store.clone(), "payments", IngestOptions::default())?;
/// // ...
/// let report = store
///     .replay(&mq, &Selection::Filter(Filter::queue("payments")), StoreReplayOptions { actor: "ops@example.com".into(), ..Default::default() })
///     .await?;
/// println!("replayed {} of {}", report.replayed, report.selected);
/// ingester.stop().await;
/// # Ok(()) }
/// ```
pub struct AsyncSqlDeadLetterStore<S> {
    rules: Arc<Rules>,
    source: Arc<S>,
}

impl<S> Clone for AsyncSqlDeadLetterStore<S> {
    fn clone(&self) -> Self {
        AsyncSqlDeadLetterStore { rules: self.rules.clone(), source: self.source.clone() }
    }
}

impl<S: AsyncConnectionSource> AsyncSqlDeadLetterStore<S> {
    /// A store whose calls take connections from `source`.
    pub fn new(source: S, options: DeadLetterStoreOptions) -> Result<Self> {
        Ok(AsyncSqlDeadLetterStore { rules: Arc::new(Rules::new(&options)?), source: Arc::new(source) })
    }

    /// The dead letters' table.
    pub fn table(&self) -> &str {
        &self.rules.st.table
    }

    /// The DDL for `dialect`, one statement per element.
    pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        self.rules.st.create_schema(dialect)
    }

    /// Create both tables and their indexes if they do not exist.
    pub async fn create_schema(&self) -> Result<()> {
        let c = self.connection().await?;
        self.rules.create_schema(&c).await
    }

    /// See [`SqlDeadLetterStore::insert`](super::SqlDeadLetterStore::insert).
    /// Cancel safe: dropped before its commit, nothing was inserted.
    pub async fn insert(&self, letters: &[NewDeadLetter]) -> Result<u64> {
        let c = self.connection().await?;
        self.rules.insert(&c, letters).await
    }

    /// See [`SqlDeadLetterStore::list`](super::SqlDeadLetterStore::list).
    pub async fn list(&self, filter: &Filter, after_id: Option<i64>, limit: usize) -> Result<Page> {
        let c = self.connection().await?;
        self.rules.list(&c, filter, after_id, limit).await
    }

    /// One row.
    pub async fn find(&self, id: i64) -> Result<Option<StoredDeadLetter>> {
        let c = self.connection().await?;
        self.rules.find(&c, id).await
    }

    /// See [`SqlDeadLetterStore::counts`](super::SqlDeadLetterStore::counts).
    pub async fn counts(&self, filter: &Filter, top: usize) -> Result<Counts> {
        let c = self.connection().await?;
        self.rules.counts(&c, filter, top).await
    }

    /// Delete rows by id, recorded as `actor`'s.
    pub async fn discard(&self, ids: &[i64], actor: &str) -> Result<u64> {
        check_actor(actor)?;
        let c = self.connection().await?;
        self.rules.discard(&c, ids, actor).await
    }

    /// Delete what `filter` matches now, recorded as `actor`'s. A filter
    /// that sets nothing (blank texts count as unset) is refused: deleting
    /// every dead letter of every queue is [`Self::purge_all`].
    pub async fn purge(&self, filter: &Filter, actor: &str) -> Result<u64> {
        check_actor(actor)?;
        check_purge_filter(filter)?;
        let c = self.connection().await?;
        self.rules.purge(&c, filter, actor).await
    }

    /// Delete every row of every queue, recorded as `actor`'s.
    pub async fn purge_all(&self, actor: &str) -> Result<u64> {
        check_actor(actor)?;
        let c = self.connection().await?;
        self.rules.purge(&c, &Filter::default(), actor).await
    }

    /// Delete rows past `retention`, recorded as `actor`'s when any went.
    pub async fn prune(&self, queue: Option<&str>, retention: &Retention, actor: &str) -> Result<u64> {
        let c = self.connection().await?;
        self.rules.prune(&c, queue, retention, actor).await
    }

    /// The newest `limit` audit rows.
    pub async fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        let c = self.connection().await?;
        self.rules.audit(&c, limit).await
    }

    /// Replay what `selection` names at this moment (its snapshot): each
    /// row leased, sent with a confirm at `options.rate` a second, and
    /// deleted once confirmed; recorded in the audit table. Rows that
    /// arrive while it runs are not in the snapshot and are not sent, and
    /// a row another replay holds is skipped, so each row goes out once.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, never lossy: see [`Replay::send`].
    pub async fn replay(&self, mq: &Connection, selection: &Selection, options: StoreReplayOptions) -> Result<StoreReplayReport> {
        selection.check_for_replay()?;
        let actor = options.actor.clone();
        let ids = {
            let c = self.connection().await?;
            self.rules.snapshot(&c, selection).await?
        };
        let mut run = Replay::new(ids, options)?;
        let mut failure = None;
        while let Some(chunk) = run.next_chunk() {
            let rows = {
                let c = self.connection().await?;
                self.rules.claim(&c, run.id(), &chunk, run.lease_until()).await?
            };
            run.skipped(chunk.len() - rows.len());
            let sent = run.send(mq, &rows).await;
            let c = self.connection().await?;
            let deleted = self.rules.delete_sent(&c, run.id(), &sent.confirmed).await?;
            run.replayed(deleted as usize);
            if !sent.unsent.is_empty() {
                self.rules.release(&c, run.id(), &sent.unsent).await?;
            }
            if let Some(e) = sent.error {
                failure = Some(e);
                break;
            }
        }
        let c = self.connection().await?;
        self.rules.record(&c, &actor, "replay", run.queue(selection), run.detail(selection), run.report().replayed as u64).await?;
        match failure {
            Some(e) => Err(e),
            None => Ok(run.report().clone()),
        }
    }

    async fn connection(&self) -> Result<S::Connection<'_>> {
        self.source
            .connection()
            .await
            .map_err(|e| Error::new(e.kind().clone(), format!("cannot get the dead-letter store's connection: {}", e.message())))
    }
}
