//! Partitions: order per key across several runners.
//!
//! A partitioned queue is `partitions` queues, `{queue}.p0` … `{queue}.pN-1`,
//! each declared with `x-single-active-consumer`: every runner subscribes to
//! every partition, and the broker hands each partition's messages to one of
//! them at a time, in queue order, failing over to the next when that one's
//! channel goes (a runner killed, its connection lost). A message goes to the
//! partition its key hashes to, so the messages of one key are handled one
//! after another, in the order they were published, by one consumer.
//!
//! The hash is computed here, in the library, rather than by RabbitMQ's
//! consistent-hash exchange: the plugin is off by default and would have to
//! be enabled on every broker (and every node of a cluster) an application
//! meets, and its ring spreads keys by weight over however many queues are
//! bound, so the publisher cannot say which queue a key lands on. Here the
//! partition of a key is a pure function of the key and the count: the same
//! in Ruby and Rust (both call this), testable without a broker, and a
//! publisher needs no plugin, only the count the consumer declared.
//!
//! What survives a retry: nothing of the order. A message that fails goes
//! round the retry ladder and comes back behind the messages published after
//! it; the next message of its key is not held back meanwhile. Order holds
//! for every key among the messages that did not fail. A runner that dies
//! mid-handler under the idempotent guard costs no order: its claimed
//! message is held in place by the next owner
//! ([`Idempotent::keep_order`](crate::idempotency::Idempotent::keep_order)),
//! and taken over at once when the dead runner's process has provably
//! exited (docs/ordering.md).

use crate::error::{Error, Result};

/// The most partitions a queue may have.
pub const MAX_PARTITIONS: u16 = 1024;

/// Where a partitioned message goes: the key that picks the partition, and
/// how many partitions the queue has (what its consumers declared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionKey {
    /// The key (an account id): messages with the same key keep their order.
    pub key: String,
    /// The queue's partition count.
    pub partitions: u16,
}

impl PartitionKey {
    /// `key` over `partitions` partitions.
    pub fn new(key: impl Into<String>, partitions: u16) -> Self {
        PartitionKey { key: key.into(), partitions }
    }

    /// The partition queue of `queue` this key goes to.
    pub fn queue(&self, queue: &str) -> Result<String> {
        check_count(self.partitions)?;
        Ok(partition_queue(queue, partition_of(&self.key, self.partitions)))
    }
}

/// Refuse a count that cannot be a partitioned queue.
pub fn check_count(partitions: u16) -> Result<()> {
    count(i64::from(partitions)).map(|_| ())
}

/// The count as a partitioned queue takes it, from any whole number a
/// caller was given (Ruby's, which may be -1 or 2**40): refused, with the
/// number as given, unless it is 1 to [`MAX_PARTITIONS`].
pub fn count(partitions: i64) -> Result<u16> {
    match u16::try_from(partitions) {
        Ok(n) if (1..=MAX_PARTITIONS).contains(&n) => Ok(n),
        _ => Err(Error::invalid(format!(
            "partitions must be between 1 and {MAX_PARTITIONS} (got {partitions}); the publisher must give the count its consumers declared"
        ))),
    }
}

/// The partition (0..partitions) of `key`: FNV-1a (64 bits) of its UTF-8
/// bytes, modulo the count. Stable across versions and languages: changing
/// it would move every key, and with it the order of messages in flight.
pub fn partition_of(key: &str, partitions: u16) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(partitions.max(1))) as u16
}

/// The name of partition `partition` of `queue`: `{queue}.p{partition}`.
pub fn partition_queue(queue: &str, partition: u16) -> String {
    format!("{queue}.p{partition}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_goes_to_the_same_partition_and_keys_spread() {
        // Fixed values: a change of hash moves keys, and must fail here.
        assert_eq!(partition_of("", 8), (0xcbf2_9ce4_8422_2325u64 % 8) as u16);
        assert_eq!(partition_of("acct-1", 8), partition_of("acct-1", 8));
        let mut seen = [0u32; 8];
        for n in 0..1000 {
            seen[usize::from(partition_of(&format!("acct-{n}"), 8))] += 1;
        }
        assert!(seen.iter().all(|&c| c > 80), "uneven: {seen:?}");
        assert_eq!(partition_queue("shop.payments", 3), "shop.payments.p3");
        assert_eq!(PartitionKey::new("acct-1", 8).queue("q").unwrap(), format!("q.p{}", partition_of("acct-1", 8)));
        assert!(PartitionKey::new("acct-1", 0).queue("q").is_err());
    }
}
