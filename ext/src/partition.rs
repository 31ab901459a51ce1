//! AceMQ::AMQP.partition_queue and .partition_queues: core's partitions
//! (acemq::partition), so Ruby names and picks partitions exactly as Rust
//! does.

use crate::errors::IntoRuby;
use magnus::{function, prelude::*, Error, RModule, Ruby};

/// The partition queue of `queue` that `key` goes to, of `partitions`.
fn partition_queue(ruby: &Ruby, queue: String, key: String, partitions: i64) -> Result<String, Error> {
    let partitions = acemq::partition::count(partitions).rb(ruby)?;
    acemq::partition::PartitionKey::new(key, partitions).queue(&queue).rb(ruby)
}

/// Every partition queue of `queue`, in order.
fn partition_queues(ruby: &Ruby, queue: String, partitions: i64) -> Result<Vec<String>, Error> {
    let partitions = acemq::partition::count(partitions).rb(ruby)?;
    Ok((0..partitions).map(|p| acemq::partition::partition_queue(&queue, p)).collect())
}

pub fn init(_ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    amqp.define_singleton_method("partition_queue", function!(partition_queue, 3))?;
    amqp.define_singleton_method("partition_queues", function!(partition_queues, 2))?;
    Ok(())
}
