//! One wire, two languages: the Rust half of spec/integration/wire_spec.rb.
//!
//! `wire publish QUEUE SPEC` publishes one message as a Rust service would,
//! SPEC being JSON: `{"origin", "payload", "id", "type", "timestamp",
//! "headers", "publish_headers", "publish_type", "envelope_origin",
//! "attempt"}` (all but origin and payload optional). `wire consume QUEUE`
//! takes one message, accepts it, and prints its envelope and payload as one
//! line of JSON. AMQP_URL names the broker.

use acemq::{Ack, ConnectionOptions, ConsumeOptions, Connection, Envelope, Outcome, PublishOptions};
use serde_json::{json, Value};
use std::time::Duration;

fn text(spec: &Value, name: &str) -> Option<String> {
    spec.get(name).and_then(Value::as_str).map(str::to_owned)
}

fn headers(spec: &Value, name: &str) -> acemq::Headers {
    spec.get(name).and_then(Value::as_object).cloned().unwrap_or_default()
}

async fn publish(url: &str, queue: &str, spec: &Value) -> acemq::Result<()> {
    let options = ConnectionOptions { origin: text(spec, "origin"), ..ConnectionOptions::default() };
    let mq = Connection::open_with(url, options).await?;
    let mut envelope = Envelope::new();
    if let Some(id) = text(spec, "id") {
        envelope = envelope.with_id(id);
    }
    envelope.kind = text(spec, "type");
    if let Some(t) = spec.get("timestamp").and_then(Value::as_u64) {
        envelope.timestamp = Some(t);
    }
    envelope.headers = headers(spec, "headers");
    envelope.origin = text(spec, "envelope_origin");
    if let Some(n) = spec.get("attempt").and_then(Value::as_u64) {
        envelope.attempt = n as u32;
    }
    let options = PublishOptions {
        envelope: Some(envelope),
        kind: text(spec, "publish_type"),
        headers: headers(spec, "publish_headers"),
        ..PublishOptions::default()
    };
    let sent = mq.publish(&spec["payload"], queue, options).await?;
    println!("{}", json!({ "id": sent.id, "origin": sent.origin }));
    mq.close().await;
    Ok(())
}

async fn consume(url: &str, queue: &str) -> acemq::Result<()> {
    let mq = Connection::open(url).await?;
    let consumer = mq.consumer(queue, ConsumeOptions::default()).await?;
    let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .map_err(|_| acemq::Error::new(acemq::ErrorKind::Timeout, format!("nothing arrived on {queue} within 10 s")))?
        .ok_or_else(|| acemq::Error::new(acemq::ErrorKind::Closed, "the consumer stopped"))?;
    let m = delivery.message.clone();
    consumer.settle(delivery, Outcome::Ack(Ack::accept())).await?;
    consumer.close().await;
    mq.close().await;
    let e = &m.envelope;
    println!(
        "{}",
        json!({
            "id": e.id, "type": e.kind, "origin": e.origin, "timestamp": e.timestamp,
            "attempt": e.attempt, "headers": e.headers, "payload": m.payload,
        })
    );
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["publish", queue, spec] => match serde_json::from_str(spec) {
            Ok(spec) => publish(&url, queue, &spec).await,
            Err(e) => Err(acemq::Error::new(acemq::ErrorKind::InvalidArgument, format!("SPEC is not JSON: {e}"))),
        },
        ["consume", queue] => consume(&url, queue).await,
        _ => Err(acemq::Error::new(acemq::ErrorKind::InvalidArgument, "usage: wire publish QUEUE SPEC | wire consume QUEUE")),
    };
    if let Err(e) = result {
        eprintln!("wire: {e}");
        std::process::exit(1);
    }
}
