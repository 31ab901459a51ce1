//! `Connection::teardown` (issue 37 part 4): a queue goes with its rungs and
//! its DLQ, and a queue still holding messages is refused whole. On
//! memory:// always and on RabbitMQ when AMQP_URL is set.

use acemq::{ConsumeOptions, ErrorKind, PublishOptions, RetryPolicy, TeardownOptions, Topology};
use serde_json::json;
use std::time::Duration;

mod support;
use support::{transports, unique};

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_goes_with_its_rungs_and_dlq_and_one_with_messages_is_refused() {
    for mq in transports().await {
        let q = unique("retire");
        let topology = Topology::new().queue(&q);
        mq.apply(&topology).await.unwrap();
        let ladder = RetryPolicy::new(3, Duration::from_secs(1), Duration::from_secs(10));
        // Opening a consumer declares the ladder: two rungs and the DLQ.
        let consumer = mq.consumer(&q, ConsumeOptions { retry: ladder.clone(), ..Default::default() }).await.unwrap();
        consumer.close().await;
        let mut all = vec![q.clone()];
        all.extend(ladder.rung_queues(&q));
        all.push(acemq::dlq_name(&q));
        for name in &all {
            assert!(mq.queue_counts(name).await.unwrap().is_some(), "{name} was declared");
        }

        mq.publish(&json!({"n": 1}), &q, PublishOptions::default()).await.unwrap();
        let options = TeardownOptions { retry: vec![ladder.clone()], force: false };
        let refused = mq.teardown(&topology, &options).await.unwrap_err();
        assert_eq!(refused.kind(), &ErrorKind::InvalidArgument);
        assert!(refused.message().contains(&format!("{q} (1 messages, 0 consumers)")), "{refused}");
        assert!(refused.message().contains("nothing was deleted"), "{refused}");
        for name in &all {
            assert!(mq.queue_counts(name).await.unwrap().is_some(), "{name} is still there after the refusal");
        }

        let report = mq.teardown(&topology, &TeardownOptions { force: true, ..options.clone() }).await.unwrap();
        assert_eq!(report.deleted, all);
        assert_eq!(report.messages, 1);
        for name in &all {
            assert!(mq.queue_counts(name).await.unwrap().is_none(), "{name} is gone");
        }
        // Again: nothing left, nothing refused.
        assert_eq!(mq.teardown(&topology, &options).await.unwrap().deleted, Vec::<String>::new());
    }
}
