//! The envelope: what travels with a payload in AMQP properties and headers.

use crate::headers::Headers;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

/// Header carrying the message id, unchanged across retries, rungs and the DLQ.
pub const ID_HEADER: &str = "x-acemq-id";
/// Header carrying the publishing connection's origin.
pub const ORIGIN_HEADER: &str = "x-acemq-origin";
/// Header carrying the attempt number (1 for the first delivery).
pub const ATTEMPT_HEADER: &str = "x-acemq-attempt";

/// Identity and metadata of one message.
///
/// `id` is a UUIDv7 unless given. It is the idempotency key by default, so it
/// is carried unchanged through every retry, every rung queue and the DLQ.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The message id (`message_id` and `x-acemq-id`).
    pub id: String,
    /// The message type, e.g. `payment.requested.v1` (AMQP `type`).
    pub kind: Option<String>,
    /// Who published it (AMQP `app_id` and `x-acemq-origin`).
    pub origin: Option<String>,
    /// Seconds since the epoch when it was first published (AMQP `timestamp`).
    pub timestamp: u64,
    /// 1 on the first delivery, raised by one on every retry.
    pub attempt: u32,
    /// Application headers, without the `x-acemq-*` ones.
    pub headers: Headers,
}

impl Default for Envelope {
    fn default() -> Self {
        Self::new()
    }
}

impl Envelope {
    /// A fresh envelope: a new UUIDv7 id, now, attempt 1.
    pub fn new() -> Self {
        Envelope {
            id: new_id(),
            kind: None,
            origin: None,
            timestamp: now_secs(),
            attempt: 1,
            headers: Headers::new(),
        }
    }

    /// Set the type.
    pub fn with_type(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Set the id (to force a known id, e.g. in a test).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Add an application header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
}

/// A new UUIDv7, as text. Time-ordered, so ids sort roughly by publish time.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
