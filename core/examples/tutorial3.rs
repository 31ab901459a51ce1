//! Tutorial 3, "Never processing twice", in Rust: Steps 1–6 of the guide,
//! printing what `bin/demo` (the Ruby version) prints. On memory:// unless
//! AMQP_URL is set, then on RabbitMQ; SQLite files in a temporary directory.
//!
//! `cargo run -p acemq --example tutorial3`
//!
//! core/tests/tutorial.rs runs [`run`] on both transports and checks what it
//! reports: charged twice without the guard and once with it, the key
//! confirmed, the rolled-back order leaving no outbox row, the relay
//! publishing once.

use acemq::idempotency::{IdempotencyStore, Idempotent, InMemoryIdempotencyStore, SqlIdempotencyOptions, SqlIdempotencyStore};
use acemq::outbox::{OutboxRecord, OutboxRelay, OutboxStoreOptions, RelayOptions, SqlOutboxStore};
use acemq::sql::{SqlConnection, SqlValue, SqliteConnection};
use acemq::{Ack, ConsumeOptions, Connection, Envelope, ExchangeKind, Handler, Message, PublishOptions, Topology};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What each step showed, for the test to check.
#[derive(Debug, Default)]
pub struct Report {
    /// Step 1: times A-1 was charged without a guard (2).
    pub unguarded_charges: usize,
    /// Step 2: times A-1 was charged with the in-memory guard (1).
    pub guarded_charges: usize,
    /// Step 2: deliveries accepted as duplicates (1).
    pub duplicates: u64,
    /// Step 3: charges with the SQLite guard (1), and whether its key is confirmed.
    pub sql_charges: usize,
    /// Step 3: `confirmed(id)` on the SQLite store.
    pub key_confirmed: bool,
    /// Step 5: rows in the outbox after one commit and one rollback (1).
    pub outbox_after_rollback: u64,
    /// Step 5: what one `sweep` published (1).
    pub relayed: usize,
    /// Step 5: the payload and type the bound queue received.
    pub received: Option<(Value, Option<String>)>,
    /// Step 5: rows left after the sweep (0).
    pub outbox_after_sweep: u64,
    /// Step 6: `payments` rows for A-5 after two deliveries (1).
    pub payment_rows: i64,
    /// Step 6: receipts the relay published for A-5 (1).
    pub receipts: usize,
}

/// Poll `done` every 10 ms for up to `timeout`, as bin/demo's `wait_until`.
async fn wait_until(timeout: Duration, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `db.transaction do … end`: commit what `work` did, or roll it back if it failed.
fn transaction<T>(db: &SqliteConnection, work: impl FnOnce() -> Result<T, BoxError>) -> Result<T, BoxError> {
    // IMMEDIATE takes the write lock now: a deferred transaction that reads
    // first and writes later can fail at once (SQLITE_BUSY) instead of
    // waiting for the relay's connection to finish its write.
    db.execute("BEGIN IMMEDIATE", &[])?;
    match work() {
        Ok(value) => {
            db.execute("COMMIT", &[])?;
            Ok(value)
        }
        Err(e) => {
            db.execute("ROLLBACK", &[])?;
            Err(e)
        }
    }
}

fn count(db: &SqliteConnection, sql: &str) -> Result<i64, BoxError> {
    match db.query(sql, &[])?.first().and_then(|row| row.first()) {
        Some(SqlValue::Int(n)) => Ok(*n),
        other => Err(format!("{sql} returned {other:?}").into()),
    }
}

fn step(title: &str) {
    println!();
    println!("{title}");
}

/// A handler that charges and says so: Steps 1–3 use the same one.
fn charging(charged: Arc<Mutex<Vec<String>>>) -> Charging {
    Charging { charged }
}

/// The payment handler: a type of its own, so the guard around it can be
/// named (`Idempotent<InMemoryIdempotencyStore, Charging>`), its state
/// borrowed by every worker through `&self`.
struct Charging {
    charged: Arc<Mutex<Vec<String>>>,
}

impl Handler for Charging {
    type Output = Ack;

    async fn handle(&self, message: Message) -> Ack {
        let order = message.payload["order_id"].as_str().unwrap_or_default().to_owned();
        let mut charged = self.charged.lock().unwrap();
        charged.push(order.clone());
        println!("charged {order} ({} so far)", charged.len());
        Ack::accept()
    }
}

/// Steps 1–6 on `url`, with SQLite files under `dir`.
pub async fn run(url: &str, dir: &Path) -> Result<Report, BoxError> {
    let mut report = Report::default();
    let run = uuid::Uuid::now_v7().simple().to_string();
    let endpoint = url.rsplit('@').next().unwrap_or(url);
    println!("AceMQ demo on {}", if url.contains('@') { format!("amqp://{endpoint}") } else { url.to_owned() });

    let mq = Connection::open(url).await?;
    let queue = format!("payments-{run}");
    mq.apply(&Topology::new().queue(&queue)).await?;
    let order = |id: &str, amount: i64| json!({ "order_id": id, "amount": amount });
    let twice = |envelope: &Envelope| PublishOptions { envelope: Some(envelope.clone()), ..PublishOptions::default() };

    // -- Step 1 --------------------------------------------------------------
    step("Step 1 — See the duplicate");
    let charged = Arc::new(Mutex::new(Vec::new()));
    let subscription = mq.consume(&queue, ConsumeOptions::default(), charging(charged.clone())).await?;
    let envelope = Envelope::new().with_type("payment.requested.v1");
    for _ in 0..2 {
        mq.publish(&order("A-1", 4200), &queue, twice(&envelope)).await?;
    }
    wait_until(Duration::from_secs(5), || charged.lock().unwrap().len() >= 2).await;
    subscription.cancel().await;
    report.unguarded_charges = charged.lock().unwrap().len();
    println!("=> the same envelope twice is the same message id twice: charged {} times", report.unguarded_charges);

    // -- Step 2 --------------------------------------------------------------
    step("Step 2 — Remember what you have handled");
    let charged = Arc::new(Mutex::new(Vec::new()));
    let store = InMemoryIdempotencyStore::new(Duration::from_secs(6 * 3600));
    let once = Idempotent::new(store, charging(charged.clone()));
    let guard = once.guard().clone();
    let subscription = mq.consume(&queue, ConsumeOptions::default(), once).await?;
    let envelope = Envelope::new().with_type("payment.requested.v1");
    for _ in 0..2 {
        mq.publish(&order("A-1", 4200), &queue, twice(&envelope)).await?;
    }
    wait_until(Duration::from_secs(5), || guard.stats().duplicates >= 1).await;
    subscription.cancel().await;
    report.guarded_charges = charged.lock().unwrap().len();
    report.duplicates = guard.stats().duplicates;
    println!(
        "=> charged {} time; the second delivery was accepted as a duplicate ({})",
        report.guarded_charges, report.duplicates
    );

    // -- Step 3 --------------------------------------------------------------
    step("Step 3 — Make it survive more than one process");
    let path = dir.join("payments.db");
    let path = path.to_str().ok_or("the temporary directory's path is not UTF-8")?;
    // The guard's claims are committed writes of their own, never part of a
    // handler's transaction, so the store has a connection of its own.
    let store = Arc::new(SqlIdempotencyStore::new(SqliteConnection::open(path)?, SqlIdempotencyOptions::default())?);
    store.create_schema()?;
    let charged = Arc::new(Mutex::new(Vec::new()));
    let once = Idempotent::new(store.clone(), charging(charged.clone()));
    let guard = once.guard().clone();
    let subscription = mq.consume(&queue, ConsumeOptions::default(), once).await?;
    let envelope = Envelope::new().with_type("payment.requested.v1");
    for _ in 0..2 {
        mq.publish(&order("A-2", 1500), &queue, twice(&envelope)).await?;
    }
    wait_until(Duration::from_secs(5), || guard.stats().duplicates >= 1).await;
    subscription.cancel().await;
    report.sql_charges = charged.lock().unwrap().len();
    report.key_confirmed = store.confirmed(&envelope.id)?;
    println!("=> the key is a row in SQLite now: confirmed?({}…) = {}", &envelope.id[..8], report.key_confirmed);

    // -- Step 4 --------------------------------------------------------------
    step("Step 4 — The other duplicate, and the harder one");
    println!("A write and a publish are two things that fail independently: commit first and the");
    println!("event may never be announced; publish first and it may describe work that never happened.");

    // -- Step 5 --------------------------------------------------------------
    step("Step 5 — The outbox");
    let events = format!("orders-events-{run}");
    let placed = format!("orders-placed-{run}");
    mq.apply(&Topology::new().exchange(&events, ExchangeKind::Topic).queue(&placed).bind(&placed, &events, "order.placed")).await?;
    let db = Arc::new(SqliteConnection::open(path)?);
    db.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)", &[])?;
    let outbox = Arc::new(SqlOutboxStore::new(SqliteConnection::open(path)?, OutboxStoreOptions::default())?);
    outbox.create_schema()?;
    // Patterns.record: the envelope by the rules every publish follows, with
    // this connection's origin.
    let record = |mq: &Connection, event: Value, to: &str, exchange: &str, kind: Option<&str>| {
        let envelope = mq.envelope_for(&PublishOptions { kind: kind.map(Into::into), ..PublishOptions::default() });
        OutboxRecord::json(exchange, to, &event, envelope)
    };

    transaction(&db, || {
        db.execute("INSERT INTO orders (id, total) VALUES (?, ?)", &[SqlValue::Text("A-3".into()), SqlValue::Int(9900)])?;
        outbox.add(&record(&mq, json!({"order_id": "A-3"}), "order.placed", &events, Some("order.placed.v2"))?, db.as_ref())?;
        Ok(())
    })?;
    let declined = transaction(&db, || {
        db.execute("INSERT INTO orders (id, total) VALUES (?, ?)", &[SqlValue::Text("A-4".into()), SqlValue::Int(100)])?;
        outbox.add(&record(&mq, json!({"order_id": "A-4"}), "order.placed", &events, Some("order.placed.v2"))?, db.as_ref())?;
        Err::<(), BoxError>("card declined".into())
    });
    assert!(declined.is_err());
    report.outbox_after_rollback = outbox.backlog()?.count;
    println!(
        "committed A-3, rolled back A-4: the outbox holds {} message (A-4 went with its rollback)",
        report.outbox_after_rollback
    );

    let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
    let listener = mq
        .consume(&placed, ConsumeOptions::default(), move |m: Message| {
            let _ = tx.send(m);
            std::future::ready(Ack::accept())
        })
        .await?;
    let relay_store = SqlOutboxStore::new(SqliteConnection::open(path)?, OutboxStoreOptions::default())?;
    let relay = OutboxRelay::new(mq.clone(), relay_store, RelayOptions { interval: Duration::from_secs(1), ..RelayOptions::default() });
    report.relayed = relay.sweep().await?;
    println!("relay.sweep published {}", report.relayed);
    let event = tokio::time::timeout(Duration::from_secs(5), received.recv()).await?.ok_or("the listener stopped")?;
    listener.cancel().await;
    report.outbox_after_sweep = outbox.backlog()?.count;
    println!(
        "=> {placed} received {} ({}), outbox now holds {}",
        event.payload,
        event.envelope.kind.as_deref().unwrap_or(""),
        report.outbox_after_sweep
    );
    report.received = Some((event.payload, event.envelope.kind));

    // -- Step 6 --------------------------------------------------------------
    step("Step 6 — Order of operations");
    db.execute("CREATE TABLE payments (order_id TEXT, amount INTEGER)", &[])?;
    let billing = format!("billing-events-{run}");
    let taken = format!("payment-taken-{run}");
    mq.apply(&Topology::new().exchange(&billing, ExchangeKind::Direct).queue(&taken).bind(&taken, &billing, "payment.taken")).await?;
    // The relay gets a connection of its own, as in bin/demo: it sweeps on
    // its own task while handlers write with theirs.
    let relay_store = SqlOutboxStore::new(SqliteConnection::open(path)?, OutboxStoreOptions::default())?;
    let relay = OutboxRelay::new(mq.clone(), relay_store, RelayOptions { interval: Duration::from_secs(1), ..RelayOptions::default() });
    relay.start()?;

    let (work_db, work_outbox, work_mq, work_billing) = (db.clone(), outbox.clone(), mq.clone(), billing.clone());
    // 1. the guard runs outside the transaction; 2. the work and the message
    // about it commit together; 3. the key is confirmed after the accept.
    let handler = Idempotent::new(store.clone(), move |message: Message| {
        let done = transaction(&work_db, || {
            let order_id = message.payload["order_id"].as_str().unwrap_or_default();
            let amount = message.payload["amount"].as_i64().unwrap_or_default();
            work_db.execute(
                "INSERT INTO payments (order_id, amount) VALUES (?, ?)",
                &[SqlValue::Text(order_id.into()), SqlValue::Int(amount)],
            )?;
            let receipt = record(&work_mq, json!({"order_id": order_id}), "payment.taken", &work_billing, None)?;
            work_outbox.add(&receipt, work_db.as_ref())?;
            Ok(())
        });
        std::future::ready(match done {
            Ok(()) => Ack::accept(),
            Err(e) => Ack::retry(format!("payment not recorded: {e}")),
        })
    });
    let guard = handler.guard().clone();
    let subscription = mq.consume(&queue, ConsumeOptions::default(), handler).await?;
    let (tx, mut receipts) = tokio::sync::mpsc::unbounded_channel();
    let receipt_listener = mq
        .consume(&taken, ConsumeOptions::default(), move |m: Message| {
            let _ = tx.send(m);
            std::future::ready(Ack::accept())
        })
        .await?;
    let envelope = Envelope::new().with_type("payment.requested.v1");
    for _ in 0..2 {
        mq.publish(&order("A-5", 4200), &queue, twice(&envelope)).await?;
    }
    let receipt = tokio::time::timeout(Duration::from_secs(5), receipts.recv()).await?.ok_or("the listener stopped")?;
    wait_until(Duration::from_secs(5), || guard.stats().duplicates >= 1).await;
    subscription.cancel().await;
    relay.close().await;
    // Anything the relay published twice would be here by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    receipt_listener.cancel().await;
    report.receipts = 1 + std::iter::from_fn(|| receipts.try_recv().ok()).count();
    report.payment_rows = count(&db, "SELECT COUNT(*) FROM payments WHERE order_id = 'A-5'")?;
    println!(
        "delivered twice; payments rows for A-5: {}; receipts published by the relay: {}",
        report.payment_rows, receipt.payload
    );
    println!("=> the guard turned the duplicate away, the work and its message committed together, the relay published it");

    mq.close().await;
    Ok(report)
}

#[allow(dead_code)] // core/tests/tutorial.rs includes this file for `run`
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "memory://demo".into());
    let dir = std::env::temp_dir().join(format!("acemq-demo-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&url, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result.map(|_| ())
}
