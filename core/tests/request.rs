//! Request/reply over direct reply-to (RabbitMQ, when AMQP_URL is set) and
//! on memory://: replies matched to many requests in flight, a timeout, a
//! late reply dropped and counted; a failing responder's error reply, an
//! expired request dropped, a retry-safe request retried.

use acemq::{Ack, Backtrace, ConsumeOptions, Connection, ErrorKind, Failure, Outcome, PublishOptions, RequestOptions, RetryPolicy, Topology};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;
use support::{eventually, transports, unique};

/// Messages ready on `q`, each rung of `policy`'s ladder and its DLQ: every
/// copy a failed request could have left.
async fn copies(mq: &Connection, q: &str, policy: &RetryPolicy) -> u64 {
    let mut names = vec![q.to_owned(), acemq::dlq_name(q)];
    names.extend(policy.rungs().into_iter().map(|d| acemq::rung_name(q, d)));
    let mut n = 0;
    for name in names {
        n += mq.queue_counts(&name).await.unwrap().map_or(0, |c| c.ready);
    }
    n
}

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
        // Answered, late: the handler takes the request in time and replies
        // after its requester gave up. (A request still queued at its
        // deadline is dropped unhandled: a_request_past_its_deadline_…)
        let server: Connection = mq.clone();
        let handle = mq
            .consume(&q, ConsumeOptions::default(), move |m: acemq::Message| {
                let server = server.clone();
                async move {
                    if m.payload["n"] == 1 {
                        tokio::time::sleep(Duration::from_millis(800)).await;
                    }
                    server.reply(&m, &json!({ "late": true }), PublishOptions::default()).await.unwrap();
                    Outcome::Ack(Ack::accept())
                }
            })
            .await
            .unwrap();
        let err = mq.request(&json!({"n": 1}), &q, within(Duration::from_millis(300))).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Timeout), "{err}");
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

/// A responder that fails (an `Err`, then a reject with a reason) answers
/// at once with an error reply: the requester gets `ErrorKind::Remote` with
/// the class, message and frames, well inside its 30 s timeout, and the
/// request is neither retried nor dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_responder_answers_with_an_error_at_once() {
    for mq in transports().await {
        let q = unique("rpc-fail");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let handled = Arc::new(AtomicU32::new(0));
        let seen = handled.clone();
        let handle = mq
            .consume(&q, ConsumeOptions::default(), move |m: acemq::Message| {
                seen.fetch_add(1, Ordering::Relaxed);
                async move {
                    if m.payload["reject"] == true {
                        return Ok(Ack::reject("out of stock"));
                    }
                    Err(Failure::new("billing::Declined", "card <b>declined</b>")
                        .with_backtrace(Backtrace::from_frames(["billing.rs:42:in charge", "handler.rs:7:in call"])))
                }
            })
            .await
            .unwrap();
        let asked = Instant::now();
        let err = mq.request(&json!({"n": 1}), &q, within(Duration::from_secs(30))).await.unwrap_err();
        assert!(asked.elapsed() < Duration::from_secs(5), "waited {:?}: the error did not come back at once", asked.elapsed());
        assert_eq!(err.kind(), &ErrorKind::Remote, "{err}");
        assert!(err.is_remote());
        let remote = err.remote().expect("a remote error has what the responder sent");
        assert_eq!(remote.class(), Some("billing::Declined"));
        assert_eq!(remote.message(), "card <b>declined</b>");
        assert_eq!(remote.backtrace().unwrap().as_str().lines().next(), Some("billing.rs:42:in charge"));
        assert!(err.to_string().contains("billing::Declined: card <b>declined</b>"), "{err}");

        let err = mq.request(&json!({"reject": true}), &q, within(Duration::from_secs(30))).await.unwrap_err();
        let remote = err.remote().unwrap();
        assert_eq!((remote.class(), remote.message(), remote.backtrace()), (None, "out of stock", None));

        let policy = RetryPolicy::default();
        eventually("both requests acknowledged", Duration::from_secs(5), || async { handle.consumer().stats().error_replied == 2 }).await;
        assert_eq!(copies(&mq, &q, &policy).await, 0, "no copy on the queue, a rung or the DLQ");
        let stats = handle.consumer().stats();
        assert_eq!((stats.retried, stats.dead_lettered, stats.expired), (0, 0, 0), "{stats:?}");
        assert_eq!(handled.load(Ordering::Relaxed), 2, "each handled once");
        handle.cancel().await;
        mq.close().await;
    }
}

/// A request still queued when its requester gave up is dropped unhandled
/// when a consumer meets it: counted `expired`, reported as a `process`
/// event with that outcome, and neither retried nor dead-lettered. The
/// request after it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_deadline_is_dropped_unhandled() {
    acemq::metrics::enable();
    let expired_events = Arc::new(AtomicU32::new(0));
    let counted = expired_events.clone();
    let id = acemq::events::subscribe(move |e: &acemq::events::Event| {
        if let acemq::events::Event::Process(p) = e {
            if p.outcome == acemq::events::ProcessOutcome::Expired {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    for mq in transports().await {
        let before = expired_events.load(Ordering::Relaxed);
        let q = unique("rpc-expired");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let err = mq.request(&json!({"n": 1}), &q, within(Duration::from_millis(200))).await.unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::Timeout, "{err}");
        let handled = Arc::new(AtomicU32::new(0));
        let seen = handled.clone();
        let server = mq.clone();
        let handle = mq
            .consume(&q, ConsumeOptions::default(), move |m: acemq::Message| {
                seen.fetch_add(1, Ordering::Relaxed);
                let server = server.clone();
                async move {
                    server.reply(&m, &json!({"n": m.payload["n"]}), PublishOptions::default()).await.unwrap();
                    Ack::accept()
                }
            })
            .await
            .unwrap();
        let reply = mq.request(&json!({"n": 2}), &q, within(Duration::from_secs(10))).await.unwrap();
        assert_eq!(reply.payload["n"], 2);
        eventually("the expired request counted, the live one accepted", Duration::from_secs(5), || async {
            let s = handle.consumer().stats();
            s.expired == 1 && s.accepted == 1
        })
        .await;
        assert_eq!(handled.load(Ordering::Relaxed), 1, "only the live request was handled");
        assert_eq!(mq.late_replies(), 0, "the expired request was never answered");
        assert_eq!(copies(&mq, &q, &RetryPolicy::default()).await, 0);
        let stats = handle.consumer().stats();
        assert_eq!((stats.retried, stats.dead_lettered, stats.error_replied, stats.accepted), (0, 0, 0, 1), "{stats:?}");
        assert_eq!(expired_events.load(Ordering::Relaxed) - before, 1, "one process event with outcome expired");
        let metrics = acemq::metrics::render();
        let line = format!("messaging_destination_name=\"{q}\",outcome=\"expired\"}} 1");
        assert!(metrics.contains(&line), "{line} not in the metrics:\n{metrics}");
        handle.cancel().await;
        mq.close().await;
    }
    acemq::events::unsubscribe(id);
}

/// A request sent `retry_safe` that fails once goes round the ladder and
/// its requester gets the normal reply; one whose retries run out gets the
/// error reply then, not before, and leaves no copy behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_safe_request_is_retried_before_it_is_answered() {
    for mq in transports().await {
        let q = unique("rpc-retry");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let policy = RetryPolicy::new(3, Duration::from_millis(200), Duration::from_millis(400));
        let server = mq.clone();
        let handle = mq
            .consume(&q, ConsumeOptions { retry: policy.clone(), ..Default::default() }, move |m: acemq::Message| {
                let server = server.clone();
                async move {
                    if m.payload["always_fail"] == true || m.envelope.attempt == 1 {
                        return Err(Failure::new("Flaky", format!("attempt {}", m.envelope.attempt)));
                    }
                    server.reply(&m, &json!({"attempt": m.envelope.attempt}), PublishOptions::default()).await.unwrap();
                    Ok(Ack::accept())
                }
            })
            .await
            .unwrap();
        let safe = |timeout| RequestOptions { timeout, retry_safe: true, ..Default::default() };
        let reply = mq.request(&json!({}), &q, safe(Duration::from_secs(30))).await.unwrap();
        assert_eq!(reply.payload["attempt"], 2, "answered by the second attempt");
        let err = mq.request(&json!({"always_fail": true}), &q, safe(Duration::from_secs(30))).await.unwrap_err();
        assert_eq!(err.remote().map(|r| r.message()), Some("attempt 3"), "{err}: answered once the 3 attempts were spent");
        eventually("the last attempt acknowledged", Duration::from_secs(5), || async { handle.consumer().stats().error_replied == 1 }).await;
        let stats = handle.consumer().stats();
        assert_eq!((stats.retried, stats.dead_lettered), (3, 0), "{stats:?}");
        assert_eq!(copies(&mq, &q, &policy).await, 0);
        // The same failure, not retry-safe: answered at the first attempt.
        let err = mq.request(&json!({"always_fail": true}), &q, within(Duration::from_secs(30))).await.unwrap_err();
        assert_eq!(err.remote().map(|r| r.message()), Some("attempt 1"), "{err}");
        handle.cancel().await;
        mq.close().await;
    }
}
