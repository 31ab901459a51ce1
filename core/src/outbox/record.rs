//! One message waiting in the outbox: where it goes, what it says, and the
//! envelope it will travel with.

use crate::envelope::Envelope;
use crate::error::Result;
use serde::Serialize;

/// A message written to the outbox in the caller's transaction and published
/// later by a relay.
///
/// The envelope is stored as it was built, so a message that went through the
/// outbox is indistinguishable on the wire from one published directly: same
/// id, type, origin, timestamp and headers. `envelope.attempt` is not stored;
/// a relayed message is a first publish and carries attempt 1.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRecord {
    /// The row id: `None` before [`add`](crate::outbox::SqlOutboxStore::add),
    /// always set on a record returned by
    /// [`claim`](crate::outbox::SqlOutboxStore::claim).
    pub id: Option<i64>,
    /// The exchange to publish to (empty for the default exchange).
    pub exchange: String,
    /// The routing key to publish with.
    pub routing_key: String,
    /// The body, JSON text, published byte for byte.
    pub body: String,
    /// Id, type, origin, timestamp and headers.
    pub envelope: Envelope,
}

impl OutboxRecord {
    /// A record with a body that is already JSON text.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        body: impl Into<String>,
        envelope: Envelope,
    ) -> Self {
        OutboxRecord {
            id: None,
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body: body.into(),
            envelope,
        }
    }

    /// Whether the relay could ever send it: a destination, names and
    /// properties within the broker's limits. `add` checks it too; an
    /// application that builds records ahead of the transaction can refuse a
    /// bad one where it is made rather than as a row the relay cannot send.
    pub fn check(&self) -> Result<()> {
        crate::connection::check_destination(&self.exchange, &self.routing_key, &crate::wire::props_for(&self.envelope))
    }

    /// A record whose body is `payload` serialized to JSON.
    pub fn json<T: Serialize + ?Sized>(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        payload: &T,
        envelope: Envelope,
    ) -> Result<Self> {
        let body = serde_json::to_string(payload)?;
        Ok(Self::new(exchange, routing_key, body, envelope))
    }
}
