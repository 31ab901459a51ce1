//! What the integration tests share: unique names, the transports every
//! scenario runs on (memory:// always, RabbitMQ when AMQP_URL is set), and a
//! bounded wait for the next delivery.
#![allow(dead_code)] // each test crate uses its own part of it

pub mod sql;

use acemq::{Connection, Consumer};
use std::time::Duration;

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

pub async fn transports() -> Vec<Connection> {
    let mut out = vec![Connection::open(&format!("memory://{}", unique("t"))).await.unwrap()];
    if let Ok(url) = std::env::var("AMQP_URL") {
        out.push(Connection::open(&url).await.expect("AMQP_URL is set but the broker cannot be reached"));
    }
    out
}

pub async fn next(c: &Consumer) -> acemq::Delivery {
    tokio::time::timeout(Duration::from_secs(10), c.next()).await.expect("no delivery within 10s").expect("consumer closed")
}

/// Wait until `f` answers true, polling every 20 ms; fail naming `what`
/// after `limit`.
pub async fn eventually<F: Fn() -> Fut, Fut: std::future::Future<Output = bool>>(what: &str, limit: Duration, f: F) {
    let until = std::time::Instant::now() + limit;
    while !f().await {
        assert!(std::time::Instant::now() < until, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
