//! Trace context through every copy the engine makes, and the engine's
//! spans as a subscriber records them. memory:// always; RabbitMQ too when
//! AMQP_URL is set (CI sets it).

use acemq::outbox::{AsyncSqlOutboxStore, OutboxRecord, OutboxRelay, OutboxStoreOptions, RelayOptions};
use acemq::sql::{AsyncConnectionSource, AsyncSqliteConnection};
use acemq::{Ack, ConsumeOptions, Connection, Outcome, PublishOptions, RetryPolicy, Topology, TraceContext};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TS: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

mod support;
use support::{next, transports, unique};

/// memory:// moves its clock; RabbitMQ waits out the rung's TTL.
async fn wait_for_ladder(mq: &Connection) {
    match mq.memory_broker() {
        Some(b) => b.advance(Duration::from_secs(1)),
        None => tokio::time::sleep(Duration::from_millis(50)).await,
    }
}

fn traced() -> PublishOptions {
    let mut headers = acemq::Headers::new();
    TraceContext { traceparent: TP.into(), tracestate: Some(TS.into()) }.insert_into(&mut headers);
    PublishOptions { headers, ..Default::default() }
}

fn assert_carried(d: &acemq::Delivery, at: &str) {
    let h = &d.message.envelope.headers;
    assert_eq!(h.get("traceparent"), Some(&Value::from(TP)), "traceparent {at}");
    assert_eq!(h.get("tracestate"), Some(&Value::from(TS)), "tracestate {at}");
    let parent = acemq::trace::parent(&d.message).expect("a trace context");
    assert_eq!(parent.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736", "{at}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_trace_context_is_carried_through_rungs_the_dlq_a_replay_and_the_outbox() {
    for mq in transports().await {
        let q = unique("traced");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let options = ConsumeOptions {
            retry: RetryPolicy::new(3, Duration::from_millis(200), Duration::from_millis(200)),
            ..Default::default()
        };
        let c = mq.consumer(&q, options.clone()).await.unwrap();
        mq.publish(&json!({"n": 1}), &q, traced()).await.unwrap();
        for attempt in 1..=3 {
            let d = next(&c).await;
            assert_eq!(d.message.envelope.attempt, attempt);
            assert_carried(&d, &format!("at attempt {attempt}"));
            c.settle(d, Outcome::Ack(Ack::retry("not yet"))).await.unwrap();
            wait_for_ladder(&mq).await;
        }
        c.close().await;
        let peeked = mq.peek_dead_letters(&q, 1).await.unwrap();
        assert_eq!(peeked.len(), 1, "the third retry dead-lettered it");
        mq.replay_dead_letters(&q, Default::default()).await.unwrap();
        let c = mq.consumer(&q, options.clone()).await.unwrap();
        let d = next(&c).await;
        assert_eq!(d.message.envelope.attempt, 1);
        assert_carried(&d, "after a replay");
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();

        // Through the outbox: the row stores the headers, the relay sends them.
        let file = std::env::temp_dir().join(format!("acemq-{}.db", unique("trace"))).to_str().unwrap().to_owned();
        let table = format!("outbox_{}", uuid::Uuid::now_v7().simple());
        let options = OutboxStoreOptions { table, ..OutboxStoreOptions::default() };
        let store = AsyncSqlOutboxStore::new(AsyncSqliteConnection::open(&file).await.unwrap(), options).unwrap();
        store.create_schema().await.unwrap();
        let env = mq.envelope_for(&traced());
        let app = AsyncSqliteConnection::open(&file).await.unwrap();
        store.add(&OutboxRecord::json("", &q, &json!({"n": 2}), env).unwrap(), &app.connection().await.unwrap()).await.unwrap();
        let relay = OutboxRelay::new(Arc::new(mq.clone()), store, RelayOptions::default());
        assert_eq!(relay.sweep().await.unwrap(), 1);
        let d = next(&c).await;
        assert_carried(&d, "through the outbox");
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        c.close().await;
        let _ = std::fs::remove_file(&file);
    }
}

// ---------------------------------------------------------------------------
// A subscriber that records spans: name, fields, parent.

#[derive(Debug, Clone)]
struct Recorded {
    name: &'static str,
    metadata: &'static Metadata<'static>,
    fields: HashMap<String, String>,
}

thread_local! {
    /// The spans entered on this thread, innermost last: what
    /// `Span::current()` asks the subscriber for.
    static ENTERED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[derive(Default)]
struct Recorder {
    next: AtomicU64,
    spans: Mutex<HashMap<u64, Recorded>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

impl Subscriber for &'static Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut r = Recorded { name: span.metadata().name(), metadata: span.metadata(), fields: HashMap::new() };
        span.record(&mut Fields(&mut r.fields));
        self.spans.lock().unwrap().insert(id, r);
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(r) = self.spans.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Fields(&mut r.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, id: &Id) {
        ENTERED.with(|e| e.borrow_mut().push(id.into_u64()));
    }
    fn exit(&self, id: &Id) {
        ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            if let Some(at) = e.iter().rposition(|x| *x == id.into_u64()) {
                e.remove(at);
            }
        });
    }
    fn current_span(&self) -> tracing_core::span::Current {
        let top = ENTERED.with(|e| e.borrow().last().copied());
        match top.and_then(|id| self.spans.lock().unwrap().get(&id).map(|r| (id, r.metadata))) {
            Some((id, metadata)) => tracing_core::span::Current::new(Id::from_u64(id), metadata),
            None => tracing_core::span::Current::none(),
        }
    }
    fn clone_span(&self, id: &Id) -> Id {
        id.clone()
    }
}

fn recorder() -> &'static Recorder {
    static R: OnceLock<&'static Recorder> = OnceLock::new();
    R.get_or_init(|| {
        let r: &'static Recorder = Box::leak(Box::default());
        tracing::subscriber::set_global_default(r).expect("no other subscriber in this test binary");
        r
    })
}

fn spans_with(r: &Recorder, name: &str, key: &str, value: &str) -> Vec<Recorded> {
    r.spans.lock().unwrap().values().filter(|s| s.name == name && s.fields.get(key).map(String::as_str) == Some(value)).cloned().collect()
}

/// A queue of its own, and one message on it carrying the trace context.
async fn traced_on_a_new_queue(mq: &Connection, name: &str) -> (String, acemq::Envelope) {
    let q = unique(name);
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    let env = mq.publish(&json!({"n": 1}), &q, traced()).await.unwrap();
    (q, env)
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_and_process_are_spans_with_the_messaging_attributes() {
    let r = recorder();
    for mq in transports().await {
        let (q, env) = traced_on_a_new_queue(&mq, "spans").await;
        let published = spans_with(r, "publish", "messaging.message.id", &env.id);
        assert_eq!(published.len(), 1, "{published:?}");
        let f = &published[0].fields;
        for (k, v) in [
            ("otel.kind", "producer"),
            ("otel.name", "publish amq.default"),
            ("messaging.system", "rabbitmq"),
            ("messaging.operation.type", "publish"),
            ("messaging.destination.name", ""),
            ("messaging.rabbitmq.destination.routing_key", q.as_str()),
            ("acemq.traceparent", TP),
        ] {
            assert_eq!(f.get(k).map(String::as_str), Some(v), "publish {k}: {f:?}");
        }

        // The push consumer: the handler runs inside the process span.
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        let handle = mq
            .consume(&q, ConsumeOptions::default(), move |message: acemq::Message| {
                let s = s.clone();
                async move {
                    *s.lock().unwrap() = Some((tracing::Span::current().metadata().map(|m| m.name()), acemq::trace::parent(&message)));
                    Outcome::Ack(Ack::accept())
                }
            })
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let done = spans_with(r, "process", "messaging.message.id", &env.id);
            if done.first().is_some_and(|s| s.fields.contains_key("acemq.outcome")) {
                let f = &done[0].fields;
                for (k, v) in [
                    ("otel.kind", "consumer"),
                    ("otel.name", format!("process {q}").as_str()),
                    ("messaging.system", "rabbitmq"),
                    ("messaging.operation.type", "process"),
                    ("messaging.destination.name", ""),
                    ("messaging.rabbitmq.destination.routing_key", q.as_str()),
                    ("acemq.queue", q.as_str()),
                    ("acemq.attempt", "1"),
                    ("acemq.traceparent", TP),
                    ("acemq.outcome", "accepted"),
                ] {
                    assert_eq!(f.get(k).map(String::as_str), Some(v), "process {k}: {f:?}");
                }
                assert!(f.contains_key("messaging.rabbitmq.message.delivery_tag"), "{f:?}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no settled process span: {done:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (current, parent) = seen.lock().unwrap().clone().expect("the handler ran");
        assert_eq!(current, Some("process"), "the handler runs inside the process span");
        assert_eq!(parent.unwrap().traceparent, TP);
        handle.cancel().await;

        // A retry records its outcome; the exhausted one says dead_lettered.
        let options = ConsumeOptions { retry: RetryPolicy::new(1, Duration::from_millis(200), Duration::from_millis(200)), ..Default::default() };
        let c = mq.consumer(&q, options).await.unwrap();
        let env = mq.publish(&json!({"n": 2}), &q, PublishOptions::default()).await.unwrap();
        let d = next(&c).await;
        c.settle(d, Outcome::Ack(Ack::retry("no"))).await.unwrap();
        let done = spans_with(r, "process", "messaging.message.id", &env.id);
        assert_eq!(done[0].fields.get("acemq.outcome").map(String::as_str), Some("dead_lettered"), "{done:?}");
        assert_eq!(done[0].fields.get("acemq.traceparent").map(String::as_str), Some(""), "no context, an empty field");
        c.close().await;
        mq.close().await;
    }
}

/// A request whose handler fails is answered with an error reply, and its
/// process span says so (`error_replied`), not the retry its settlement
/// would have been.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_requests_span_says_it_was_answered_with_an_error() {
    let r = recorder();
    for mq in transports().await {
        let q = unique("span-rpc");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let (asker, to) = (mq.clone(), q.clone());
        let asked = tokio::spawn(async move {
            asker.request(&json!({"n": 1}), &to, acemq::RequestOptions { timeout: Duration::from_secs(30), ..Default::default() }).await
        });
        let d = next(&c).await;
        let id = d.message.envelope.id.clone();
        c.settle(d, Outcome::Raised { class: "Boom".into(), message: "no".into(), fatal: false }).await.unwrap();
        let err = asked.await.unwrap().unwrap_err();
        assert_eq!(err.remote().map(|e| e.class()), Some(Some("Boom")), "{err}");
        let done = spans_with(r, "process", "messaging.message.id", &id);
        assert_eq!(done[0].fields.get("acemq.outcome").map(String::as_str), Some("error_replied"), "{done:?}");
        c.close().await;
        mq.close().await;
    }
}

/// The Ruby extension's path: a delivery fetched and admitted lean carries
/// no copy of where it came from in its message, and its process span is
/// still named from the delivery itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_admitted_lean_reads_where_it_came_from_off_its_body_and_names_its_span_from_it() {
    let r = recorder();
    for mq in transports().await {
        let (q, env) = traced_on_a_new_queue(&mq, "lean").await;
        let c = Arc::new(mq.consumer(&q, ConsumeOptions::default()).await.unwrap());
        let reader = c.clone();
        let d = tokio::task::spawn_blocking(move || loop {
            if let acemq::Fetch::Unread(unread) = reader.fetch_blocking(Duration::from_secs(10)) {
                assert_eq!(unread.message().delivery, acemq::DeliveryInfo::default(), "filled in by admit, not before");
                break reader.admit_lean(*unread).expect("no circuit breaker");
            }
        })
        .await
        .unwrap();
        assert_eq!(d.message.delivery, acemq::DeliveryInfo::default(), "admitted lean: no copy in the message");
        let body = d.shared_body();
        assert_eq!((body.exchange(), body.routing_key(), body.redelivered()), ("", q.as_str(), false));
        assert_eq!(body.properties().content_type.as_deref(), Some("application/json"));
        assert_eq!(body.properties().message_id.as_deref(), Some(env.id.as_str()));
        let spans = spans_with(r, "process", "messaging.message.id", &env.id);
        assert_eq!(spans.len(), 1, "{spans:?}");
        let f = &spans[0].fields;
        for (k, v) in [
            ("otel.name", format!("process {q}").as_str()),
            ("messaging.destination.name", ""),
            ("messaging.rabbitmq.destination.routing_key", q.as_str()),
            ("acemq.queue", q.as_str()),
        ] {
            assert_eq!(f.get(k).map(String::as_str), Some(v), "process {k}: {f:?}");
        }
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        c.close().await;
        mq.close().await;
    }
}
