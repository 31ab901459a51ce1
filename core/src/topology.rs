//! Exchanges, queues and bindings, declared idempotently.
//!
//! Applying a topology is safe from every process at boot: declaring what
//! already exists with the same arguments is a no-op on RabbitMQ and on
//! `memory://`. Declaring it with *different* arguments is an error that says
//! which argument differs; nothing is ever deleted to make a declaration fit.

use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::retry::dlq_name;
use serde_json::Value;
use std::time::Duration;

/// The kind of an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routes on an exact routing key.
    Direct,
    /// Routes on a dotted pattern (`*` one word, `#` any number).
    Topic,
    /// Routes to every bound queue.
    Fanout,
    /// Routes on headers (RabbitMQ only; `memory://` refuses it).
    Headers,
}

impl ExchangeKind {
    /// Every kind, in the order error messages list them.
    pub const ALL: [ExchangeKind; 4] = [Self::Direct, Self::Topic, Self::Fanout, Self::Headers];

    /// Parse `direct`, `topic`, `fanout`, `headers`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "direct" => Ok(Self::Direct),
            "topic" => Ok(Self::Topic),
            "fanout" => Ok(Self::Fanout),
            "headers" => Ok(Self::Headers),
            other => Err(Error::invalid(format!(
                "unknown exchange type {other:?}: use direct, topic, fanout or headers"
            ))),
        }
    }

    /// The AMQP name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Topic => "topic",
            Self::Fanout => "fanout",
            Self::Headers => "headers",
        }
    }
}

/// One exchange to declare. Durable.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeSpec {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: ExchangeKind,
}

/// RabbitMQ's queue types, as far as the ladder is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// A classic queue: one node's, and the default, because it is what
    /// every broker version and `memory://` have.
    #[default]
    Classic,
    /// A quorum queue: replicated (Raft), with delivery counting and, since
    /// RabbitMQ 3.10, at-least-once dead-lettering. What a cluster should
    /// use for anything that must not be lost.
    Quorum,
}

impl QueueType {
    /// Every type, in the order error messages list them.
    pub const ALL: [QueueType; 2] = [Self::Classic, Self::Quorum];

    /// Parse `classic` or `quorum`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "classic" => Ok(Self::Classic),
            "quorum" => Ok(Self::Quorum),
            other => Err(Error::invalid(format!("unknown queue type {other:?}: use classic or quorum"))),
        }
    }

    /// The `x-queue-type` value.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Quorum => "quorum",
        }
    }
}

/// How many times a quorum queue delivers a message before the broker
/// dead-letters it to `{queue}.dlq` on its own. The ladder does not count
/// here (a retry is a copy to a rung, a new message); what counts is a
/// message given back unsettled: a consumer that died holding it, a lost
/// channel, a copy that failed. Twenty is far above what connection losses
/// do to an innocent message, and a bound on one that kills every consumer
/// it reaches.
pub const DEFAULT_DELIVERY_LIMIT: u64 = 20;

/// The delivery limit a quorum queue's DLQ is declared with: in effect
/// none. A DLQ has no dead-letter target of its own, so a message past its
/// limit is dropped, and RabbitMQ 4.x gives a quorum queue declared without
/// one a limit of 20 — where every dead letter an operator looks at and
/// gives back counts (3.10, 4.0), and where a message the broker
/// dead-lettered for its delivery limit arrives with its count already past
/// 20 (4.3). `-1`, unlimited on 4.x, drops a message at its first return on
/// 3.10; a large number means the same on every version and survives an
/// upgrade. RabbitMQ accepts up to 2^40 here (measured on 3.10.8, 4.0.5,
/// 4.3.6); a billion returns is none.
pub const DLQ_DELIVERY_LIMIT: u64 = 1_000_000_000;

/// One queue to declare. Durable; `{name}.dlq` is declared with it unless
/// `dead_letter_queue` is false (the DLQ and rung queues themselves).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSpec {
    /// Its name.
    pub name: String,
    /// AMQP queue arguments (`x-message-ttl`, `x-dead-letter-exchange`, ...).
    pub arguments: Headers,
    /// Declare `{name}.dlq` too.
    pub dead_letter_queue: bool,
    /// Classic or quorum; the DLQ and the rungs get the same.
    pub queue_type: QueueType,
}

impl QueueSpec {
    /// A plain durable queue with a DLQ.
    pub fn new(name: impl Into<String>) -> Self {
        QueueSpec { name: name.into(), arguments: Headers::new(), dead_letter_queue: true, queue_type: QueueType::Classic }
    }

    /// One consumer at a time: `x-single-active-consumer`. The broker hands
    /// every message to one subscribed consumer, the others wait, and the
    /// next one takes over when it goes (since RabbitMQ 3.8). What keeps a
    /// queue's order across several runners (see [`crate::partition`]).
    pub fn single_active_consumer(mut self) -> Self {
        self.arguments.insert("x-single-active-consumer".into(), serde_json::Value::Bool(true));
        self
    }

    /// The same queue as another type.
    pub fn with_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
        self
    }

    /// The arguments it is declared with: its own, plus what its type needs.
    /// A quorum queue is declared `x-queue-type: quorum`; one that
    /// dead-letters (a rung's TTL back to its queue, a main queue's delivery
    /// limit to its DLQ) does it at least once (`x-dead-letter-strategy:
    /// at-least-once`, which RabbitMQ allows only with `x-overflow:
    /// reject-publish`), so a message moving between them is confirmed on
    /// arrival rather than sent and hoped for. A main quorum queue gets a
    /// delivery limit and its DLQ as the dead-letter target. Arguments given
    /// explicitly win.
    pub fn declared_arguments(&self) -> Headers {
        let mut a = self.arguments.clone();
        if self.queue_type == QueueType::Quorum {
            a.entry("x-queue-type").or_insert_with(|| Value::from("quorum"));
            if self.dead_letter_queue && !a.contains_key("x-dead-letter-exchange") {
                a.insert("x-dead-letter-exchange".into(), Value::from(""));
                a.insert("x-dead-letter-routing-key".into(), Value::from(dlq_name(&self.name)));
            }
            if self.dead_letter_queue {
                a.entry("x-delivery-limit").or_insert_with(|| Value::from(DEFAULT_DELIVERY_LIMIT));
            }
            if a.contains_key("x-dead-letter-exchange") {
                a.entry("x-dead-letter-strategy").or_insert_with(|| Value::from("at-least-once"));
                a.entry("x-overflow").or_insert_with(|| Value::from("reject-publish"));
            }
        }
        a
    }

    /// `{queue}.dlq`, of `queue`'s type: no DLQ of its own, and, when
    /// quorum, [`DLQ_DELIVERY_LIMIT`].
    pub fn dead_letters_of(queue: &str, queue_type: QueueType) -> Self {
        let mut dlq = QueueSpec::new(dlq_name(queue)).with_type(queue_type);
        dlq.dead_letter_queue = false;
        if queue_type == QueueType::Quorum {
            dlq.arguments.insert("x-delivery-limit".into(), Value::from(DLQ_DELIVERY_LIMIT));
        }
        dlq
    }

    /// Whether this is a quorum DLQ as [`QueueSpec::dead_letters_of`] makes
    /// it: declared with [`DLQ_DELIVERY_LIMIT`], which one that already
    /// exists may not have.
    pub(crate) fn is_quorum_dlq(&self) -> bool {
        self.queue_type == QueueType::Quorum
            && !self.dead_letter_queue
            && self.name.ends_with(".dlq")
            && self.arguments.get("x-delivery-limit").and_then(Value::as_u64) == Some(DLQ_DELIVERY_LIMIT)
    }

    /// A queue whose messages wait `ttl` and are then dead-lettered through
    /// the default exchange to `target`: a rung of the retry ladder.
    pub fn delay(name: impl Into<String>, ttl: Duration, target: &str) -> Self {
        let mut arguments = Headers::new();
        arguments.insert("x-message-ttl".into(), Value::from(ttl.as_millis() as u64));
        arguments.insert("x-dead-letter-exchange".into(), Value::from(""));
        arguments.insert("x-dead-letter-routing-key".into(), Value::from(target));
        QueueSpec { name: name.into(), arguments, dead_letter_queue: false, queue_type: QueueType::Classic }
    }
}

/// A binding of a queue to an exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingSpec {
    /// The queue.
    pub queue: String,
    /// The exchange.
    pub exchange: String,
    /// The routing key or pattern.
    pub routing_key: String,
}

/// A set of declarations, applied in order: exchanges, queues (each with its
/// DLQ), bindings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Topology {
    /// Exchanges.
    pub exchanges: Vec<ExchangeSpec>,
    /// Queues.
    pub queues: Vec<QueueSpec>,
    /// Bindings.
    pub bindings: Vec<BindingSpec>,
}

impl Topology {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an exchange.
    pub fn exchange(mut self, name: impl Into<String>, kind: ExchangeKind) -> Self {
        self.exchanges.push(ExchangeSpec { name: name.into(), kind });
        self
    }

    /// Add a durable queue (and its `{name}.dlq`).
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queues.push(QueueSpec::new(name));
        self
    }

    /// Add a partitioned queue: `{name}.p0` … `{name}.p{partitions-1}`, each
    /// with one active consumer at a time and a DLQ of its own (see
    /// [`crate::partition`]).
    pub fn partitioned_queue(mut self, name: impl Into<String>, partitions: u16) -> Self {
        let name = name.into();
        for p in 0..partitions {
            self.queues.push(QueueSpec::new(crate::partition::partition_queue(&name, p)).single_active_consumer());
        }
        self
    }

    /// Add a quorum queue (and its `{name}.dlq`, quorum too).
    pub fn quorum_queue(mut self, name: impl Into<String>) -> Self {
        self.queues.push(QueueSpec::new(name).with_type(QueueType::Quorum));
        self
    }

    /// Add a queue with full control over its declaration.
    pub fn queue_spec(mut self, spec: QueueSpec) -> Self {
        self.queues.push(spec);
        self
    }

    /// Bind `queue` to `exchange` with `routing_key`.
    pub fn bind(mut self, queue: impl Into<String>, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.bindings.push(BindingSpec { queue: queue.into(), exchange: exchange.into(), routing_key: routing_key.into() });
        self
    }

    /// Check names before anything reaches the broker.
    pub fn validate(&self) -> Result<()> {
        for e in &self.exchanges {
            check_name("exchange", &e.name)?;
            if e.name.is_empty() || e.name.starts_with("amq.") {
                return Err(Error::invalid(format!(
                    "exchange name {:?} is reserved: the default exchange and amq.* exist already and cannot be declared",
                    e.name
                )));
            }
        }
        for q in &self.queues {
            crate::limits::queue(&q.name)?;
            if q.name.is_empty() {
                return Err(Error::invalid("queue name is empty: give the queue a name"));
            }
        }
        for b in &self.bindings {
            check_name("queue", &b.queue)?;
            check_name("exchange", &b.exchange)?;
            crate::limits::short("binding routing key", &b.routing_key)?;
            if b.exchange.is_empty() {
                return Err(Error::invalid("cannot bind to the default exchange: it routes by queue name already"));
            }
        }
        Ok(())
    }

    /// Every queue declaration this topology implies, DLQs included, in order.
    pub fn expanded_queues(&self) -> Vec<QueueSpec> {
        let mut out = Vec::new();
        for q in &self.queues {
            if q.dead_letter_queue {
                out.push(QueueSpec::dead_letters_of(&q.name, q.queue_type));
            }
            out.push(q.clone());
        }
        out
    }
}

fn check_name(what: &str, name: &str) -> Result<()> {
    crate::limits::short(&format!("{what} name"), name)
}

#[cfg(test)]
mod quorum_tests {
    use super::*;

    #[test]
    fn a_quorum_queue_dead_letters_at_least_once_to_its_dlq_and_its_dlq_is_quorum_too() {
        let t = Topology::new().quorum_queue("payments");
        let qs = t.expanded_queues();
        let (dlq, main) = (&qs[0], &qs[1]);
        assert_eq!((dlq.name.as_str(), dlq.queue_type), ("payments.dlq", QueueType::Quorum));
        let a = main.declared_arguments();
        assert_eq!(a["x-queue-type"], "quorum");
        assert_eq!(a["x-dead-letter-routing-key"], "payments.dlq");
        assert_eq!(a["x-dead-letter-strategy"], "at-least-once");
        assert_eq!(a["x-overflow"], "reject-publish");
        assert_eq!(a["x-delivery-limit"], DEFAULT_DELIVERY_LIMIT);
        let d = dlq.declared_arguments();
        assert!(!d.contains_key("x-dead-letter-exchange"), "{d:?}");
        assert_eq!(d["x-delivery-limit"], DLQ_DELIVERY_LIMIT, "a DLQ drops what passes its limit");
        assert!(dlq.is_quorum_dlq() && !main.is_quorum_dlq());
        let classic = Topology::new().queue("orders").expanded_queues();
        assert!(classic[0].declared_arguments().is_empty(), "a classic DLQ has no delivery limit to set");
    }

    #[test]
    fn a_rung_keeps_its_ttl_and_target_and_explicit_arguments_win() {
        let rung = QueueSpec::delay("payments.retry.1s", Duration::from_secs(1), "payments").with_type(QueueType::Quorum);
        let a = rung.declared_arguments();
        assert_eq!((a["x-message-ttl"].as_u64(), a["x-dead-letter-strategy"].as_str()), (Some(1000), Some("at-least-once")));
        let mut own = QueueSpec::new("q").with_type(QueueType::Quorum);
        own.arguments.insert("x-delivery-limit".into(), Value::from(3));
        assert_eq!(own.declared_arguments()["x-delivery-limit"], 3);
        assert!(QueueSpec::new("c").declared_arguments().is_empty(), "classic adds nothing");
        assert!(QueueType::parse("stream").unwrap_err().to_string().contains("classic or quorum"));
    }
}
