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
    /// Seconds since the epoch when it was first published (AMQP
    /// `timestamp`): now for a new envelope; None for a consumed message
    /// whose publisher set none (pika, amqplib and most clients leave it
    /// out), never 0 (1970).
    pub timestamp: Option<u64>,
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
            timestamp: Some(now_secs()),
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
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let id = match random_bits() {
        Some(random) => uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid(),
        None => uuid::Uuid::now_v7(),
    };
    let mut text = uuid::Uuid::encode_buffer();
    id.hyphenated().encode_lower(&mut text).to_owned()
}

/// Random bytes drawn from the system at a time: a UUIDv7 takes ten, and a
/// system call for each was most of what making an id cost.
const RANDOM_BUFFER: usize = 1000;

/// Ten random bytes for an id, from a buffer of this thread's refilled from
/// the system. A forked child must not hand out its parent's bytes (two
/// processes would make the same ids in the same millisecond): the buffer
/// knows the process it was filled in and is refilled in any other. None
/// when the system has no randomness to give, and the id takes uuid's own.
fn random_bits() -> Option<[u8; 10]> {
    struct Buffer {
        pid: u32,
        at: usize,
        bytes: [u8; RANDOM_BUFFER],
    }
    thread_local! {
        static BUFFER: std::cell::RefCell<Buffer> =
            const { std::cell::RefCell::new(Buffer { pid: 0, at: RANDOM_BUFFER, bytes: [0; RANDOM_BUFFER] }) };
    }
    BUFFER.with(|b| {
        let mut b = b.borrow_mut();
        let pid = std::process::id();
        if b.pid != pid || b.at + 10 > RANDOM_BUFFER {
            getrandom::fill(&mut b.bytes).ok()?;
            b.pid = pid;
            b.at = 0;
        }
        let at = b.at;
        b.at += 10;
        let mut out = [0; 10];
        out.copy_from_slice(&b.bytes[at..at + 10]);
        Some(out)
    })
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_uuidv7_unique_and_time_ordered_across_buffer_refills() {
        // Several refills of the random buffer (100 ids each).
        let ids: Vec<String> = (0..2_500).map(|_| new_id()).collect();
        let mut seen = std::collections::HashSet::new();
        for id in &ids {
            let u = uuid::Uuid::parse_str(id).expect("a UUID");
            assert_eq!(u.get_version_num(), 7, "{id}");
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122, "{id}");
            assert_eq!(id, &id.to_lowercase());
            assert!(seen.insert(u.as_bytes()[6..].to_vec()), "random part repeated: {id}");
        }
        let millis = |id: &str| uuid::Uuid::parse_str(id).unwrap().get_timestamp().unwrap().to_unix().0;
        assert!(millis(&ids[0]) <= millis(&ids[ids.len() - 1]));
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert!(now - millis(&ids[0]) < 5, "the timestamp is now");
    }
}
