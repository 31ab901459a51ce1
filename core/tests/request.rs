//! Request/reply over direct reply-to (RabbitMQ, when AMQP_URL is set) and
//! on memory://: replies matched to many requests in flight, a timeout, a
//! late reply dropped and counted.

use acemq::{Ack, ConsumeOptions, Connection, ErrorKind, Outcome, PublishOptions, RequestOptions, Topology};
use serde_json::json;
use std::time::Duration;

mod support;
use support::{transports, unique};

fn within(timeout: Duration) -> RequestOptions {
    RequestOptions { timeout, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_each_get_their_own_reply() {
    for mq in transports().await {
        let q = unique("rpc");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let server = mq.clone();
        let handle = mq
            .consume(&q, ConsumeOptions { concurrency: 4, ..Default::default() }, move |m: acemq::Message| {
                let server = server.clone();
                async move {
                    let n = m.payload["n"].as_i64().unwrap();
                    server.reply(&m, &json!({ "square": n * n }), PublishOptions::default()).await.unwrap();
                    Outcome::Ack(Ack::accept())
                }
            })
            .await
            .unwrap();
        let asks = (0..40).map(|n| {
            let mq = mq.clone();
            let q = q.clone();
            tokio::spawn(async move { (n, mq.request(&json!({ "n": n }), &q, within(Duration::from_secs(10))).await) })
        });
        for ask in asks {
            let (n, reply) = ask.await.unwrap();
            assert_eq!(reply.unwrap().payload["square"], n * n);
        }
        handle.cancel().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_nobody_answers_times_out_and_its_late_reply_is_counted() {
    for mq in transports().await {
        let q = unique("rpc-slow");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        // A bad request first: to a queue nobody declared, refused at once.
        let err = mq.request(&json!({}), &unique("nobody"), within(Duration::from_secs(5))).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Unroutable), "{err}");
        let err = mq.request(&json!({"n": 1}), &q, within(Duration::from_millis(300))).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Timeout), "{err}");
        assert_eq!(mq.late_replies(), 0);
        // Now answered, late: the request waits in the queue.
        let server: Connection = mq.clone();
        let handle = mq
            .consume(&q, ConsumeOptions::default(), move |m: acemq::Message| {
                let server = server.clone();
                async move {
                    server.reply(&m, &json!({ "late": true }), PublishOptions::default()).await.unwrap();
                    Outcome::Ack(Ack::accept())
                }
            })
            .await
            .unwrap();
        for _ in 0..100 {
            if mq.late_replies() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(mq.late_replies(), 1);
        // And the connection goes on answering.
        let reply = mq.request(&json!({"n": 2}), &q, within(Duration::from_secs(5))).await.unwrap();
        assert_eq!(reply.payload["late"], true);
        // A published message has nobody to reply to.
        let plain = acemq::Message::new(json!({}), acemq::Envelope::new());
        assert!(mq.reply(&plain, &json!({}), PublishOptions::default()).await.is_err());
        handle.cancel().await;
        mq.close().await;
    }
}
