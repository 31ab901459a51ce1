//! Handlers as a Rust service writes them (issue 37): a struct with `&self`
//! state, `Result` with `?`, the guard passed to `consume` as it is. On
//! memory:// always and on RabbitMQ when AMQP_URL is set.

use acemq::idempotency::{Idempotent, InMemoryIdempotencyStore};
use acemq::{Ack, ConsumeOptions, Failure, Handler, Message, PublishOptions, RetryPolicy, Topology};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod support;
use support::{eventually, transports, unique};

#[derive(Debug)]
struct GatewayDown;
impl std::fmt::Display for GatewayDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the gateway did not answer")
    }
}
impl std::error::Error for GatewayDown {}

/// Accepts `{"ok": true}`, retries on a `GatewayDown` through `?`, and
/// rejects a bad amount as fatal.
struct Charge {
    handled: AtomicUsize,
}

impl Charge {
    fn gateway(&self, message: &Message) -> Result<(), GatewayDown> {
        if message.payload["down"] == true { Err(GatewayDown) } else { Ok(()) }
    }
}

impl Handler for Charge {
    type Output = Result<Ack, Failure>;

    async fn handle(&self, message: Message) -> Result<Ack, Failure> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let amount: i64 = message.payload["amount"].as_str().unwrap_or("1").parse().map_err(Failure::fatal)?;
        self.gateway(&message)?;
        let _ = amount;
        Ok(Ack::accept())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_from_a_struct_handler_are_retries_by_type_and_fatal_ones_rejects() {
    for mq in transports().await {
        let q = unique("charge");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let options = ConsumeOptions { retry: RetryPolicy::new(1, Duration::from_millis(100), Duration::from_millis(100)), ..Default::default() };
        let handle = mq.consume(&q, options, Charge { handled: AtomicUsize::new(0) }).await.unwrap();
        for body in [json!({"amount": "5"}), json!({"down": true}), json!({"amount": "five"}), json!({"amount": "6"})] {
            mq.publish(&body, &q, PublishOptions::default()).await.unwrap();
        }
        let mut letters = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while letters.len() < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            letters = mq.peek_dead_letters(&q, 10).await.unwrap();
        }
        handle.cancel().await;
        let mut classes: Vec<_> = letters.iter().map(|l| l.error_class.clone().unwrap_or_default()).collect();
        classes.sort();
        assert_eq!(classes, ["core::num::error::ParseIntError", "handlers::GatewayDown"], "{letters:?}");
        let down = letters.iter().find(|l| l.error_class.as_deref() == Some("handlers::GatewayDown")).unwrap();
        // max_attempts 1: the retry had nowhere to go, so it says so.
        assert!(down.reason.as_deref().unwrap_or_default().contains("the gateway did not answer"), "{down:?}");
        assert_eq!(mq.queue_counts(&q).await.unwrap().map(|c| c.ready), Some(0), "the good messages before and after were accepted");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guard_is_passed_as_it_is_and_its_claim_timeout_becomes_the_deadline() {
    for mq in transports().await {
        let q = unique("once");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let store = InMemoryIdempotencyStore::new(Duration::from_secs(3600)).with_claim_timeout(Duration::from_secs(90));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let once = Idempotent::new(store, move |_m: Message| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ack::accept() }
        });
        let guard = once.guard().clone();
        let handle = mq.consume(&q, ConsumeOptions::default(), once).await.unwrap();
        assert_eq!(handle.consumer().options().timeout, Duration::from_secs(90));
        assert_eq!(handle.consumer().options().claim_timeout, Some(Duration::from_secs(90)));
        let twice = PublishOptions { envelope: Some(acemq::Envelope::new()), ..Default::default() };
        for _ in 0..2 {
            mq.publish(&json!({"n": 1}), &q, twice.clone()).await.unwrap();
        }
        eventually("a duplicate", Duration::from_secs(10), || async { guard.stats().duplicates == 1 }).await;
        handle.cancel().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // Options guarded by the caller are the caller's.
        let store = InMemoryIdempotencyStore::new(Duration::from_secs(3600)).with_claim_timeout(Duration::from_secs(90));
        let mine = ConsumeOptions::default().guarded_by(Duration::from_secs(30));
        let handle = mq.consume(&q, mine, Idempotent::new(store, |_m: Message| async { Ack::accept() })).await.unwrap();
        assert_eq!(handle.consumer().options().timeout, Duration::from_secs(30));
        handle.cancel().await;
    }
}
