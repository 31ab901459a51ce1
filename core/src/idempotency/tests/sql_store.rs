//! The SQL store over SQLite: each rule, the statements it sends, and the
//! PostgreSQL text of them.

use super::TempDb;
use crate::error::Result;
use crate::idempotency::statements::Statements;
use crate::idempotency::{ConnectionSource, IdempotencyStore, SqlIdempotencyOptions, SqlIdempotencyStore, TimeColumns};
use crate::sql::{Dialect, SqlConnection};
use std::time::Duration;
use crate::idempotency::{ManualClock, PerCall};
use crate::idempotency::{Clock, SystemClock};
use crate::sql::{SqlValue, SqliteConnection};
use std::sync::{Arc, Barrier};

fn opts(worker: &str) -> SqlIdempotencyOptions {
    SqlIdempotencyOptions {
        worker: Some(worker.into()),
        claim_timeout: Duration::from_secs(10),
        retention: Duration::from_secs(3600),
        ..Default::default()
    }
}

fn store(db: &TempDb, worker: &str, clock: &ManualClock) -> SqlIdempotencyStore<SqliteConnection> {
    let s = SqlIdempotencyStore::new(db.connect(), opts(worker)).unwrap().with_clock(clock.clone());
    s.create_schema().unwrap();
    s
}

fn rows(db: &TempDb) -> Vec<crate::sql::Row> {
    db.connect()
        .query("SELECT message_id, state, claimed_by, recorded_at, expires_at FROM acemq_idempotency ORDER BY message_id", &[])
        .unwrap()
}

#[test]
fn claim_is_one_row_and_confirm_makes_it_a_fact() {
    let db = TempDb::new("claim");
    let clock = ManualClock::default();
    let s = store(&db, "w1", &clock);
    s.create_schema().unwrap(); // twice is fine
    assert!(s.first_time("k").unwrap());
    assert!(!s.first_time("k").unwrap());
    let now = clock.now_millis();
    assert_eq!(
        rows(&db),
        vec![vec![
            SqlValue::Text("k".into()),
            SqlValue::Text("CLAIMED".into()),
            SqlValue::Text("w1".into()),
            SqlValue::Int(now),
            SqlValue::Int(now + 3_600_000),
        ]]
    );
    assert!(!s.confirmed("k").unwrap());
    s.confirm("k").unwrap();
    s.confirm("k").unwrap(); // idempotent
    assert!(s.confirmed("k").unwrap());
    assert!(!s.confirmed("never-seen").unwrap());
}

#[test]
fn stale_claim_taken_over_after_claim_timeout_and_not_before() {
    let db = TempDb::new("stale");
    let clock = ManualClock::default();
    let (a, b) = (store(&db, "w1", &clock), store(&db, "w2", &clock));
    assert!(a.first_time("k").unwrap());
    clock.advance(Duration::from_secs(10));
    assert!(!b.first_time("k").unwrap(), "a claim exactly the timeout old is still honoured");
    clock.advance(Duration::from_millis(1));
    assert!(b.first_time("k").unwrap(), "a stale claim is taken over");
    assert!(!a.first_time("k").unwrap(), "the takeover is a fresh claim");
    let row = &rows(&db)[0];
    assert_eq!(row[2], SqlValue::Text("w2".into()));
    assert_eq!(row[3], SqlValue::Int(clock.now_millis()));
    // The worker that lost its claim can no longer forget it.
    a.forget("k").unwrap();
    assert_eq!(rows(&db).len(), 1);
}

#[test]
fn confirmed_is_never_taken_over() {
    let db = TempDb::new("confirmed");
    let clock = ManualClock::default();
    let (a, b) = (store(&db, "w1", &clock), store(&db, "w2", &clock));
    assert!(a.first_time("k").unwrap());
    a.confirm("k").unwrap();
    clock.advance(Duration::from_secs(3000));
    assert!(!b.first_time("k").unwrap());
    a.forget("k").unwrap();
    assert!(b.confirmed("k").unwrap(), "forget never removes a confirmed key");
}

#[test]
fn forget_removes_only_this_workers_own_claim() {
    let db = TempDb::new("forget");
    let clock = ManualClock::default();
    let (a, b) = (store(&db, "w1", &clock), store(&db, "w2", &clock));
    assert!(a.first_time("k").unwrap());
    b.forget("k").unwrap();
    assert!(!b.first_time("k").unwrap(), "another worker cannot forget w1's claim");
    a.forget("k").unwrap();
    assert!(rows(&db).is_empty());
    assert!(b.first_time("k").unwrap(), "after forget the retry runs");
}

#[test]
fn purge_expired_counts_what_it_removes_and_leaves_live_rows() {
    let db = TempDb::new("purge");
    let clock = ManualClock::default();
    let s = store(&db, "w1", &clock);
    s.first_time("old-1").unwrap();
    s.first_time("old-2").unwrap();
    s.confirm("old-2").unwrap();
    clock.advance(Duration::from_secs(1800));
    s.first_time("young").unwrap();
    assert_eq!(s.purge_expired().unwrap(), 0);
    clock.advance(Duration::from_secs(1800) + Duration::from_millis(1));
    assert_eq!(s.purge_expired().unwrap(), 2);
    let left: Vec<_> = rows(&db).into_iter().map(|r| r[0].clone()).collect();
    assert_eq!(left, vec![SqlValue::Text("young".into())]);
    assert_eq!(s.purge_expired().unwrap(), 0);
    assert!(s.first_time("old-2").unwrap(), "a purged key is new again");
}

#[test]
fn nothing_on_the_handling_path_deletes_a_confirmed_or_foreign_row() {
    let db = TempDb::new("nodelete");
    let clock = ManualClock::default();
    let s = store(&db, "w1", &clock);
    for i in 0..20 {
        s.first_time(&format!("k{i}")).unwrap();
        s.confirm(&format!("k{i}")).unwrap();
    }
    clock.advance(Duration::from_secs(7200));
    for i in 0..20 {
        assert!(!s.first_time(&format!("k{i}")).unwrap());
        s.forget(&format!("k{i}")).unwrap();
    }
    assert_eq!(rows(&db).len(), 20, "expired rows stay until purged");
}

#[test]
fn two_connections_racing_first_time_have_exactly_one_winner() {
    let db = TempDb::new("race");
    let clock = SystemClock;
    let stores: Vec<_> = ["w1", "w2"]
        .iter()
        .map(|w| {
            let s = SqlIdempotencyStore::new(db.connect(), opts(w)).unwrap().with_clock(clock);
            s.create_schema().unwrap();
            s
        })
        .collect();
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = stores
        .into_iter()
        .map(|s| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                (0..200)
                    .map(|i| {
                        barrier.wait();
                        s.first_time(&format!("race-{i}")).unwrap()
                    })
                    .collect::<Vec<bool>>()
            })
        })
        .collect();
    let wins: Vec<Vec<bool>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, (a, b)) in wins[0].iter().zip(&wins[1]).enumerate() {
        assert_eq!(*a as u8 + *b as u8, 1, "race-{i}: {a} {b}");
    }
    assert_eq!(rows(&db).len(), 200);
}

#[test]
fn per_call_source_and_boxed_sources_work() {
    let db = TempDb::new("percall");
    let path = db.path.clone();
    let opened = std::cell::Cell::new(0);
    let source = PerCall(|| {
        opened.set(opened.get() + 1);
        SqliteConnection::open(&path)
    });
    let s = SqlIdempotencyStore::new(source, opts("w1")).unwrap();
    s.create_schema().unwrap();
    assert!(s.first_time("k").unwrap());
    assert!(!s.first_time("k").unwrap());
    assert_eq!(opened.get(), 3);

    let boxed: Box<dyn ConnectionSource> = Box::new(db.connect());
    let s: SqlIdempotencyStore = SqlIdempotencyStore::new(boxed, opts("w1")).unwrap();
    assert!(!s.first_time("k").unwrap());
    let conn: Box<dyn SqlConnection> = Box::new(db.connect());
    let s = SqlIdempotencyStore::new(conn, opts("w1")).unwrap();
    s.confirm("k").unwrap();
    assert!(s.confirmed("k").unwrap());
}

#[test]
fn custom_table_and_its_expiry_index() {
    let db = TempDb::new("table");
    let o = SqlIdempotencyOptions { table: "handled_messages".into(), ..opts("w1") };
    let s = SqlIdempotencyStore::new(db.connect(), o).unwrap();
    s.create_schema().unwrap();
    assert!(s.first_time("k").unwrap());
    let idx = db
        .connect()
        .query("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'handled_messages' AND sql IS NOT NULL", &[])
        .unwrap();
    assert_eq!(idx, vec![vec![SqlValue::Text("handled_messages_expiry".into())]]);
}

#[test]
fn bad_options_are_refused_with_what_to_do() {
    let db = TempDb::new("opts");
    for table in ["", "a b", "x;DROP TABLE y", "1abc", "public.t.u", "public.1t"] {
        let o = SqlIdempotencyOptions { table: table.into(), ..Default::default() };
        let e = SqlIdempotencyStore::new(db.connect(), o).err().expect(table);
        assert!(e.message().contains("letters, digits and underscores"), "{e}");
    }
    let o = SqlIdempotencyOptions { claim_timeout: Duration::ZERO, ..Default::default() };
    assert!(SqlIdempotencyStore::new(db.connect(), o).is_err());
    let o = SqlIdempotencyOptions { worker: Some(String::new()), ..Default::default() };
    assert!(SqlIdempotencyStore::new(db.connect(), o).is_err());
}

#[test]
fn default_worker_is_hostname_and_pid() {
    let db = TempDb::new("worker");
    let s = SqlIdempotencyStore::new(db.connect(), SqlIdempotencyOptions::default()).unwrap();
    let w = s.worker();
    assert!(w.ends_with(&format!(":{}", std::process::id())), "{w}");
    assert!(!w.starts_with(':'), "{w}");
}

#[test]
fn batches_follow_the_one_message_rules() {
    let db = TempDb::new("batch");
    let clock = ManualClock::default();
    let (a, b) = (store(&db, "w1", &clock), store(&db, "w2", &clock));
    assert!(a.first_time("confirmed").unwrap());
    a.confirm("confirmed").unwrap();
    assert!(a.first_time("stale").unwrap());
    assert!(a.first_time("live").unwrap());
    clock.advance(Duration::from_secs(11));
    assert!(a.first_time("live").unwrap()); // a takes its own stale claim back: now live again
    let got = b.claim_batch(&["new", "confirmed", "stale", "live", "new"]).unwrap();
    assert_eq!(got, vec![true, false, true, false, false]);
    b.confirm_batch(&["new", "stale"]).unwrap();
    assert!(b.confirmed("new").unwrap() && b.confirmed("stale").unwrap());
    assert!(!b.confirmed("live").unwrap());
    assert_eq!(b.claim_batch(&[]).unwrap(), Vec::<bool>::new());
}

#[test]
fn failed_batch_rolls_back() {
    let db = TempDb::new("batchfail");
    let clock = ManualClock::default();
    let s = store(&db, "w1", &clock);
    db.connect().execute("DROP INDEX acemq_idempotency_expiry", &[]).unwrap();
    // A trigger that fails the second insert: the first must not stay.
    db.connect()
        .execute(
            "CREATE TRIGGER no_b BEFORE INSERT ON acemq_idempotency WHEN NEW.message_id = 'b' \
             BEGIN SELECT RAISE(ABORT, 'no b'); END",
            &[],
        )
        .unwrap();
    assert!(s.claim_batch(&["a", "b"]).is_err());
    assert!(rows(&db).is_empty());
    assert!(s.first_time("a").unwrap(), "the connection is usable after the rollback");
}

#[test]
fn postgres_sql_text() {
    let s = Statements::new("acemq_idempotency", Dialect::Postgres, TimeColumns::EpochMillis);
    assert_eq!(
        s.create_table,
        "CREATE TABLE IF NOT EXISTS acemq_idempotency (message_id TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL, \
         claimed_by TEXT, recorded_at BIGINT NOT NULL, expires_at BIGINT NOT NULL)"
    );
    assert_eq!(
        s.create_index.as_deref(),
        Some("CREATE INDEX IF NOT EXISTS acemq_idempotency_expiry ON acemq_idempotency (expires_at)")
    );
    assert_eq!(
        s.claim(2),
        "INSERT INTO acemq_idempotency (message_id, state, claimed_by, recorded_at, expires_at) \
         VALUES ($1, 'CLAIMED', $2, $3, $4), ($5, 'CLAIMED', $6, $7, $8) \
         ON CONFLICT (message_id) DO UPDATE SET claimed_by = excluded.claimed_by, \
         recorded_at = excluded.recorded_at, expires_at = excluded.expires_at \
         WHERE acemq_idempotency.state = 'CLAIMED' AND acemq_idempotency.recorded_at < $9 RETURNING message_id"
    );
    assert_eq!(s.confirm(1), "UPDATE acemq_idempotency SET state = 'CONFIRMED' WHERE message_id IN ($1)");
    assert_eq!(s.confirm(3), "UPDATE acemq_idempotency SET state = 'CONFIRMED' WHERE message_id IN ($1, $2, $3)");
    assert_eq!(s.forget, "DELETE FROM acemq_idempotency WHERE message_id = $1 AND state = 'CLAIMED' AND claimed_by = $2");
    assert_eq!(s.state, "SELECT state FROM acemq_idempotency WHERE message_id = $1");
    assert_eq!(s.purge, "DELETE FROM acemq_idempotency WHERE expires_at < $1");
    for sql in [&s.claim(5), &s.confirm(5), &s.forget, &s.state, &s.purge] {
        assert!(!sql.contains('?'), "{sql}");
    }
}

#[test]
fn sqlite_sql_text() {
    let s = Statements::new("t", Dialect::Sqlite, TimeColumns::EpochMillis);
    assert!(s.create_table.contains("recorded_at INTEGER NOT NULL, expires_at INTEGER NOT NULL"));
    assert_eq!(s.claim(1).matches('?').count(), 5);
    assert_eq!(s.claim(100).matches('?').count(), 401);
    assert_eq!(s.confirm(100).matches('?').count(), 100);
    assert!(!s.claim(3).contains('$'));
}

#[test]
fn mysql_sql_text() {
    let s = Statements::new("t", Dialect::Mysql, TimeColumns::EpochMillis);
    assert!(s.create_table.contains("message_id VARBINARY(255) NOT NULL PRIMARY KEY"), "{}", s.create_table);
    assert!(s.create_table.contains("INDEX t_expiry (expires_at)"), "{}", s.create_table);
    assert!(s.create_index.is_none());
    assert_eq!(
        s.claim(1),
        "INSERT INTO t (message_id, state, claimed_by, recorded_at, expires_at) VALUES (?, 'CLAIMED', ?, ?, ?) \
         ON DUPLICATE KEY UPDATE claimed_by = IF(state = 'CLAIMED' AND recorded_at < ?, VALUES(claimed_by), claimed_by), \
         expires_at = IF(state = 'CLAIMED' AND recorded_at < ?, VALUES(expires_at), expires_at), \
         recorded_at = IF(state = 'CLAIMED' AND recorded_at < ?, VALUES(recorded_at), recorded_at)"
    );
    // The largest batch stays within the 999 parameters of every dialect.
    assert_eq!(s.claim(crate::idempotency::statements::CLAIM_ROWS).matches('?').count(), 999);
    assert_eq!(s.claimed_mysql(2).matches('?').count(), 5);
    assert!(!s.claim(3).contains('$') && !s.forget.contains('$'));
}

/// A connection that says it is PostgreSQL and answers as `pg` does
/// (every column a string), recording what the store sends.
struct FakePg(std::cell::RefCell<Vec<(String, Vec<SqlValue>)>>);

impl SqlConnection for FakePg {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        self.0.borrow_mut().push((sql.into(), params.to_vec()));
        Ok(1)
    }
    fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<crate::sql::Row>> {
        self.0.borrow_mut().push((sql.into(), params.to_vec()));
        if sql.starts_with("INSERT") {
            // The claim returns the first key as this worker's.
            Ok(vec![vec![params[0].clone()]])
        } else {
            Ok(vec![vec![SqlValue::Text("CONFIRMED".into())]])
        }
    }
}

#[test]
fn postgres_dialect_binds_keys_as_text_and_times_as_integers() {
    let clock = ManualClock::new(1_000_000);
    let s = SqlIdempotencyStore::new(FakePg(Default::default()), opts("w1")).unwrap().with_clock(clock);
    assert!(s.first_time("k").unwrap(), "a key the claim returns is this worker's");
    assert!(s.confirmed("k").unwrap());
    assert_eq!(s.claim_batch(&["b", "a", "b"]).unwrap(), vec![false, true, false], "only returned keys are first");
    s.confirm_batch(&["b", "a", "b"]).unwrap();
    let calls = s.source.0.borrow();
    // One statement per call, and for a batch with keys claimed elsewhere
    // one look at who holds them (a dead worker's claim is taken over).
    assert_eq!(calls.len(), 5, "one statement per call, one look at the losers' owners: {calls:?}");
    assert!(calls[0].0.contains("$5"));
    assert_eq!(
        calls[0].1,
        vec![
            SqlValue::Text("k".into()),
            SqlValue::Text("w1".into()),
            SqlValue::Int(1_000_000),
            SqlValue::Int(1_000_000 + 3_600_000),
            SqlValue::Int(1_000_000 - 10_000),
        ]
    );
    // Distinct keys, sorted (the lock order), once each.
    assert_eq!(calls[2].1[0], SqlValue::Text("a".into()));
    assert_eq!(calls[2].1[4], SqlValue::Text("b".into()));
    assert_eq!(calls[2].1.len(), 9);
    assert!(calls[3].0.contains("claimed_by"), "{}", calls[3].0);
    assert_eq!(calls[3].1, vec![SqlValue::Text("b".into())], "only the key this worker lost");
    assert_eq!(calls[4].1, vec![SqlValue::Text("a".into()), SqlValue::Text("b".into())]);
}

#[test]
fn datetime_columns_sql_text() {
    let dt = TimeColumns::DatetimeUtc;
    let pg = Statements::new("payments.keys", Dialect::Postgres, dt);
    assert!(pg.create_table.starts_with("CREATE TABLE IF NOT EXISTS payments.keys ("), "{}", pg.create_table);
    assert!(pg.create_table.contains("recorded_at TIMESTAMP(6) NOT NULL, expires_at TIMESTAMP(6) NOT NULL"));
    // An index is named without its schema: it lives in its table's.
    assert_eq!(pg.create_index.as_deref(), Some("CREATE INDEX IF NOT EXISTS keys_expiry ON payments.keys (expires_at)"));
    assert!(pg.claim_one.is_none(), "one statement claims a batch where RETURNING answers");
    // Times are sent as text, cast there: a driver that prepares would type
    // a bare parameter as a timestamp and refuse text.
    assert_eq!(pg.purge, "DELETE FROM payments.keys WHERE expires_at < CAST(CAST($1 AS TEXT) AS TIMESTAMP)");
    assert!(pg.claim(1).contains("VALUES ($1, 'CLAIMED', $2, CAST(CAST($3 AS TEXT) AS TIMESTAMP), CAST(CAST($4 AS TEXT) AS TIMESTAMP))"), "{}", pg.claim(1));
    let lite = Statements::new("aux.keys", Dialect::Sqlite, dt);
    assert!(lite.create_table.contains("recorded_at TEXT NOT NULL"));
    assert_eq!(lite.create_index.as_deref(), Some("CREATE INDEX IF NOT EXISTS aux.keys_expiry ON keys (expires_at)"));
    let my = Statements::new("t", Dialect::Mysql, dt);
    assert!(my.create_table.contains("recorded_at DATETIME(6) NOT NULL"), "{}", my.create_table);
    let (insert, takeover) = my.claim_one.expect("MySQL with datetimes claims key by key");
    assert_eq!(
        insert,
        "INSERT IGNORE INTO t (message_id, state, claimed_by, recorded_at, expires_at) VALUES (?, 'CLAIMED', ?, ?, ?)"
    );
    assert_eq!(
        takeover,
        "UPDATE t SET claimed_by = ?, recorded_at = ?, expires_at = ? \
         WHERE message_id = ? AND state = 'CLAIMED' AND recorded_at < ?"
    );
    assert!(Statements::new("t", Dialect::Mysql, TimeColumns::EpochMillis).claim_one.is_none());
}

#[test]
fn datetime_columns_hold_utc_text_and_keep_every_rule() {
    let db = TempDb::new("datetime");
    let clock = ManualClock::default();
    let open = |w: &str| {
        let s = SqlIdempotencyStore::new(db.connect(), opts(w)).unwrap().with_time_columns(TimeColumns::DatetimeUtc);
        s.with_clock(clock.clone())
    };
    let (a, b) = (open("w1"), open("w2"));
    a.create_schema().unwrap();
    assert!(a.first_time("k").unwrap());
    assert!(!b.first_time("k").unwrap());
    let row = &rows(&db)[0];
    assert_eq!(row[3], SqlValue::Text(crate::sql::time::datetime_text(clock.now_millis())));
    assert_eq!(row[4], SqlValue::Text(crate::sql::time::datetime_text(clock.now_millis() + 3_600_000)));
    clock.advance(Duration::from_millis(10_001));
    assert!(b.first_time("k").unwrap(), "a stale claim is taken over");
    b.confirm("k").unwrap();
    clock.advance(Duration::from_secs(100));
    assert!(!a.first_time("k").unwrap(), "never a confirmed key");
    clock.advance(Duration::from_secs(3600));
    assert_eq!(a.purge_expired().unwrap(), 1);
}
