//! How to consume: a consumer's options, their defaults and the rules for its sizes.

use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::topology::QueueType;
use super::{CircuitBreaker, Throttle};
use std::time::Duration;

/// The handler deadline when none is given: well inside RabbitMQ's default
/// `consumer_timeout` (30 minutes), so the broker never closes a channel
/// over a slow handler before the consumer has settled its delivery.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// RabbitMQ's default `consumer_timeout`.
pub const DEFAULT_BROKER_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How to consume.
#[derive(Debug, Clone)]
pub struct ConsumeOptions {
    /// Deliveries in flight at once, never unlimited. Default 32.
    pub prefetch: u16,
    /// Handlers running at once (push consumer; the Ruby consumer's threads).
    pub concurrency: usize,
    /// The retry ladder.
    pub retry: RetryPolicy,
    /// The type of the queue, which its DLQ and rungs take. None: what this
    /// connection applied for it in a topology, else classic.
    pub queue_type: Option<QueueType>,
    /// The handler deadline: a delivery not settled this long after it was
    /// handed out is settled by the consumer as a retry (reason and
    /// [`TIMEOUT_CLASS`](super::TIMEOUT_CLASS) on the copy), and whatever its handler returns
    /// later is discarded (counted as `abandoned`). The handler is not
    /// interrupted: nothing is killed mid-write. Default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// The broker's `consumer_timeout`, which `timeout` must be shorter than
    /// (RabbitMQ 3.10 and 4.0 close the whole channel of a consumer holding a
    /// delivery longer; 4.3 cancels a quorum queue's consumer and leaves
    /// classic queues alone, so a queue known to be classic is not checked
    /// against it there). Default RabbitMQ's own,
    /// [`DEFAULT_BROKER_CONSUMER_TIMEOUT`].
    pub broker_consumer_timeout: Duration,
    /// The idempotency store's claim timeout, when the handler is guarded
    /// (the Ruby consumer fills it from the handler's store): `timeout` must
    /// not be longer, or a handler still running has its claim taken over.
    pub claim_timeout: Option<Duration>,
    /// The consumer's name in events and logs (the Ruby consumer class's
    /// name). None: the queue's.
    pub name: Option<String>,
    /// Pause when handlers keep failing ([`CircuitBreaker`]). None: never.
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Hand out at most so many messages per period, in this process
    /// ([`Throttle`]). None: as fast as the handlers take them.
    pub throttle: Option<Throttle>,
    /// Share the throttle's limit with every process whose consumer of the
    /// same name uses the same store: leases of tokens from a SQL row
    /// ([`crate::throttle`]). Needs `throttle`. None: the limit is per process.
    pub throttle_store: Option<crate::throttle::SharedStore>,
    /// The queue is single active consumer and its order matters (a
    /// partition, [`crate::partition`]): stopping does not cancel on the
    /// broker, which would hand the next consumer the messages behind the
    /// ones this one still holds; it stops handing out, and closing the
    /// channel gives back what was held, at the head and in order, as the
    /// next consumer takes over. Default false.
    pub keep_order: bool,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        Self::with_concurrency(1)
    }
}

impl ConsumeOptions {
    /// The defaults for `concurrency` handlers: a prefetch of 32, or twice
    /// the concurrency when that is more (each handler has one delivery in
    /// hand and one waiting, so none idles while the broker sends the next),
    /// and the default retry ladder.
    pub fn with_concurrency(concurrency: usize) -> Self {
        Self::with_batches(concurrency, 1)
    }

    /// For a handler guarded by an idempotency store whose claims last
    /// `claim_timeout` ([`crate::idempotency::IdempotencyStore::claim_timeout`]):
    /// kept for the startup checks, and the handler deadline lowered to it
    /// when that is shorter, since past it the claim could be taken over
    /// and the message run twice at once. A `timeout` set after this is
    /// the caller's own (the checks refuse one longer than the claim).
    pub fn guarded_by(mut self, claim_timeout: Duration) -> Self {
        self.claim_timeout = Some(claim_timeout);
        self.timeout = self.timeout.min(claim_timeout);
        self
    }

    /// The defaults for `concurrency` handlers that each take up to `batch`
    /// deliveries at once (the idempotent guard's batch path): a prefetch of
    /// twice `concurrency × batch`, at least 32. Each handler has one batch in
    /// hand and the next arriving; with a prefetch of only one batch the
    /// broker sends nothing new until a batch is acknowledged, and a batch
    /// can never be bigger than the prefetch.
    pub fn with_batches(concurrency: usize, batch: usize) -> Self {
        let prefetch =
            u16::try_from(concurrency.saturating_mul(batch.max(1)).saturating_mul(2)).unwrap_or(u16::MAX).max(32);
        ConsumeOptions {
            prefetch,
            concurrency,
            retry: RetryPolicy::default(),
            queue_type: None,
            timeout: DEFAULT_TIMEOUT,
            broker_consumer_timeout: DEFAULT_BROKER_CONSUMER_TIMEOUT,
            claim_timeout: None,
            name: None,
            circuit_breaker: None,
            throttle: None,
            throttle_store: None,
            keep_order: false,
        }
    }

    /// The rules for a consumer's sizes, once: what `open` checks, and what
    /// Ruby's `consume` and the Rails DSL check through the extension where
    /// they are given. `prefetch` None is the default (always valid).
    pub fn check_sizes(concurrency: u64, prefetch: Option<u64>, batch: u64) -> Result<()> {
        if concurrency == 0 {
            return Err(Error::invalid("concurrency must be at least 1"));
        }
        match prefetch {
            Some(0) => return Err(Error::invalid("prefetch must be at least 1: unlimited prefetch is not offered")),
            Some(p) if p > u64::from(u16::MAX) => {
                return Err(Error::invalid(format!("prefetch must be at most 65535, AMQP's 16-bit field (got {p})")))
            }
            _ => {}
        }
        if batch == 0 {
            return Err(Error::invalid("batch must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ConsumeOptions;

    #[test]
    fn the_default_prefetch_is_two_deliveries_or_two_batches_per_handler() {
        assert_eq!(ConsumeOptions::with_concurrency(1).prefetch, 32);
        assert_eq!(ConsumeOptions::with_concurrency(40).prefetch, 80);
        assert_eq!(ConsumeOptions::with_batches(1, 100).prefetch, 200);
        assert_eq!(ConsumeOptions::with_batches(4, 100).prefetch, 800);
        assert_eq!(ConsumeOptions::with_batches(1000, 1000).prefetch, u16::MAX);
    }

    #[test]
    fn a_guarded_handlers_deadline_is_its_claims_when_that_is_shorter() {
        use std::time::Duration;
        let short = ConsumeOptions::default().guarded_by(Duration::from_secs(60));
        assert_eq!((short.timeout, short.claim_timeout), (Duration::from_secs(60), Some(Duration::from_secs(60))));
        let long = ConsumeOptions::default().guarded_by(Duration::from_secs(3600));
        assert_eq!(long.timeout, super::DEFAULT_TIMEOUT);
        // A timeout the caller sets afterwards is theirs; the startup checks
        // refuse it when it outlives the claim.
        let mut named = ConsumeOptions::default().guarded_by(Duration::from_secs(60));
        named.timeout = Duration::from_secs(120);
        assert!(crate::checks::handler_timeout(named.timeout, named.broker_consumer_timeout, named.claim_timeout).is_err());
    }
}
