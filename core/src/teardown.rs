//! Taking a topology's queues down again: each queue with its DLQ and its
//! retry rungs, which `apply` and the consumer declared and nothing else
//! removes. For tests, and for retiring a consumer.

use crate::connection::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::retry::{dlq_name, RetryPolicy};
use crate::topology::Topology;

/// How [`Connection::teardown`] goes about it.
#[derive(Debug, Clone, Default)]
pub struct TeardownOptions {
    /// The ladders whose rungs to remove, as the consumers were opened with
    /// them (rung names follow the delays). Empty: the default ladder's.
    pub retry: Vec<RetryPolicy>,
    /// Delete even queues that hold messages or have consumers. Without it
    /// such a topology is refused whole, and nothing is deleted.
    pub force: bool,
}

/// What [`Connection::teardown`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeardownReport {
    /// The queues deleted, in order: each queue, its rungs, its DLQ.
    pub deleted: Vec<String>,
    /// Messages they held when deleted (only with `force`; ready messages,
    /// as the broker counts them).
    pub messages: u64,
}

impl Connection {
    /// Delete `topology`'s queues, each with its retry rungs and its DLQ.
    /// Exchanges stay (other queues may be bound to them); the queues'
    /// bindings go with the queues. A queue that does not exist is skipped,
    /// so tearing down twice is harmless.
    ///
    /// Refused with [`ErrorKind::InvalidArgument`], before anything is
    /// deleted, when any of those queues holds a message or a queue has a
    /// consumer: deleting them would lose the messages (the DLQ's
    /// included) or pull a queue from under a running consumer. Replay or
    /// drain them, stop the consumer, or set `force`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped teardown may have deleted some of the
    /// queues; running it again deletes the rest.
    pub async fn teardown(&self, topology: &Topology, options: &TeardownOptions) -> Result<TeardownReport> {
        let default = [RetryPolicy::default()];
        let ladders = if options.retry.is_empty() { &default[..] } else { &options.retry[..] };
        let mut names: Vec<String> = Vec::new();
        for spec in &topology.queues {
            names.push(spec.name.clone());
            for ladder in ladders {
                names.extend(ladder.rung_queues(&spec.name));
            }
            names.push(dlq_name(&spec.name));
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));

        let counts = self.backend().queue_counts_many(&names).await?;
        let present: Vec<(String, crate::QueueCounts)> =
            names.into_iter().zip(counts).filter_map(|(name, c)| c.map(|c| (name, c))).collect();
        let busy: Vec<String> = present
            .iter()
            .filter(|(_, c)| c.ready > 0 || c.consumers > 0)
            .map(|(name, c)| format!("{name} ({} messages, {} consumers)", c.ready, c.consumers))
            .collect();
        if !busy.is_empty() && !options.force {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "not tearing down: {} would lose messages or a running consumer; replay or drain them, stop the consumer, or pass force (nothing was deleted)",
                    busy.join(", ")
                ),
            ));
        }
        let messages = present.iter().map(|(_, c)| c.ready).sum();
        let deleted: Vec<String> = present.into_iter().map(|(name, _)| name).collect();
        self.backend().delete_queues(&deleted).await?;
        Ok(TeardownReport { deleted, messages })
    }
}
