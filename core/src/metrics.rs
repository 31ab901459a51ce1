//! Counters and histograms fed by the [`events`], in the
//! Prometheus text format (OpenMetrics 1.0), named after the OpenTelemetry
//! messaging semantic conventions where one exists.
//!
//! Nothing is recorded until [`enable`] is called (the runner's health
//! endpoint calls it, and so does the first [`render`]): until then the
//! engine's hot path pays one atomic load per emission point.
//!
//! ```no_run
//! acemq::metrics::enable();
//! // ... consume, publish ...
//! let text = acemq::metrics::render(); // serve it on /metrics
//! # let _ = text;
//! ```
//!
//! Built on `prometheus-client`, the Prometheus project's own Rust client:
//! pure Rust, no protobuf, and the text encoder is its, not ours.

use crate::events::{self, Event};
use once_cell::sync::{Lazy, OnceCell};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Destination {
    messaging_system: &'static str,
    messaging_destination_name: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Queue {
    messaging_destination_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Rung {
    messaging_destination_name: String,
    rung: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Verdict {
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueState {
    messaging_destination_name: String,
    state: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn durations() -> Histogram {
    // 1 ms to about 33 s, doubling: a confirm takes a few milliseconds on a
    // healthy broker, a handler anything up to its deadline.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

struct Metrics {
    registry: Registry,
    published: Family<Destination, Counter>,
    publish_duration: Histograms<Destination>,
    consumed: Family<Destination, Counter>,
    process_duration: Histograms<Destination>,
    retries: Family<Rung, Counter>,
    dead_letters: Family<Queue, Counter>,
    idempotency: Family<Verdict, Counter>,
    outbox_published: Counter,
    outbox_failures: Family<Queue, Counter>,
    outbox_backlog: Gauge,
    outbox_oldest_age: Gauge<f64, AtomicU64>,
    connection: Family<State, Counter>,
    subscription: Family<QueueState, Counter>,
    /// 1 while a queue's consumer is paused by an operator / its breaker open.
    paused: Family<Queue, Gauge>,
    circuit_open: Family<Queue, Gauge>,
    runner: Family<State, Gauge>,
    dropped: Counter,
}

static METRICS: Lazy<Metrics> = Lazy::new(|| {
    let mut r = Registry::default();
    let m = Metrics {
        published: Family::default(),
        publish_duration: Family::new_with_constructor(durations),
        consumed: Family::default(),
        process_duration: Family::new_with_constructor(durations),
        retries: Family::default(),
        dead_letters: Family::default(),
        idempotency: Family::default(),
        outbox_published: Counter::default(),
        outbox_failures: Family::default(),
        outbox_backlog: Gauge::default(),
        outbox_oldest_age: Gauge::default(),
        connection: Family::default(),
        subscription: Family::default(),
        paused: Family::default(),
        circuit_open: Family::default(),
        runner: Family::default(),
        dropped: Counter::default(),
        registry: Registry::default(),
    };
    r.register("messaging_client_sent_messages", "Messages published, by destination and outcome (confirmed, failed)", m.published.clone());
    r.register_with_unit(
        "messaging_client_operation_duration",
        "Publish to confirm, by destination and outcome",
        Unit::Seconds,
        m.publish_duration.clone(),
    );
    r.register(
        "messaging_client_consumed_messages",
        "Deliveries settled, by queue and outcome (accepted, retried, dead_lettered, duplicate, in_progress, waited, timed_out, failed, expired, error_replied)",
        m.consumed.clone(),
    );
    r.register_with_unit(
        "messaging_process_duration",
        "Handing a delivery out to its settlement, by queue and outcome",
        Unit::Seconds,
        m.process_duration.clone(),
    );
    r.register("acemq_retries", "Copies to a rung of the retry ladder, by queue and rung", m.retries.clone());
    r.register("acemq_dead_letters", "Copies to the DLQ, by queue", m.dead_letters.clone());
    r.register(
        "acemq_idempotency_verdicts",
        "Idempotency decisions other than run: duplicate, in_progress, missing_key, store_error, confirm_failed, forget_failed",
        m.idempotency.clone(),
    );
    r.register("acemq_outbox_published", "Outbox rows confirmed and deleted by the relay", m.outbox_published.clone());
    r.register("acemq_outbox_failures", "Outbox rows that failed to publish, by destination", m.outbox_failures.clone());
    r.register("acemq_outbox_backlog", "Outbox rows waiting, as of the last sweep", m.outbox_backlog.clone());
    r.register_with_unit("acemq_outbox_oldest_age", "Age of the oldest waiting outbox row, as of the last sweep", Unit::Seconds, m.outbox_oldest_age.clone());
    r.register("acemq_connection_events", "Connection lost, recovered, blocked, unblocked", m.connection.clone());
    r.register("acemq_subscription_events", "Subscriptions failed, cancelled by the broker, resubscribed", m.subscription.clone());
    r.register("acemq_runner_state", "1 for the runner's current state", m.runner.clone());
    r.register("acemq_consumer_paused", "1 while the queue's consumer is paused by an operator (taking nothing, not down)", m.paused.clone());
    r.register("acemq_circuit_open", "1 while the queue's consumer's circuit breaker is open (from open until a trial closes it)", m.circuit_open.clone());
    r.register("acemq_events_dropped", "Events not delivered to Ruby subscribers because their queue was full", m.dropped.clone());
    Metrics { registry: r, ..m }
});

static ENABLED: OnceCell<events::SubscriberId> = OnceCell::new();

/// Start recording (idempotent). Until it is called nothing is recorded.
pub fn enable() {
    ENABLED.get_or_init(|| {
        Lazy::force(&METRICS);
        events::subscribe(record)
    });
}

/// Whether [`enable`] has been called.
pub fn is_enabled() -> bool {
    ENABLED.get().is_some()
}

/// Everything recorded so far, in the OpenMetrics text format (ends with
/// `# EOF`). Enables recording if it was not.
pub fn render() -> String {
    enable();
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &METRICS.registry);
    out
}

/// Count events that could not be delivered (the Ruby gem's queue was full).
pub fn dropped(n: u64) {
    if is_enabled() {
        METRICS.dropped.inc_by(n);
    }
}

const RABBITMQ: &str = "rabbitmq";

fn record(event: &Event) {
    let m = &*METRICS;
    match event {
        Event::Publish(p) => {
            let dest = if p.exchange.is_empty() { p.routing_key.clone() } else { p.exchange.clone() };
            let l = Destination { messaging_system: RABBITMQ, messaging_destination_name: dest, outcome: p.outcome.to_owned() };
            m.published.get_or_create(&l).inc();
            m.publish_duration.get_or_create(&l).observe(p.duration.as_secs_f64());
        }
        Event::Process(p) => {
            let l = Destination {
                messaging_system: RABBITMQ,
                messaging_destination_name: p.queue.clone(),
                outcome: p.outcome.as_str().to_owned(),
            };
            m.consumed.get_or_create(&l).inc();
            m.process_duration.get_or_create(&l).observe(p.duration.as_secs_f64());
        }
        Event::Retry(r) => {
            m.retries.get_or_create(&Rung { messaging_destination_name: r.queue.clone(), rung: r.rung.clone() }).inc();
        }
        Event::DeadLetter(d) => {
            m.dead_letters.get_or_create(&Queue { messaging_destination_name: d.queue.clone() }).inc();
        }
        Event::Idempotency(i) => {
            m.idempotency.get_or_create(&Verdict { verdict: i.verdict.to_owned() }).inc();
        }
        Event::Outbox(o) => {
            m.outbox_published.inc_by(o.published as u64);
            for e in &o.errors {
                let dest = if e.exchange.is_empty() { e.routing_key.clone() } else { e.exchange.clone() };
                m.outbox_failures.get_or_create(&Queue { messaging_destination_name: dest }).inc();
            }
            if let Some(b) = o.backlog {
                m.outbox_backlog.set(i64::try_from(b).unwrap_or(i64::MAX));
                m.outbox_oldest_age.set(o.oldest_age.map_or(0.0, |a| a.as_secs_f64()));
            }
        }
        Event::Connection(c) => {
            m.connection.get_or_create(&State { state: c.state.to_owned() }).inc();
        }
        Event::Subscription(s) => {
            m.subscription
                .get_or_create(&QueueState { messaging_destination_name: s.queue.clone(), state: s.state.to_owned() })
                .inc();
            let queue = || Queue { messaging_destination_name: s.queue.clone() };
            match s.state {
                "paused" | "resumed" => {
                    m.paused.get_or_create(&queue()).set(i64::from(s.state == "paused"));
                }
                "circuit_open" | "circuit_closed" => {
                    m.circuit_open.get_or_create(&queue()).set(i64::from(s.state == "circuit_open"));
                }
                _ => {}
            }
        }
        Event::Runner(r) => {
            for s in ["running", "quiet", "stopping", "stopped", "failed"] {
                m.runner.get_or_create(&State { state: s.to_owned() }).set(i64::from(s == r.state));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_openmetrics_text_with_the_families() {
        enable();
        events::emit(|| Event::Idempotency(events::Idempotency { verdict: "duplicate", key: Some("k".into()), error: None }));
        let text = render();
        assert!(text.contains("# TYPE acemq_events_dropped counter"), "{text}");
        assert!(text.contains("acemq_idempotency_verdicts_total{verdict=\"duplicate\"}"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"));
    }
}
