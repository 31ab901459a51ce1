//! The transport's observable behaviour, on memory:// always and on RabbitMQ
//! when AMQP_URL is set (CI sets it). Every scenario runs on both.

use acemq::{Ack, ConsumeOptions, Connection, ErrorKind, ExchangeKind, Outcome, PublishOptions, RetryPolicy, Topology};
use serde_json::json;
use std::time::Duration;

mod support;
use support::{next, transports, unique};

/// `{"n": n}` to the queue `to`, as a batch or a stream takes it.
fn numbered(mq: &Connection, n: usize, to: &str) -> acemq::OutgoingMessage {
    acemq::OutgoingMessage {
        body: serde_json::to_vec(&json!({ "n": n })).unwrap(),
        exchange: String::new(),
        routing_key: to.to_owned(),
        envelope: mq.envelope_for(&PublishOptions::default()),
    }
}

fn short_ladder(max_attempts: u32) -> ConsumeOptions {
    ConsumeOptions { retry: RetryPolicy::new(max_attempts, Duration::from_millis(200), Duration::from_millis(400)), ..Default::default() }
}

async fn wait_for_ladder(mq: &Connection) {
    match mq.memory_broker() {
        Some(b) => b.advance(Duration::from_secs(1)),
        None => tokio::time::sleep(Duration::from_millis(50)).await,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_then_consume_carries_the_envelope() {
    for mq in transports().await {
        let q = unique("pay");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let env = mq
            .publish(&json!({"order_id": "A-1"}), &q, PublishOptions { kind: Some("payment.requested.v1".into()), ..Default::default() })
            .await
            .unwrap();
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let d = next(&c).await;
        assert_eq!(d.message.payload["order_id"], "A-1");
        assert_eq!(d.message.envelope.id, env.id);
        assert_eq!(d.message.envelope.kind.as_deref(), Some("payment.requested.v1"));
        assert_eq!(d.message.envelope.attempt, 1);
        assert_eq!(d.message.envelope.origin.as_deref(), Some(mq.origin()));
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        assert_eq!(c.stats().accepted, 1);
        c.close().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_counts_is_a_passive_declare() {
    for mq in transports().await {
        let q = unique("counts");
        assert_eq!(mq.queue_counts(&q).await.unwrap(), None); // and nothing was created
        assert_eq!(mq.queue_counts(&q).await.unwrap(), None);
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..2 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        assert_eq!(mq.queue_counts(&q).await.unwrap(), Some(acemq::QueueCounts { ready: 2, consumers: 0 }));
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let d = next(&c).await;
        let counts = mq.queue_counts(&q).await.unwrap().unwrap();
        assert_eq!(counts.consumers, 1);
        assert!(counts.ready <= 1, "delivered messages are not ready: {counts:?}");
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        c.close().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exchanges_route_by_kind() {
    for mq in transports().await {
        let ex = unique("events");
        let q = unique("orders");
        mq.apply(&Topology::new().exchange(&ex, ExchangeKind::Topic).queue(&q).bind(&q, &ex, "order.*")).await.unwrap();
        let opts = PublishOptions { exchange: ex.clone(), ..Default::default() };
        mq.publish(&json!({"n": 1}), "order.placed", opts.clone()).await.unwrap();
        let err = mq.publish(&json!({"n": 2}), "invoice.paid", opts.clone()).await.unwrap_err();
        assert_eq!(*err.kind(), ErrorKind::Unroutable, "{err}");
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let d = next(&c).await;
        assert_eq!(d.message.payload["n"], 1);
        assert_eq!(d.message.delivery.exchange, ex);
        assert_eq!(d.message.delivery.routing_key, "order.placed");
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        c.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_climbs_the_ladder_then_dead_letters_with_the_reason() {
    for mq in transports().await {
        let q = unique("ladder");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let env = mq.publish(&json!({"x": 1}), &q, PublishOptions::default()).await.unwrap();
        let c = mq.consumer(&q, short_ladder(3)).await.unwrap();
        for attempt in 1..=3u32 {
            if attempt > 1 {
                wait_for_ladder(&mq).await;
            }
            let d = next(&c).await;
            assert_eq!(d.message.envelope.attempt, attempt);
            assert_eq!(d.message.envelope.id, env.id, "the id survives every rung");
            c.settle(d, Outcome::Ack(Ack::retry(format!("down {attempt}")))).await.unwrap();
        }
        let dlq = mq.consumer(&format!("{q}.dlq"), ConsumeOptions::default()).await.unwrap();
        let d = next(&dlq).await;
        assert_eq!(d.message.envelope.id, env.id);
        let reason = d.message.envelope.headers["x-acemq-reason"].as_str().unwrap().to_owned();
        assert!(reason.contains("retries exhausted") && reason.contains("down 3"), "{reason}");
        assert_eq!(d.message.envelope.attempt, 3);
        assert_eq!(d.message.envelope.headers["x-acemq-original-routing-key"], json!(q));
        dlq.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        assert_eq!(c.stats().retried, 2);
        assert_eq!(c.stats().dead_lettered, 1);
        c.close().await;
        dlq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn raised_errors_retry_and_fatal_ones_reject() {
    for mq in transports().await {
        let q = unique("raise");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        mq.publish(&json!({"x": 1}), &q, PublishOptions::default()).await.unwrap();
        let c = mq.consumer(&q, short_ladder(5)).await.unwrap();
        let d = next(&c).await;
        c.settle(d, Outcome::Raised { class: "Timeout::Error".into(), message: "slow".into(), fatal: false }).await.unwrap();
        wait_for_ladder(&mq).await;
        let d = next(&c).await;
        assert_eq!(d.message.envelope.attempt, 2);
        assert_eq!(d.message.envelope.headers["x-acemq-error-class"], "Timeout::Error");
        c.settle(d, Outcome::Raised { class: "AceMQ::AMQP::FatalError".into(), message: "bad".into(), fatal: true }).await.unwrap();
        let dlq = mq.consumer(&format!("{q}.dlq"), ConsumeOptions::default()).await.unwrap();
        let d = next(&dlq).await;
        assert_eq!(d.message.envelope.headers["x-acemq-error-class"], "AceMQ::AMQP::FatalError");
        assert_eq!(d.message.envelope.attempt, 2);
        dlq.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        c.close().await;
        dlq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_is_not_json_is_dead_lettered_byte_for_byte() {
    for mq in transports().await {
        let q = unique("garbage");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let env = mq.envelope_for(&PublishOptions::default());
        mq.send_json(b"\xffnot json", "", &q, &env).await.unwrap().wait().await.unwrap();
        mq.publish(&json!({"ok": true}), &q, PublishOptions::default()).await.unwrap();
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let d = next(&c).await;
        assert_eq!(d.message.payload["ok"], true, "the bad one is skipped, not handed to the handler");
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        assert_eq!(c.stats().dead_lettered, 1);
        c.close().await;
    }
}

/// `next` is cancel safe: a wait given up takes nothing and keeps nothing
/// (on RabbitMQ the waiting handler holds the subscription's stream while it
/// waits, and must give it back), and handlers waiting together each get
/// their own delivery.
#[tokio::test(flavor = "multi_thread")]
async fn a_wait_given_up_takes_nothing_and_waiting_handlers_share_the_deliveries() {
    for mq in transports().await {
        let q = unique("abandoned");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let c = std::sync::Arc::new(mq.consumer(&q, ConsumeOptions::default()).await.unwrap());
        for _ in 0..5 {
            assert!(tokio::time::timeout(Duration::from_millis(20), c.next()).await.is_err(), "nothing was published");
        }
        // A wait given up while another is under way: the other still gets the message.
        let waiting = tokio::spawn({
            let c = c.clone();
            async move { next(&c).await }
        });
        assert!(tokio::time::timeout(Duration::from_millis(50), c.next()).await.is_err());
        mq.publish(&json!({"n": 1}), &q, PublishOptions::default()).await.unwrap();
        let d = waiting.await.unwrap();
        assert_eq!(d.message.payload["n"], 1);
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        // Two handlers waiting at once, two messages: one each, neither lost.
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { next(&c).await })
            })
            .collect();
        for n in 2..=3 {
            mq.publish(&json!({"n": n}), &q, PublishOptions::default()).await.unwrap();
        }
        let mut got = Vec::new();
        for w in waiters {
            let d = w.await.unwrap();
            got.push(d.message.payload["n"].as_i64().unwrap());
            c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        }
        got.sort_unstable();
        assert_eq!(got, [2, 3]);
        assert_eq!(c.stats().accepted, 3);
        c.close().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unsettled_messages_come_back_when_a_consumer_goes_away() {
    for mq in transports().await {
        let q = unique("redeliver");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        mq.publish(&json!({"x": 1}), &q, PublishOptions::default()).await.unwrap();
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let d = next(&c).await;
        assert!(!d.message.delivery.redelivered);
        drop(d);
        c.close().await;
        let c2 = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let d = next(&c2).await;
        assert!(d.message.delivery.redelivered);
        c2.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        c2.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_its_own_error() {
    for mq in transports().await {
        let err = mq.publish(&json!({}), "x", PublishOptions { exchange: unique("missing"), ..Default::default() }).await.unwrap_err();
        assert!(err.is_not_found(), "{err:?}");
        // The connection keeps working after a 404 closed the publishing channel.
        let q = unique("after404");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        mq.publish(&json!({}), &q, PublishOptions::default()).await.unwrap();
        let missing = mq.consumer(&unique("nope"), ConsumeOptions::default()).await.err().expect("consuming a missing queue fails");
        assert!(missing.is_not_found(), "{missing:?}");
        let unroutable = mq.publish(&json!({}), &unique("noqueue"), PublishOptions::default()).await.unwrap_err();
        assert_eq!(*unroutable.kind(), ErrorKind::Unroutable);
        let bad_policy = mq.consumer(&q, ConsumeOptions { retry: RetryPolicy::new(0, Duration::from_secs(1), Duration::from_secs(1)), ..Default::default() }).await;
        assert_eq!(*bad_policy.err().unwrap().kind(), ErrorKind::InvalidArgument);
    }
    let err = Connection::open("kafka://localhost").await.unwrap_err();
    assert_eq!(*err.kind(), ErrorKind::InvalidUrl);
    assert!(err.to_string().contains("amqp://"));
}

#[tokio::test(flavor = "multi_thread")]
async fn redeclaring_a_queue_with_other_arguments_says_which() {
    for mq in transports().await {
        let q = unique("conflict");
        mq.apply(&Topology::new().queue_spec(acemq::QueueSpec::delay(&q, Duration::from_secs(1), "x"))).await.unwrap();
        let err = mq.apply(&Topology::new().queue_spec(acemq::QueueSpec::delay(&q, Duration::from_secs(2), "x"))).await.unwrap_err();
        assert!(err.is_precondition_failed(), "{err:?}");
        assert!(err.to_string().contains("x-message-ttl"), "{err}");

        // Declared together (one round trip): the conflict in the middle is
        // the error reported, not the channel closing under the ones after it.
        let (a, c) = (unique("before"), unique("after"));
        let together = Topology::new()
            .queue(&a)
            .queue_spec(acemq::QueueSpec::delay(&q, Duration::from_secs(3), "x"))
            .queue(&c);
        let err = mq.apply(&together).await.unwrap_err();
        assert!(err.is_precondition_failed(), "{err:?}");
        assert!(err.to_string().contains(&q), "names the queue in conflict: {err}");
        // The connection goes on: a later declaration and a publish work.
        mq.apply(&Topology::new().queue(&c)).await.unwrap();
        mq.publish(&json!({}), &c, PublishOptions::default()).await.unwrap();

        // A consumer whose rung exists with other arguments fails to open,
        // its subscription (opened alongside the ladder) closed behind it.
        let main = unique("ladder-conflict");
        mq.apply(&Topology::new().queue(&main)).await.unwrap();
        let rung = format!("{main}.retry.1s");
        mq.apply(&Topology::new().queue_spec(acemq::QueueSpec::delay(&rung, Duration::from_secs(7), &main))).await.unwrap();
        let err = mq.consumer(&main, ConsumeOptions::default()).await.err().expect("a conflicting rung fails the consumer");
        assert!(err.is_precondition_failed(), "{err:?}");
        if let Some(counts) = mq.queue_counts(&main).await.unwrap() {
            assert!(eventually_zero_consumers(&mq, &main).await, "the subscription is closed: {counts:?}");
        }
    }
}

async fn eventually_zero_consumers(mq: &Connection, queue: &str) -> bool {
    for _ in 0..100 {
        if mq.queue_counts(queue).await.unwrap().is_some_and(|c| c.consumers == 0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn push_consumer_runs_the_handler() {
    for mq in transports().await {
        let q = unique("push");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let handle = mq
            .consume(&q, ConsumeOptions { concurrency: 4, ..Default::default() }, move |m: acemq::Message| {
                let tx = tx.clone();
                async move {
                    tx.send(m.payload["n"].as_i64().unwrap()).unwrap();
                    Outcome::Ack(Ack::accept())
                }
            })
            .await
            .unwrap();
        for n in 0..50 {
            mq.publish(&json!({"n": n}), &q, PublishOptions::default()).await.unwrap();
        }
        let mut seen = Vec::new();
        while seen.len() < 50 {
            seen.push(tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap());
        }
        seen.sort();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
        handle.cancel().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn connecting_to_nothing_fails_fast() {
    let started = std::time::Instant::now();
    let opts = acemq::ConnectionOptions { connect_timeout: Duration::from_secs(2), ..Default::default() };
    let err = Connection::open_with("amqp://guest:guest@127.0.0.1:1", opts).await.unwrap_err();
    assert_eq!(*err.kind(), ErrorKind::ConnectionFailed, "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    if std::env::var("AMQP_URL").is_ok() {
        let err = Connection::open("amqp://guest:wrong@127.0.0.1:5672").await.unwrap_err();
        assert_eq!(*err.kind(), ErrorKind::AuthenticationFailed, "{err:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_replay_with_attempts_reset_and_history_kept() {
    for mq in transports().await {
        let q = unique("replay");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let c = mq.consumer(&q, short_ladder(1)).await.unwrap();
        let mut ids = Vec::new();
        for (n, kind) in ["a.v1", "b.v1", "a.v1"].iter().enumerate() {
            let env = mq
                .publish(&json!({"n": n}), &q, PublishOptions { kind: Some(kind.to_string()), ..Default::default() })
                .await
                .unwrap();
            ids.push(env.id);
            let d = next(&c).await;
            let reason = if n == 1 { "gateway down" } else { "card declined" };
            c.settle(d, Outcome::Ack(Ack::reject(reason))).await.unwrap();
        }
        c.close().await;
        let only_a = acemq::ReplayOptions { kind: Some("a.v1".into()), reason: Some("declined".into()), limit: Some(1), ..Default::default() };
        let report = mq.replay_dead_letters(&q, only_a).await.unwrap();
        assert_eq!(report.replayed, 1);
        let rest = mq.replay_dead_letters(&q, acemq::ReplayOptions { reason: Some("declined".into()), ..Default::default() }).await.unwrap();
        assert_eq!(rest.replayed, 1, "the other a.v1 one");
        assert_eq!(rest.skipped, 1, "the gateway one stays");
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let mut back = Vec::new();
        for _ in 0..2 {
            let d = next(&c).await;
            assert_eq!(d.message.envelope.attempt, 1);
            let history = d.message.envelope.headers["x-acemq-history"].as_array().unwrap().clone();
            assert_eq!(history.len(), 1);
            assert_eq!(history[0]["reason"], "card declined");
            assert!(!d.message.envelope.headers.contains_key("x-acemq-reason"));
            back.push(d.message.envelope.id.clone());
            c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        }
        back.sort();
        let mut want = vec![ids[0].clone(), ids[2].clone()];
        want.sort();
        assert_eq!(back, want);
        c.close().await;
        // The gateway one is still in the DLQ.
        let all = mq.replay_dead_letters(&q, acemq::ReplayOptions::default()).await.unwrap();
        assert_eq!(all, acemq::ReplayReport { replayed: 1, skipped: 0 });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reject_whose_dlq_was_deleted_declares_it_again_rather_than_losing_the_message() {
    let mq = Connection::open(&format!("memory://{}", unique("t"))).await.unwrap();
    let q = unique("nodlq");
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
    assert!(mq.memory_broker().unwrap().delete_queue(&format!("{q}.dlq")));
    mq.publish(&json!({"x": 1}), &q, PublishOptions::default()).await.unwrap();
    let d = next(&c).await;
    c.settle(d, Outcome::Ack(Ack::reject("bad"))).await.unwrap();
    assert_eq!(mq.memory_broker().unwrap().depth(&format!("{q}.dlq")).unwrap().ready, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_a_missing_exchange_fails_only_those_messages_and_keeps_the_connection() {
    for mq in transports().await {
        let q = unique("batch404");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let missing = unique("missing");
        for round in 0..20 {
            let env = mq.envelope_for(&PublishOptions::default());
            let body = br#"{"n":1}"#;
            let messages: Vec<acemq::JsonMessage<'_>> = (0..10)
                .map(|i| acemq::JsonMessage {
                    body,
                    exchange: if i % 3 == 0 { &missing } else { "" },
                    routing_key: &q,
                    envelope: &env,
                })
                .collect();
            let mut outcomes = Vec::new();
            for sent in mq.send_json_batch(&messages).await {
                outcomes.push(match sent {
                    Ok(c) => c.wait().await,
                    Err(e) => Err(e),
                });
            }
            for (i, r) in outcomes.iter().enumerate() {
                if i % 3 == 0 {
                    assert!(r.as_ref().unwrap_err().is_not_found(), "round {round} message {i}: {r:?}");
                } else {
                    assert!(r.is_ok(), "round {round} message {i}: {r:?}");
                }
            }
        }
        // Still one working connection.
        mq.publish(&json!({"after": true}), &q, PublishOptions::default()).await.unwrap();
    }
}

/// A held batch (`send_all`): every message sent in order, every confirm
/// waited for, and an unroutable message in the middle reported only after
/// the ones around it are stored.
#[tokio::test(flavor = "multi_thread")]
async fn send_all_stores_the_batch_and_reports_a_failure_after_every_confirm() {
    for mq in transports().await {
        let q = unique("sendall");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let message = |n, to: &str| numbered(&mq, n, to);
        let good: Vec<_> = (0..5).map(|n| message(n, &q)).collect();
        assert_eq!(mq.send_all(&good).await.unwrap(), 5);
        assert_eq!(mq.send_all(&[]).await.unwrap(), 0);

        let mut mixed: Vec<_> = (5..7).map(|n| message(n, &q)).collect();
        mixed.push(message(99, &unique("noqueue")));
        mixed.extend((7..9).map(|n| message(n, &q)));
        let err = mq.send_all(&mixed).await.unwrap_err();
        assert_eq!(*err.kind(), ErrorKind::Unroutable, "{err}");
        // The good one behind the bad one was stored too, in order.
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..9 {
            let d = next(&c).await;
            seen.push(d.message.payload["n"].as_u64().unwrap());
            c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        }
        assert_eq!(seen, vec![0, 1, 2, 3, 4, 5, 6, 7, 8]);
    }
}

/// Close this connection from the broker's side, as a restart or a network
/// cut would: `rabbitmqctl close_connection` on the connection named by its
/// origin.
fn broker_closes(origin: &str) {
    let out = std::process::Command::new("rabbitmqctl").args(["list_connections", "pid", "client_properties"]).output().expect("rabbitmqctl");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut closed = 0;
    for line in text.lines().filter(|l| l.contains(&format!("{{\"connection_name\",\"{origin}\"}}"))) {
        let pid = line.split('\t').next().unwrap();
        let status = std::process::Command::new("rabbitmqctl").args(["close_connection", pid, "spec: broker went away"]).status().unwrap();
        assert!(status.success());
        closed += 1;
    }
    assert!(closed > 0, "no connection named {origin} in:\n{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn publishing_and_consuming_survive_the_broker_closing_the_connection() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    let origin = unique("survivor");
    let opts = acemq::ConnectionOptions { origin: Some(origin.clone()), ..Default::default() };
    let mq = Connection::open_with(&url, opts).await.unwrap();
    let q = unique("survive");
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
    mq.publish(&json!({"n": 1}), &q, PublishOptions::default()).await.unwrap();
    let held = next(&c).await;

    broker_closes(&origin);
    // The delivery in hand came from the lost channel: settling it now is a
    // no-op, never an error, and the broker delivers it again.
    c.settle(held, Outcome::Ack(Ack::accept())).await.unwrap();
    // The next publish dials again; the consumer subscribes again by itself.
    let mut published = false;
    for _ in 0..50 {
        if mq.publish(&json!({"n": 2}), &q, PublishOptions::default()).await.is_ok() {
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(published, "publishing did not recover");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let d = next(&c).await;
        seen.push((d.message.payload["n"].as_i64().unwrap(), d.message.delivery.redelivered));
        c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
    }
    seen.sort();
    assert_eq!(seen, vec![(1, true), (2, false)]);
    c.close().await;
    // Nothing left behind unacknowledged: a fresh consumer finds the queue empty.
    let again = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(500), again.next()).await.is_err());
    again.close().await;
}

/// The handler deadline: a push consumer whose handler overruns has its
/// delivery retried by the consumer, goes on to the next message, and the
/// late outcome is discarded.
#[tokio::test(flavor = "multi_thread")]
async fn a_handler_past_its_timeout_is_retried_and_its_late_outcome_discarded() {
    for mq in transports().await {
        let q = unique("deadline");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let options = ConsumeOptions { timeout: Duration::from_millis(300), ..short_ladder(3) };
        let handle = mq
            .consume(&q, options, move |m: acemq::Message| {
                let log = log.clone();
                async move {
                    let slow = m.payload["slow"] == true && m.envelope.attempt == 1;
                    log.lock().unwrap().push((m.payload["n"].as_i64().unwrap(), m.envelope.attempt));
                    if slow {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                    Outcome::Ack(Ack::accept())
                }
            })
            .await
            .unwrap();
        mq.publish(&json!({"n": 1, "slow": true}), &q, PublishOptions::default()).await.unwrap();
        mq.publish(&json!({"n": 2}), &q, PublishOptions::default()).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while handle.consumer().stats().abandoned < 1 {
            assert!(std::time::Instant::now() < deadline, "{:?} {:?}", seen.lock().unwrap(), handle.consumer().stats());
            wait_for_ladder(&mq).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, vec![(1, 1), (1, 2), (2, 1)]);
        let s = handle.consumer().stats();
        assert_eq!((s.accepted, s.retried, s.timed_out, s.abandoned), (2, 1, 1, 1), "{s:?}");
        handle.cancel().await;
        mq.close().await;
    }
}

/// A pull consumer's deadline, seen from the settler that holds the
/// delivery: it says its handler is overdue once the deadline has settled
/// the delivery, the consumer no longer counts it in flight, and the late
/// accept is discarded. A settler settles only on the consumer that handed
/// it out.
#[tokio::test(flavor = "multi_thread")]
async fn a_settler_says_when_its_deadline_settled_it_and_settles_only_where_it_came_from() {
    for mq in transports().await {
        let (q, elsewhere) = (unique("overdue"), unique("overdue-other"));
        mq.apply(&Topology::new().queue(&q).queue(&elsewhere)).await.unwrap();
        let options = ConsumeOptions { timeout: Duration::from_millis(200), ..short_ladder(3) };
        let c = std::sync::Arc::new(mq.consumer(&q, options).await.unwrap());
        c.watch_deadlines();
        mq.publish(&json!({"n": 1}), &q, PublishOptions::default()).await.unwrap();
        let (message, settler) = next(&c).await.into_parts();
        assert_eq!((message.payload["n"].as_i64(), c.in_flight(), settler.is_overdue()), (Some(1), 1, false));
        support::eventually("the deadline settles it", Duration::from_secs(5), || async { settler.is_overdue() }).await;
        assert_eq!(c.in_flight(), 0);
        c.accept(settler);
        let s = c.stats();
        assert_eq!((s.accepted, s.timed_out, s.abandoned), (0, 1, 1), "{s:?}");

        let other = mq.consumer(&elsewhere, ConsumeOptions::default()).await.unwrap();
        mq.publish(&json!({"n": 2}), &elsewhere, PublishOptions::default()).await.unwrap();
        let foreign = next(&other).await;
        assert!(!c.owns(foreign.settler()) && other.owns(foreign.settler()));
        c.accept(foreign);
        let errors = c.take_errors();
        assert!(errors.len() == 1 && errors[0].to_string().contains("another consumer"), "{errors:?}");
        assert_eq!((c.stats().accepted, other.stats().accepted, other.in_flight()), (0, 0, 1));
        other.close().await;
        c.close().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_past_the_brokers_consumer_timeout_is_refused() {
    let mq = Connection::open(&format!("memory://{}", unique("t"))).await.unwrap();
    let q = unique("deadline");
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    let options = ConsumeOptions { timeout: Duration::from_secs(3600), ..Default::default() };
    let e = mq.consumer(&q, options).await.err().expect("refused");
    assert_eq!(*e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("consumer_timeout (30m)"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publish_keeps_the_envelopes_origin_and_goes_out_as_attempt_one() {
    // The same rule the Ruby gem gets (spec/integration/wire_spec.rb): an
    // envelope reused from a delivery on its third attempt is a first
    // delivery where it is published next.
    for mq in transports().await {
        let q = unique("fwd");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let mut env = acemq::Envelope::new().with_type("payment.requested.v1");
        env.attempt = 3;
        env.origin = Some("billing@elsewhere".into());
        let sent = mq.publish(&json!({"n": 1}), &q, PublishOptions { envelope: Some(env.clone()), ..Default::default() }).await.unwrap();
        assert_eq!((sent.attempt, sent.origin.as_deref()), (1, Some("billing@elsewhere")));
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let d = next(&c).await;
        assert_eq!(d.message.envelope.id, env.id);
        assert_eq!(d.message.envelope.attempt, 1);
        assert_eq!(d.message.envelope.origin.as_deref(), Some("billing@elsewhere"));
        c.accept(d);
        c.close().await;
        mq.close().await;
    }
}

/// The frame_max a connection proposes (limits::FRAME_MAX, so that lapin's
/// buffers are not grown and written through at connect) bounds a frame,
/// not a message: a body 1 MiB short of RabbitMQ's default
/// `max_message_size` and headers close to the properties budget both still
/// arrive whole. The default was 128 MiB up to 3.13 and is 16 MiB from 4.0
/// (measured: 4.0.5 refuses 127 MiB with a 406), so the body is 15 MiB.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_near_the_brokers_limits_round_trips() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    let mq = Connection::open(&url).await.unwrap();
    let q = unique("big");
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    let body = "x".repeat(15 * 1024 * 1024);
    let mut headers = acemq::Headers::new();
    headers.insert("big".into(), json!("h".repeat(acemq::limits::MAX_PROPERTIES - 4096)));
    mq.publish(&json!({ "blob": body }), &q, PublishOptions { headers, ..Default::default() }).await.unwrap();
    let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(60), c.next()).await.expect("no delivery within 60s").expect("consumer closed");
    assert_eq!(d.message.payload["blob"].as_str().map(str::len), Some(body.len()));
    assert!(d.message.payload["blob"] == json!(body));
    assert_eq!(d.message.envelope.headers["big"].as_str().map(str::len), Some(acemq::limits::MAX_PROPERTIES - 4096));
    c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
    c.close().await;
    mq.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_or_peek_limit_of_zero_is_refused() {
    for mq in transports().await {
        let q = unique("limits");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let err = mq.replay_dead_letters(&q, acemq::ReplayOptions { limit: Some(0), ..Default::default() }).await.unwrap_err();
        assert_eq!(*err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("at least 1"), "{err}");
        let err = mq.peek_dead_letters(&q, 0).await.unwrap_err();
        assert_eq!(*err.kind(), ErrorKind::InvalidArgument, "{err}");
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn envelope_for_adds_a_trace_context_only_where_there_is_none() {
    let mq = Connection::open(&format!("memory://{}", unique("trace"))).await.unwrap();
    let mut context = acemq::Headers::new();
    context.insert("traceparent".into(), json!("00-aaaa-bbbb-01"));
    context.insert("tracestate".into(), json!("k=v"));
    let fresh = mq.envelope_for(&PublishOptions { trace_context: context.clone(), ..Default::default() });
    assert_eq!(fresh.headers["traceparent"], "00-aaaa-bbbb-01");
    assert_eq!(fresh.headers["tracestate"], "k=v");
    let mut forwarded = acemq::Headers::new();
    forwarded.insert("traceparent".into(), json!("00-cccc-dddd-01"));
    let kept = mq.envelope_for(&PublishOptions { headers: forwarded, trace_context: context, ..Default::default() });
    assert_eq!(kept.headers["traceparent"], "00-cccc-dddd-01");
    assert!(!kept.headers.contains_key("tracestate"), "a context already there is left whole: {:?}", kept.headers);
    mq.close().await;
}

/// A publish stream sends in order across many chunks, more than its window
/// holds (so a push waits for room), and `finish` reports the first failure
/// after every confirm, with the messages around it delivered.
#[tokio::test(flavor = "multi_thread")]
async fn a_publish_stream_sends_in_order_past_its_window_and_reports_the_first_failure() {
    for mq in transports().await {
        let q = unique("stream");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let message = |n, to: &str| numbered(&mq, n, to);
        let total = acemq::STREAM_WINDOW * 2 + 10;
        let mut stream = mq.stream();
        let mut waited = false;
        for n in 0..total {
            if !stream.try_push(message(n, &q)).unwrap() {
                waited = true;
                stream.flush().await.unwrap();
            }
        }
        assert_eq!(stream.finish().await.unwrap(), total);
        let c = mq.consumer(&q, ConsumeOptions { prefetch: 500, ..Default::default() }).await.unwrap();
        for n in 0..total {
            let d = next(&c).await;
            assert_eq!(d.message.payload["n"], n, "in the order handed over");
            c.accept(d);
        }
        c.close().await;
        // On RabbitMQ the stream outran the broker and had to wait for room
        // at least once; memory:// takes everything at once.
        if mq.memory_broker().is_none() {
            assert!(waited, "{total} messages never filled a window of {}", acemq::STREAM_WINDOW);
        }

        let nowhere = unique("nowhere");
        let mut stream = mq.stream();
        for m in [message(0, &q), message(1, &nowhere), message(2, &q)] {
            stream.push(m).await.unwrap();
        }
        let err = stream.finish().await.unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::Unroutable, "{err}");
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        for n in [0, 2] {
            let d = next(&c).await;
            assert_eq!(d.message.payload["n"], n);
            c.accept(d);
        }
        c.close().await;
        mq.close().await;
    }
}

/// Acceptances go on the wire from whichever thread settles the delivery
/// that fills a batch (half the prefetch), the rest within a short delay.
/// Settled out of order from several threads at once, no ack may reach the
/// broker behind a `multiple` one that covered it (RabbitMQ closes the
/// channel over the unknown tag, and the consumer subscribes again), and
/// every one is acknowledged: nothing comes back to a second consumer.
#[tokio::test(flavor = "multi_thread")]
async fn acceptances_from_several_threads_out_of_order_all_reach_the_broker() {
    for mq in transports().await {
        let q = unique("acks");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let n = 1200;
        let env = mq.envelope_for(&PublishOptions::default());
        let messages: Vec<acemq::JsonMessage<'_>> =
            (0..n).map(|_| acemq::JsonMessage { body: br#"{"n":1}"#, exchange: "", routing_key: &q, envelope: &env }).collect();
        for sent in mq.send_json_batch(&messages).await {
            sent.unwrap().wait().await.unwrap();
        }
        let c = std::sync::Arc::new(mq.consumer(&q, ConsumeOptions { prefetch: 20, ..Default::default() }).await.unwrap());
        let (tx, rx) = std::sync::mpsc::channel::<acemq::Delivery>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        // Four threads settle what they are handed, each holding a few back
        // and settling them in reverse, so tags arrive far out of order.
        let settlers: Vec<_> = (0..4)
            .map(|_| {
                let (c, rx) = (c.clone(), rx.clone());
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    loop {
                        let next = rx.lock().unwrap().recv();
                        let Ok(d) = next else { break };
                        held.push(d);
                        if held.len() == 3 {
                            while let Some(d) = held.pop() {
                                c.accept(d);
                            }
                        }
                    }
                    while let Some(d) = held.pop() {
                        c.accept(d);
                    }
                })
            })
            .collect();
        for _ in 0..n {
            tx.send(next(&c).await).unwrap();
        }
        drop(tx);
        for t in settlers {
            t.join().unwrap();
        }
        assert_eq!(c.stats().accepted, n as u64);
        assert_eq!(c.resubscriptions(), 0, "the channel was closed under the consumer");
        c.close().await;
        let again = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let back = tokio::time::timeout(Duration::from_millis(500), again.next()).await;
        assert!(back.is_err(), "a message came back: an acceptance never reached the broker");
        again.close().await;
        mq.close().await;
    }
}
