//! The dead-letter store (acemq::dead_letters) on the real broker and the
//! real databases: SQLite files always, PostgreSQL when `DATABASE_URL` is
//! set (with `--features postgres`), MySQL or MariaDB when `MYSQL_URL` is
//! (with `--features mysql`); memory:// always, RabbitMQ when `AMQP_URL` is.
//! Each scenario makes tables and queues of its own and removes them.

mod support;

use acemq::dead_letters::{
    ingest_once, AsyncSqlDeadLetterStore, DeadLetterFeed, DeadLetterStoreOptions, Filter, IngestOptions, Ingester, NewDeadLetter,
    Retention, Selection, StoreReplayOptions,
};
use acemq::sql::{AsyncSqliteConnection, Dialect};
use acemq::{dlq_name, Ack, ConsumeOptions, Connection, Envelope, Message, RetryPolicy, Topology};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::sql::Source;
use support::{eventually, transports, unique};

// ---------------------------------------------------------------------------
// The databases

enum Backend {
    Sqlite(String),
    #[cfg(feature = "postgres")]
    Postgres(String),
    #[cfg(feature = "mysql")]
    Mysql(String),
}

/// One scenario's database and tables (dropped, or the file removed, at the end).
struct Db {
    backend: Backend,
    table: String,
}

fn table_name(what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("dl_{what}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

fn databases(what: &str) -> Vec<Db> {
    let table = table_name(what);
    let file = std::env::temp_dir().join(format!("acemq-{table}.db")).to_str().unwrap().to_owned();
    #[allow(unused_mut)]
    let mut out = vec![Db { backend: Backend::Sqlite(file), table: table.clone() }];
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        out.push(Db { backend: Backend::Postgres(url), table: table.clone() });
    }
    #[cfg(feature = "mysql")]
    if let Ok(url) = std::env::var("MYSQL_URL") {
        out.push(Db { backend: Backend::Mysql(url), table: table.clone() });
    }
    out
}

impl Db {
    fn options(&self) -> DeadLetterStoreOptions {
        DeadLetterStoreOptions { table: self.table.clone(), audit_table: format!("{}_audit", self.table) }
    }

    async fn store(&self) -> AsyncSqlDeadLetterStore<Source> {
        let source = match &self.backend {
            Backend::Sqlite(path) => Source::Sqlite(AsyncSqliteConnection::open(path).await.unwrap()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => Source::Pg(acemq::sql::PgConnection::connect(url).await.expect("DATABASE_URL is set but PostgreSQL cannot be reached")),
            #[cfg(feature = "mysql")]
            Backend::Mysql(url) => Source::My(acemq::sql::MysqlConnection::connect(url).await.expect("MYSQL_URL is set but MySQL cannot be reached")),
        };
        let store = AsyncSqlDeadLetterStore::new(source, self.options()).unwrap();
        store.create_schema().await.unwrap();
        store
    }

    fn name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "postgres",
            #[cfg(feature = "mysql")]
            Backend::Mysql(_) => "mysql",
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        #[allow(unused_variables)]
        let tables = [self.table.clone(), format!("{}_audit", self.table)];
        match &self.backend {
            Backend::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => {
                let url = url.clone();
                let _ = std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
                        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
                        tokio::spawn(conn);
                        for t in tables {
                            client.batch_execute(&format!("DROP TABLE IF EXISTS {t}")).await.unwrap();
                        }
                    })
                })
                .join();
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql(url) => {
                let url = url.replacen("mysql2://", "mysql://", 1);
                let _ = std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
                        use mysql_async::prelude::Queryable;
                        let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                        for t in tables {
                            conn.query_drop(format!("DROP TABLE IF EXISTS {t}")).await.unwrap();
                        }
                        let _ = conn.disconnect().await;
                    })
                })
                .join();
            }
        }
    }
}


async fn rows(store: &AsyncSqlDeadLetterStore<Source>) -> u64 {
    store.counts(&Filter::default(), 10).await.unwrap().total
}

/// Publish a dead letter straight to `queue`'s DLQ, as the ladder would.
async fn dead_letter(mq: &Connection, queue: &str, body: &[u8], headers: serde_json::Map<String, Value>) -> String {
    let mut envelope = Envelope::new().with_type("order.placed.v1");
    envelope.headers = headers;
    mq.send_json(body, "", &dlq_name(queue), &envelope).await.unwrap().wait().await.unwrap();
    envelope.id
}

fn failure(reason: &str, class: &str) -> serde_json::Map<String, Value> {
    let mut h = serde_json::Map::new();
    h.insert("x-acemq-reason".into(), json!(reason));
    h.insert("x-acemq-error-class".into(), json!(class));
    h.insert("x-acemq-failed-at".into(), json!(1_700_000_000u64));
    h.insert("x-acemq-backtrace".into(), json!("app/handler.rb:12:in `call'\napp/worker.rb:3"));
    h
}

fn fast() -> IngestOptions {
    IngestOptions { retry: Duration::from_millis(200), idle: Duration::from_millis(300), ..IngestOptions::default() }
}

// ---------------------------------------------------------------------------
// Ingest

#[tokio::test(flavor = "multi_thread")]
async fn ingest_is_idempotent_and_a_kill_between_commit_and_ack_doubles_nothing() {
    for mq in transports().await {
        for db in databases("kill") {
            let q = unique("dl-kill");
            mq.apply(&Topology::new().queue(&q)).await.unwrap();
            let store = db.store().await;
            let mut ids = Vec::new();
            for n in 0..5 {
                ids.push(dead_letter(&mq, &q, format!("{{\"n\":{n}}}").as_bytes(), failure("card declined", "Payments::Declined")).await);
            }
            // The kill: the batch is committed, then the process dies
            // before its ack; the broker gives the deliveries back.
            let feed = DeadLetterFeed::open(&mq, &q, 50).await.unwrap();
            let batch = feed.next_batch(50, Duration::from_millis(200), Duration::from_secs(5)).await.unwrap();
            assert_eq!(batch.len(), 5, "{}", db.name());
            assert_eq!(store.insert(&batch.letters).await.unwrap(), 5);
            feed.close().await;
            // Inserting the same delivery again inserts nothing.
            store.insert(&batch.letters).await.unwrap();
            assert_eq!(rows(&store).await, 5);
            // The next ingester gets them again: still one row each.
            let report = ingest_once(&mq, &store, &q, &fast()).await.unwrap();
            assert_eq!(report.received, 5, "{} redelivered: {report:?}", db.name());
            assert_eq!(rows(&store).await, 5, "{}: none doubled", db.name());
            assert_eq!(mq.queue_counts(&dlq_name(&q)).await.unwrap().unwrap().ready, 0, "the DLQ is empty: acknowledged after the commit");
            let page = store.list(&Filter::queue(&q), None, 10).await.unwrap();
            let mut stored: Vec<String> = page.letters.iter().map(|l| l.letter.message_id.clone()).collect();
            stored.sort();
            ids.sort();
            assert_eq!(stored, ids, "every one, once");
            let one = &page.letters[0];
            assert_eq!(one.letter.reason.as_deref(), Some("card declined"));
            assert_eq!(one.letter.error_class.as_deref(), Some("Payments::Declined"));
            assert_eq!(one.letter.kind.as_deref(), Some("order.placed.v1"));
            assert_eq!(one.letter.failed_at, 1_700_000_000);
            assert_eq!(one.letter.backtrace.as_deref(), Some("app/handler.rb:12:in `call'\napp/worker.rb:3"));
            assert_eq!(one.letter.properties["type"], json!("order.placed.v1"));
            teardown(&mq, &q).await;
        }
    }
}

async fn teardown(mq: &Connection, q: &str) {
    mq.teardown(&Topology::new().queue(q), &acemq::TeardownOptions { force: true, ..Default::default() }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_ingester_stands_by_until_the_first_stops() {
    for mq in transports().await {
        let db = databases("standby").remove(0);
        let q = unique("dl-standby");
        mq.apply(&Topology::new().queue(&q)).await.unwrap();
        let store = db.store().await;
        let first = Ingester::start(&mq, store.clone(), &q, fast()).unwrap();
        eventually("the first ingester has the DLQ", Duration::from_secs(10), || async { first.is_active() }).await;
        let second = Ingester::start(&mq, store.clone(), &q, fast()).unwrap();
        eventually("the second says why it stands by", Duration::from_secs(10), || async { second.last_error().is_some() }).await;
        assert!(!second.is_active());
        assert!(second.last_error().unwrap().contains("exclusive"), "{:?}", second.last_error());
        let err = ingest_once(&mq, &store, &q, &fast()).await.unwrap_err();
        assert!(DeadLetterFeed::is_taken(&err), "{err}");
        dead_letter(&mq, &q, b"{}", failure("one", "E")).await;
        eventually("the first stores it", Duration::from_secs(10), || async { rows(&store).await == 1 }).await;
        first.stop().await;
        eventually("the second takes over", Duration::from_secs(10), || async { second.is_active() }).await;
        dead_letter(&mq, &q, b"{}", failure("two", "E")).await;
        eventually("the second stores the next", Duration::from_secs(10), || async { rows(&store).await == 2 }).await;
        // Counted once acknowledged, a moment after the commit the row
        // count sees (a .ci/run's 4.3 stage read 0 in between).
        eventually("the second counts it", Duration::from_secs(10), || async { second.received() == 1 }).await;
        second.stop().await;
        teardown(&mq, &q).await;
    }
}

// ---------------------------------------------------------------------------
// Replay

#[tokio::test(flavor = "multi_thread")]
async fn replay_of_letters_whose_handler_still_fails_replays_each_exactly_once() {
    for mq in transports().await {
        for db in databases("replay") {
            let q = unique("dl-replay");
            mq.apply(&Topology::new().queue(&q)).await.unwrap();
            let store = db.store().await;
            // Every copy the handler sees, by message id.
            let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
            let s = seen.clone();
            let options = ConsumeOptions { retry: RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)), ..Default::default() };
            let handle = mq
                .consume(&q, options, move |m: Message| {
                    let s = s.clone();
                    async move {
                        *s.lock().unwrap().entry(m.envelope.id.clone()).or_default() += 1;
                        Ack::reject("still failing")
                    }
                })
                .await
                .unwrap();
            let ingester = Ingester::start(&mq, store.clone(), &q, fast()).unwrap();
            const N: usize = 20;
            for n in 0..N {
                mq.publish(&json!({ "n": n }), &q, Default::default()).await.unwrap();
            }
            eventually("20 rows", Duration::from_secs(20), || async { rows(&store).await == N as u64 }).await;
            let options = StoreReplayOptions { rate: 200.0, actor: "ops@example.com".into(), ..Default::default() };
            let report = store.replay(&mq, &Selection::Filter(Filter::queue(&q)), options).await.unwrap();
            assert_eq!((report.selected, report.replayed, report.skipped), (N, N, 0), "{}: {report:?}", db.name());
            // Each copy fails again and comes back as a new row.
            eventually("the replayed copies are stored again", Duration::from_secs(20), || async { rows(&store).await == N as u64 }).await;
            eventually("each seen twice", Duration::from_secs(20), || async { seen.lock().unwrap().values().sum::<usize>() == 2 * N }).await;
            // Nothing more comes: the replay sent each once and read no queue.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen.len(), N);
            assert!(seen.values().all(|n| *n == 2), "{}: every id handled exactly twice (first + one replay): {seen:?}", db.name());
            assert_eq!(rows(&store).await, N as u64);
            let page = store.list(&Filter::queue(&q), None, 100).await.unwrap();
            for l in &page.letters {
                assert_eq!(l.letter.headers["x-acemq-replayed-by"], json!(report.id), "the new row shows the replay");
                assert_eq!(l.letter.history.as_ref().unwrap().as_array().unwrap().len(), 1, "{:?}", l.letter.history);
            }
            let audit = store.audit(10).await.unwrap();
            assert_eq!(audit[0].action, "replay");
            assert_eq!(audit[0].actor, "ops@example.com");
            assert_eq!(audit[0].count, N as u64);
            assert_eq!(audit[0].detail["replay"], json!(report.id));
            ingester.stop().await;
            handle.cancel().await;
            teardown(&mq, &q).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_sends_only_its_snapshot_and_a_row_once_across_two_replays() {
    let mq = transports().await.pop().unwrap();
    let db = databases("snapshot").remove(0);
    let q = unique("dl-snap");
    mq.apply(&Topology::new().queue(&q)).await.unwrap();
    let store = db.store().await;
    for n in 0..6 {
        dead_letter(&mq, &q, format!("{n}").as_bytes(), failure(if n < 3 { "timeout" } else { "declined" }, "E")).await;
    }
    ingest_once(&mq, &store, &q, &fast()).await.unwrap();
    let ids: Vec<i64> = store.list(&Filter::queue(&q), None, 10).await.unwrap().letters.iter().map(|l| l.id).collect();
    // Two replays of overlapping ids at once: each row goes out once.
    // With no actor (the default) a replay is refused.
    let e = store.replay(&mq, &Selection::Ids(ids.clone()), StoreReplayOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("actor"), "{e}");
    let (sa, sb) = (Selection::Ids(ids[..4].to_vec()), Selection::Ids(ids[2..].to_vec()));
    let a = store.replay(&mq, &sa, StoreReplayOptions { rate: 20.0, actor: "a".into(), ..Default::default() });
    let b = store.replay(&mq, &sb, StoreReplayOptions { rate: 20.0, actor: "b".into(), ..Default::default() });
    let (a, b) = tokio::join!(a, b);
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.replayed + b.replayed, 6, "{a:?} {b:?}");
    assert_eq!(a.skipped + b.skipped, 2, "the overlap skipped by one of them: {a:?} {b:?}");
    assert_eq!(mq.queue_counts(&q).await.unwrap().unwrap().ready, 6, "six copies, not eight");
    assert_eq!(rows(&store).await, 0);
    // Ids of one queue: the audit names it, as a filter's does.
    let audit = store.audit(2).await.unwrap();
    assert_eq!(audit.iter().map(|a| a.queue.as_deref()).collect::<Vec<_>>(), vec![Some(q.as_str()); 2]);
    teardown(&mq, &q).await;
}

// ---------------------------------------------------------------------------
// Hostile headers

#[tokio::test(flavor = "multi_thread")]
async fn hostile_headers_are_stored_losslessly_and_never_error() {
    for mq in transports().await {
        for db in databases("hostile") {
            let q = unique("dl-hostile");
            mq.apply(&Topology::new().queue(&q)).await.unwrap();
            let store = db.store().await;
            let markup = "<img src=x onerror=alert(2)>\"'&";
            let shapes = [json!([5]), json!("a string"), json!({"a": {"b": [1, "<b>"]}}), json!([{"attempts": markup, "failed_at": "yesterday"}])];
            let mut sent = Vec::new();
            for (i, history) in shapes.iter().enumerate() {
                let mut h = failure(markup, markup);
                h.insert("x-acemq-history".into(), history.clone());
                h.insert("x-acemq-backtrace".into(), json!([markup, 1]));
                h.insert("x-acemq-failed-at".into(), json!(markup));
                h.insert(format!("x-{markup}"), json!(markup));
                let body: Vec<u8> = if i == 0 { vec![0xff, 0xfe, 0x00, b'<', 0x80] } else { format!("<script>{i}</script>\0").into_bytes() };
                let mut envelope = Envelope::new().with_type(markup).with_id(format!("{markup}{i}"));
                envelope.headers = h.clone();
                mq.send_json(&body, "", &dlq_name(&q), &envelope).await.unwrap().wait().await.unwrap();
                sent.push((envelope.id, body, h));
            }
            let report = ingest_once(&mq, &store, &q, &fast()).await.unwrap();
            assert_eq!(report.received, 4, "{}", db.name());
            let page = store.list(&Filter::queue(&q), None, 10).await.unwrap();
            assert_eq!(page.letters.len(), 4);
            for (id, body, h) in &sent {
                let l = page.letters.iter().find(|l| &l.letter.message_id == id).unwrap_or_else(|| panic!("{id} stored"));
                assert_eq!(&l.letter.body, body, "{}: body byte for byte", db.name());
                for (k, v) in h {
                    assert_eq!(&l.letter.headers[k], v, "{}: header {k}", db.name());
                }
                assert_eq!(l.letter.history.as_ref(), h.get("x-acemq-history"), "history kept in its shape");
                assert_eq!(l.letter.reason.as_deref(), Some(markup));
                assert_eq!(l.letter.error_class.as_deref(), Some(markup));
                assert_eq!(l.letter.kind.as_deref(), Some(markup));
                assert_eq!(l.letter.backtrace.as_deref(), Some(json!([markup, 1]).to_string().as_str()), "a backtrace that is not text is kept as its JSON");
                assert!(l.letter.failed_at > 1_700_000_000, "an unreadable failed-at is the ingest time");
                let found = store.find(l.id).await.unwrap().unwrap();
                assert_eq!(&found, l);
            }
            // Markup filters like any text; counts group it.
            let f = Filter { queue: Some(q.clone()), reason: Some("ONERROR=alert(2)".into()), error_class: Some(markup.into()), kind: Some(markup.into()), ..Default::default() };
            assert_eq!(store.list(&f, None, 10).await.unwrap().letters.len(), 4, "{}", db.name());
            let counts = store.counts(&Filter::queue(&q), 10).await.unwrap();
            assert_eq!(counts.by_reason, vec![(Some(markup.to_owned()), 4)]);
            // Replayed, the bytes go back as they came.
            let non_utf8 = page.letters.iter().find(|l| l.letter.body == sent[0].1).unwrap().id;
            store.replay(&mq, &Selection::Ids(vec![non_utf8]), StoreReplayOptions { actor: "t".into(), ..Default::default() }).await.unwrap();
            // The consumer cannot read it (not JSON) and dead-letters it
            // again; ingested, the new row holds the same bytes.
            let handled = Arc::new(AtomicUsize::new(0));
            let h = handled.clone();
            let c = mq
                .consume(&q, ConsumeOptions::default(), move |_m: Message| {
                    h.fetch_add(1, Ordering::SeqCst);
                    async { Ack::accept() }
                })
                .await
                .unwrap();
            let again = store.clone();
            eventually("the copy comes back as a row", Duration::from_secs(20), || {
                let (mq, store, q) = (mq.clone(), again.clone(), q.clone());
                async move {
                    ingest_once(&mq, &store, &q, &fast()).await.unwrap();
                    store.list(&Filter::queue(&q), None, 10).await.unwrap().letters.iter().any(|l| l.letter.headers.contains_key("x-acemq-replayed-by"))
                }
            })
            .await;
            let back = store.list(&Filter::queue(&q), None, 10).await.unwrap().letters.into_iter().find(|l| l.letter.headers.contains_key("x-acemq-replayed-by")).unwrap();
            assert_eq!(back.letter.body, sent[0].1, "{}: replayed and stored again, byte for byte", db.name());
            assert_eq!(back.letter.message_id, sent[0].0);
            assert_eq!(handled.load(Ordering::SeqCst), 0, "never handed to a handler");
            c.cancel().await;
            teardown(&mq, &q).await;
        }
    }
}

// ---------------------------------------------------------------------------
// Operations

fn letter(queue: &str, n: usize, reason: &str, class: &str, kind: &str, failed_at: i64) -> NewDeadLetter {
    NewDeadLetter {
        queue: queue.into(),
        message_id: format!("m-{n}"),
        content_hash: format!("{n:032x}"),
        body: format!("{{\"n\":{n}}}").into_bytes(),
        headers: Default::default(),
        properties: Default::default(),
        kind: Some(kind.into()),
        reason: Some(reason.into()),
        error_class: Some(class.into()),
        attempt: 3,
        exchange: Some("orders".into()),
        routing_key: Some("order.placed".into()),
        failed_at,
        history: None,
        backtrace: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn browse_filter_page_count_discard_purge_prune_and_audit() {
    for db in databases("ops") {
        let store = db.store().await;
        let mut batch = Vec::new();
        for n in 0..30 {
            let (reason, class) = if n % 3 == 0 { ("Timeout after 5s", "Net::ReadTimeout") } else { ("card 100% declined_x", "Payments::Declined") };
            batch.push(letter(if n < 20 { "payments" } else { "emails" }, n, reason, class, if n % 2 == 0 { "a.v1" } else { "b.v1" }, 1_000 + n as i64));
        }
        store.insert(&batch).await.unwrap();
        // Keyset pages, newest first, none twice even as rows arrive.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = store.list(&Filter::default(), after, 7).await.unwrap();
            seen.extend(page.letters.iter().map(|l| l.id));
            if seen.len() == 7 {
                store.insert(&[letter("payments", 99, "late", "E", "a.v1", 5_000)]).await.unwrap();
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(seen.len(), 30, "{}: {seen:?}", db.name());
        assert!(seen.windows(2).all(|w| w[0] > w[1]), "newest first, no repeats");
        // Filters.
        let count = |f: Filter| {
            let store = store.clone();
            async move { store.list(&f, None, 100).await.unwrap().letters.len() }
        };
        assert_eq!(count(Filter::queue("emails")).await, 10);
        assert_eq!(count(Filter { reason: Some("100% DECLINED_".into()), ..Default::default() }).await, 20, "{}: contains, % and _ literal, ASCII case-blind", db.name());
        assert_eq!(count(Filter { reason: Some("0% d".into()), ..Default::default() }).await, 20);
        assert_eq!(count(Filter { reason: Some("_x%".into()), ..Default::default() }).await, 0);
        assert_eq!(count(Filter { error_class: Some("Net::ReadTimeout".into()), ..Default::default() }).await, 10);
        assert_eq!(count(Filter { error_class: Some("net::readtimeout".into()), ..Default::default() }).await, 0, "{}: classes compare exactly", db.name());
        assert_eq!(count(Filter { kind: Some("a.v1".into()), queue: Some("payments".into()), ..Default::default() }).await, 11);
        assert_eq!(count(Filter { message_id: Some("m-7".into()), ..Default::default() }).await, 1);
        assert_eq!(count(Filter { message_id: Some("M-7".into()), ..Default::default() }).await, 0);
        assert_eq!(count(Filter { since: Some(1_010), before: Some(1_013), ..Default::default() }).await, 3);
        // Counts.
        let c = store.counts(&Filter::default(), 10).await.unwrap();
        assert_eq!(c.total, 31);
        assert_eq!(c.by_queue, vec![("payments".to_owned(), 21), ("emails".to_owned(), 10)]);
        assert_eq!(c.by_reason[0], (Some("card 100% declined_x".to_owned()), 20));
        assert_eq!(c.by_error_class.iter().map(|x| x.1).sum::<u64>(), 31);
        assert_eq!(store.counts(&Filter::queue("emails"), 10).await.unwrap().total, 10);
        // Discard, purge, prune, each audited.
        let m1 = Filter { message_id: Some("m-1".into()), ..Default::default() };
        let first = store.list(&m1, None, 1).await.unwrap().letters.remove(0);
        assert_eq!(store.discard(&[first.id, -1], "alice").await.unwrap(), 1);
        assert!(store.find(first.id).await.unwrap().is_none());
        // A purge names what it deletes: an empty filter, or one whose
        // every text is blank (an empty form field), is refused and
        // deletes nothing; a blank text beside a real one is no filter.
        let blank = Filter { reason: Some("  ".into()), queue: Some(String::new()), ..Default::default() };
        for f in [Filter::default(), blank] {
            let e = store.purge(&f, "bob").await.unwrap_err();
            assert!(e.to_string().contains("purge_all"), "{}: {e}", db.name());
        }
        assert_eq!(store.counts(&Filter::default(), 10).await.unwrap().total, 30, "{}", db.name());
        let emails_blank_reason = Filter { reason: Some(String::new()), ..Filter::queue("emails") };
        assert_eq!(store.list(&emails_blank_reason, None, 100).await.unwrap().letters.len(), 10);
        assert_eq!(store.purge(&emails_blank_reason, "bob").await.unwrap(), 10);
        let kept = Retention { max_count: Some(5), max_age: None };
        assert_eq!(store.prune(Some("payments"), &kept, "retention").await.unwrap(), 15);
        let left = store.list(&Filter::default(), None, 100).await.unwrap().letters;
        assert_eq!(left.len(), 5);
        assert!(left.iter().any(|l| l.letter.message_id == "m-99"), "the newest kept");
        let old = Retention { max_age: Some(Duration::from_secs(60)), max_count: None };
        assert_eq!(store.prune(None, &old, "retention").await.unwrap(), 5, "failed_at 1970: past any age");
        assert_eq!(store.prune(None, &old, "retention").await.unwrap(), 0);
        let audit = store.audit(10).await.unwrap();
        let actions: Vec<(&str, &str, u64)> = audit.iter().map(|a| (a.action.as_str(), a.actor.as_str(), a.count)).collect();
        assert_eq!(actions, vec![("prune", "retention", 5), ("prune", "retention", 15), ("purge", "bob", 10), ("discard", "alice", 1)], "{}", db.name());
        assert_eq!(audit[2].queue.as_deref(), Some("emails"));
        assert_eq!(audit[3].detail["ids"], json!([first.id, -1]));
        assert_eq!(audit[3].queue.as_deref(), Some(first.letter.queue.as_str()), "a discard of one queue's ids names it");
        // Bad input says what to do.
        let e = store.list(&Filter::default(), None, 0).await.unwrap_err();
        assert!(e.is_invalid_argument() && e.message().contains("1 to 1000"), "{e}");
        let e = store.discard(&[1], " ").await.unwrap_err();
        assert!(e.is_invalid_argument() && e.message().contains("actor"), "{e}");
        let e = AsyncSqlDeadLetterStore::new(Source::Sqlite(AsyncSqliteConnection::open(":memory:").await.unwrap()), DeadLetterStoreOptions { table: "x; DROP".into(), ..Default::default() }).err().unwrap();
        assert!(e.is_invalid_argument(), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn create_schema_twice_is_harmless_and_schema_sql_names_the_tables() {
    for db in databases("schema") {
        let store = db.store().await;
        store.create_schema().await.unwrap();
        for d in [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql] {
            let sql = store.schema_sql(d).join(";\n");
            assert!(sql.contains(&format!("CREATE TABLE IF NOT EXISTS {}_audit", db.table)), "{sql}");
            assert!(sql.contains(&format!("{}_key", db.table)), "{sql}");
        }
    }
}
