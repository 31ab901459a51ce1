//! OutboxRelay: sweep, failures, on_error, start and close.

use super::support::{add_committed, eventually, record, FakePublisher, TempDb};
use crate::outbox::{OutboxRelay, OutboxStoreOptions, RelayOptions};
use crate::sql::SqlConnection;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_publishes_in_insertion_order_and_deletes() {
    let db = TempDb::new("sweep");
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..5 {
        add_committed(&store, &app, &record("orders-events", "order.placed", n));
    }
    let publisher = Arc::new(FakePublisher::default());
    let relay = OutboxRelay::new(publisher.clone(), store, RelayOptions::default());

    assert_eq!(relay.sweep().await.unwrap(), 5);
    assert_eq!(publisher.message_ids(), ["msg-0", "msg-1", "msg-2", "msg-3", "msg-4"]);
    let published = publisher.published.lock().unwrap()[0].clone();
    assert_eq!((published.exchange.as_str(), published.routing_key.as_str()), ("orders-events", "order.placed"));
    assert_eq!(published.body, r#"{"n":0}"#);
    assert_eq!(published.envelope.kind.as_deref(), Some("order.placed.v2"));
    assert_eq!(relay.store().backlog().unwrap().count, 0);
    assert_eq!(relay.sweep().await.unwrap(), 0, "nothing left to publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_takes_one_batch() {
    let db = TempDb::new("batch");
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..5 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let publisher = Arc::new(FakePublisher::default());
    let relay = OutboxRelay::new(publisher.clone(), store, RelayOptions { batch_size: 2, ..RelayOptions::default() });
    assert_eq!(relay.sweep().await.unwrap(), 2);
    assert_eq!(relay.store().backlog().unwrap().count, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_destination_backs_off_and_does_not_block_the_others() {
    let db = TempDb::new("failing");
    let store = db.store("w1");
    let app = db.connect();
    add_committed(&store, &app, &record("missing", "order.placed", 0));
    add_committed(&store, &app, &record("orders-events", "order.placed", 1));
    let publisher = Arc::new(FakePublisher::failing(&["missing"]));
    let relay = OutboxRelay::new(publisher.clone(), store, RelayOptions::default());

    assert_eq!(relay.sweep().await.unwrap(), 1);
    assert_eq!(publisher.message_ids(), ["msg-1"]);
    add_committed(relay.store(), &app, &record("orders-events", "order.placed", 2));
    // The failed row waits out its backoff; the new one behind it goes.
    assert_eq!(relay.sweep().await.unwrap(), 1);
    assert_eq!(publisher.message_ids(), ["msg-1", "msg-2"]);

    let stuck = relay.store().stuck(10).unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].attempts, 1);
    assert!(stuck[0].last_error.as_deref().unwrap().contains("no exchange 'missing'"));

    // Once the exchange exists and the backoff has passed, it goes out.
    publisher.failing.lock().unwrap().clear();
    app.execute("UPDATE acemq_outbox SET next_attempt_at = 0", &[]).unwrap();
    assert_eq!(relay.sweep().await.unwrap(), 1);
    assert_eq!(relay.store().backlog().unwrap().count, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_is_told_the_exchange_and_routing_key() {
    let db = TempDb::new("on-error");
    let store = db.store("w1");
    let app = db.connect();
    add_committed(&store, &app, &record("billing-events", "payment.taken", 0));
    add_committed(&store, &app, &record("orders-events", "order.placed", 1));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let on_error = {
        let seen = seen.clone();
        move |error: &crate::error::Error, exchange: &str, routing_key: &str| {
            seen.lock().unwrap().push((error.reply_code(), exchange.to_owned(), routing_key.to_owned()));
        }
    };
    let publisher = Arc::new(FakePublisher::failing(&["billing-events"]));
    let relay = OutboxRelay::new(
        publisher,
        store,
        RelayOptions { on_error: Some(Box::new(on_error)), ..RelayOptions::default() },
    );

    relay.sweep().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [(Some(404), "billing-events".to_owned(), "payment.taken".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_publisher_gave_no_result_for_is_retried_not_deleted() {
    let db = TempDb::new("short-results");
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..3 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let publisher = Arc::new(FakePublisher::default());
    *publisher.truncate.lock().unwrap() = Some(1);
    let relay = OutboxRelay::new(publisher, store, RelayOptions::default());

    assert_eq!(relay.sweep().await.unwrap(), 1);
    let backlog = relay.store().backlog().unwrap();
    assert_eq!((backlog.count, backlog.stuck), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_sweeps_again_at_once_while_batches_are_full_and_close_stops_it() {
    let db = TempDb::new("start");
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..7 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let publisher = Arc::new(FakePublisher::default());
    // An interval far longer than the test: only the immediate re-sweep
    // after a full batch can empty the outbox in time.
    let relay = OutboxRelay::new(
        publisher.clone(),
        store,
        RelayOptions { interval: Duration::from_secs(3600), batch_size: 2, on_error: None },
    );
    relay.start().unwrap();
    relay.start().unwrap(); // a second start does nothing

    assert!(eventually(Duration::from_secs(5), || publisher.published.lock().unwrap().len() == 7).await);
    assert!(eventually(Duration::from_secs(5), || relay.store().backlog().unwrap().count == 0).await);
    assert_eq!(publisher.batches.load(Ordering::SeqCst), 4, "2 + 2 + 2 + 1, no empty sweeps between");

    relay.close().await;
    add_committed(relay.store(), &app, &record("ex", "rk", 99));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(relay.store().backlog().unwrap().count, 1, "a closed relay publishes nothing");
    assert!(relay.start().unwrap_err().message().contains("closed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_sweeps_every_interval() {
    let db = TempDb::new("interval");
    let store = db.store("w1");
    let app = db.connect();
    let publisher = Arc::new(FakePublisher::default());
    let relay = OutboxRelay::new(
        publisher.clone(),
        store,
        RelayOptions { interval: Duration::from_millis(20), ..RelayOptions::default() },
    );
    relay.start().unwrap();
    add_committed(relay.store(), &app, &record("ex", "rk", 1));
    assert!(eventually(Duration::from_secs(5), || publisher.published.lock().unwrap().len() == 1).await);
    relay.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_lets_the_sweep_in_progress_finish() {
    let db = TempDb::new("close");
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..3 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let publisher = Arc::new(SlowPublisher { inner: FakePublisher::default() });
    let relay = OutboxRelay::new(publisher.clone(), store, RelayOptions::default());
    relay.start().unwrap();
    assert!(eventually(Duration::from_secs(5), || publisher.inner.batches.load(Ordering::SeqCst) == 1).await);
    // The batch is being published; close waits for its confirms and deletes.
    relay.close().await;
    assert_eq!(publisher.inner.published.lock().unwrap().len(), 3);
    assert_eq!(relay.store().backlog().unwrap().count, 0);
}

#[test]
fn start_outside_a_runtime_says_so() {
    let db = TempDb::new("no-runtime");
    let relay = OutboxRelay::new(Arc::new(FakePublisher::default()), db.store("w1"), RelayOptions::default());
    assert!(relay.start().unwrap_err().message().contains("tokio runtime"));
}

#[test]
fn sweep_runs_without_a_tokio_runtime() {
    let db = TempDb::new("other-executor");
    let store = db.store_with(OutboxStoreOptions { worker_id: Some("w1".into()), ..OutboxStoreOptions::default() });
    let app = db.connect();
    add_committed(&store, &app, &record("ex", "rk", 1));
    let relay = OutboxRelay::new(Arc::new(FakePublisher::default()), store, RelayOptions::default());
    assert_eq!(futures_lite::future::block_on(relay.sweep()).unwrap(), 1);
}

/// Holds each batch for a moment before confirming it, as a broker does.
struct SlowPublisher {
    inner: FakePublisher,
}

impl crate::outbox::OutboxPublisher for SlowPublisher {
    fn publish_batch<'a>(&'a self, records: &'a [crate::outbox::OutboxRecord]) -> crate::outbox::PublishFuture<'a> {
        Box::pin(async move {
            self.inner.batches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.inner.published.lock().unwrap().extend(records.iter().cloned());
            records.iter().map(|_| Ok(())).collect()
        })
    }
}

/// The doc examples of `outbox` and `OutboxRelay`, compiled here because
/// doc tests are not part of the `--lib` run.
#[allow(dead_code)]
async fn doc_examples_compile(publisher: Arc<dyn crate::outbox::OutboxPublisher>) -> crate::error::Result<()> {
    use crate::envelope::Envelope;
    use crate::outbox::{OutboxRecord, SqlOutboxStore};
    use crate::sql::SqliteConnection;

    let store = SqlOutboxStore::new(SqliteConnection::open("app.db")?, OutboxStoreOptions::default())?;
    store.create_schema()?;
    let db = SqliteConnection::open("app.db")?;
    db.execute("BEGIN", &[])?;
    db.execute("INSERT INTO orders (total) VALUES (?)", &[crate::sql::SqlValue::Int(42)])?;
    let event = serde_json::json!({ "order_id": 1 });
    let envelope = Envelope::new().with_type("order.placed.v2");
    store.add(&OutboxRecord::json("orders-events", "order.placed", &event, envelope)?, &db)?;
    db.execute("COMMIT", &[])?;

    let relay = OutboxRelay::new(
        publisher,
        store,
        RelayOptions {
            on_error: Some(Box::new(|error: &crate::error::Error, exchange: &str, routing_key: &str| {
                eprintln!("outbox stuck on {exchange}/{routing_key}: {error}");
            })),
            ..RelayOptions::default()
        },
    );
    relay.start()?;
    relay.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_relay_wakes_on_an_add_in_this_process_before_its_interval() {
    let db = TempDb::new("wake");
    let store = db.store("w1");
    let app = db.connect();
    let publisher = Arc::new(FakePublisher::default());
    // An interval no test waits out: only the wake-up can publish in time.
    let relay = OutboxRelay::new(
        publisher.clone(),
        store,
        RelayOptions { interval: Duration::from_secs(3600), ..RelayOptions::default() },
    );
    relay.start().unwrap();
    // Let the first sweep (an empty table) finish and the relay park.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let adder = db.store("adder");
    // In a transaction held open for a while: the relay's claim waits on the
    // insert's write lock and runs after the commit, not before it.
    let app = tokio::task::spawn_blocking(move || {
        app.execute("BEGIN", &[]).unwrap();
        adder.add(&record("ex", "rk", 1), &app).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        app.execute("COMMIT", &[]).unwrap();
        app
    })
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || publisher.message_ids() == ["msg-1"]).await,
        "woken by the add, not by the hour-long interval"
    );
    drop(app);
    relay.close().await;
}

#[tokio::test]
async fn zero_interval_or_batch_is_refused_by_core() {
    let db = TempDb::new("options");
    let publisher = Arc::new(FakePublisher::default());
    let zero = OutboxRelay::new(publisher.clone(), db.store("w1"), RelayOptions { interval: Duration::ZERO, ..RelayOptions::default() });
    let e = zero.start().unwrap_err();
    assert!(e.is_invalid_argument() && e.to_string().contains("interval must be more than zero"), "{e}");
    let none = OutboxRelay::new(publisher, db.store("w2"), RelayOptions { batch_size: 0, ..RelayOptions::default() });
    let e = none.sweep().await.unwrap_err();
    assert!(e.to_string().contains("batch size must be at least 1"), "{e}");
}

#[test]
fn settle_pairs_results_and_sweeps_again_only_after_a_full_batch_without_failures() {
    use crate::outbox::{settle, Swept};
    let mut a = record("ex", "rk", 1);
    a.id = Some(1);
    let mut b = record("missing", "rk", 2);
    b.id = Some(2);
    let mut c = record("ex", "rk", 3);
    c.id = Some(3);
    let settled = settle(&[a, b, c], vec![Ok(()), Err(crate::error::Error::invalid("404"))]);
    assert_eq!(settled.swept, Swept { claimed: 3, confirmed: 1, failed: 2 });
    assert_eq!(settled.completions.iter().map(|c| c.result.is_ok()).collect::<Vec<_>>(), [true, false, false]);
    assert_eq!(settled.failures[0].1, "missing");
    assert!(settled.failures[1].0.to_string().contains("returned no result"), "a missing result is a failure");
    assert!(!settled.swept.again(3), "failures: wait");
    assert!(Swept { claimed: 3, confirmed: 3, failed: 0 }.again(3));
    assert!(!Swept { claimed: 2, confirmed: 2, failed: 0 }.again(3), "less than a batch: wait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_relay_draining_a_backlog_holds_deletes_for_the_next_claim_and_loses_none() {
    let db = TempDb::new("held-relay");
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..5 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let publisher = Arc::new(FakePublisher::default());
    let relay = OutboxRelay::new(
        publisher.clone(),
        store,
        RelayOptions { batch_size: 1, interval: Duration::from_secs(3600), ..RelayOptions::default() },
    );
    relay.start().unwrap();
    assert!(eventually(Duration::from_secs(5), || publisher.message_ids().len() == 5).await);
    assert_eq!(publisher.message_ids(), ["msg-0", "msg-1", "msg-2", "msg-3", "msg-4"], "each once, in order");
    // Each delete went out with the next claim, the last with the claim that
    // found nothing, which is made at once because rows were held.
    assert!(eventually(Duration::from_secs(5), || relay.store().backlog().unwrap().count == 0).await);
    relay.close().await;
}

/// Sends at once (what it sent is in `inner.published`, in order) and holds
/// every batch's confirms until the test opens `gate`.
struct GatedPublisher {
    inner: FakePublisher,
    gate: tokio::sync::watch::Sender<bool>,
}

impl crate::outbox::OutboxPublisher for GatedPublisher {
    fn publish_batch<'a>(&'a self, records: &'a [crate::outbox::OutboxRecord]) -> crate::outbox::PublishFuture<'a> {
        Box::pin(async move { self.send_batch(records).await.await })
    }

    #[allow(clippy::async_yields_async)]
    fn send_batch<'a>(&'a self, records: &'a [crate::outbox::OutboxRecord]) -> crate::outbox::SendFuture<'a> {
        Box::pin(async move {
            self.inner.batches.fetch_add(1, Ordering::SeqCst);
            self.inner.published.lock().unwrap().extend(records.iter().cloned());
            let n = records.len();
            let mut gate = self.gate.subscribe();
            Box::pin(async move {
                let _ = gate.wait_for(|open| *open).await;
                (0..n).map(|_| Ok(())).collect()
            }) as crate::outbox::Confirms
        })
    }
}

fn leased(conn: &crate::sql::SqliteConnection, table: &str) -> i64 {
    match super::support::scalar(conn, &format!("SELECT COUNT(*) FROM {table} WHERE claimed_by IS NOT NULL"), &[]) {
        crate::sql::SqlValue::Int(n) => n,
        other => panic!("{other:?}"),
    }
}

/// A started relay over `rows` committed rows, `batch_size` a sweep, whose
/// publisher holds every confirm until its gate opens; with the
/// application's connection and the table, to count leases.
fn gated_relay(
    name: &str,
    rows: usize,
    batch_size: usize,
) -> (TempDb, crate::sql::SqliteConnection, String, Arc<GatedPublisher>, Arc<OutboxRelay<crate::outbox::SqlOutboxStore<crate::sql::SqliteConnection>>>) {
    let db = TempDb::new(name);
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..rows {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let table = store.table().to_owned();
    let (gate, _) = tokio::sync::watch::channel(false);
    let publisher = Arc::new(GatedPublisher { inner: FakePublisher::default(), gate });
    let relay = Arc::new(OutboxRelay::new(
        publisher.clone(),
        store,
        RelayOptions { batch_size, interval: Duration::from_secs(3600), ..RelayOptions::default() },
    ));
    relay.start().unwrap();
    (db, app, table, publisher, relay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_relay_claims_the_next_batch_while_the_confirms_of_a_full_one_are_in_flight() {
    let (_db, app, table, publisher, relay) = gated_relay("in-flight", 7, 3);
    // The first batch is sent and unconfirmed; the second is claimed while
    // those confirms are still out, and the relay goes no further: it
    // settles the first before it sends the second or claims a third.
    assert!(eventually(Duration::from_secs(5), || leased(&app, &table) == 6).await, "leased: {}", leased(&app, &table));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(leased(&app, &table), 6, "one batch claimed ahead, not more");
    assert_eq!(publisher.inner.message_ids(), ["msg-0", "msg-1", "msg-2"]);
    assert_eq!(relay.store().backlog().unwrap().count, 7, "nothing deleted before its confirm");

    publisher.gate.send_replace(true);
    assert!(eventually(Duration::from_secs(5), || relay.store().backlog().unwrap().count == 0).await);
    let ids: Vec<String> = (0..7).map(|n| format!("msg-{n}")).collect();
    assert_eq!(publisher.inner.message_ids(), ids, "each once, in id order");
    relay.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_relay_with_a_batch_in_flight_settles_it_and_loses_nothing() {
    let (_db, app, table, publisher, relay) = gated_relay("close-in-flight", 6, 2);
    assert!(eventually(Duration::from_secs(5), || leased(&app, &table) == 4).await);
    // close waits for the sweep in progress, which waits for the first
    // batch's confirms, then sends the second and waits for those too.
    let closing = tokio::spawn({
        let relay = relay.clone();
        async move { relay.close().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    publisher.gate.send_replace(true);
    closing.await.unwrap();
    let sent = publisher.inner.message_ids();
    assert_eq!(sent, ["msg-0", "msg-1", "msg-2", "msg-3"], "the batch claimed ahead went out too, nothing more");
    assert_eq!(relay.store().backlog().unwrap().count, 2, "what was sent and confirmed is deleted, the rest is there");
    assert_eq!(leased(&app, &table), 0, "nothing is left leased by a relay that stopped cleanly");
}

#[test]
fn a_batch_is_left_in_flight_only_when_full_and_after_a_batch_without_failures() {
    use crate::outbox::Swept;
    assert!(Swept::default().keep_in_flight(3, 3), "the first full batch");
    assert!(Swept { claimed: 3, confirmed: 3, failed: 0 }.keep_in_flight(3, 3));
    assert!(!Swept::default().keep_in_flight(2, 3), "less than a batch: nothing more is waiting");
    assert!(!Swept { claimed: 3, confirmed: 2, failed: 1 }.keep_in_flight(3, 3), "after a failure, one at a time");
    // The deprecated InFlight answers with the same rule.
    #[allow(deprecated)]
    let kept = crate::outbox::InFlight::worth_it(3, 3, &Swept::default());
    assert!(kept);
}
