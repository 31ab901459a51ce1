//! Delayed delivery on any RabbitMQ, with no plugin: a cascade of TTL levels.
//!
//! Level `k` is an exchange and a quorum queue, both `acemq.delay.NN`, whose
//! messages wait 2^k seconds and are then dead-lettered to level `k - 1`
//! (level 0 to `acemq.delay.deliver`). A delayed message is published to the
//! level of the highest set bit of its delay in whole seconds, with a routing
//! key that spells every bit of the delay and then the destination:
//!
//! ```text
//! acemq-delay.0.0. ... .1.0.1.q.payments      5 s to the queue "payments"
//! acemq-delay.0.0. ... .1.1.0.x.orders-events 6 s to the exchange "orders-events"
//! ```
//!
//! Each level's exchange sends a key whose bit `k` is 1 to its queue and one
//! whose bit is 0 straight on to the next level (an exchange-to-exchange
//! binding), so a message waits in at most one queue per set bit: 5 s is 4 s
//! in level 2 and 1 s in level 0. The delivery exchange is bound to each
//! destination once, the first time something is delayed to it. To an
//! exchange the message carries its own routing key in `CC`, which RabbitMQ
//! routes alongside the cascade's key at every hop and, at the destination,
//! with its bindings, so the destination's bindings match the key it was
//! published with (its consumers see the cascade's key as the delivery's
//! routing key: AMQP delivers the key a message was first published with;
//! `CC` itself is taken off on arrival). The queue count is fixed ([`LEVELS`] of them) whatever
//! the delays are (NServiceBus's design for RabbitMQ).
//!
//! The due time travels in the message ([`DUE_HEADER`], milliseconds since
//! the epoch), so an outbox row relayed late waits only what is left, and a
//! copy of a delivered message (a retry, a forward) is never delayed again.

pub use crate::cascade::{due_ms, due_of, epoch_ms, level_name, remaining_secs, DELIVER_EXCHANGE, DUE_HEADER, LEVELS, MAX_DELAY};
use crate::error::Result;

/// How many messages wait in each level of the cascade, level 0 first: the
/// level queues' ready counts on RabbitMQ (0 for a level not declared yet),
/// the `memory://` broker's delayed messages by the level they would be in.
/// What `acemq status` and the dashboard show.
pub async fn waiting(conn: &crate::Connection) -> Result<Vec<u64>> {
    if let Some(b) = conn.memory_broker() {
        return Ok(b.delayed_by_level());
    }
    let mut out = Vec::with_capacity(LEVELS as usize);
    for k in 0..LEVELS {
        out.push(conn.queue_counts(&level_name(k)).await?.map_or(0, |c| c.ready));
    }
    Ok(out)
}
