//! The retry policy and the ladder of delay queues it implies.

use crate::error::{Error, Result};
use std::time::Duration;

/// How a consumer retries a message that was not accepted.
///
/// Attempt `n` (1-based) that fails waits `initial_delay * 2^(n-1)`, capped at
/// `max_delay`, in a rung queue before it comes back. The attempt numbered
/// `max_attempts` that fails is dead-lettered with "retries exhausted".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Deliveries in all, the first included. At least 1; 1 means never retry.
    pub max_attempts: u32,
    /// The delay after the first failure.
    pub initial_delay: Duration,
    /// The longest delay: doubling stops here.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Five attempts, 1 s doubling to at most 5 min: a message that fails for
    /// a transient reason (a deploy, a database failover) gets about 15 s of
    /// chances before it is dead-lettered, without a redelivery storm.
    fn default() -> Self {
        RetryPolicy { max_attempts: 5, initial_delay: Duration::from_secs(1), max_delay: Duration::from_secs(300) }
    }
}

impl RetryPolicy {
    /// A policy; checked with [`RetryPolicy::validate`] before it is used.
    pub fn new(max_attempts: u32, initial_delay: Duration, max_delay: Duration) -> Self {
        RetryPolicy { max_attempts, initial_delay, max_delay }
    }

    /// Refuse a policy that cannot work, at declaration rather than at the first failure.
    pub fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::invalid(
                "max_attempts must be at least 1 (1 means no retries: a failure is dead-lettered at once)",
            ));
        }
        if self.max_attempts > 1 && self.initial_delay.is_zero() {
            return Err(Error::invalid("initial_delay must be greater than zero when retries are allowed"));
        }
        if self.max_delay < self.initial_delay {
            return Err(Error::invalid(format!(
                "max_delay ({:?}) must not be shorter than initial_delay ({:?})",
                self.max_delay, self.initial_delay
            )));
        }
        Ok(())
    }

    /// The delay before attempt `failed_attempt + 1`.
    pub fn delay_after(&self, failed_attempt: u32) -> Duration {
        let shift = failed_attempt.saturating_sub(1).min(32);
        let delay = self.initial_delay.saturating_mul(1u32 << shift.min(31));
        delay.min(self.max_delay)
    }

    /// Every distinct delay the ladder needs, shortest first: one rung queue each.
    pub fn rungs(&self) -> Vec<Duration> {
        let mut out: Vec<Duration> = Vec::new();
        for attempt in 1..self.max_attempts {
            let d = self.delay_after(attempt);
            if out.last() != Some(&d) {
                out.push(d);
            }
        }
        out
    }

    /// The rung queues this ladder puts behind `queue`, shortest delay
    /// first: what an operator looks for in the broker's queue list.
    pub fn rung_queues(&self, queue: &str) -> Vec<String> {
        self.rungs().into_iter().map(|d| rung_name(queue, d)).collect()
    }
}

/// The rung queue for `delay` behind `queue`: `{queue}.retry.{delay}`, where
/// the delay is written so that a person reading the queue list sees it
/// (`500ms`, `1s`, `300s`).
pub fn rung_name(queue: &str, delay: Duration) -> String {
    let ms = delay.as_millis();
    if ms % 1000 == 0 {
        format!("{queue}.retry.{}s", ms / 1000)
    } else {
        format!("{queue}.retry.{ms}ms")
    }
}

/// The dead-letter queue behind `queue`.
pub fn dlq_name(queue: &str) -> String {
    format!("{queue}.dlq")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_cap() {
        let p = RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(p.rungs(), vec![1, 2, 4, 8].into_iter().map(Duration::from_secs).collect::<Vec<_>>());
        let capped = RetryPolicy::new(6, Duration::from_secs(100), Duration::from_secs(300));
        assert_eq!(capped.rungs(), vec![100, 200, 300].into_iter().map(Duration::from_secs).collect::<Vec<_>>());
    }

    #[test]
    fn bad_policies_are_refused() {
        assert!(RetryPolicy::new(0, Duration::from_secs(1), Duration::from_secs(2)).validate().is_err());
        assert!(RetryPolicy::new(3, Duration::ZERO, Duration::from_secs(2)).validate().is_err());
        assert!(RetryPolicy::new(3, Duration::from_secs(5), Duration::from_secs(2)).validate().is_err());
        assert!(RetryPolicy::new(1, Duration::ZERO, Duration::ZERO).validate().is_ok());
    }

    #[test]
    fn rung_names_show_the_delay() {
        assert_eq!(rung_name("payments", Duration::from_secs(4)), "payments.retry.4s");
        assert_eq!(rung_name("payments", Duration::from_millis(250)), "payments.retry.250ms");
        assert_eq!(dlq_name("payments"), "payments.dlq");
    }

    #[test]
    fn rung_queues_are_the_ladders_distinct_delays() {
        let policy = RetryPolicy::new(6, Duration::from_secs(1), Duration::from_secs(4));
        assert_eq!(policy.rung_queues("payments"), ["payments.retry.1s", "payments.retry.2s", "payments.retry.4s"]);
        assert!(RetryPolicy::new(1, Duration::ZERO, Duration::ZERO).rung_queues("payments").is_empty());
    }
}
