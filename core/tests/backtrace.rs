//! A Rust handler's error carries its chain of sources round the retry
//! ladder and into the DLQ as `x-acemq-backtrace`, the newest failure's
//! replacing the one before, bounded whatever the error says. On memory://
//! always and on RabbitMQ when AMQP_URL is set.

use acemq::{Ack, Backtrace, ConsumeOptions, Connection, DeadLetter, Failure, Handler, Message, PublishOptions, RetryPolicy, Topology};
use serde_json::json;
use std::sync::Mutex;
use std::time::Duration;

mod support;
use support::{eventually, transports, unique};

const HEADER: &str = "x-acemq-backtrace";

#[derive(Debug)]
struct GatewayDown(String);
impl std::fmt::Display for GatewayDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for GatewayDown {}

/// An error with a source, as a service's own error wrapping a library's.
#[derive(Debug)]
struct ChargeFailed(Box<dyn std::error::Error + Send + Sync>);
impl std::fmt::Display for ChargeFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the charge failed")
    }
}
impl std::error::Error for ChargeFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// `{"ok": true}` is accepted. `{"fail": true}` fails through `?` with a
/// parse error wrapped on its first attempt and a gateway error wrapped on
/// its second, and notes the backtrace its second attempt arrived with.
/// `{"hostile": true}` fails with a message of markup, control characters
/// and 100 KiB.
struct Charge {
    seen_on_retry: Mutex<Option<String>>,
}

impl Handler for Charge {
    type Output = Result<Ack, Failure>;

    async fn handle(&self, message: Message) -> Result<Ack, Failure> {
        if message.payload["hostile"] == true {
            let text = format!("<script>alert(1)</script>\n\u{1b}[31m{}", "x".repeat(100 * 1024));
            return Err(ChargeFailed(Box::new(GatewayDown(text))).into());
        }
        if message.payload["fail"] != true {
            return Ok(Ack::accept());
        }
        if message.envelope.attempt == 1 {
            let parsed: Result<u8, _> = "five".parse();
            parsed.map_err(|e| ChargeFailed(Box::new(e)))?;
        }
        *self.seen_on_retry.lock().unwrap() = message.envelope.headers.get(HEADER).and_then(|v| v.as_str()).map(str::to_owned);
        Err(ChargeFailed(Box::new(GatewayDown("the gateway did not answer".into()))))?
    }
}

async fn dead_letters(mq: &Connection, q: &str, n: usize) -> Vec<DeadLetter> {
    let found = Mutex::new(Vec::new());
    eventually(&format!("{n} dead letters in {q}.dlq"), Duration::from_secs(10), || async {
        // memory:// keeps its rungs' delays on a clock of its own.
        if let Some(b) = mq.memory_broker() {
            b.advance(Duration::from_secs(1));
        }
        let letters = mq.peek_dead_letters(q, 10).await.unwrap();
        let done = letters.len() >= n;
        *found.lock().unwrap() = letters;
        done
    })
    .await;
    found.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_newest_errors_chain_goes_round_the_ladder_to_the_dlq() {
    for mq in transports().await {
        let q = unique("bt");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let options = ConsumeOptions { retry: RetryPolicy::new(2, Duration::from_millis(100), Duration::from_millis(100)), ..Default::default() };
        let charge = std::sync::Arc::new(Charge { seen_on_retry: Mutex::new(None) });
        struct Shared(std::sync::Arc<Charge>);
        impl Handler for Shared {
            type Output = Result<Ack, Failure>;
            async fn handle(&self, message: Message) -> Result<Ack, Failure> {
                self.0.handle(message).await
            }
        }
        let handle = mq.consume(&q, options, Shared(charge.clone())).await.unwrap();
        for body in [json!({"ok": true}), json!({"fail": true}), json!({"ok": true})] {
            mq.publish(&body, &q, PublishOptions::default()).await.unwrap();
        }
        let letters = dead_letters(&mq, &q, 1).await;
        handle.cancel().await;

        // The retry arrived with the first failure's chain...
        let first = charge.seen_on_retry.lock().unwrap().clone();
        assert_eq!(
            first.as_deref(),
            Some("backtrace::ChargeFailed: the charge failed\ncaused by: invalid digit found in string"),
            "on the rung's copy"
        );
        // ...and the dead letter has the second's alone.
        assert_eq!(letters.len(), 1, "{letters:?}");
        assert_eq!(
            letters[0].headers[HEADER],
            json!("backtrace::ChargeFailed: the charge failed\ncaused by: the gateway did not answer")
        );
        assert_eq!(letters[0].error_class.as_deref(), Some("backtrace::ChargeFailed"));
        assert_eq!(mq.queue_counts(&q).await.unwrap().map(|c| c.ready), Some(0), "the good messages were accepted");
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_error_is_bounded_and_the_messages_around_it_are_handled() {
    for mq in transports().await {
        let q = unique("bt-hostile");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let options = ConsumeOptions { retry: RetryPolicy::new(1, Duration::from_millis(100), Duration::from_millis(100)), ..Default::default() };
        let handle = mq.consume(&q, options, Charge { seen_on_retry: Mutex::new(None) }).await.unwrap();
        for body in [json!({"ok": true}), json!({"hostile": true}), json!({"ok": true})] {
            mq.publish(&body, &q, PublishOptions::default()).await.unwrap();
        }
        let letters = dead_letters(&mq, &q, 1).await;
        handle.cancel().await;
        assert_eq!(letters.len(), 1, "{letters:?}");
        let bt = letters[0].headers[HEADER].as_str().unwrap();
        assert!(bt.len() <= Backtrace::MAX_BYTES, "{} bytes", bt.len());
        let lines: Vec<&str> = bt.split('\n').collect();
        assert_eq!(lines.len(), 2, "the error and its source, one line each: {bt:?}");
        assert_eq!(lines[0], "backtrace::ChargeFailed: the charge failed");
        assert!(lines[1].starts_with("caused by: <script>alert(1)</script>\\n\\u{1b}[31mxxx"), "{:?}", &lines[1][..60]);
        assert!(lines[1].contains("line cut from") && lines[1].len() <= Backtrace::MAX_LINE, "{}", lines[1].len());
        assert_eq!(mq.queue_counts(&q).await.unwrap().map(|c| c.ready), Some(0), "the good messages before and after were accepted");
        mq.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_asked_for_with_an_ack_carries_no_backtrace() {
    for mq in transports().await {
        let q = unique("bt-ack");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let options = ConsumeOptions { retry: RetryPolicy::new(2, Duration::from_millis(100), Duration::from_millis(100)), ..Default::default() };
        // The first attempt raises; the second asks for a retry with an Ack,
        // which must drop the first one's chain rather than pair it with its
        // own reason.
        let handle = mq
            .consume(&q, options, |m: Message| async move {
                if m.envelope.attempt == 1 {
                    Err(Failure::from(GatewayDown("down".into())))
                } else {
                    Ok(Ack::retry("asked by hand"))
                }
            })
            .await
            .unwrap();
        mq.publish(&json!({}), &q, PublishOptions::default()).await.unwrap();
        let letters = dead_letters(&mq, &q, 1).await;
        handle.cancel().await;
        assert!(letters[0].reason.as_deref().unwrap_or_default().contains("asked by hand"), "{letters:?}");
        assert_eq!(letters[0].headers.get(HEADER), None, "{:?}", letters[0].headers);
        mq.close().await;
    }
}
