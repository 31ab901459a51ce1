//! When lapin cannot open a channel for a reason of its own (its record of
//! the connection's channels went wrong: ChannelsLimitReached, or a stale
//! error on channel.open), the engine replaces the connection instead of
//! failing every later call (issue 47, part 1). The refusal is injected once
//! (`ACEMQ_FAULT_INJECT=refuse-channel-open`, core/src/fault.rs): with the
//! fixed lapin in vendor/ it no longer happens by itself. The replacement is
//! real: a new connection to RabbitMQ, the old one closed, a consumer
//! subscribed again on the new one. RabbitMQ only (AMQP_URL).

use acemq::{ConnectionOptions, ConsumeOptions, PublishOptions, Topology};
use serde_json::json;
use std::time::Duration;

mod support;
use support::{eventually, next, unique};

/// The broker's connections named `origin`.
fn broker_connections(origin: &str) -> usize {
    let out = std::process::Command::new("rabbitmqctl").args(["list_connections", "client_properties"]).output().expect("rabbitmqctl");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&format!("{{\"connection_name\",\"{origin}\"}}"))).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_channel_refused_by_the_clients_bookkeeping_replaces_the_connection() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    // Before anything reads it: fault.rs reads the variable once.
    std::env::set_var("ACEMQ_FAULT_INJECT", "refuse-channel-open");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let into = seen.clone();
    let sub = acemq::events::subscribe(move |e| {
        if let acemq::events::Event::Connection(c) = e {
            into.lock().unwrap().push((c.state, c.reason.clone().unwrap_or_default()));
        }
    });
    let origin = unique("bookkeeping");
    let mq = acemq::Connection::open_with(&url, ConnectionOptions { origin: Some(origin.clone()), ..Default::default() }).await.unwrap();
    let q = unique("bookkeeping");
    // The topology's declares open the first channel: refused once, the
    // connection replaced, the declares done on the new one.
    mq.apply(&Topology::new().queue(&q)).await.expect("apply after the refused channel");
    let states = seen.lock().unwrap().clone();
    assert!(
        states.iter().any(|(state, reason)| *state == "replaced" && reason.contains("ChannelsLimitReached")),
        "no `replaced` connection event: {states:?}"
    );
    acemq::events::unsubscribe(sub);
    assert_eq!(broker_connections(&origin), 1, "the old connection is closed, the new one open");

    // Good traffic on the replacement: publish, count, consume.
    mq.publish(&json!({"n": 1}), &q, PublishOptions::default()).await.unwrap();
    assert_eq!(mq.queue_counts(&q).await.unwrap().map(|c| c.ready), Some(1));
    let c = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
    let d = next(&c).await;
    assert_eq!(d.message.payload["n"], json!(1));
    c.accept(d);
    c.close().await;
    eventually("the consumer's channel given back", Duration::from_secs(5), || async { mq.resources().channels <= 1 }).await;
    mq.close().await;
}
