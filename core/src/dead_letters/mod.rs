//! Dead letters as data: each `{queue}.dlq` ingested into a SQL table, and
//! the operator's work done on the table.
//!
//! A queue can only be read by taking messages and giving them back, which
//! no care makes lossless, order-keeping and safe for two readers (issue
//! 48). The store reads each DLQ once, into rows, and everything after that
//! (browse, filter, count, replay, discard, purge) is a query.
//!
//! - **Lossless**: a batch is inserted in one transaction, committed, then
//!   acknowledged. A kill before the commit leaves the deliveries in the
//!   DLQ; after it, the broker delivers them again and the insert skips them.
//! - **Idempotent**: a row is unique on (queue, message id, content hash),
//!   the hash a fixed 128-bit FNV-1a of body, headers and properties.
//! - **One ingester per DLQ**: it consumes exclusively; a second one
//!   stands by ([`Ingester`]).
//! - **Replay is a snapshot**: the ids matching when it is asked, each
//!   leased, sent with a confirm at a set pace, deleted once confirmed. It
//!   never reads the DLQ, so it never meets its own copies.
//! - **Audited**: replay, discard, purge and prune each write a row.
//!
//! ```no_run
//! use acemq::dead_letters::{ingest_once, AsyncSqlDeadLetterStore, DeadLetterStoreOptions, Filter, IngestOptions};
//! use acemq::sql::AsyncSqliteConnection;
//!
//! # async fn run(mq: acemq::Connection) -> acemq::Result<()> {
//! let store = AsyncSqlDeadLetterStore::new(AsyncSqliteConnection::open("app.db").await?, DeadLetterStoreOptions::default())?;
//! store.create_schema().await?;
//! ingest_once(&mq, &store, "payments", &IngestOptions::default()).await?;
//! let counts = store.counts(&Filter::queue("payments"), 10).await?;
//! println!("{} dead letters; by reason {:?}", counts.total, counts.by_reason);
//! # Ok(()) }
//! ```

mod async_store;
mod feed;
mod filter;
mod hash;
mod ingest;
mod letter;
mod options;
mod replay;
pub(crate) mod rules;
mod statements;
mod store;

pub use async_store::AsyncSqlDeadLetterStore;
pub use feed::{Batch, DeadLetterFeed};
pub use filter::{AuditEntry, Counts, Filter, Page, Selection};
pub use ingest::{ingest_once, IngestReport, Ingester, RETENTION_ACTOR};
pub use letter::{NewDeadLetter, StoredDeadLetter, BACKTRACE_HEADER};
pub use options::{DeadLetterStoreOptions, IngestOptions, ReplayRoute, Retention, StoreReplayOptions, MAX_REPLAY_RATE, MIN_REPLAY_RATE};
pub use replay::{Replay, Sent, StoreReplayReport};
pub use rules::MAX_PAGE;
pub use store::SqlDeadLetterStore;
