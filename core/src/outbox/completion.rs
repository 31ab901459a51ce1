//! What happened to one claimed record: the input of
//! [`complete`](crate::outbox::SqlOutboxStore::complete).

use super::OutboxRecord;
use std::fmt::Display;

/// The outcome of publishing one claimed record.
///
/// Plain data (the error is already text) so the Ruby extension can build it
/// from the results it got without the GVL and pass it back on a Ruby thread.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The row id of the claimed record.
    pub id: i64,
    /// `Ok` once the broker confirmed it; otherwise why not.
    pub result: Result<(), String>,
    /// Where it was going, for reporting.
    pub exchange: String,
    /// Its routing key, for reporting.
    pub routing_key: String,
}

impl Completion {
    /// The broker confirmed `record`: its row is deleted.
    pub fn confirmed(record: &OutboxRecord) -> Self {
        Self::of(record, Ok(()))
    }

    /// Publishing `record` failed: its row is retried after a backoff.
    pub fn failed(record: &OutboxRecord, error: impl Display) -> Self {
        Self::of(record, Err(error.to_string()))
    }

    fn of(record: &OutboxRecord, result: Result<(), String>) -> Self {
        Completion {
            // A record without an id was never claimed; 0 matches no row
            // (ids start at 1), so completing it does nothing.
            id: record.id.unwrap_or(0),
            result,
            exchange: record.exchange.clone(),
            routing_key: record.routing_key.clone(),
        }
    }
}

impl crate::events::OutboxOutcome for Completion {
    fn destination(&self) -> (&str, &str) {
        (&self.exchange, &self.routing_key)
    }

    fn error(&self) -> Option<&str> {
        self.result.as_ref().err().map(String::as_str)
    }
}

impl From<(i64, Result<(), String>, String, String)> for Completion {
    fn from((id, result, exchange, routing_key): (i64, Result<(), String>, String, String)) -> Self {
        Completion { id, result, exchange, routing_key }
    }
}
