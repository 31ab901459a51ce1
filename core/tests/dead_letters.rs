//! Reading a DLQ (peek, filtered replay) gives back what stays, and puts a
//! dead letter whose broker delivery count is near a limit back at the
//! DLQ's tail as a fresh copy instead (replay.rs, `REFRESH_AT`), on
//! memory:// and RabbitMQ. A classic DLQ passes a publisher's
//! `x-delivery-count` through untouched, which stands in here for the count
//! RabbitMQ 4.x shows on a message it dead-lettered for its delivery limit.

mod support;

use acemq::{dlq_name, Ack, ConsumeOptions, Headers, Outcome, PublishOptions, Topology};
use serde_json::{json, Value};
use support::{next, transports, unique};

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_near_a_delivery_limit_is_put_back_fresh_and_read_once_per_read() {
    for mq in transports().await {
        let q = unique("refresh");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let dlq = dlq_name(&q);
        let mut ids = Vec::new();
        for n in 0..3 {
            let mut headers = Headers::new();
            if n == 1 {
                headers.insert("x-delivery-count".into(), json!(21));
                // What 4.x writes beside x-death, read when x-death is gone.
                headers.insert("x-last-death-reason".into(), json!("delivery_limit"));
                headers.insert("x-last-death-queue".into(), json!(q));
            }
            let env = mq.publish(&json!({ "n": n }), &dlq, PublishOptions { headers, ..Default::default() }).await.unwrap();
            ids.push(env.id);
        }
        let first = mq.peek_dead_letters(&q, 10).await.unwrap();
        assert_eq!(first.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), ids, "read once each, in order: the copy put back is not read again");
        assert_eq!(first[1].reason.as_deref(), Some(format!("dead-lettered by the broker: delivery_limit on {q}").as_str()));
        let second = mq.peek_dead_letters(&q, 10).await.unwrap();
        assert_eq!(
            second.iter().map(|d| d.id.clone()).collect::<Vec<_>>(),
            vec![ids[0].clone(), ids[2].clone(), ids[1].clone()],
            "the one near a limit moved to the tail, once"
        );
        assert_eq!(second[2].reason, first[1].reason, "its reason kept in x-acemq-reason");
        let skipped = mq.replay_dead_letters(&q, acemq::ReplayOptions { reason: Some("no such reason".into()), ..Default::default() }).await.unwrap();
        assert_eq!(skipped, acemq::ReplayReport { replayed: 0, skipped: 3 });
        let all = mq.replay_dead_letters(&q, acemq::ReplayOptions::default()).await.unwrap();
        assert_eq!(all, acemq::ReplayReport { replayed: 3, skipped: 0 });
        let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
        for _ in 0..3 {
            let d = next(&c).await;
            let h = &d.message.envelope.headers;
            for gone in ["x-delivery-count", "x-acquired-count", "x-acemq-refreshed-by"] {
                assert!(!h.contains_key(gone), "{gone} on a replayed copy: {h:?}");
            }
            if d.message.envelope.id == ids[1] {
                let history = h["x-acemq-history"].as_array().unwrap();
                assert_eq!(history[0]["reason"], Value::from(format!("dead-lettered by the broker: delivery_limit on {q}")));
            }
            c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        }
        c.close().await;
    }
}
