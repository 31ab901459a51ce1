//! Tutorial 3 in Rust (core/examples/tutorial3.rs) checked for what the
//! guide says each step shows, on memory:// always and on RabbitMQ when
//! AMQP_URL is set: the Rust counterpart of spec/integration/demo_spec.rb.

#[path = "../examples/tutorial3.rs"]
mod tutorial3;

use serde_json::json;

async fn check(url: &str) {
    let dir = std::env::temp_dir().join(format!("acemq-tutorial-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = tutorial3::run(url, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let r = report.unwrap_or_else(|e| panic!("tutorial on {url}: {e}"));

    assert_eq!(r.unguarded_charges, 2, "Step 1: the same envelope twice charges twice");
    assert_eq!((r.guarded_charges, r.duplicates), (1, 1), "Step 2: once, the second accepted as a duplicate");
    assert_eq!(r.sql_charges, 1, "Step 3: once with the SQLite store");
    assert!(r.key_confirmed, "Step 3: the key is confirmed");
    assert_eq!(r.outbox_after_rollback, 1, "Step 5: the rollback took A-4's row with it");
    assert_eq!(r.relayed, 1, "Step 5: one sweep published the one committed row");
    assert_eq!(r.received, Some((json!({"order_id": "A-3"}), Some("order.placed.v2".into()))));
    assert_eq!(r.outbox_after_sweep, 0, "Step 5: confirmed rows are deleted");
    assert_eq!(r.payment_rows, 1, "Step 6: the duplicate did not pay twice");
    assert_eq!(r.receipts, 1, "Step 6: the relay published the receipt once");
}

#[tokio::test(flavor = "multi_thread")]
async fn tutorial_on_memory() {
    check("memory://tutorial").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tutorial_on_rabbitmq() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    check(&url).await;
}
