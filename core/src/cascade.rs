//! The mechanism of [`crate::delay`] (whose docs explain the cascade): its
//! names, the route of a delayed message and its due time, what a
//! connection has declared. Plain values, below the transports that declare
//! the cascade and the connection that publishes into it; [`crate::delay`],
//! above the connection, re-exports the public ones.

use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::topology::{ExchangeKind, ExchangeSpec, QueueSpec, QueueType};
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Header carrying when a delayed message is due, in milliseconds since the
/// epoch. Set by a publish with a delay; read by the cascade and by
/// `memory://`; left on the delivered message (fire time minus this is the
/// delay's lateness).
pub const DUE_HEADER: &str = "x-acemq-due";

/// How many levels the cascade has: level `k` holds 2^k seconds, so the
/// longest delay is 2^28 - 1 seconds, eight and a half years.
pub const LEVELS: u32 = 28;

/// The longest delay: [`LEVELS`] bits of whole seconds.
pub const MAX_DELAY: Duration = Duration::from_secs((1 << LEVELS) - 1);

/// Where level 0 dead-letters to: bound to each destination.
pub const DELIVER_EXCHANGE: &str = "acemq.delay.deliver";

/// The first word of every cascade routing key. A destination's own key (in
/// `CC`) is routed at every level too, and could only match a level's
/// binding if it started with this word and had as many words after it.
const KEY_PREFIX: &str = "acemq-delay";

/// The exchange and the queue of level `k`.
pub fn level_name(k: u32) -> String {
    format!("acemq.delay.{k:02}")
}

/// Milliseconds since the epoch of `at`.
pub fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The due time (ms since the epoch) of a publish with `delay` or `at`,
/// checked: a delay past [`MAX_DELAY`] is refused, saying what the limit is.
/// None when neither is given. A time in the past is due now.
pub fn due_ms(delay: Option<Duration>, at: Option<SystemTime>) -> Result<Option<u64>> {
    if delay.is_some() && at.is_some() {
        return Err(Error::invalid("give delay: or at:, not both"));
    }
    // A delay is sent in whole seconds, rounded up: 2^28 - 1.5 s is 2^28 s,
    // one past the cascade (issue 49: `Patterns.record(delay: 2**28)` was
    // taken here, within the second's slack `at:` needs, and refused only
    // by the cascade when sent).
    if delay.is_some_and(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0) > MAX_DELAY.as_secs()) {
        return Err(too_long());
    }
    let now = SystemTime::now();
    let due = match (delay, at) {
        (Some(d), _) => now.checked_add(d),
        (_, Some(at)) => Some(at),
        _ => return Ok(None),
    };
    let due = due.filter(|due| due.duration_since(now).map_or(true, |d| d <= MAX_DELAY + Duration::from_secs(1)));
    due.map(|due| Some(epoch_ms(due))).ok_or_else(too_long)
}

/// The due time of `delay` or `at` without the checks of [`due_ms`] (what
/// [`Connection::envelope_for`](crate::Connection::envelope_for), which
/// cannot fail, writes; a delay too long is refused when it is sent).
pub(crate) fn due_unchecked(delay: Option<Duration>, at: Option<SystemTime>) -> Option<u64> {
    match (delay, at) {
        (Some(d), _) => Some(epoch_ms(SystemTime::now()).saturating_add(d.as_millis().min(u64::MAX as u128) as u64)),
        (_, Some(at)) => Some(epoch_ms(at)),
        _ => None,
    }
}

/// The due time a header value holds (a number, or digits in text).
pub(crate) fn due_value(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// The due time a message's headers carry, if any.
pub fn due_of(headers: &Headers) -> Option<u64> {
    headers.get(DUE_HEADER).and_then(due_value)
}

pub(crate) fn too_long() -> Error {
    Error::invalid(format!(
        "a delay can be at most {} s (about 8.5 years: {} levels of the delay cascade); publish it later, or keep it in a table and publish when it is nearer",
        MAX_DELAY.as_secs(),
        LEVELS
    ))
}

/// Whole seconds from `now_ms` to `due_ms`, rounded up (a delay is never
/// shortened); 0 when it is due.
pub fn remaining_secs(due_ms: u64, now_ms: u64) -> u64 {
    due_ms.saturating_sub(now_ms).div_ceil(1000)
}

/// How a delayed message enters the cascade.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Route {
    /// The level exchange of the delay's highest set bit.
    pub exchange: String,
    /// The bits and the destination.
    pub routing_key: String,
    /// The destination's own routing key, for `CC` (to an exchange only).
    pub cc: Option<String>,
    /// The binding of the delivery exchange the destination needs.
    pub destination: Destination,
}

/// What the delivery exchange is bound to for one destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Destination {
    /// A queue (a publish to the default exchange).
    Queue(String),
    /// An exchange.
    Exchange(String),
}

impl Destination {
    fn tag(&self) -> (&'static str, &str) {
        match self {
            Destination::Queue(q) => ("q", q),
            Destination::Exchange(e) => ("x", e),
        }
    }

    /// The delivery exchange's binding key for it: any bits, then it.
    pub fn binding_key(&self) -> String {
        let (tag, name) = self.tag();
        format!("{KEY_PREFIX}{}.{tag}.{name}", ".*".repeat(LEVELS as usize))
    }
}

/// The route of a message to `exchange`/`routing_key` due in `secs` (> 0).
pub(crate) fn route(exchange: &str, routing_key: &str, secs: u64) -> Result<Route> {
    let (destination, cc) = if exchange.is_empty() {
        (Destination::Queue(routing_key.to_owned()), None)
    } else {
        (Destination::Exchange(exchange.to_owned()), Some(routing_key.to_owned()))
    };
    let (tag, name) = destination.tag();
    if name.split('.').any(|w| w == "*" || w == "#") {
        return Err(Error::invalid(format!(
            "cannot delay a message to '{name}': a word '*' or '#' in its name would match other destinations in the delay cascade's topic routing; rename it"
        )));
    }
    let mut key = String::with_capacity(KEY_PREFIX.len() + 2 * LEVELS as usize + 3 + name.len());
    key.push_str(KEY_PREFIX);
    for k in (0..LEVELS).rev() {
        key.push_str(if secs >> k & 1 == 1 { ".1" } else { ".0" });
    }
    key.push('.');
    key.push_str(tag);
    key.push('.');
    key.push_str(name);
    if key.len() > 255 {
        return Err(Error::invalid(format!(
            "cannot delay a message to '{name}': the delay cascade's routing key adds {} bytes to the name and RabbitMQ allows 255; use a name of at most {} bytes",
            key.len() - name.len(),
            255 - (key.len() - name.len())
        )));
    }
    let top = level_of(secs.max(1)).unwrap_or(0);
    Ok(Route { exchange: level_name(top), routing_key: key, cc, destination })
}

/// The binding key of level `k`'s exchange that picks bit `k` = `bit`.
fn level_key(k: u32, bit: u8) -> String {
    format!("{KEY_PREFIX}{}.{bit}.#", ".*".repeat((LEVELS - 1 - k) as usize))
}

/// The cascade: the exchanges (every level's and the delivery exchange),
/// the level queues, the queue bindings and the exchange-to-exchange
/// bindings (source, destination, key).
///
/// The level queues are quorum queues that dead-letter at least once: a
/// message moves between levels with a confirm, so a broker that stops
/// mid-move delivers it twice rather than never (a classic queue's
/// dead-lettering is published without one). Quorum queues take a message
/// TTL and at-least-once dead-lettering from RabbitMQ 3.10 on; every level
/// holds messages of one TTL, first in first out, so expiring at the head
/// (how a queue TTL works) is expiring on time.
pub(crate) struct Cascade {
    pub exchanges: Vec<ExchangeSpec>,
    pub queues: Vec<QueueSpec>,
    pub queue_bindings: Vec<(String, String, String)>,
    pub exchange_bindings: Vec<(String, String, String)>,
}

pub(crate) fn cascade() -> Cascade {
    let mut c = Cascade { exchanges: Vec::new(), queues: Vec::new(), queue_bindings: Vec::new(), exchange_bindings: Vec::new() };
    c.exchanges.push(ExchangeSpec { name: DELIVER_EXCHANGE.into(), kind: ExchangeKind::Topic });
    for k in 0..LEVELS {
        let name = level_name(k);
        let next = if k == 0 { DELIVER_EXCHANGE.to_owned() } else { level_name(k - 1) };
        c.exchanges.push(ExchangeSpec { name: name.clone(), kind: ExchangeKind::Topic });
        let mut q = QueueSpec::new(name.clone()).with_type(QueueType::Quorum);
        q.dead_letter_queue = false;
        q.arguments.insert("x-message-ttl".into(), Value::from((1u64 << k) * 1000));
        q.arguments.insert("x-dead-letter-exchange".into(), Value::from(next.clone()));
        c.queues.push(q);
        c.queue_bindings.push((name.clone(), name.clone(), level_key(k, 1)));
        c.exchange_bindings.push((name, next, level_key(k, 0)));
    }
    c
}

/// The per-connection memory of what is declared: the cascade once, and
/// each destination's binding once.
#[derive(Default)]
pub(crate) struct Declared {
    pub cascade: bool,
    pub destinations: std::collections::HashSet<Destination>,
}

/// The level a message due in `secs` waits in now: its highest set bit.
pub(crate) fn level_of(secs: u64) -> Option<u32> {
    (secs > 0).then(|| 63 - secs.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AMQP topic matching, as the memory broker routes.
    fn topic(pattern: &str, key: &str) -> bool {
        crate::transport::memory::topic_matches(pattern, key)
    }

    /// Walk a key through the cascade as the broker would: the queues it
    /// waits in, in order, and whether it reaches its destination.
    fn walk(r: &Route) -> (Vec<u32>, bool) {
        let c = cascade();
        let mut at = r.exchange.clone();
        let mut waited = Vec::new();
        loop {
            if at == DELIVER_EXCHANGE {
                return (waited, topic(&r.destination.binding_key(), &r.routing_key));
            }
            let k: u32 = at.rsplit('.').next().unwrap().parse().unwrap();
            let to_queue = c.queue_bindings.iter().any(|(q, e, key)| *e == at && *q == at && topic(key, &r.routing_key));
            let onward = c.exchange_bindings.iter().find(|(s, _, key)| *s == at && topic(key, &r.routing_key));
            assert!(to_queue ^ onward.is_some(), "level {k} routes a key exactly one way");
            if to_queue {
                waited.push(k);
            }
            at = if k == 0 { DELIVER_EXCHANGE.into() } else { level_name(k - 1) };
        }
    }

    #[test]
    fn a_delay_waits_once_per_set_bit_and_reaches_its_destination() {
        for secs in [1u64, 2, 3, 5, 60, 1800, 86_400, 1_000_000, MAX_DELAY.as_secs()] {
            let r = route("", "payments", secs).unwrap();
            let (waited, delivered) = walk(&r);
            assert!(delivered, "{secs} s reaches payments");
            assert_eq!(waited.iter().map(|k| 1u64 << k).sum::<u64>(), secs, "{secs} s waits {waited:?}");
            assert_eq!(waited.len() as u32, secs.count_ones());
        }
    }

    #[test]
    fn a_queue_destination_is_matched_exactly() {
        let r = route("", "shop.payments", 3).unwrap();
        assert!(!topic(&Destination::Queue("payments".into()).binding_key(), &r.routing_key));
        assert!(!topic(&Destination::Exchange("shop.payments".into()).binding_key(), &r.routing_key));
        let x = route("orders", "order.placed", 3).unwrap();
        assert_eq!(x.cc.as_deref(), Some("order.placed"));
        // The CC key never matches a level or the delivery exchange.
        let c = cascade();
        assert!(!c.queue_bindings.iter().chain(&c.exchange_bindings).any(|(_, _, k)| topic(k, "order.placed")));
    }

    #[test]
    fn bad_destinations_and_delays_are_refused_with_what_to_do() {
        assert!(route("", "a.#", 1).unwrap_err().message().contains("rename"));
        assert!(route("", &"q".repeat(200), 1).unwrap_err().message().contains("at most"));
        assert!(due_ms(Some(MAX_DELAY * 2), None).unwrap_err().message().contains("at most"));
        // 2^28 s, and a fraction past the last whole second, are one past it.
        assert!(due_ms(Some(MAX_DELAY + Duration::from_secs(1)), None).unwrap_err().message().contains("at most"));
        assert!(due_ms(Some(MAX_DELAY + Duration::from_millis(1)), None).is_err());
        assert!(due_ms(Some(MAX_DELAY), None).unwrap().is_some());
        assert!(due_ms(Some(Duration::from_secs(1)), Some(SystemTime::now())).is_err());
        assert_eq!(remaining_secs(10_001, 0), 11);
        assert_eq!(remaining_secs(5, 10), 0);
    }
}
