//! The README's Rust example: `cargo run -p acemq --example quickstart` (needs RabbitMQ).

use acemq::{Ack, ConsumeOptions, Connection, Message, PublishOptions, RetryPolicy, Topology};
use serde_json::json;
use std::time::Duration;

#[tokio::main]
async fn main() -> acemq::Result<()> {
    let mq = Connection::open("amqp://guest:guest@localhost:5672").await?;
    mq.apply(&Topology::new().queue("payments")).await?;

    let options = ConsumeOptions {
        concurrency: 4,
        retry: RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(300)),
        ..Default::default()
    };
    let handle = mq
        .consume("payments", options, |message: Message| async move {
            println!("charging {}", message.payload["order_id"]);
            Ack::accept()
        })
        .await?;

    mq.publish(&json!({"order_id": "A-1", "amount": 4200}), "payments", PublishOptions::default()).await?;

    handle.cancel().await;
    mq.close().await;
    Ok(())
}
