//! Startup checks: settings that each look fine alone and together lose
//! messages or run them twice. Run when a consumer opens; a conflict that
//! cannot work is an error, one that may be meant is a warning
//! ([`crate::Consumer::warnings`]). Each says what to change.

use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use std::time::Duration;

/// A duration as a person writes it: `25m`, `30s`, `1.5s`, `250ms`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// The handler deadline against what bounds it: above zero; shorter than
/// the broker's `consumer_timeout`, which would otherwise close the whole
/// channel first (every delivery on it back to the queue, every handler's
/// settlement lost); and, for a guarded handler, no longer than the
/// idempotency claim, which another worker takes over when it expires (the
/// message would run twice at once).
pub fn handler_timeout(timeout: Duration, broker: Duration, claim_timeout: Option<Duration>) -> Result<()> {
    if timeout.is_zero() {
        return Err(Error::invalid("timeout must be longer than zero: it is how long a handler may run before its delivery is retried"));
    }
    if timeout >= broker {
        return Err(Error::invalid(format!(
            "timeout ({}) must be shorter than the broker's consumer_timeout ({}): RabbitMQ would close the channel first and redeliver \
             every message on it; lower the timeout, or if your broker's consumer_timeout is longer, set the consumer's consumer timeout option to it",
            human(timeout),
            human(broker)
        )));
    }
    if let Some(claim) = claim_timeout {
        if timeout > claim {
            return Err(Error::invalid(format!(
                "timeout ({}) is longer than the idempotency store's claim_timeout ({}): a handler still running when its claim expires \
                 has it taken over, and the message runs twice at once; lower the timeout to at most {}, or raise the store's claim_timeout",
                human(timeout),
                human(claim),
                human(claim)
            )));
        }
    }
    Ok(())
}

/// A quorum queue's delivery limit against the ladder. Retries are copies
/// (new messages), so the limit counts only deliveries given back unsettled.
/// What counts, measured: a closed channel's deliveries (a consumer killed
/// holding one, a channel lost) and basic.reject with requeue on 3.10.8,
/// 4.0.5 and 4.3.6; basic.nack with requeue (AceMQ's give-back when a copy
/// cannot be made) on 3.10.8 and 4.0.5 but not 4.3.6; a consumer_timeout
/// return on 3.10.8 and 4.0.5 (the channel is closed) but not 4.3.6 (the
/// consumer is cancelled). Below `max_attempts`, a message that meets a few
/// of those is dead-lettered by the broker — without AceMQ's reason, before
/// the ladder has had its attempts. The limit is the queue's own, or the
/// broker's default for a quorum queue declared without one (20 on 4.x).
pub fn delivery_limit(queue: &str, limit: Option<u64>, policy: &RetryPolicy) -> Option<String> {
    let limit = limit?;
    (limit < u64::from(policy.max_attempts)).then(|| {
        format!(
            "{queue}: x-delivery-limit {limit} is below max_attempts {}: a message given back unsettled {limit} times (consumers killed \
             holding it, channels lost) is dead-lettered by the broker before the retry ladder has had its attempts; raise \
             x-delivery-limit to at least {} (AceMQ declares 20 unless told otherwise; RabbitMQ 4.x gives 20 to a quorum queue declared without one)",
            policy.max_attempts, policy.max_attempts
        )
    })
}

/// The ladder against an idempotent handler's claim. A redelivery that finds
/// the key claimed by another handler waits on the ladder's rungs without
/// spending attempts until the claim expires ([`crate::Outcome::Wait`]);
/// with no rungs (`max_attempts` 1) it cannot wait, and is dead-lettered
/// unrun while the other handler may have died.
pub fn ladder_and_claim(queue: &str, policy: &RetryPolicy, claim_timeout: Option<Duration>) -> Option<String> {
    let claim = claim_timeout?;
    (policy.max_attempts <= 1).then(|| {
        format!(
            "{queue}: max_attempts 1 leaves an idempotent consumer nowhere to wait: a redelivery that finds its key claimed by a \
             handler that died (a claim lives {}) is dead-lettered without running; allow retries (max_attempts 2 or more)",
            human(claim)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        assert_eq!(human(Duration::from_secs(1500)), "25m");
        assert_eq!(human(Duration::from_secs(30)), "30s");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn a_deadline_past_the_broker_or_the_claim_is_refused_naming_both() {
        let min = Duration::from_secs(60);
        let e = handler_timeout(30 * min, 30 * min, None).unwrap_err().to_string();
        assert!(e.contains("30m") && e.contains("consumer_timeout"), "{e}");
        let e = handler_timeout(10 * min, 30 * min, Some(5 * min)).unwrap_err().to_string();
        assert!(e.contains("10m") && e.contains("5m") && e.contains("twice"), "{e}");
        assert!(handler_timeout(5 * min, 30 * min, Some(5 * min)).is_ok());
        assert!(handler_timeout(Duration::ZERO, 30 * min, None).is_err());
    }

    #[test]
    fn a_delivery_limit_below_the_attempts_is_named() {
        let p = RetryPolicy::default();
        let w = delivery_limit("payments", Some(3), &p).unwrap();
        assert!(w.contains("x-delivery-limit 3") && w.contains("max_attempts 5"), "{w}");
        assert!(delivery_limit("payments", Some(20), &p).is_none());
        assert!(delivery_limit("payments", None, &p).is_none());
    }

    #[test]
    fn one_attempt_with_a_claim_is_named() {
        let one = RetryPolicy::new(1, Duration::ZERO, Duration::ZERO);
        assert!(ladder_and_claim("q", &one, Some(Duration::from_secs(300))).unwrap().contains("5m"));
        assert!(ladder_and_claim("q", &RetryPolicy::default(), Some(Duration::from_secs(300))).is_none());
        assert!(ladder_and_claim("q", &one, None).is_none());
    }
}
