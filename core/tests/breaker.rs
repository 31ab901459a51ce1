//! The circuit breaker knows what an outage is (issue 49 part 2): only the
//! failures its predicate names open it, the others (a bug, a bad message)
//! take the retry ladder into the DLQ without pausing anything, and an open
//! breaker tries one message every probe interval, so a downstream's return
//! is seen within about one interval however long `pause` is. memory://
//! always, RabbitMQ when AMQP_URL is set.

use acemq::{dlq_name, Ack, BreakerState, CircuitBreaker, ConsumeOptions, Failed, Failure, Outcome, PublishOptions, RetryPolicy, Topology};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;
use support::{eventually, transports, unique};

/// A handler's bug: not the downstream's fault.
#[derive(Debug)]
struct Bug;

impl std::fmt::Display for Bug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("undefined method `total' for nil")
    }
}

impl std::error::Error for Bug {}

/// What the downstream answers while it is down.
fn refused() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "downstream refused the connection")
}

/// The breaker's transitions on `queue`, as its events report them
/// (`circuit_open`, ...), in order.
fn transitions(queue: &str) -> (acemq::events::SubscriberId, Arc<Mutex<Vec<&'static str>>>) {
    let seen: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let (out, queue) = (seen.clone(), queue.to_owned());
    let id = acemq::events::subscribe(move |e| {
        if let acemq::events::Event::Subscription(s) = e {
            if s.queue == queue && s.state.starts_with("circuit_") {
                seen.lock().unwrap().push(s.state);
            }
        }
    });
    (id, out)
}

#[tokio::test(flavor = "multi_thread")]
async fn bugs_take_the_ladder_to_the_dlq_and_only_the_outage_opens_the_breaker() {
    for mq in transports().await {
        let q = unique("breaker-on");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let down = Arc::new(AtomicBool::new(false));
        // Handled (accepted) per message number, and handler calls per number.
        let accepted: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
        let failed_io = Arc::new(AtomicUsize::new(0));
        let options = ConsumeOptions {
            prefetch: 10,
            retry: RetryPolicy { max_attempts: 3, initial_delay: Duration::from_millis(100), max_delay: Duration::from_millis(200) },
            circuit_breaker: Some(
                CircuitBreaker::new(3, Duration::from_secs(30), Duration::from_secs(60))
                    .probe(Duration::from_millis(300))
                    .on(|f: &Failed<'_>| f.is::<std::io::Error>()),
            ),
            ..ConsumeOptions::with_concurrency(2)
        };
        let (d2, a2, f2) = (down.clone(), accepted.clone(), failed_io.clone());
        let handle = mq
            .consume(&q, options, move |m: acemq::Message| {
                let (down, accepted, failed_io) = (d2.clone(), a2.clone(), f2.clone());
                async move {
                    let n = m.payload["n"].as_u64().unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if n % 5 == 0 {
                        return Err(Failure::from(Bug));
                    }
                    if down.load(Ordering::SeqCst) {
                        failed_io.fetch_add(1, Ordering::SeqCst);
                        return Err(refused().into());
                    }
                    *accepted.lock().unwrap().entry(n).or_default() += 1;
                    Ok::<_, Failure>(Ack::accept())
                }
            })
            .await
            .unwrap();
        let c = handle.consumer();
        let (listener, seen) = transitions(&q);

        // Bugs alone: 6 messages failing 3 times each, 18 failures, and
        // the breaker (3 open it) never moves.
        for n in 0..30u64 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        eventually("the 24 good ones are handled and the 6 bugs dead-lettered", Duration::from_secs(20), || async {
            accepted.lock().unwrap().len() == 24 && mq.queue_counts(&dlq_name(&q)).await.unwrap().unwrap().ready == 6
        })
        .await;
        assert!(seen.lock().unwrap().is_empty(), "bugs moved the breaker: {:?}", seen.lock().unwrap());

        // The outage, with bugs still mixed in.
        down.store(true, Ordering::SeqCst);
        for n in 30..60u64 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        eventually("the outage opens the breaker", Duration::from_secs(10), || async { c.breaker_state() == Some(BreakerState::Open) })
            .await;
        // Trials every 300 ms while it lasts.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        down.store(false, Ordering::SeqCst);
        eventually("every good message is handled", Duration::from_secs(30), || async { accepted.lock().unwrap().len() == 48 }).await;
        eventually("the bugs of the second batch reach the DLQ", Duration::from_secs(10), || async {
            mq.queue_counts(&dlq_name(&q)).await.unwrap().unwrap().ready == 12
        })
        .await;
        // Nothing more arrives, the ladder is empty, nothing was handled twice.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(mq.queue_counts(&dlq_name(&q)).await.unwrap().unwrap().ready, 12, "a good message was dead-lettered, or a bug was not");
        assert_eq!(mq.queue_counts(&q).await.unwrap().unwrap().ready, 0);
        let accepted = accepted.lock().unwrap().clone();
        assert!(accepted.values().all(|&k| k == 1), "a message was accepted twice: {accepted:?}");
        assert!((0..60u64).filter(|n| n % 5 != 0).all(|n| accepted.contains_key(&n)));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.first(), Some(&"circuit_open"), "{seen:?}");
        assert_eq!(seen.last(), Some(&"circuit_closed"), "{seen:?}");
        assert_eq!(c.breaker_state(), Some(BreakerState::Closed));
        // 3 failures open it, up to one more per handler was running, and a
        // trial per probe: the outage did not send the valid messages round.
        let spent = failed_io.load(Ordering::SeqCst);
        assert!((3..=15).contains(&spent), "{spent} downstream failures during a 1.5 s outage");
        acemq::events::unsubscribe(listener);
        handle.cancel().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_breaker_sees_the_downstream_return_within_a_probe_whatever_the_pause() {
    for mq in transports().await {
        let q = unique("breaker-probe");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        for n in 0..40 {
            mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
        }
        let down = Arc::new(AtomicBool::new(true));
        let trials = Arc::new(AtomicUsize::new(0));
        let options = ConsumeOptions {
            prefetch: 10,
            circuit_breaker: Some(CircuitBreaker::new(2, Duration::from_secs(30), Duration::from_secs(60)).probe(Duration::from_millis(500))),
            ..ConsumeOptions::with_concurrency(1)
        };
        let (d2, t2) = (down.clone(), trials.clone());
        let handle = mq
            .consume(&q, options, move |_m: acemq::Message| {
                let (down, trials) = (d2.clone(), t2.clone());
                async move {
                    if down.load(Ordering::SeqCst) {
                        trials.fetch_add(1, Ordering::SeqCst);
                        return Err(Failure::from(refused()));
                    }
                    Ok(Ack::accept())
                }
            })
            .await
            .unwrap();
        let c = handle.consumer();
        eventually("the breaker opens", Duration::from_secs(10), || async { c.breaker_state() == Some(BreakerState::Open) }).await;
        let opened = trials.load(Ordering::SeqCst);
        // A failed trial reopens it for one probe interval, not the pause.
        eventually("two trials fail while it is down", Duration::from_secs(10), || async { trials.load(Ordering::SeqCst) >= opened + 2 })
            .await;
        down.store(false, Ordering::SeqCst);
        let back = Instant::now();
        eventually("the breaker closes", Duration::from_secs(30), || async { c.breaker_state() == Some(BreakerState::Closed) }).await;
        let took = back.elapsed();
        // Within one probe interval and a resubscription: 10 s is far
        // inside the 60 s pause it no longer waits out.
        assert!(took < Duration::from_secs(10), "closed {took:?} after the downstream came back (probe 500 ms, pause 60 s)");
        // The failed ones come back off the ladder: every message is
        // accepted, none dead-lettered.
        eventually("every message is handled", Duration::from_secs(30), || async { c.stats().accepted == 40 }).await;
        assert_eq!(c.stats().dead_lettered, 0);
        handle.cancel().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_trial_spends_no_attempt_so_a_quiet_queue_outlasts_a_long_outage() {
    for mq in transports().await {
        let q = unique("breaker-quiet");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        mq.publish(&json!({ "n": 1 }), &q, PublishOptions::default()).await.unwrap();
        let down = Arc::new(AtomicBool::new(true));
        let calls = Arc::new(AtomicUsize::new(0));
        let options = ConsumeOptions {
            // Two attempts: without the trials' waits the second failed
            // trial would dead-letter the one valid message.
            retry: RetryPolicy { max_attempts: 2, initial_delay: Duration::from_millis(100), max_delay: Duration::from_millis(100) },
            circuit_breaker: Some(CircuitBreaker::new(1, Duration::from_secs(30), Duration::from_secs(60)).probe(Duration::from_millis(200))),
            ..ConsumeOptions::with_concurrency(1)
        };
        let (d2, c2) = (down.clone(), calls.clone());
        let handle = mq
            .consume(&q, options, move |_m: acemq::Message| {
                let (down, calls) = (d2.clone(), c2.clone());
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if down.load(Ordering::SeqCst) {
                        return Err(Failure::from(refused()));
                    }
                    Ok(Ack::accept())
                }
            })
            .await
            .unwrap();
        let c = handle.consumer();
        eventually("the one message is tried five times while it is down", Duration::from_secs(20), || async {
            calls.load(Ordering::SeqCst) >= 5
        })
        .await;
        down.store(false, Ordering::SeqCst);
        eventually("it is handled once the downstream is back", Duration::from_secs(20), || async { c.stats().accepted == 1 }).await;
        let s = c.stats();
        assert_eq!(s.dead_lettered, 0, "a failed trial spent the message's last attempt");
        assert_eq!(s.retried, 1, "only the failure that opened the breaker spends an attempt");
        assert!(s.waited >= 3, "the failed trials went round unspent: {s:?}");
        assert_eq!(mq.queue_counts(&dlq_name(&q)).await.unwrap().unwrap().ready, 0);
        handle.cancel().await;
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trial_that_waits_neither_closes_nor_reopens_the_breaker() {
    for mq in transports().await {
        let q = unique("breaker-wait");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        mq.publish(&json!({ "n": 1 }), &q, PublishOptions::default()).await.unwrap();
        // 0: the downstream refuses; 1: not now (a database away: Wait); 2: fine.
        let mode = Arc::new(AtomicUsize::new(0));
        let options = ConsumeOptions {
            retry: RetryPolicy { max_attempts: 5, initial_delay: Duration::from_millis(100), max_delay: Duration::from_millis(100) },
            circuit_breaker: Some(CircuitBreaker::new(1, Duration::from_secs(30), Duration::from_secs(60)).probe(Duration::from_millis(200))),
            ..ConsumeOptions::with_concurrency(1)
        };
        let (listener, seen) = transitions(&q);
        let m2 = mode.clone();
        let handle = mq
            .consume(&q, options, move |_m: acemq::Message| {
                let mode = m2.clone();
                async move {
                    match mode.load(Ordering::SeqCst) {
                        0 => Outcome::from(Failure::from(refused())),
                        1 => Outcome::Wait { reason: "the database is unavailable".into(), up_to: Duration::from_secs(60) },
                        _ => Outcome::Ack(Ack::accept()),
                    }
                }
            })
            .await
            .unwrap();
        let c = handle.consumer();
        eventually("the refusal opens the breaker", Duration::from_secs(10), || async { c.breaker_state() == Some(BreakerState::Open) }).await;
        mode.store(1, Ordering::SeqCst);
        // Its trials wait: each says nothing about the downstream, so the
        // next message (the same one, back from its rung) is the trial.
        eventually("two trials wait", Duration::from_secs(10), || async { c.stats().waited >= 2 }).await;
        assert!(!seen.lock().unwrap().contains(&"circuit_closed"), "a wait closed the breaker: {:?}", seen.lock().unwrap());
        mode.store(2, Ordering::SeqCst);
        eventually("a good trial closes it", Duration::from_secs(10), || async { c.stats().accepted == 1 }).await;
        eventually("closed", Duration::from_secs(5), || async { c.breaker_state() == Some(BreakerState::Closed) }).await;
        assert_eq!(c.stats().dead_lettered, 0);
        acemq::events::unsubscribe(listener);
        handle.cancel().await;
        mq.close().await;
    }
}
