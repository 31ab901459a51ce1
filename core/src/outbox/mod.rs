//! The transactional outbox: write a message in the same transaction as the
//! work it describes, and let a relay publish it afterwards.
//!
//! Publishing and committing are two things that fail independently; no
//! ordering of the two closes the gap, and publishing inside the transaction
//! holds a database lock across a network round trip. The outbox makes the
//! message part of the transaction instead: [`SqlOutboxStore::add`] writes it
//! with the caller's connection, so it commits or rolls back with the work,
//! and [`OutboxRelay`] (or the Ruby extension, driving the same [`Cycle`]
//! on a Ruby thread) publishes committed rows and deletes each only once
//! the broker has confirmed it.
//!
//! That is at least once, deliberately: a crash between a confirm and the
//! delete publishes the message again. The idempotent consumer is what makes
//! the duplicate harmless; a lost message could not be recognised at all.
//!
//! ```no_run
//! use acemq::Envelope;
//! use acemq::outbox::{OutboxRecord, OutboxStoreOptions, SqlOutboxStore};
//! use acemq::sql::{SqlConnection, SqliteConnection};
//!
//! # fn main() -> acemq::Result<()> {
//! let store = SqlOutboxStore::new(SqliteConnection::open("app.db")?, OutboxStoreOptions::default())?;
//! store.create_schema()?;
//!
//! let db = SqliteConnection::open("app.db")?;
//! db.execute("BEGIN", &[])?;
//! db.execute("INSERT INTO orders (total) VALUES (?)", &[acemq::sql::SqlValue::Int(42)])?;
//! let event = serde_json::json!({ "order_id": 1 });
//! let envelope = Envelope::new().with_type("order.placed.v2");
//! store.add(&OutboxRecord::json("orders-events", "order.placed", &event, envelope)?, &db)?;
//! db.execute("COMMIT", &[])?; // roll back instead and the message is gone too
//! # Ok(()) }
//! ```

mod async_store;
mod backlog;
mod completion;
mod cycle;
mod options;
mod publisher;
mod record;
mod relay;
mod rules;
mod statements;
mod store;
mod sweep;
mod wake;

#[cfg(test)]
mod tests;

pub use async_store::AsyncSqlOutboxStore;
pub use backlog::{Backlog, StuckRecord};
pub use completion::Completion;
pub use cycle::{Action, Cycle, Failure, Input, Report};
pub use options::OutboxStoreOptions;
pub use publisher::{Confirms, OutboxPublisher, PublishFuture, SendFuture};
pub use record::OutboxRecord;
pub use relay::{OnError, OutboxRelay, RelayOptions, RelayStore};
pub use store::SqlOutboxStore;
pub use crate::sql::default_worker_id;
#[allow(deprecated)] // InFlight: deprecated, re-exported for one release.
pub use sweep::InFlight;
pub use sweep::{settle, Settled, Swept};
pub use wake::LocalWake;
