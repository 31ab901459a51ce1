//! A delivered message: the parsed payload, the envelope, and where it came from.

use crate::envelope::Envelope;
use crate::wire::Props;
use serde_json::Value;

/// Where a delivery came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryInfo {
    /// The queue it was consumed from.
    pub queue: String,
    /// The exchange it was published to (empty for the default exchange).
    pub exchange: String,
    /// The routing key it was published with.
    pub routing_key: String,
    /// The broker has delivered it before (a consumer went away unacked).
    pub redelivered: bool,
    /// Every AMQP property it arrived with (`correlation_id`, `reply_to`,
    /// `priority`, `content_encoding`, `expiration`, `user_id`, ...), and its
    /// headers as they arrived, the `x-acemq-*` ones included
    /// ([`Props::header`], [`Props::header_bytes`] for byte arrays).
    pub properties: Props,
}

/// One message as a handler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The JSON body, parsed.
    pub payload: Value,
    /// Id, type, origin, timestamp, attempt, headers.
    pub envelope: Envelope,
    /// Queue, exchange, routing key, redelivered.
    pub delivery: DeliveryInfo,
}

impl Message {
    /// A message built by hand, for tests of a handler: no broker involved.
    pub fn new(payload: Value, envelope: Envelope) -> Self {
        Message { payload, envelope, delivery: DeliveryInfo::default() }
    }
}
