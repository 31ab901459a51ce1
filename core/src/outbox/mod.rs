//! The transactional outbox: write a message in the same transaction as the
//! work it describes, and let a relay publish it afterwards.
//!
//! Publishing and committing are two things that fail independently; no
//! ordering of the two closes the gap, and publishing inside the transaction
//! holds a database lock across a network round trip. The outbox makes the
//! message part of the transaction instead: [`SqlOutboxStore::add`] writes it
//! with the caller's connection, so it commits or rolls back with the work,
//! and [`OutboxRelay`] (or the store's `claim` / `complete` steps driven by
//! the Ruby extension) publishes committed rows and deletes each only once
//! the broker has confirmed it.
//!
//! That is at least once, deliberately: a crash between a confirm and the
//! delete publishes the message again. The idempotent consumer is what makes
//! the duplicate harmless; a lost message could not be recognised at all.

mod backlog;
mod completion;
mod options;
mod publisher;
mod record;
mod relay;
mod statements;
mod store;
mod values;
mod worker_id;

#[cfg(test)]
mod tests;

pub use backlog::{Backlog, StuckRecord};
pub use completion::Completion;
pub use options::OutboxStoreOptions;
pub use publisher::{OutboxPublisher, PublishFuture};
pub use record::OutboxRecord;
pub use relay::{OnError, OutboxRelay, RelayOptions};
pub use store::SqlOutboxStore;
pub use worker_id::default_worker_id;
