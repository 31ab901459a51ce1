//! Raw lapin for issue 35's benchmarks (bench/delay_rpc.rb runs it):
//!
//!   bench_rpc serve QUEUE           answer every request on QUEUE (raw lapin:
//!                                   reply to reply_to with its correlation_id,
//!                                   then ack) until killed; the one responder
//!                                   both requesters are measured against
//!   bench_rpc raw_rpc QUEUE N K     N requests over direct reply-to, K in
//!                                   flight on one channel, as acemq sends them
//!                                   (mandatory, confirmed, the confirm and the
//!                                   reply awaited together); prints the rate
//!
//!   bench_rpc acemq_rpc QUEUE N K   the same through acemq's Rust API
//!                                   (`Connection::request`), K tasks
//!
//! AMQP_URL as for the other benches.

use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::oneshot;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const REPLY_TO: &str = "amq.rabbitmq.reply-to";

async fn serve(url: &str, queue: &str) -> Result<(), BoxError> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(200, BasicQosOptions::default()).await?;
    let mut consumer =
        ch.basic_consume(ShortString::from(queue), ShortString::from("serve"), BasicConsumeOptions::default(), FieldTable::default()).await?;
    println!("ready");
    while let Some(Ok(d)) = consumer.next().await {
        if let (Some(to), Some(id)) = (d.properties.reply_to().clone(), d.properties.correlation_id().clone()) {
            let props = BasicProperties::default().with_correlation_id(id).with_content_type(ShortString::from("application/json"));
            let _ = ch.basic_publish(ShortString::from(""), to, BasicPublishOptions::default(), br#"{"ok":true}"#, props).await;
        }
        d.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

async fn raw_rpc(url: &str, queue: &str, n: usize, inflight: usize) -> Result<f64, BoxError> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let waiters: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>> = Arc::default();
    let mut replies = ch
        .basic_consume(
            ShortString::from(REPLY_TO),
            ShortString::from(""),
            BasicConsumeOptions { no_ack: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?;
    let w = waiters.clone();
    tokio::spawn(async move {
        while let Some(Ok(d)) = replies.next().await {
            if let Some(id) = d.properties.correlation_id() {
                if let Some(tx) = w.lock().unwrap().remove(id.as_str()) {
                    let _ = tx.send(());
                }
            }
        }
    });
    let body = br#"{"order_id":"A-1","amount":4200}"#;
    let t = Instant::now();
    let tasks: Vec<_> = (0..inflight)
        .map(|k| {
            let (ch, waiters, queue) = (ch.clone(), waiters.clone(), queue.to_owned());
            tokio::spawn(async move {
                for i in (k..n).step_by(inflight) {
                    let id = format!("{k}-{i}");
                    let (tx, rx) = oneshot::channel();
                    waiters.lock().unwrap().insert(id.clone(), tx);
                    let props = BasicProperties::default()
                        .with_correlation_id(ShortString::from(id))
                        .with_reply_to(ShortString::from(REPLY_TO))
                        .with_content_type(ShortString::from("application/json"))
                        .with_delivery_mode(2);
                    let confirm = ch
                        .basic_publish(ShortString::from(""), ShortString::from(queue.as_str()), BasicPublishOptions { mandatory: true, immediate: false }, body, props)
                        .await?;
                    let (c, r) = tokio::join!(confirm, rx);
                    c?;
                    r?;
                }
                Ok::<(), BoxError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

async fn acemq_rpc(url: &str, queue: &str, n: usize, inflight: usize) -> Result<f64, BoxError> {
    let mq = acemq::Connection::open(url).await?;
    let body = serde_json::json!({"order_id": "A-1", "amount": 4200});
    mq.request(&body, queue, acemq::RequestOptions::default()).await?; // the reply channel, outside the clock
    let t = Instant::now();
    let tasks: Vec<_> = (0..inflight)
        .map(|k| {
            let (mq, queue, body) = (mq.clone(), queue.to_owned(), body.clone());
            tokio::spawn(async move {
                for _ in (k..n).step_by(inflight) {
                    mq.request(&body, &queue, acemq::RequestOptions::default()).await?;
                }
                Ok::<(), acemq::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    mq.close().await;
    Ok(rate)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["serve", queue] => serve(&url, queue).await,
        ["raw_rpc", queue, n, k] => {
            let rate = raw_rpc(&url, queue, n.parse()?, k.parse()?).await?;
            println!("{{\"rate\": {rate:.1}}}");
            Ok(())
        }
        ["acemq_rpc", queue, n, k] => {
            let rate = acemq_rpc(&url, queue, n.parse()?, k.parse()?).await?;
            println!("{{\"rate\": {rate:.1}}}");
            Ok(())
        }
        _ => Err("usage: bench_rpc serve QUEUE | bench_rpc raw_rpc|acemq_rpc QUEUE N INFLIGHT".into()),
    }
}
