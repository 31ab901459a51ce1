//! The async stores against real databases, as a Rust service uses them:
//! SQLite files always, PostgreSQL when `DATABASE_URL` is set (bin/test and
//! CI set it; the crate must be built with `--features postgres`), MySQL or
//! MariaDB when `MYSQL_URL` is (`mysql://root@127.0.0.1:3306/test`, or the
//! `mysql2://` form bin/test sets; with `--features mysql`). Every scenario
//! runs on each, with a table of its own, dropped afterwards.
//!
//! The properties about several processes run in several processes: the
//! test binary starts copies of itself (`child_process`, below) the way the
//! Ruby specs fork.

mod support;

use acemq::Envelope;
use acemq::idempotency::{
    AsyncIdempotencyStore, AsyncSqlIdempotencyStore, Idempotent, ManualClock, SqlIdempotencyOptions, TimeColumns,
};
use acemq::outbox::{
    AsyncSqlOutboxStore, OutboxPublisher, OutboxRecord, OutboxRelay, OutboxStoreOptions, PublishFuture, RelayOptions,
};
use acemq::sql::{AsyncConnectionSource, AsyncSqlConnection, AsyncSqliteConnection, Dialect, Row, SqlValue};
use acemq::{Ack, Connection, Message, Outcome, Topology};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;
use support::sql::Source;

// ---------------------------------------------------------------------------
// The databases

#[derive(Clone, Debug)]
enum Backend {
    Sqlite(String),
    #[cfg(feature = "postgres")]
    Postgres(String),
    #[cfg(feature = "mysql")]
    Mysql(String),
}

/// One scenario's database and table name; the table (SQLite: the file) is
/// removed when it is dropped.
struct Db {
    backend: Backend,
    table: String,
}

fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("t_{name}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

/// SQLite always; PostgreSQL too when DATABASE_URL is set.
fn databases(name: &str) -> Vec<Db> {
    let table = unique(name);
    let file = std::env::temp_dir().join(format!("acemq-{table}.db")).to_str().unwrap().to_owned();
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(unused_mut))]
    let mut out = vec![Db { backend: Backend::Sqlite(file), table: table.clone() }];
    match std::env::var("DATABASE_URL") {
        #[cfg(feature = "postgres")]
        Ok(url) => out.push(Db { backend: Backend::Postgres(url), table }),
        #[cfg(not(feature = "postgres"))]
        Ok(_) => note("DATABASE_URL is set but acemq was built without the postgres feature: PostgreSQL tests skipped (cargo test --features postgres)"),
        Err(_) => note("DATABASE_URL is not set: PostgreSQL tests skipped, SQLite only"),
    }
    #[cfg(feature = "mysql")]
    if let Ok(url) = std::env::var("MYSQL_URL") {
        out.push(Db { backend: Backend::Mysql(url), table: unique(name) });
    }
    out
}

/// Said once per run, past the harness's capture (written to stderr
/// directly), so a passing run still says what it did not test.
fn note(what: &str) {
    use std::io::Write;
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = writeln!(std::io::stderr(), "note: {what}");
    });
}

impl Db {
    async fn source(&self) -> Source {
        match &self.backend {
            Backend::Sqlite(path) => Source::Sqlite(AsyncSqliteConnection::open(path).await.unwrap()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => Source::Pg(
                acemq::sql::PgConnection::connect(url).await.expect("DATABASE_URL is set but PostgreSQL cannot be reached"),
            ),
            #[cfg(feature = "mysql")]
            Backend::Mysql(url) => Source::My(
                acemq::sql::MysqlConnection::connect(url).await.expect("MYSQL_URL is set but MySQL cannot be reached"),
            ),
        }
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

    /// The environment a child process needs to open this database.
    fn env(&self) -> Vec<(&'static str, String)> {
        let (kind, location) = match &self.backend {
            Backend::Sqlite(path) => ("sqlite", path.clone()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => ("postgres", url.clone()),
            #[cfg(feature = "mysql")]
            Backend::Mysql(url) => ("mysql", url.clone()),
        };
        vec![("ACEMQ_TEST_DB_KIND", kind.into()), ("ACEMQ_TEST_DB", location), ("ACEMQ_TEST_TABLE", self.table.clone())]
    }

    fn from_env() -> Db {
        let location = std::env::var("ACEMQ_TEST_DB").unwrap();
        let backend = match std::env::var("ACEMQ_TEST_DB_KIND").unwrap().as_str() {
            "sqlite" => Backend::Sqlite(location),
            #[cfg(feature = "postgres")]
            "postgres" => Backend::Postgres(location),
            #[cfg(feature = "mysql")]
            "mysql" => Backend::Mysql(location),
            other => panic!("unknown database kind {other}"),
        };
        Db { backend, table: std::env::var("ACEMQ_TEST_TABLE").unwrap() }
    }

    async fn outbox(&self, worker: &str, lease: Duration) -> AsyncSqlOutboxStore<Source> {
        let options = OutboxStoreOptions {
            table: self.table.clone(),
            worker_id: Some(worker.into()),
            lease,
            ..OutboxStoreOptions::default()
        };
        let store = AsyncSqlOutboxStore::new(self.source().await, options).unwrap();
        store.create_schema().await.unwrap();
        store
    }

    async fn keys(&self, worker: &str) -> AsyncSqlIdempotencyStore<Source> {
        self.keys_of(Some(worker)).await
    }

    /// A store whose worker is `worker`, or this process's `hostname:pid`.
    async fn keys_of(&self, worker: Option<&str>) -> AsyncSqlIdempotencyStore<Source> {
        let options = SqlIdempotencyOptions {
            table: self.table.clone(),
            worker: worker.map(str::to_owned),
            claim_timeout: Duration::from_secs(10),
            retention: Duration::from_secs(3600),
        };
        AsyncSqlIdempotencyStore::new(self.source().await, options).unwrap()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        match &self.backend {
            Backend::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => {
                // Drop runs inside the test's runtime: drop the table from a
                // thread of its own with a runtime of its own.
                let (url, table) = (url.clone(), self.table.clone());
                let _ = std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
                        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
                        tokio::spawn(conn);
                        client.batch_execute(&format!("DROP TABLE IF EXISTS {table}")).await.unwrap();
                    })
                })
                .join();
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql(url) => {
                let (url, table) = (url.clone(), self.table.clone());
                let _ = std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
                        use mysql_async::prelude::Queryable;
                        let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                        conn.query_drop(format!("DROP TABLE IF EXISTS {table}")).await.unwrap();
                        let _ = conn.disconnect().await;
                    })
                })
                .join();
            }
        }
    }
}

async fn count(source: &Source, table: &str) -> i64 {
    let conn = source.connection().await.unwrap();
    match &conn.query(&format!("SELECT COUNT(*) FROM {table}"), &[]).await.unwrap()[0][0] {
        SqlValue::Int(n) => *n,
        other => panic!("count is {other:?}"),
    }
}

fn record(n: usize) -> OutboxRecord {
    OutboxRecord::json(
        "orders-events",
        "order.placed",
        &serde_json::json!({ "n": n }),
        Envelope::new().with_type("order.placed.v2").with_id(format!("msg-{n}")),
    )
    .unwrap()
}

/// Remembers what it published; optionally slow, as a broker's confirms are.
#[derive(Default)]
struct Recorder {
    published: Mutex<Vec<String>>,
    delay: Duration,
}

impl OutboxPublisher for Recorder {
    fn publish_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> PublishFuture<'a> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            let mut published = self.published.lock().unwrap();
            records.iter().map(|r| published.push(r.envelope.id.clone())).map(Ok).collect()
        })
    }
}

/// The test binary again, running only `child_process` with `role`.
fn spawn_child(db: &Db, role: &str, extra: &[(&str, String)]) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_process", "--exact", "--nocapture", "--test-threads=1"]).env("ACEMQ_TEST_CHILD", role);
    for (k, v) in db.env().into_iter().chain(extra.iter().map(|(k, v)| (*k, v.clone()))) {
        cmd.env(k, v);
    }
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::inherit());
    cmd.spawn().unwrap()
}

fn epoch_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

// ---------------------------------------------------------------------------
// Idempotency

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_confirm_forget_and_takeover() {
    // The engine's table (integer times) and the guide's ActiveRecord
    // migration's (datetimes): one set of rules on either.
    let kinds = [("keys", TimeColumns::EpochMillis), ("keys_dt", TimeColumns::DatetimeUtc)];
    for (db, times) in kinds.into_iter().flat_map(|(name, times)| databases(name).into_iter().map(move |db| (db, times))) {
        let clock = ManualClock::default();
        let a = db.keys("w1").await.with_time_columns(times).with_clock(clock.clone());
        let b = db.keys("w2").await.with_time_columns(times).with_clock(clock.clone());
        a.create_schema().await.unwrap();
        a.create_schema().await.unwrap(); // twice is fine

        assert!(a.first_time_async("k").await.unwrap(), "{}: the first claim wins", db.name());
        assert!(!b.first_time_async("k").await.unwrap(), "{}: a live claim is honoured", db.name());
        b.forget_async("k").await.unwrap();
        assert!(!b.first_time_async("k").await.unwrap(), "{}: another worker cannot forget w1's claim", db.name());

        clock.advance(Duration::from_secs(10));
        assert!(!b.first_time_async("k").await.unwrap(), "{}: a claim exactly the timeout old still holds", db.name());
        clock.advance(Duration::from_millis(1));
        assert!(b.first_time_async("k").await.unwrap(), "{}: a stale claim is taken over", db.name());
        assert!(!a.first_time_async("k").await.unwrap(), "{}: the takeover is a fresh claim", db.name());
        a.forget_async("k").await.unwrap(); // a lost it: does nothing
        assert!(!a.confirmed_async("k").await.unwrap());

        b.confirm_async("k").await.unwrap();
        b.confirm_async("k").await.unwrap(); // idempotent
        assert!(a.confirmed_async("k").await.unwrap());
        clock.advance(Duration::from_secs(3000));
        assert!(!a.first_time_async("k").await.unwrap(), "{}: a confirmed key is never taken over", db.name());
        b.forget_async("k").await.unwrap();
        assert!(a.confirmed_async("k").await.unwrap(), "{}: forget never removes a confirmed key", db.name());

        assert!(a.first_time_async("j").await.unwrap());
        a.forget_async("j").await.unwrap();
        assert!(b.first_time_async("j").await.unwrap(), "{}: after forget the retry runs", db.name());

        // Batches follow the same rules in one transaction.
        let got = b.claim_batch(&["new", "k", "j", "new"]).await.unwrap();
        assert_eq!(got, [true, false, false, false], "{}", db.name());
        b.confirm_batch(&["new", "j"]).await.unwrap();
        assert!(a.confirmed_async("new").await.unwrap() && a.confirmed_async("j").await.unwrap());

        // k was last claimed at 10 s (expires at 3610 s), j and new at 3010 s.
        clock.advance(Duration::from_secs(3601));
        assert_eq!(a.purge_expired().await.unwrap(), 3, "{}: k, j and new are past their retention", db.name());
        assert_eq!(count(a.source(), &db.table).await, 0);
    }
}

/// A datetime table that keeps whole seconds (MySQL's `DATETIME` and
/// PostgreSQL's `TIMESTAMP(0)`, what Rails 6.1's `t.datetime` makes on
/// MySQL): the rules hold, because no claim has to find the times it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datetime_table_of_whole_seconds_keeps_the_rules() {
    for db in databases("keys_s") {
        let clock = ManualClock::default();
        let a = db.keys("w1").await.with_time_columns(TimeColumns::DatetimeUtc).with_clock(clock.clone());
        let b = db.keys("w2").await.with_time_columns(TimeColumns::DatetimeUtc).with_clock(clock.clone());
        let conn = a.source().connection().await.unwrap();
        let (key, time) = match conn.dialect() {
            Dialect::Mysql => ("VARBINARY(255)", "DATETIME"),
            Dialect::Postgres => ("VARCHAR(255)", "TIMESTAMP(0)"),
            Dialect::Sqlite => ("VARCHAR(255)", "DATETIME"),
        };
        let ddl = format!(
            "CREATE TABLE {} (message_id {key} NOT NULL PRIMARY KEY, state VARCHAR(16) NOT NULL, \
             claimed_by VARCHAR(64), recorded_at {time} NOT NULL, expires_at {time} NOT NULL)",
            db.table
        );
        conn.execute(&ddl, &[]).await.unwrap();
        drop(conn);
        clock.advance(Duration::from_millis(700)); // not on a whole second

        assert!(a.first_time_async("k").await.unwrap(), "{}: the first claim wins", db.name());
        assert!(!b.first_time_async("k").await.unwrap(), "{}: a live claim is honoured", db.name());
        assert_eq!(a.first_time_many_async(&["k", "n"]).await.unwrap(), [false, true], "{}", db.name());
        clock.advance(Duration::from_secs(12));
        assert!(b.first_time_async("k").await.unwrap(), "{}: a stale claim is taken over", db.name());
        assert!(!a.first_time_async("k").await.unwrap(), "{}: the takeover is a fresh claim", db.name());
        b.confirm_async("k").await.unwrap();
        assert!(a.confirmed_async("k").await.unwrap() && !a.confirmed_async("n").await.unwrap());
        clock.advance(Duration::from_secs(60));
        assert!(!a.first_time_async("k").await.unwrap(), "{}: a confirmed key is never taken over", db.name());
        a.forget_async("n").await.unwrap();
        assert_eq!(count(a.source(), &db.table).await, 1, "{}: a's own claim forgotten", db.name());
        clock.advance(Duration::from_secs(3600));
        assert_eq!(a.purge_expired().await.unwrap(), 1, "{}", db.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotent_handler_runs_once_per_key_on_the_async_store() {
    for db in databases("handler") {
        let store = db.keys("w1").await;
        store.create_schema().await.unwrap();
        let charged = Arc::new(AtomicUsize::new(0));
        let c = charged.clone();
        let charge = Idempotent::new(store.clone(), move |_m: Message| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Outcome::Ack(Ack::accept())
            }
        })
        .with_key(|m| m.payload["order_id"].as_str().map(|id| format!("charge:{id}")));
        let message = || Message::new(serde_json::json!({ "order_id": "A-1" }), Envelope::new());
        // Awaited on a spawned task: the store's futures are Send.
        let charge = Arc::new(charge);
        for _ in 0..2 {
            let (charge, m) = (charge.clone(), message());
            let outcome = tokio::spawn(async move { charge.handle(m).await }).await.unwrap();
            assert_eq!(outcome, Outcome::Ack(Ack::Accept));
        }
        assert_eq!(charged.load(Ordering::SeqCst), 1, "{}: charged once", db.name());
        assert!(store.confirmed_async("charge:A-1").await.unwrap());
        assert_eq!(charge.guard().stats().duplicates, 1);
    }
}

/// A runner killed mid-handler leaves its claim: the next owner of the
/// key (a partition's new single active consumer) takes it over as soon as
/// the claimant's process has exited, not after the claim timeout (10 s
/// here, and the clock does not move), because a process that has exited
/// can neither confirm nor forget. While the claimant lives its claim holds;
/// a confirmed key is never taken over; a worker id that does not name a
/// process of this host is never proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_claim_is_taken_over_at_once() {
    let kinds = [("dead", TimeColumns::EpochMillis), ("dead_dt", TimeColumns::DatetimeUtc)];
    for (db, times) in kinds.into_iter().flat_map(|(name, times)| databases(name).into_iter().map(move |db| (db, times))) {
        let me = db.keys_of(None).await.with_time_columns(times);
        me.create_schema().await.unwrap();
        // The child says it has claimed by writing this file (what it
        // prints is the harness's until it exits).
        let signal = std::env::temp_dir().join(format!("acemq-{}-claimed", db.table));
        let _ = std::fs::remove_file(&signal);
        let extra = [
            ("ACEMQ_TEST_DATETIME", (times == TimeColumns::DatetimeUtc).to_string()),
            ("ACEMQ_TEST_SIGNAL", signal.to_str().unwrap().to_owned()),
        ];
        let mut child = spawn_child(&db, "claim-and-wait", &extra);
        let claimed = async {
            while !signal.exists() {
                assert!(child.try_wait().unwrap().is_none(), "{}: the child ended before it claimed", db.name());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), claimed).await.expect("the child never claimed held and done");
        let _ = std::fs::remove_file(&signal);

        assert!(!me.first_time_async("held").await.unwrap(), "{}: a live claimant's claim holds", db.name());
        // Another host's pid, and a given worker id: not ours to judge.
        let elsewhere = db.keys(&format!("elsewhere:{}", child.id())).await.with_time_columns(times);
        let named = db.keys("relay-1").await.with_time_columns(times);
        assert!(elsewhere.first_time_async("remote").await.unwrap() && named.first_time_async("named").await.unwrap());

        child.kill().unwrap();
        child.wait().unwrap();
        assert!(me.first_time_async("held").await.unwrap(), "{}: the dead child's claim is taken over at once", db.name());
        assert!(!me.first_time_async("done").await.unwrap(), "{}: its confirmed key is not", db.name());
        assert!(me.confirmed_async("done").await.unwrap());
        assert_eq!(
            me.first_time_many_async(&["remote", "named", "fresh"]).await.unwrap(),
            [false, false, true],
            "{}: another host's claim and a named worker's wait out their lease",
            db.name()
        );
        // The takeover is this worker's claim: forget removes it, and the
        // dead worker's own forget (were it to arrive) would not.
        me.forget_async("held").await.unwrap();
        assert!(elsewhere.first_time_async("held").await.unwrap(), "{}: forgotten by its new owner", db.name());
    }
}

/// The guard of a keep_order consumer meets a key another (live) worker
/// claims: it waits in place, polling the store, instead of sending the
/// message round the ladder. Confirmed meanwhile: a duplicate, accepted
/// without running. Forgotten meanwhile: it runs, here. Without keep_order
/// the same delivery is sent round the ladder to wait (what put it behind
/// later messages of its key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_order_guard_holds_a_claimed_message_in_place() {
    for db in databases("hold") {
        let other = db.keys("other-runner").await;
        other.create_schema().await.unwrap();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let r = ran.clone();
        let guard = |store, keep_order: bool| {
            let r = r.clone();
            let g = Idempotent::new(store, move |m: Message| {
                let r = r.clone();
                async move {
                    r.lock().unwrap().push(m.payload["order_id"].as_str().unwrap().to_owned());
                    Outcome::Ack(Ack::accept())
                }
            })
            .with_key(|m| m.payload["order_id"].as_str().map(str::to_owned));
            Arc::new(if keep_order { g.keep_order() } else { g })
        };
        let order = |id: &str| Message::new(serde_json::json!({ "order_id": id }), Envelope::new());
        let held = guard(db.keys("new-owner").await, true);

        for (key, confirm) in [("A-1", true), ("A-2", false)] {
            assert!(other.first_time_async(key).await.unwrap());
            let (h, m) = (held.clone(), order(key));
            let handling = tokio::spawn(async move { h.handle(m).await });
            // The guard looks at least once (a claim elsewhere, counted)
            // before the other worker settles its claim.
            let looked = async {
                while held.guard().stats().claimed_elsewhere < if confirm { 1 } else { 2 } {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(30), looked).await.expect("the guard never looked at the key");
            if confirm {
                other.confirm_async(key).await.unwrap();
            } else {
                other.forget_async(key).await.unwrap();
            }
            assert_eq!(handling.await.unwrap(), Outcome::Ack(Ack::Accept), "{}: {key}", db.name());
        }
        assert_eq!(*ran.lock().unwrap(), ["A-2"], "{}: the confirmed key is a duplicate, the forgotten one runs", db.name());
        let stats = held.guard().stats();
        assert_eq!((stats.held, stats.duplicates, stats.runs), (2, 1, 1), "{}: {stats:?}", db.name());
        assert!(other.confirmed_async("A-2").await.unwrap(), "{}: the held run confirmed its key", db.name());

        assert!(other.first_time_async("A-3").await.unwrap());
        let ladder = guard(db.keys("new-owner").await, false);
        match ladder.handle(order("A-3")).await {
            Outcome::Wait { .. } => {}
            other => panic!("{}: without keep_order a claimed key waits round the ladder, got {other:?}", db.name()),
        }
        assert_eq!(ladder.guard().stats().held, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_racing_for_each_key_have_exactly_one_winner() {
    race(1, TimeColumns::EpochMillis).await;
}

/// Batches of 25 overlapping keys, one child walking them forwards and the
/// other backwards: every key still has exactly one winner, and the batches
/// (one statement each, keys sent sorted) never deadlock each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_claiming_overlapping_batches_have_exactly_one_winner() {
    race(25, TimeColumns::EpochMillis).await;
}

/// The same on the guide's migration's datetime columns, where a MySQL
/// claim goes key by key (INSERT IGNORE, then the takeover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_claiming_batches_on_a_datetime_table_have_exactly_one_winner() {
    race(25, TimeColumns::DatetimeUtc).await;
}

async fn race(batch: usize, times: TimeColumns) {
    const KEYS: usize = 200;
    let datetime = times == TimeColumns::DatetimeUtc;
    for db in databases(if datetime { "race_dt" } else { "race" }) {
        db.keys("parent").await.with_time_columns(times).create_schema().await.unwrap();
        let start_at = (epoch_ms() + 1500).to_string();
        let children: Vec<_> = ["w1", "w2"]
            .iter()
            .map(|w| {
                spawn_child(
                    &db,
                    "claim",
                    &[
                        ("ACEMQ_TEST_WORKER", w.to_string()),
                        ("ACEMQ_TEST_START_AT", start_at.clone()),
                        ("ACEMQ_TEST_KEYS", KEYS.to_string()),
                        ("ACEMQ_TEST_BATCH", batch.to_string()),
                        ("ACEMQ_TEST_DATETIME", datetime.to_string()),
                    ],
                )
            })
            .collect();
        let mut wins: HashMap<String, Vec<String>> = HashMap::new();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}: a claiming child failed", db.name());
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains("raced ") {
                    eprintln!("{}: {line}", db.name());
                }
                // The harness prints "test child_process ... " before the
                // test's first line, on the same line.
                if let Some(rest) = line.split_once("claimed ").map(|(_, rest)| rest) {
                    let (worker, key) = rest.split_once(' ').unwrap();
                    wins.entry(key.to_owned()).or_default().push(worker.to_owned());
                }
            }
        }
        assert_eq!(wins.len(), KEYS, "{}: every key was claimed", db.name());
        for (key, winners) in &wins {
            assert_eq!(winners.len(), 1, "{}: {key} claimed by {winners:?}", db.name());
        }
        let by: HashSet<&String> = wins.values().flatten().collect();
        eprintln!("{}: batch {batch}, {} keys, winners {by:?}", db.name(), wins.len());
    }
}

/// A small deterministic generator (xorshift), so a failing round can be
/// replayed from its seed without a new crate.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

async fn all_rows(db: &Db, source: &Source) -> Vec<Row> {
    let conn = source.connection().await.unwrap();
    let sql = format!("SELECT message_id, state, claimed_by, recorded_at, expires_at FROM {} ORDER BY message_id", db.table);
    let mut rows = conn.query(&sql, &[]).await.unwrap();
    if conn.dialect() == Dialect::Mysql {
        // A MySQL claim adds its own stamp, under a second, to expires_at
        // (how it finds its rows again): compared without it, and only when
        // it is in that range, so a wrong expiry still differs.
        for row in &mut rows {
            if let (SqlValue::Int(at), SqlValue::Int(expires)) = (row[3].clone(), row[4].clone()) {
                if (0..1000).contains(&(expires - at - 3_600_000)) {
                    row[4] = SqlValue::Int(at + 3_600_000);
                }
            }
        }
    }
    rows
}

/// Every state a key can be in when a batch arrives, set up identically in
/// two tables; then one table answers a batch (one statement) and the other
/// the same keys one at a time. The answers, in order, and the rows left
/// behind are the same, on SQLite and on PostgreSQL, over mixed batches with
/// repeated keys, and so are the rows after a batch confirm and confirms
/// one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claim_decides_each_key_exactly_as_alone() {
    const TIMEOUT_MS: i64 = 10_000;
    for (batched, alone) in databases("batch").into_iter().zip(databases("alone")) {
        let clock = ManualClock::default();
        let store = |db: &Db, source: Source| {
            let options = SqlIdempotencyOptions {
                table: db.table.clone(),
                worker: Some("me".into()),
                claim_timeout: Duration::from_millis(TIMEOUT_MS as u64),
                retention: Duration::from_secs(3600),
            };
            AsyncSqlIdempotencyStore::new(source, options).unwrap().with_clock(clock.clone())
        };
        let (a, b) = (store(&batched, batched.source().await), store(&alone, alone.source().await));
        a.create_schema().await.unwrap();
        b.create_schema().await.unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut decided = [0usize; 2];
        for round in 0..12 {
            let now = acemq::idempotency::Clock::now_millis(&clock);
            // (state, claimed_by, recorded_at) per kind; None: no row.
            let kinds: [Option<(&str, &str, i64)>; 8] = [
                None,
                Some(("CONFIRMED", "other", now - 3 * TIMEOUT_MS)),
                Some(("CONFIRMED", "me", now - 1)),
                Some(("CLAIMED", "other", now - TIMEOUT_MS / 2)),
                Some(("CLAIMED", "other", now - TIMEOUT_MS - 1)),
                Some(("CLAIMED", "other", now - TIMEOUT_MS)), // exactly the timeout: still honoured
                Some(("CLAIMED", "me", now - 1)),
                Some(("CLAIMED", "me", now - 2 * TIMEOUT_MS)),
            ];
            let keys: Vec<String> = (0..40).map(|i| format!("r{round}-k{i}")).collect();
            let mut set_up: HashMap<&str, Option<(&str, &str, i64)>> = HashMap::new();
            for key in &keys {
                let kind = kinds[rng.below(kinds.len())];
                set_up.insert(key, kind);
                if let Some((state, by, at)) = kind {
                    for (db, st) in [(&batched, &a), (&alone, &b)] {
                        let conn = st.source().connection().await.unwrap();
                        let sql = match conn.dialect() {
                            Dialect::Sqlite | Dialect::Mysql => format!("INSERT INTO {} VALUES (?, ?, ?, ?, ?)", db.table),
                            Dialect::Postgres => format!("INSERT INTO {} VALUES ($1, $2, $3, $4, $5)", db.table),
                        };
                        let params = [
                            SqlValue::Text(key.clone()),
                            SqlValue::Text(state.into()),
                            SqlValue::Text(by.into()),
                            SqlValue::Int(at),
                            SqlValue::Int(at + 3_600_000),
                        ];
                        conn.execute(&sql, &params).await.unwrap();
                    }
                }
            }
            let batch: Vec<&str> = (0..1 + rng.below(60)).map(|_| keys[rng.below(keys.len())].as_str()).collect();
            let together = a.first_time_many_async(&batch).await.unwrap();
            let mut one_by_one = Vec::new();
            for key in &batch {
                one_by_one.push(b.first_time_async(key).await.unwrap());
            }
            assert_eq!(together, one_by_one, "{} round {round}: {batch:?}", batched.name());
            // And both are the rule: first for a new key or a stale claim
            // (anybody's), never for a confirmed key or a live claim, and a
            // key repeated in the batch at most once.
            let mut seen = HashSet::new();
            let rule: Vec<bool> = batch
                .iter()
                .map(|k| {
                    seen.insert(*k)
                        && match set_up[k] {
                            None => true,
                            Some((state, _, at)) => state == "CLAIMED" && at < now - TIMEOUT_MS,
                        }
                })
                .collect();
            assert_eq!(together, rule, "{} round {round}: {batch:?}", batched.name());
            for first in &together {
                decided[*first as usize] += 1;
            }
            assert_eq!(all_rows(&batched, a.source()).await, all_rows(&alone, b.source()).await, "{} round {round}", batched.name());

            let confirm: Vec<&str> = batch.iter().copied().filter(|_| rng.below(2) == 0).collect();
            a.confirm_many_async(&confirm).await.unwrap();
            for key in &confirm {
                b.confirm_async(key).await.unwrap();
            }
            assert_eq!(all_rows(&batched, a.source()).await, all_rows(&alone, b.source()).await, "{} round {round}: confirm", batched.name());
            clock.advance(Duration::from_millis(TIMEOUT_MS as u64 / 3));
        }
        // Both answers happened, so the comparison compared something.
        assert!(decided[0] > 20 && decided[1] > 20, "{}: {decided:?}", batched.name());
        eprintln!("{}: {} not first, {} first, each as alone", batched.name(), decided[0], decided[1]);
    }
}

// ---------------------------------------------------------------------------
// Outbox

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_commits_and_rolls_back_with_the_callers_transaction() {
    for db in databases("rollback") {
        let store = db.outbox("w1", Duration::from_secs(60)).await;
        let app = db.source().await;
        let tx = app.connection().await.unwrap();
        tx.execute("BEGIN", &[]).await.unwrap();
        store.add(&record(1), &tx).await.unwrap();
        assert_eq!(count(store.source(), &db.table).await, 0, "{}: not visible before the commit", db.name());
        tx.execute("ROLLBACK", &[]).await.unwrap();
        assert_eq!(store.backlog().await.unwrap().count, 0, "{}: the rollback took the row", db.name());

        tx.execute("BEGIN", &[]).await.unwrap();
        let id = store.add(&record(2), &tx).await.unwrap();
        tx.execute("COMMIT", &[]).await.unwrap();
        assert!(id > 0);
        let claimed = store.claim(10).await.unwrap();
        assert_eq!(claimed.iter().map(|r| r.id).collect::<Vec<_>>(), [Some(id)], "{}", db.name());
        assert_eq!(claimed[0].envelope.id, "msg-2");
        assert_eq!(claimed[0].body, r#"{"n":2}"#);
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_takes_the_services_own_tokio_postgres_transaction() {
    for db in databases("pgtx") {
        let Backend::Postgres(url) = db.backend.clone() else { continue };
        let store = db.outbox("w1", Duration::from_secs(60)).await;
        let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let work = format!("{}_work", db.table);
        client.batch_execute(&format!("CREATE TABLE {work} (id BIGINT PRIMARY KEY)")).await.unwrap();

        // Rolled back: neither the work nor the message.
        let tx = client.transaction().await.unwrap();
        tx.execute(&format!("INSERT INTO {work} VALUES (1)"), &[]).await.unwrap();
        store.add(&record(1), &tx).await.unwrap();
        tx.rollback().await.unwrap();
        // Dropped without a commit: the same.
        let tx = client.transaction().await.unwrap();
        store.add(&record(2), &tx).await.unwrap();
        drop(tx);
        assert_eq!(store.backlog().await.unwrap().count, 0);

        // Committed: both.
        let tx = client.transaction().await.unwrap();
        tx.execute(&format!("INSERT INTO {work} VALUES (3)"), &[]).await.unwrap();
        // Send: a handler can add from a task tokio moves between threads.
        send(store.add(&record(3), &tx)).await.unwrap();
        tx.commit().await.unwrap();
        let claimed = store.claim(10).await.unwrap();
        assert_eq!(claimed.iter().map(|r| r.envelope.id.as_str()).collect::<Vec<_>>(), ["msg-3"]);
        let rows = client.query(&format!("SELECT id FROM {work}"), &[]).await.unwrap();
        assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), [3]);
        client.batch_execute(&format!("DROP TABLE {work}")).await.unwrap();
    }
}

#[cfg(feature = "postgres")]
fn send<F: Future + Send>(f: F) -> F {
    f
}

async fn fill(db: &Db, store: &AsyncSqlOutboxStore<Source>, n: usize) {
    let app = db.source().await;
    let tx = app.connection().await.unwrap();
    tx.execute("BEGIN", &[]).await.unwrap();
    for i in 0..n {
        store.add(&record(i), &tx).await.unwrap();
    }
    tx.execute("COMMIT", &[]).await.unwrap();
}

/// A started relay sweeps when a row is committed, not an `interval` later:
/// on PostgreSQL through its `LISTEN` (the row committed on another
/// connection, which is what another process does), on SQLite through the
/// process's own wake-up. The interval is a minute, so only the wake-up can
/// deliver within the few seconds allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_relay_wakes_when_a_row_is_committed() {
    for db in databases("wakes") {
        #[cfg(feature = "mysql")]
        if matches!(db.backend, Backend::Mysql(_)) {
            // MySQL has no NOTIFY, and a process's own wake-up would find
            // the row still locked (SKIP LOCKED passes it by) before its
            // commit: a relay there polls at its interval.
            continue;
        }
        let store = db.outbox("relay", Duration::from_secs(60)).await;
        let publisher = Arc::new(Recorder::default());
        let options = RelayOptions { interval: Duration::from_secs(60), ..RelayOptions::default() };
        let relay = OutboxRelay::new(publisher.clone(), store, options);
        relay.start().unwrap();
        // Its first sweep finds nothing and it waits; then, from another
        // connection, one row at a time.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let other = db.source().await;
        let adder = AsyncSqlOutboxStore::new(other, OutboxStoreOptions { table: db.table.clone(), ..Default::default() }).unwrap();
        for n in 1..=3 {
            let session = db.source().await;
            let conn = session.connection().await.unwrap();
            adder.add(&record(n), &conn).await.unwrap();
            let started = std::time::Instant::now();
            while publisher.published.lock().unwrap().len() < n {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "{}: row {n} was not relayed within 5 s of its commit (interval 60 s)",
                    db.name()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        assert_eq!(*publisher.published.lock().unwrap(), ["msg-1", "msg-2", "msg-3"], "{}", db.name());
        // Closing stops the listening too: the relay's task ends.
        tokio::time::timeout(Duration::from_secs(5), relay.close()).await.expect("the relay closes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_table_publish_each_row_once() {
    const ROWS: usize = 300;
    for db in databases("relays") {
        let a = db.outbox("relay-a", Duration::from_secs(60)).await;
        let b = db.outbox("relay-b", Duration::from_secs(60)).await;
        fill(&db, &a, ROWS).await;
        let publisher = Arc::new(Recorder { delay: Duration::from_millis(20), ..Recorder::default() });
        let options = || RelayOptions { batch_size: 25, interval: Duration::from_millis(20), ..RelayOptions::default() };
        let ra = OutboxRelay::new(publisher.clone(), a, options());
        let rb = OutboxRelay::new(publisher.clone(), b, options());
        let (mut from_a, mut from_b) = (0, 0);
        loop {
            let (x, y) = tokio::join!(ra.sweep(), rb.sweep());
            let (x, y) = (x.unwrap(), y.unwrap());
            from_a += x;
            from_b += y;
            if x + y == 0 {
                break;
            }
        }
        let published = publisher.published.lock().unwrap().clone();
        let distinct: HashSet<&String> = published.iter().collect();
        assert_eq!(published.len(), ROWS, "{}: every row published once ({from_a} by a, {from_b} by b)", db.name());
        assert_eq!(distinct.len(), ROWS);
        assert!(from_a > 0 && from_b > 0, "{}: both relays took rows ({from_a}, {from_b})", db.name());
        assert_eq!(ra.store().backlog().await.unwrap().count, 0);
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_skips_rows_another_relay_has_locked() {
    for db in databases("skiplocked") {
        if !matches!(db.backend, Backend::Postgres(_)) {
            continue;
        }
        let a = db.outbox("relay-a", Duration::from_secs(60)).await;
        let b = db.outbox("relay-b", Duration::from_secs(60)).await;
        fill(&db, &a, 10).await;
        // Another relay mid-claim: its transaction holds the row locks of
        // the five oldest rows and has not committed.
        let other = db.source().await;
        let tx = other.connection().await.unwrap();
        tx.execute("BEGIN", &[]).await.unwrap();
        let locked = tx
            .query(&format!("SELECT id FROM {} ORDER BY id LIMIT 5 FOR UPDATE", db.table), &[])
            .await
            .unwrap();
        assert_eq!(locked.len(), 5);
        // b does not wait for it: it takes the other five at once.
        let claimed = tokio::time::timeout(Duration::from_secs(5), b.claim(100)).await.expect("the claim waited on locked rows").unwrap();
        let ids: Vec<SqlValue> = claimed.iter().map(|r| SqlValue::Int(r.id.unwrap())).collect();
        assert_eq!(ids.len(), 5);
        assert!(locked.iter().all(|row| !ids.contains(&row[0])), "a locked row was claimed");
        tx.execute("ROLLBACK", &[]).await.unwrap();
        // Released, the first five are claimable; b's five are leased.
        let rest = a.claim(100).await.unwrap();
        assert_eq!(rest.len(), 5);
        assert!(rest.iter().all(|r| !ids.contains(&SqlValue::Int(r.id.unwrap()))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_confirm_and_delete_publishes_again_and_loses_nothing() {
    for db in databases("crash") {
        let store = db.outbox("parent", Duration::from_secs(60)).await;
        fill(&db, &store, 3).await;
        // A relay process publishes the rows to a broker, has them
        // confirmed, and dies before it deletes them.
        let child = spawn_child(&db, "relay-and-crash", &[("ACEMQ_FAULT_INJECT", "exit-after-publish".to_string())]);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(86), "{}: the child died at the fault point", db.name());
        assert!(String::from_utf8_lossy(&out.stdout).contains("relaying"), "{}", db.name());
        assert_eq!(store.backlog().await.unwrap().count, 3, "{}: confirmed but not deleted", db.name());
        assert!(store.claim(10).await.unwrap().is_empty(), "{}: still leased to the dead relay", db.name());

        // Its lease (300 ms) runs out; another relay publishes them again.
        let publisher = Arc::new(Recorder::default());
        let relay = OutboxRelay::new(publisher.clone(), store, RelayOptions::default());
        let mut published = 0;
        for _ in 0..100 {
            published += relay.sweep().await.unwrap();
            if published == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(*publisher.published.lock().unwrap(), ["msg-0", "msg-1", "msg-2"], "{}: a duplicate, never a loss", db.name());
        assert_eq!(relay.store().backlog().await.unwrap().count, 0);
    }
}

// ---------------------------------------------------------------------------
// The child processes

/// Does nothing unless started by a test above with `ACEMQ_TEST_CHILD` set.
#[test]
fn child_process() {
    let Ok(role) = std::env::var("ACEMQ_TEST_CHILD") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        // ManuallyDrop: the table is the parent's to drop.
        let db = std::mem::ManuallyDrop::new(Db::from_env());
        match role.as_str() {
            "claim" => {
                let worker = std::env::var("ACEMQ_TEST_WORKER").unwrap();
                let keys: usize = std::env::var("ACEMQ_TEST_KEYS").unwrap().parse().unwrap();
                let mut store = db.keys(&worker).await;
                if std::env::var("ACEMQ_TEST_DATETIME").as_deref() == Ok("true") {
                    store = store.with_time_columns(TimeColumns::DatetimeUtc);
                }
                // Connected; now start together.
                let start_at: u128 = std::env::var("ACEMQ_TEST_START_AT").unwrap().parse().unwrap();
                tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(epoch_ms()) as u64)).await;
                let batch: usize = std::env::var("ACEMQ_TEST_BATCH").map(|b| b.parse().unwrap()).unwrap_or(1);
                let mut all: Vec<String> = (0..keys).map(|i| format!("race-{i}")).collect();
                if worker == "w2" {
                    // The other way round: batches that overlap in reverse.
                    all.reverse();
                }
                let began = epoch_ms();
                for chunk in all.chunks(batch) {
                    let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
                    let answers = if batch == 1 {
                        vec![store.first_time_async(chunk[0]).await.unwrap()]
                    } else {
                        store.first_time_many_async(&chunk).await.unwrap()
                    };
                    for (key, first) in chunk.iter().zip(answers) {
                        if first {
                            println!("claimed {worker} {key}");
                        }
                    }
                }
                println!("raced {worker} from {began} to {}", epoch_ms());
            }
            "claim-and-wait" => {
                // This process's hostname:pid, as a runner's store has it.
                let mut store = db.keys_of(None).await;
                if std::env::var("ACEMQ_TEST_DATETIME").as_deref() == Ok("true") {
                    store = store.with_time_columns(TimeColumns::DatetimeUtc);
                }
                assert!(store.first_time_async("held").await.unwrap());
                assert!(store.first_time_async("done").await.unwrap());
                store.confirm_async("done").await.unwrap();
                std::fs::write(std::env::var("ACEMQ_TEST_SIGNAL").unwrap(), b"claimed").unwrap();
                // Killed here by the parent, holding the claim of "held".
                tokio::time::sleep(Duration::from_secs(60)).await;
                panic!("the parent did not kill this child");
            }
            "relay-and-crash" => {
                let store = db.outbox("child", Duration::from_millis(300)).await;
                let mq = Connection::open("memory://").await.unwrap();
                let topology = Topology::new().queue("orders").exchange("orders-events", acemq::ExchangeKind::Topic).bind("orders", "orders-events", "#");
                mq.apply(&topology).await.unwrap();
                println!("relaying");
                let relay = OutboxRelay::new(Arc::new(mq), store, RelayOptions::default());
                // With ACEMQ_FAULT_INJECT=exit-after-publish the publisher
                // exits the process (status 86) once the broker has confirmed
                // the batch, before the rows are deleted.
                relay.sweep().await.unwrap();
                panic!("the fault point was not reached");
            }
            other => panic!("unknown child role {other}"),
        }
    });
}
