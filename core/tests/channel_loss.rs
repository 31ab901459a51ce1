//! A channel lost under a busy consumer (issue 30, part 1): what lapin had
//! already read off the socket for it, up to a prefetch window, can never be
//! acknowledged, and the broker has taken it back to deliver again. None of
//! it is handed out: after the loss, the first deliveries are the window the
//! broker gives back, every one marked redelivered. RabbitMQ only (AMQP_URL);
//! spec/integration/connection_loss_repeats_spec.rb measures the same under
//! load from Ruby.

use acemq::{Connection, ConsumeOptions, Next, PublishOptions, Topology};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;
use support::{next, unique};

const TOTAL: usize = 100;
const PREFETCH: u16 = 16;

/// Close this connection from the broker's side: `rabbitmqctl
/// close_connection` on the connection named by its origin.
fn broker_closes(origin: &str) {
    let out = std::process::Command::new("rabbitmqctl").args(["list_connections", "pid", "client_properties"]).output().expect("rabbitmqctl");
    let text = String::from_utf8_lossy(&out.stdout);
    let pids: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&format!("{{\"connection_name\",\"{origin}\"}}")))
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert!(!pids.is_empty(), "no connection named {origin} in:\n{text}");
    for pid in pids {
        let status = std::process::Command::new("rabbitmqctl").args(["close_connection", pid, "test: the broker went away"]).status().unwrap();
        assert!(status.success());
    }
}

/// A consumer on a queue of TOTAL messages, holding one delivery while the
/// broker has sent it the rest of its window; then the broker closes the
/// connection. Returns the consumer, the delivery in hand, and the queue.
async fn loss_with_a_full_window(url: &str) -> (Connection, Arc<acemq::Consumer>, acemq::Delivery) {
    let origin = unique("window");
    let opts = acemq::ConnectionOptions { origin: Some(origin.clone()), ..Default::default() };
    let mq = Connection::open_with(url, opts).await.unwrap();
    let q = unique("window");
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    for n in 0..TOTAL {
        mq.publish(&json!({ "n": n }), &q, PublishOptions::default()).await.unwrap();
    }
    let c = Arc::new(mq.consumer(&q, ConsumeOptions { prefetch: PREFETCH, ..Default::default() }).await.unwrap());
    let held = next(&c).await;
    // The broker has sent the whole window: one in hand, the rest buffered
    // in lapin, read off the socket long before rabbitmqctl gets to it.
    let until = Instant::now() + Duration::from_secs(10);
    while mq.queue_counts(&q).await.unwrap().unwrap().ready > (TOTAL - usize::from(PREFETCH)) as u64 {
        assert!(Instant::now() < until, "the broker did not send a full window");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker_closes(&origin);
    (mq, c, held)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_channels_buffered_deliveries_are_never_handed_out() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    let (mq, c, held) = loss_with_a_full_window(&url).await;
    // Read at once, before the supervisor's own look at the channel: the
    // reader is what must see that the channel is gone.
    for i in 0..usize::from(PREFETCH) {
        let d = next(&c).await;
        assert!(d.message.delivery.redelivered, "delivery {i} after the loss came from the lost channel: {:?}", d.message.payload);
        c.accept(d);
    }
    c.accept(held); // from the lost channel: settles nothing, raises nothing
    assert_eq!(c.resubscriptions(), 1);
    c.close().await;
    mq.close().await;
}

/// The same through the blocking reader, which the Ruby consumer's threads
/// use.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_channels_buffered_deliveries_are_never_handed_to_a_blocking_reader() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    let (mq, c, held) = loss_with_a_full_window(&url).await;
    let reader = c.clone();
    let seen = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while seen.len() < usize::from(PREFETCH) && Instant::now() < until {
            if let Next::Delivery(d) = reader.next_blocking(Duration::from_millis(200)) {
                seen.push((d.message.payload["n"].clone(), d.message.delivery.redelivered));
                reader.accept(*d);
            }
        }
        seen
    })
    .await
    .unwrap();
    assert_eq!(seen.len(), usize::from(PREFETCH), "{seen:?}");
    assert!(seen.iter().all(|(_, redelivered)| *redelivered), "deliveries from the lost channel were handed out: {seen:?}");
    c.accept(held);
    c.close().await;
    mq.close().await;
}
