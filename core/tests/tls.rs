//! amqps:// from Rust. The settings are checked always; the handshake runs
//! when AMQPS_URL names a TLS broker and ACEMQ_TLS_DIR holds the
//! certificates spec/support/tls_certificates.rb makes (ca.pem,
//! other-ca.pem, client.pem, client.key). spec/integration/tls_spec.rb is the
//! full matrix, against the same engine code.

use acemq::{Ack, ConnectionOptions, ConsumeOptions, Connection, ErrorKind, Outcome, PublishOptions, TlsOptions, Topology};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

fn options(tls: TlsOptions) -> ConnectionOptions {
    ConnectionOptions { tls: Some(tls), connect_timeout: Duration::from_secs(5), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_settings_with_a_plain_url_are_refused() {
    let e = Connection::open_with("amqp://guest:guest@127.0.0.1:5672", options(TlsOptions::default())).await.err().unwrap();
    assert_eq!(e.kind(), &ErrorKind::InvalidUrl);
    assert!(e.message().contains("would not be encrypted"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_ca_file_is_named_before_dialling() {
    // Port 1: nothing is dialled, the file is read first.
    let tls = TlsOptions { ca_file: Some("/nonexistent/ca.pem".into()), ..Default::default() };
    let e = Connection::open_with("amqps://guest:guest@127.0.0.1:1", options(tls)).await.err().unwrap();
    assert_eq!(e.kind(), &ErrorKind::InvalidArgument);
    assert!(e.message().contains("/nonexistent/ca.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn amqps_publishes_and_consumes_and_names_a_wrong_ca() {
    let (Ok(url), Ok(dir)) = (std::env::var("AMQPS_URL"), std::env::var("ACEMQ_TLS_DIR")) else { return };
    let dir = PathBuf::from(dir);
    let good = TlsOptions {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join("client.pem")),
        key_file: Some(dir.join("client.key")),
        ..Default::default()
    };

    let wrong = TlsOptions { ca_file: Some(dir.join("other-ca.pem")), ..good.clone() };
    let e = Connection::open_with(&url, options(wrong)).await.err().expect("a broker signed by another CA is refused");
    assert!(e.is_tls() && e.is_connection(), "{e:?}");
    assert!(e.message().contains("not signed by a CA in ca_file"), "{e}");

    let mq = Connection::open_with(&url, options(good)).await.unwrap();
    let q = format!("tls-rust-{}", uuid::Uuid::now_v7().simple());
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    mq.publish(&json!({"over": "tls"}), &q, PublishOptions::default()).await.unwrap();
    let consumer = mq.consumer(&q, ConsumeOptions::default()).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await.unwrap().unwrap();
    assert_eq!(d.message.payload, json!({"over": "tls"}));
    consumer.settle(d, Outcome::Ack(Ack::accept())).await.unwrap();
    mq.close().await;
}
