//! The idempotent consumer: a handler will be called twice, so make it not mind.
//!
//! A [`Guard`] asks an [`IdempotencyStore`] whether a key is seen for the
//! first time; if it is, the handler runs and the key is confirmed when it
//! accepts or forgotten when it does not (so the retry really runs); if it
//! is not, the message is accepted without running the handler. The claim
//! is its own committed write, never part of the handler's transaction: a
//! claim that rolls back with the work is not a claim.
//!
//! Stores: [`InMemoryIdempotencyStore`] (one process: specs and development)
//! and [`SqlIdempotencyStore`] (SQLite or PostgreSQL through the SQL seam).

mod clock;
mod guard;
mod handler;
mod memory;
mod source;
mod sql;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use guard::{Before, Guard, GuardStats, MISSING_KEY_CLASS, MISSING_KEY_MESSAGE};
pub use handler::{default_key, idempotent, Idempotent, KeyFn};
pub use memory::{InMemoryIdempotencyStore, DEFAULT_CLAIM_TIMEOUT, DEFAULT_WINDOW};
pub use source::{ConnectionSource, PerCall};
pub use sql::{SqlIdempotencyOptions, SqlIdempotencyStore, DEFAULT_RETENTION, DEFAULT_TABLE};
pub use store::IdempotencyStore;

#[cfg(test)]
mod tests;
