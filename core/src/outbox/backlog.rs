//! What an operator asks of an outbox: how far behind is it, and what is stuck.

use std::time::Duration;

/// The state of the outbox at a glance. A count that keeps growing or an
/// oldest age past a few intervals means the relay is not keeping up or not
/// running; `stuck` above zero means some destination keeps failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// Rows not yet confirmed by the broker, leased ones included.
    pub count: u64,
    /// How long the oldest of them has waited; `None` when the outbox is empty.
    pub oldest_age: Option<Duration>,
    /// Rows that have failed at least once (see [`StuckRecord`]).
    pub stuck: u64,
}

/// A row that has failed at least once: where it is going and why it has not
/// got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckRecord {
    /// The row id.
    pub id: i64,
    /// The exchange it is published to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// The message id of its envelope.
    pub message_id: String,
    /// How many attempts have failed.
    pub attempts: u32,
    /// Why the last one failed.
    pub last_error: Option<String>,
    /// When it is tried next, in milliseconds since the epoch (database clock).
    pub next_attempt_at: i64,
    /// When it was added, in milliseconds since the epoch (database clock).
    pub created_at: i64,
}
