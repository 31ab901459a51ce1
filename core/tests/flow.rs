//! Flow (issue 36): a paused consumer holds nothing and spends no attempt;
//! a circuit breaker pauses a consumer whose handlers keep failing and tries
//! one message before it closes; a throttle paces hand-outs, and one shared
//! through a store holds consumers to one limit. memory:// always,
//! RabbitMQ when AMQP_URL is set.

use acemq::{Ack, BreakerState, CircuitBreaker, ConsumeOptions, Next, Outcome, PublishOptions, Throttle, Topology};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;
use support::{eventually, next, transports, unique};


#[tokio::test(flavor = "multi_thread")]
async fn a_paused_consumer_gives_back_what_it_buffered_unspent_and_resumes_in_order() {
    for mq in transports().await {
        let q = unique("pause");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..20 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        let c = Arc::new(mq.consumer(&q, ConsumeOptions { prefetch: 8, ..Default::default() }).await.unwrap());
        let held = next(&c).await;
        assert_eq!(held.message.payload["n"], 0);
        eventually("the broker sends a full window", Duration::from_secs(10), || async {
            mq.queue_counts(&q).await.unwrap().unwrap().ready == 12
        })
        .await;
        c.pause().await;
        assert!(c.is_paused());
        // Everything but the delivery in hand is back on the queue.
        eventually("the buffered deliveries go back", Duration::from_secs(10), || async {
            mq.queue_counts(&q).await.unwrap().unwrap().ready == 19
        })
        .await;
        let reader = c.clone();
        let got = tokio::task::spawn_blocking(move || matches!(reader.next_blocking(Duration::from_millis(300)), Next::Delivery(_)))
            .await
            .unwrap();
        assert!(!got, "a paused consumer handed a delivery out");
        // The delivery in hand settles while paused.
        c.settle(held, Outcome::Ack(Ack::accept())).await.unwrap();
        c.resume().await.unwrap();
        assert!(!c.is_paused());
        for n in 1..20 {
            let d = next(&c).await;
            assert_eq!(d.message.payload["n"], n, "out of order after the resume");
            assert_eq!(d.message.envelope.attempt, 1, "the pause spent an attempt on {n}");
            c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        }
        assert_eq!(c.stats().accepted, 20);
        assert_eq!(c.stats().retried, 0);
        c.close().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_circuit_breaker_pauses_a_failing_consumer_and_closes_after_a_good_trial() {
    for mq in transports().await {
        let q = unique("breaker");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..40 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        let down = Arc::new(AtomicBool::new(true));
        let calls = Arc::new(AtomicUsize::new(0));
        let options = ConsumeOptions {
            prefetch: 10,
            concurrency: 2,
            circuit_breaker: Some(CircuitBreaker::new(3, Duration::from_secs(30), Duration::from_millis(800))),
            ..ConsumeOptions::with_concurrency(2)
        };
        let (d2, c2) = (down.clone(), calls.clone());
        let handle = mq
            .consume(&q, options, move |_m| {
                let (down, calls) = (d2.clone(), c2.clone());
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    if down.load(Ordering::SeqCst) {
                        Outcome::Raised { class: "Downstream".into(), message: "503".into(), fatal: false }
                    } else {
                        Outcome::Ack(Ack::accept())
                    }
                }
            })
            .await
            .unwrap();
        let c = handle.consumer();
        eventually("the breaker opens", Duration::from_secs(10), || async { c.breaker_state() == Some(BreakerState::Open) }).await;
        // Paused: the rest of the window is back on the queue, and no more
        // valid messages go round the ladder while the downstream is down.
        eventually("the window goes back", Duration::from_secs(10), || async {
            mq.queue_counts(&q).await.unwrap().unwrap().ready >= 40 - 5
        })
        .await;
        // The third failure opens the breaker as it is counted; its retry is
        // settled (and counted in stats) a moment after.
        eventually("the failures' retries settled", Duration::from_secs(10), || async { c.stats().retried >= 3 }).await;
        let failed = c.stats().retried;
        assert!((3..=4).contains(&failed), "{failed} retries before the breaker opened (3 open it, 1 more may be in a handler)");
        // Still down at the trial: it fails and the breaker opens again.
        // The trial's message goes round without spending an attempt (a
        // wait, issue 49): the downstream is down, the message is not at
        // fault.
        eventually("a trial fails and opens it again", Duration::from_secs(10), || async { c.stats().waited > 0 }).await;
        assert_eq!(c.stats().waited, 1, "more than the trial ran while half-open");
        assert_eq!(c.stats().retried, failed, "the failed trial spent an attempt");
        down.store(false, Ordering::SeqCst);
        eventually("the breaker closes and every message is handled", Duration::from_secs(30), || async {
            c.breaker_state() == Some(BreakerState::Closed) && c.stats().accepted == 40
        })
        .await;
        assert_eq!(c.stats().dead_lettered, 0);
        handle.cancel().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_throttle_hands_out_its_limit_then_paces_the_rest() {
    for mq in transports().await {
        let q = unique("throttle");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..15 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        let options = ConsumeOptions { throttle: Some(Throttle::new(5, Duration::from_secs(1))), ..Default::default() };
        let c = mq.consumer(&q, options).await.unwrap();
        let started = Instant::now();
        for _ in 0..15 {
            let d = next(&c).await;
            c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        }
        // 5 at once, then 5 a second: the last of the 15 not before 2 s.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1900), "15 messages at 5/s took {took:?}");
        c.close().await;
        mq.close().await;
    }
}

/// A stopped consumer is not held until its throttle's next token: a
/// thread blocked in `next_blocking` and a task awaiting `next` both end
/// at once (the break-it run: `cancel` took `per`, for ever with a
/// `per` of 2**40 seconds).
#[tokio::test(flavor = "multi_thread")]
async fn stopping_a_throttled_consumer_does_not_wait_for_the_next_token() {
    for mq in transports().await {
        let q = unique("throttle-stop");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..4 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        let options = ConsumeOptions { throttle: Some(Throttle::new(1, Duration::from_secs(3600))), ..Default::default() };
        let c = Arc::new(mq.consumer(&q, options).await.unwrap());
        let first = next(&c).await; // the one token of the hour
        let blocked = {
            let c = c.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                loop {
                    match c.next_blocking(Duration::from_millis(500)) {
                        Next::Closed => return t.elapsed(),
                        Next::Delivery(_) => panic!("a delivery without a token"),
                        Next::Empty if t.elapsed() > Duration::from_secs(30) => panic!("still open after 30 s"),
                        Next::Empty => {}
                    }
                }
            })
        };
        let awaited = {
            let c = c.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                assert!(c.next().await.is_none(), "a delivery without a token");
                t.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let stopped = Instant::now();
        c.stop().await;
        let awaited = tokio::time::timeout(Duration::from_secs(10), awaited).await.expect("next() held after stop").unwrap();
        let blocked = tokio::task::spawn_blocking(move || blocked.join().unwrap()).await.unwrap();
        assert!(stopped.elapsed() < Duration::from_secs(5), "{:?}", stopped.elapsed());
        assert!(awaited < Duration::from_secs(5) && blocked < Duration::from_secs(5), "{awaited:?} {blocked:?}");
        c.settle(first, Outcome::Ack(Ack::accept())).await.unwrap();
        c.close().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_key_routes_to_the_partition_core_computes_and_keeps_its_order() {
    use acemq::partition::{partition_of, partition_queue, PartitionKey};
    for mq in transports().await {
        let q = unique("parts");
        mq.apply(&Topology::new().partitioned_queue(&q, 4)).await.unwrap();
        let keys = ["acct-1", "acct-2", "acct-3", "acct-4", "acct-5", "acct-6"];
        for n in 0..30 {
            let key = keys[n % keys.len()];
            let options = PublishOptions { partition: Some(PartitionKey::new(key, 4)), ..Default::default() };
            mq.publish(&json!({ "key": key, "n": n }), &q, options).await.unwrap();
        }
        let bad = PublishOptions { partition: Some(PartitionKey::new("acct-1", 0)), ..Default::default() };
        assert!(mq.publish(&json!({}), &q, bad).await.is_err(), "a partition count of 0 is refused");
        let mut seen = 0;
        for p in 0..4u16 {
            let c = mq.consumer(&partition_queue(&q, p), ConsumeOptions::default()).await.unwrap();
            let expected: Vec<usize> = (0..30).filter(|n| partition_of(keys[n % keys.len()], 4) == p).collect();
            for &n in &expected {
                let d = next(&c).await;
                // In publish order within the partition, and only its keys.
                assert_eq!(d.message.payload["n"], n, "partition {p}");
                c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
            }
            seen += expected.len();
            c.close().await;
        }
        assert_eq!(seen, 30);
        mq.close().await;
    }
}

/// A store that fails its first `failures` leases, then asks `inner`.
struct Flaky {
    inner: acemq::throttle::SqlThrottleStore<acemq::sql::SqliteConnection>,
    failures: AtomicUsize,
    asked: AtomicUsize,
}

impl acemq::throttle::ThrottleStore for Flaky {
    fn lease(&self, name: &str, throttle: Throttle, want: u32) -> acemq::Result<acemq::throttle::Lease> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if self.failures.load(Ordering::SeqCst) > 0 {
            self.failures.fetch_sub(1, Ordering::SeqCst);
            return Err(acemq::Error::new(acemq::ErrorKind::Store, "database is down"));
        }
        self.inner.lease(name, throttle, want)
    }
}

fn sqlite_throttle(failures: usize) -> Arc<Flaky> {
    Arc::new(Flaky {
        inner: acemq::throttle::SqlThrottleStore::new(acemq::sql::SqliteConnection::open(":memory:").unwrap()),
        failures: AtomicUsize::new(failures),
        asked: AtomicUsize::new(0),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shared_throttle_holds_two_consumers_to_one_limit() {
    for mq in transports().await {
        let q = unique("shared-throttle");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..20 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        let store = acemq::throttle::SharedStore(sqlite_throttle(0));
        let options = || ConsumeOptions {
            name: Some(format!("{q}-consumer")),
            // Each holds a few: neither takes the whole queue into its prefetch.
            prefetch: 4,
            throttle: Some(Throttle::new(5, Duration::from_secs(1))),
            throttle_store: Some(store.clone()),
            ..Default::default()
        };
        let (a, b) = (mq.consumer(&q, options()).await.unwrap(), mq.consumer(&q, options()).await.unwrap());
        let started = Instant::now();
        let taken = Arc::new(AtomicUsize::new(0));
        let take = |c: acemq::Consumer, taken: Arc<AtomicUsize>| async move {
            while taken.load(Ordering::SeqCst) < 20 {
                if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(200), c.next()).await {
                    taken.fetch_add(1, Ordering::SeqCst);
                    c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
                }
            }
            c.close().await;
        };
        tokio::join!(take(a, taken.clone()), take(b, taken.clone()));
        // Each alone would hand out 5 at once and 5 a second after: 20 in
        // about 1.3 s between them (measured: 15 in 0.8 s). Shared, 5 per
        // window of the store: four windows, the first maybe partial.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(2000), "20 messages at 5 per window shared took {took:?}");
        assert_eq!(taken.load(Ordering::SeqCst), 20);
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_throttle_store_holds_deliveries_reports_and_retries() {
    for mq in transports().await {
        let q = unique("throttle-outage");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..3 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        let failures = Arc::new(AtomicUsize::new(0));
        let seen = failures.clone();
        let queue = q.clone();
        let listener = acemq::events::subscribe(move |e| {
            if let acemq::events::Event::Subscription(s) = e {
                if s.queue == queue && s.state == "throttle_store_failed" {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let flaky = sqlite_throttle(2);
        let options = ConsumeOptions {
            throttle: Some(Throttle::new(10, Duration::from_secs(1))),
            throttle_store: Some(acemq::throttle::SharedStore(flaky.clone())),
            ..Default::default()
        };
        let c = mq.consumer(&q, options).await.unwrap();
        // Nothing is handed out while the store fails; each failure is
        // reported and asked again a second later; then all three, in order.
        for n in 0..3 {
            let d = next(&c).await;
            assert_eq!(d.message.payload["n"], n);
            c.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
        }
        assert_eq!(failures.load(Ordering::SeqCst), 2);
        assert!(flaky.asked.load(Ordering::SeqCst) >= 3);
        assert_eq!(c.stats().dead_lettered, 0);
        acemq::events::unsubscribe(listener);
        c.close().await;
        mq.close().await;
    }
}
