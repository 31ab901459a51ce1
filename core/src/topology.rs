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
}

impl QueueSpec {
    /// A plain durable queue with a DLQ.
    pub fn new(name: impl Into<String>) -> Self {
        QueueSpec { name: name.into(), arguments: Headers::new(), dead_letter_queue: true }
    }

    /// A queue whose messages wait `ttl` and are then dead-lettered through
    /// the default exchange to `target`: a rung of the retry ladder.
    pub fn delay(name: impl Into<String>, ttl: Duration, target: &str) -> Self {
        let mut arguments = Headers::new();
        arguments.insert("x-message-ttl".into(), Value::from(ttl.as_millis() as u64));
        arguments.insert("x-dead-letter-exchange".into(), Value::from(""));
        arguments.insert("x-dead-letter-routing-key".into(), Value::from(target));
        QueueSpec { name: name.into(), arguments, dead_letter_queue: false }
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
                let mut dlq = QueueSpec::new(dlq_name(&q.name));
                dlq.dead_letter_queue = false;
                out.push(dlq);
            }
            out.push(q.clone());
        }
        out
    }
}

fn check_name(what: &str, name: &str) -> Result<()> {
    crate::limits::short(&format!("{what} name"), name)
}
