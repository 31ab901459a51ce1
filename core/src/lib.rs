//! placeholder, being written
pub mod ack;
pub mod envelope;
pub mod error;
pub mod headers;
pub mod message;
pub mod sql;
pub mod idempotency;
pub mod outbox;
