//! The idempotent consumer: a handler will be called twice, so make it not mind.
//!
//! A [`Guard`] asks an [`IdempotencyStore`] whether a key is seen for the
//! first time; if it is, the handler runs and the key is confirmed when it
//! accepts or forgotten when it does not (so the retry really runs); if it
//! is not, the message is accepted without running the handler. The claim
//! is its own committed write, never part of the handler's transaction: a
//! claim that rolls back with the work is not a claim.
//!
//! Stores: [`InMemoryIdempotencyStore`] (one process: specs and development),
//! [`SqlIdempotencyStore`] (SQLite or PostgreSQL through the blocking SQL
//! seam, which the Ruby extension drives) and [`AsyncSqlIdempotencyStore`]
//! (the same table and rules for async Rust services: PostgreSQL natively
//! with the `postgres` feature, SQLite off the runtime's worker threads).
//!
//! ```no_run
//! use acemq::{Ack, Outcome};
//! use acemq::idempotency::{Idempotent, SqlIdempotencyOptions, SqlIdempotencyStore};
//! use acemq::Message;
//! use acemq::sql::SqliteConnection;
//!
//! # fn main() -> acemq::Result<()> {
//! let store = SqlIdempotencyStore::new(SqliteConnection::open("app.sqlite3")?, SqlIdempotencyOptions::default())?;
//! store.create_schema()?;
//! // Prefix the key: the table is shared by every consumer in the application.
//! let charge = Idempotent::new(store, |m: Message| async move {
//!     // Payments::charge(&m.payload["order_id"], ...) runs once per order.
//!     Outcome::Ack(Ack::accept())
//! })
//! .with_key(|m| m.payload["order_id"].as_str().map(|id| format!("charge:{id}")));
//! // In the consumer: `let outcome = charge.handle(message).await;`
//! // Graph `charge.guard().stats().duplicates`.
//! # Ok(()) }
//! ```

// The layout follows the outbox's: the contract (store), the stores
// (memory, sql, sql_async), what they are built with (options), the rules
// written once over the async seam (rules), the SQL they run (statements),
// reading what comes back (values), and the tests beside them.
mod clock;
mod guard;
mod handler;
mod key;
mod memory;
mod options;
mod owner;
mod rules;
mod sql;
mod sql_async;
mod statements;
mod store;
mod values;

pub use clock::{Clock, ManualClock, SystemClock};
pub use guard::{
    hold_limit, next_hold_poll, Before, Guard, GuardStats, HOLD_POLL_FIRST, HOLD_POLL_MAX, INVALID_KEY_CLASS,
    MISSING_KEY_CLASS, MISSING_KEY_MESSAGE, STORE_OUTAGE_WAIT,
};
pub use handler::{default_key, idempotent, Idempotent, KeyFn};
pub use key::key_text;
pub use memory::InMemoryIdempotencyStore;
pub use options::{
    InMemoryIdempotencyOptions, SqlIdempotencyOptions, TimeColumns, DEFAULT_CLAIM_TIMEOUT, DEFAULT_RETENTION,
    DEFAULT_TABLE, DEFAULT_WINDOW,
};
// Where the seam lives; re-exported because the stores take it.
pub use crate::sql::{ConnectionSource, PerCall};
pub use sql::SqlIdempotencyStore;
pub use sql_async::AsyncSqlIdempotencyStore;
pub use store::{AsyncIdempotencyStore, IdempotencyStore};

#[cfg(test)]
mod tests;
