//! What the broker at the other end does, by its version: RabbitMQ changed
//! delivery limits, what counts toward them and where `consumer_timeout`
//! applies between 3.10, 4.0 and 4.3. Each answer here was measured on
//! RabbitMQ 3.10.8, 4.0.5 and 4.3.6 (docs/production.md, "RabbitMQ
//! versions"); a version between two measured ones is given the older
//! one's answer where that is the safer one.

use std::fmt;

/// A RabbitMQ version, as its connection.start's `version` property says it
/// (`4.3.6`; anything after the third number, such as `-rc.1`, is ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BrokerVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl BrokerVersion {
    /// Parse `4.3.6`, `3.10.8`, `4.1.0-rc.1`; None for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.trim().splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next().map_or(Some(0), |p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })?;
        Some(BrokerVersion { major, minor, patch })
    }

    const fn at_least(&self, major: u32, minor: u32) -> bool {
        self.major > major || (self.major == major && self.minor >= minor)
    }

    /// The delivery limit a quorum queue has when it was declared without
    /// one: 20 since RabbitMQ 4.0, none before.
    pub fn default_delivery_limit(&self) -> Option<u64> {
        self.at_least(4, 0).then_some(20)
    }

    /// Whether `basic.nack` with requeue counts toward a quorum queue's
    /// delivery limit. Measured: it does on 3.10.8 and 4.0.5 (as
    /// `basic.reject`, a closed channel and a cancelled consumer's
    /// unsettled deliveries do); on 4.3.6 it does not (it only raises
    /// `x-acquired-count`), while `basic.reject` and a closed channel still
    /// do. 4.1 and 4.2 are not measured and are taken to count.
    pub fn nack_requeue_counts(&self) -> bool {
        !self.at_least(4, 3)
    }

    /// Whether `x-delivery-limit: -1` means unlimited: on 4.x; on 3.10 it
    /// dead-letters (or drops) a message at its first return.
    pub fn negative_delivery_limit_is_unlimited(&self) -> bool {
        self.at_least(4, 0)
    }

    /// Whether `consumer_timeout` applies to consumers of a classic queue.
    /// Measured with `consumer_timeout = 2000`: 3.10.8 and 4.0.5 close the
    /// channel (406) of a consumer of either type; 4.3.6 leaves a classic
    /// queue's consumer alone and cancels a quorum queue's consumer
    /// (basic.cancel), the channel staying open.
    pub fn consumer_timeout_covers_classic_queues(&self) -> bool {
        !self.at_least(4, 3)
    }

    /// Whether the broker ends a consumer that held a delivery past
    /// `consumer_timeout` with basic.cancel (the channel stays open and the
    /// delivery goes back to the queue) rather than by closing its channel.
    pub fn consumer_timeout_cancels(&self) -> bool {
        self.at_least(4, 3)
    }
}

impl fmt::Display for BrokerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_rabbitmq_writes_them() {
        let v = |s| BrokerVersion::parse(s).unwrap();
        assert_eq!(v("4.3.6"), BrokerVersion { major: 4, minor: 3, patch: 6 });
        assert_eq!(v("4.1.0-rc.1").to_string(), "4.1.0");
        assert_eq!(v("3.10"), BrokerVersion { major: 3, minor: 10, patch: 0 });
        assert!(v("3.10.8") < v("4.0.5") && v("4.0.5") < v("4.3.6"));
        assert_eq!(BrokerVersion::parse("fake"), None);
        assert_eq!(BrokerVersion::parse(""), None);
    }

    #[test]
    fn each_measured_version_answers_as_measured() {
        let v = |s| BrokerVersion::parse(s).unwrap();
        assert_eq!(v("3.10.8").default_delivery_limit(), None);
        assert_eq!(v("4.0.5").default_delivery_limit(), Some(20));
        assert!(v("3.10.8").nack_requeue_counts() && v("4.0.5").nack_requeue_counts());
        assert!(!v("4.3.6").nack_requeue_counts());
        assert!(!v("3.10.8").negative_delivery_limit_is_unlimited() && v("4.0.5").negative_delivery_limit_is_unlimited());
        assert!(v("4.0.5").consumer_timeout_covers_classic_queues() && !v("4.3.6").consumer_timeout_covers_classic_queues());
    }
}
