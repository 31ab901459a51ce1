//! The event contract as a Rust service sees it, on memory:// (and on
//! RabbitMQ when AMQP_URL is set): a publish, a retry, a dead letter and a
//! duplicate, each with its payload.

use acemq::events::{self, Event, ProcessOutcome};
use acemq::idempotency::{Before, Guard, InMemoryIdempotencyStore};
use acemq::{Ack, ConsumeOptions, Connection, Outcome, PublishOptions, RetryPolicy, Topology};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", acemq::new_id())
}

/// Every event about `queue`, collected while the test runs.
fn collect(queue: &str) -> (events::SubscriberId, Arc<Mutex<Vec<Event>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s, q) = (seen.clone(), queue.to_owned());
    let id = events::subscribe(move |e| {
        let mine = match e {
            Event::Publish(p) => p.routing_key == q,
            Event::Process(p) => p.queue == q,
            Event::Retry(r) => r.queue == q,
            Event::DeadLetter(d) => d.queue == q,
            _ => false,
        };
        if mine {
            s.lock().unwrap().push(e.clone());
        }
    });
    (id, seen)
}

async fn eventually(seen: &Mutex<Vec<Event>>, n: usize) -> Vec<Event> {
    for _ in 0..200 {
        if seen.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    seen.lock().unwrap().clone()
}

async fn urls() -> Vec<String> {
    let mut out = vec![format!("memory://{}", unique("ev"))];
    if let Ok(u) = std::env::var("AMQP_URL") {
        out.push(u);
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_retry_dead_letter_and_duplicate_are_reported() {
    for url in urls().await {
        let mq = Connection::open(&url).await.unwrap();
        let queue = unique("events");
        mq.apply(&Topology::new().queue(&queue)).await.unwrap();
        let (id, seen) = collect(&queue);

        let env = mq.publish(&json!({"n": 1}), &queue, PublishOptions::default()).await.unwrap();
        let options = ConsumeOptions {
            retry: RetryPolicy::new(2, Duration::from_millis(50), Duration::from_millis(50)),
            name: Some("EventsTest".into()),
            ..Default::default()
        };
        let c = Arc::new(mq.consumer(&queue, options).await.unwrap());
        // Attempt 1 retried, attempt 2 retried again: exhausted, dead-lettered.
        for _ in 0..2 {
            let d = c.next().await.unwrap();
            c.settle(d, Outcome::Ack(Ack::retry("gateway timeout"))).await.unwrap();
        }
        let got = eventually(&seen, 4).await;
        events::unsubscribe(id);
        c.close().await;

        let publish = got.iter().find_map(|e| if let Event::Publish(p) = e { Some(p.clone()) } else { None }).unwrap();
        assert_eq!((publish.message_id.as_str(), publish.outcome), (env.id.as_str(), "confirmed"), "{url}");
        let processed: Vec<_> = got.iter().filter_map(|e| if let Event::Process(p) = e { Some(p.clone()) } else { None }).collect();
        assert_eq!(processed.iter().map(|p| p.outcome).collect::<Vec<_>>(), [ProcessOutcome::Retried, ProcessOutcome::DeadLettered], "{url}");
        assert_eq!(processed[0].consumer, "EventsTest");
        assert_eq!((processed[0].attempt, processed[1].attempt), (1, 2));
        let retry = got.iter().find_map(|e| if let Event::Retry(r) = e { Some(r.clone()) } else { None }).unwrap();
        assert_eq!(retry.rung, format!("{queue}.retry.50ms"));
        let dead = got.iter().find_map(|e| if let Event::DeadLetter(d) = e { Some(d.clone()) } else { None }).unwrap();
        assert!(dead.reason.starts_with("retries exhausted after 2 attempts"), "{}", dead.reason);
        assert_eq!(dead.dlq, format!("{queue}.dlq"));
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_is_reported_by_the_guard_and_settled_as_duplicate() {
    let mq = Connection::open(&format!("memory://{}", unique("ev"))).await.unwrap();
    let queue = unique("events-dup");
    mq.apply(&Topology::new().queue(&queue)).await.unwrap();
    let (id, seen) = collect(&queue);
    let verdicts = Arc::new(Mutex::new(Vec::new()));
    let v = verdicts.clone();
    let guard_events = events::subscribe(move |e| {
        if let Event::Idempotency(i) = e {
            v.lock().unwrap().push((i.verdict, i.key.clone()));
        }
    });
    let env = acemq::Envelope::default();
    for _ in 0..2 {
        let options = PublishOptions { envelope: Some(env.clone()), ..Default::default() };
        mq.publish(&json!({"n": 1}), &queue, options).await.unwrap();
    }
    let store = InMemoryIdempotencyStore::new(Duration::from_secs(3600));
    let guard = Guard::new();
    let c = Arc::new(mq.consumer(&queue, ConsumeOptions::default()).await.unwrap());
    for _ in 0..2 {
        let d = c.next().await.unwrap();
        match guard.before(&store, Some(&d.message.envelope.id)) {
            Before::Run { key } => {
                guard.after(&store, &key, &Outcome::Ack(Ack::Accept)).unwrap();
                c.accept(d);
            }
            // The verdict travels with the outcome to the settlement.
            dup @ Before::Duplicate => c.settle_guarded(d, dup.guarded_without_running().unwrap()).await.unwrap(),
            other => panic!("unexpected {other:?}"),
        }
    }
    let got = eventually(&seen, 3).await;
    events::unsubscribe(id);
    events::unsubscribe(guard_events);
    let outcomes: Vec<_> = got.iter().filter_map(|e| if let Event::Process(p) = e { Some(p.outcome) } else { None }).collect();
    assert_eq!(outcomes, [ProcessOutcome::Accepted, ProcessOutcome::Duplicate]);
    assert!(verdicts.lock().unwrap().contains(&("duplicate", Some(env.id.clone()))));
    c.close().await;
    mq.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guarded_consumer_reports_its_duplicate_with_a_key_of_its_own() {
    // The verdict travels with the outcome, so a key that is not the
    // message id reports the duplicate too (a table keyed by message id
    // could not).
    let mq = Connection::open(&format!("memory://{}", unique("ev"))).await.unwrap();
    let queue = unique("events-guarded");
    mq.apply(&Topology::new().queue(&queue)).await.unwrap();
    let (id, seen) = collect(&queue);
    for n in [1, 2] {
        mq.publish(&json!({"order": "A-1", "n": n}), &queue, PublishOptions::default()).await.unwrap();
    }
    let store = InMemoryIdempotencyStore::new(Duration::from_secs(3600));
    let guarded = acemq::idempotency::idempotent(store, None, |_m: acemq::Message| async { Ack::accept() })
        .with_key(|m| m.payload["order"].as_str().map(|o| format!("order:{o}")));
    let options = ConsumeOptions { concurrency: 1, ..Default::default() };
    let handle = mq.consume(&queue, options, guarded).await.unwrap();
    let got = eventually(&seen, 4).await;
    events::unsubscribe(id);
    let outcomes: Vec<_> = got.iter().filter_map(|e| if let Event::Process(p) = e { Some(p.outcome) } else { None }).collect();
    assert_eq!(outcomes, [ProcessOutcome::Accepted, ProcessOutcome::Duplicate]);
    handle.cancel().await;
    mq.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_what_was_consumed() {
    acemq::metrics::enable();
    let mq = Connection::open(&format!("memory://{}", unique("ev"))).await.unwrap();
    let queue = unique("events-metrics");
    mq.apply(&Topology::new().queue(&queue)).await.unwrap();
    mq.publish(&json!({"n": 1}), &queue, PublishOptions::default()).await.unwrap();
    let c = Arc::new(mq.consumer(&queue, ConsumeOptions::default()).await.unwrap());
    let d = c.next().await.unwrap();
    c.accept(d);
    let text = acemq::metrics::render();
    let labels = format!("messaging_system=\"rabbitmq\",messaging_destination_name=\"{queue}\",outcome=\"accepted\"");
    assert!(text.contains(&format!("messaging_client_consumed_messages_total{{{labels}}} 1")), "{text}");
    let sent = format!("messaging_client_sent_messages_total{{messaging_system=\"rabbitmq\",messaging_destination_name=\"{queue}\",outcome=\"confirmed\"}} 1");
    assert!(text.contains(&sent), "{text}");
    c.close().await;
    mq.close().await;
}

/// The Rust relay's `outbox` event is the Ruby relay's: what the sweep
/// claimed and published, and the backlog read after it (issue 50: both
/// drivers emit the same event; the Rust one left the backlog out).
#[tokio::test(flavor = "multi_thread")]
async fn the_relay_reports_each_sweep_with_the_backlog_after_it() {
    use acemq::outbox::{AsyncSqlOutboxStore, OutboxRecord, OutboxRelay, OutboxStoreOptions, RelayOptions};
    use acemq::sql::{AsyncConnectionSource, AsyncSqliteConnection};
    let mq = Connection::open(&format!("memory://{}", unique("ev"))).await.unwrap();
    let queue = unique("outbox-events");
    mq.apply(&Topology::new().queue(&queue)).await.unwrap();
    let file = std::env::temp_dir().join(format!("acemq-{}.db", unique("events"))).to_str().unwrap().to_owned();
    let options = OutboxStoreOptions { table: format!("outbox_{}", uuid::Uuid::now_v7().simple()), ..OutboxStoreOptions::default() };
    let store = AsyncSqlOutboxStore::new(AsyncSqliteConnection::open(&file).await.unwrap(), options).unwrap();
    store.create_schema().await.unwrap();
    let app = AsyncSqliteConnection::open(&file).await.unwrap();
    for n in 0..5 {
        let record = OutboxRecord::json("", &queue, &json!({ "n": n }), mq.envelope_for(&PublishOptions::default())).unwrap();
        store.add(&record, &app.connection().await.unwrap()).await.unwrap();
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let id = events::subscribe(move |e| {
        if let Event::Outbox(o) = e {
            s.lock().unwrap().push((o.claimed, o.published, o.failed, o.backlog, o.oldest_age));
        }
    });
    let relay = OutboxRelay::new(Arc::new(mq.clone()), store, RelayOptions { batch_size: 3, ..RelayOptions::default() });
    assert_eq!(relay.sweep().await.unwrap(), 3);
    assert_eq!(relay.sweep().await.unwrap(), 2);
    events::unsubscribe(id);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!((seen[0].0, seen[0].1, seen[0].2, seen[0].3), (3, 3, 0, Some(2)), "{seen:?}");
    assert!(seen[0].4.is_some(), "two rows wait: the oldest has an age ({seen:?})");
    assert_eq!((seen[1].0, seen[1].1, seen[1].2, seen[1].3, seen[1].4), (2, 2, 0, Some(0), None), "{seen:?}");
    let _ = std::fs::remove_file(&file);
}
