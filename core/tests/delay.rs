//! Delayed publish through the cascade (RabbitMQ, when AMQP_URL is set) and
//! on memory://'s clock: the same envelope arrives, not before it is due.

use acemq::{ConsumeOptions, Connection, ExchangeKind, PublishOptions, Topology};
use serde_json::json;
use std::time::{Duration, Instant};

mod support;
use support::{next, transports, unique};

/// Wait out `by` on RabbitMQ; advance the clock on memory://.
async fn pass(mq: &Connection, by: Duration) {
    match mq.memory_broker() {
        Some(b) => b.advance(by),
        None => tokio::time::sleep(by).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_arrives_once_due_with_its_envelope() {
    for mq in transports().await {
        let q = unique("delay");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        let mut headers = acemq::Headers::new();
        headers.insert("traceparent".into(), json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        let started = Instant::now();
        let env = mq
            .publish(&json!({"n": 1}), &q, PublishOptions { delay: Some(Duration::from_secs(3)), headers, ..Default::default() })
            .await
            .unwrap();
        // Nothing before it is due: 3 s is 2 s in level 1 then 1 s in level 0.
        pass(&mq, Duration::from_millis(1500)).await;
        assert!(tokio::time::timeout(Duration::from_millis(200), c.next()).await.is_err(), "not before it is due");
        if mq.memory_broker().is_some() {
            assert_eq!(acemq::delay::waiting(&mq).await.unwrap()[1], 1, "memory:// counts it in level 1");
        } else {
            let waiting = acemq::delay::waiting(&mq).await.unwrap();
            assert!(waiting[1] + waiting[0] >= 1, "RabbitMQ has it in a level: {waiting:?}");
        }
        pass(&mq, Duration::from_millis(1600)).await;
        let d = next(&c).await;
        let m = &d.message;
        if mq.memory_broker().is_none() {
            assert!(started.elapsed() >= Duration::from_secs(3), "{:?}", started.elapsed());
        }
        assert_eq!(m.envelope.id, env.id);
        assert_eq!(m.payload["n"], 1);
        assert_eq!(m.envelope.headers["traceparent"], json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        c.settle(d, acemq::Outcome::Ack(acemq::Ack::accept())).await.unwrap();
        c.close().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_to_an_exchange_keeps_its_routing_key_and_a_bad_one_is_refused() {
    for mq in transports().await {
        let ex = unique("delay-ex");
        let q = unique("delay-q");
        mq.apply(&Topology::new().exchange(&ex, ExchangeKind::Direct).queue(&q).bind(&q, &ex, "order.placed")).await.unwrap();
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        // A bad one first: a queue that does not exist is refused now, not
        // lost in a year.
        let missing = mq
            .publish(&json!({}), &unique("missing"), PublishOptions { delay: Some(Duration::from_secs(1)), ..Default::default() })
            .await;
        assert!(missing.is_err(), "a delay to no queue is refused");
        let too_long = mq
            .publish(&json!({}), &q, PublishOptions { delay: Some(acemq::delay::MAX_DELAY * 2), ..Default::default() })
            .await
            .unwrap_err();
        assert!(too_long.message().contains("at most"), "{too_long}");
        let options = PublishOptions { exchange: ex.clone(), delay: Some(Duration::from_secs(1)), ..Default::default() };
        let env = mq.publish(&json!({"n": 2}), "order.placed", options).await.unwrap();
        pass(&mq, Duration::from_millis(1100)).await;
        let d = next(&c).await;
        assert_eq!(d.message.envelope.id, env.id);
        assert!(!d.message.envelope.headers.contains_key("CC"), "the cascade's CC is not the application's");
        c.settle(d, acemq::Outcome::Ack(acemq::Ack::accept())).await.unwrap();
        c.close().await;
        mq.close().await;
    }
}
