//! The SQL store: the claim is an INSERT, SQLite and PostgreSQL alike.

use super::clock::Clock;
use super::sql_rules::Keys;
#[cfg(test)]
use super::sql_rules::Statements;
use super::store::IdempotencyStore;
use crate::error::{Error, Result};
use crate::sql::blocking::{run, Blocking};
use crate::sql::ConnectionSource;
use crate::sql::{Dialect, SqlConnection};
use std::time::Duration;

/// The table name when none is given.
pub const DEFAULT_TABLE: &str = "acemq_idempotency";

/// How long a key is remembered by default. It has to be longer than the
/// longest a duplicate can take to arrive: the top rung of the retry ladder,
/// a dead-letter queue drained by hand next week, a replay. A day is a
/// starting point, not an answer.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Options for [`SqlIdempotencyStore`].
#[derive(Debug, Clone, PartialEq)]
pub struct SqlIdempotencyOptions {
    /// The table (default `acemq_idempotency`). A plain identifier: letters,
    /// digits and underscores; use the search path for a PostgreSQL schema.
    pub table: String,
    /// How long a key is remembered before [`SqlIdempotencyStore::purge_expired`]
    /// may remove it (default 24 hours).
    pub retention: Duration,
    /// How long an unfinished claim is honoured (default 300 seconds). Longer
    /// than the slowest handler, or two consumers will work on one message at
    /// once; shorter than anybody's patience, because a consumer killed
    /// mid-handler leaves its claim behind and nothing handles the message
    /// until it expires.
    pub claim_timeout: Duration,
    /// Who claims (`claimed_by`), so that `forget` removes only this worker's
    /// own claim. `None` means `hostname:pid`, read at each call so that a
    /// forked child (Puma, Unicorn) is a different worker from its parent.
    pub worker: Option<String>,
}

impl Default for SqlIdempotencyOptions {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.to_string(),
            retention: DEFAULT_RETENTION,
            claim_timeout: super::memory::DEFAULT_CLAIM_TIMEOUT,
            worker: None,
        }
    }
}

/// Idempotency keys in a SQL table, through the SQL seam ([`SqlConnection`]).
///
/// The table is the store's own (`create_schema` makes it):
///
/// | column        | SQLite  | PostgreSQL | meaning                                   |
/// |---------------|---------|------------|-------------------------------------------|
/// | `message_id`  | TEXT PK | TEXT PK    | the key                                   |
/// | `state`       | TEXT    | TEXT       | `CLAIMED` or `CONFIRMED`                  |
/// | `claimed_by`  | TEXT    | TEXT       | the worker that claimed it                |
/// | `recorded_at` | INTEGER | BIGINT     | when it was claimed, epoch milliseconds   |
/// | `expires_at`  | INTEGER | BIGINT     | when it may be purged, epoch milliseconds |
///
/// Times are integers (epoch milliseconds, from this worker's clock) rather
/// than datetime columns: an integer compares the same way in both dialects
/// and in every driver, where timestamps come back as strings from `pg`,
/// as text in SQLite and with the session's time zone in between. This is
/// not the table from the guide's ActiveRecord migration, which has datetime
/// columns: if that table exists under the same name, give this store
/// another one.
///
/// The rules, exactly the guide's:
/// - the claim is an `INSERT ... ON CONFLICT (message_id) DO NOTHING` that
///   commits on its own (never inside the handler's transaction: a claim that
///   rolls back with the work is not a claim); the row appearing is the answer
///   to "am I the first?", because a primary key is the one thing two
///   concurrent transactions cannot both win. `DO NOTHING` rather than
///   catching a unique violation, because on PostgreSQL a violation aborts
///   the caller's transaction;
/// - on conflict, a `CLAIMED` row whose claim is older than the claim timeout
///   is taken over with one conditional `UPDATE`; a `CONFIRMED` row never is;
/// - `confirm` is an idempotent `UPDATE` to `CONFIRMED`;
/// - `forget` deletes only this worker's own `CLAIMED` row;
/// - nothing on the handling path deletes: schedule
///   [`purge_expired`](Self::purge_expired) (hourly, say). A key is remembered
///   at least for the retention and until it is purged.
pub struct SqlIdempotencyStore<C = Box<dyn ConnectionSource>> {
    source: C,
    keys: Keys,
}

impl<C: ConnectionSource> SqlIdempotencyStore<C> {
    /// A store over `source`: a connection it keeps (e.g. a
    /// [`SqliteConnection`](crate::sql::SqliteConnection)) or a
    /// [`ConnectionSource`] that lends one per call.
    pub fn new(source: C, options: SqlIdempotencyOptions) -> Result<Self> {
        Ok(Self { keys: Keys::new(options)?, source })
    }

    /// Read time from `clock` (a [`ManualClock`](super::ManualClock) in tests).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.keys = self.keys.with_clock(clock);
        self
    }

    /// The options it was built with.
    pub fn options(&self) -> &SqlIdempotencyOptions {
        self.keys.options()
    }

    /// The worker id written to `claimed_by`.
    pub fn worker(&self) -> String {
        self.keys.worker()
    }

    /// The statements [`create_schema`](Self::create_schema) runs, for a
    /// migration file.
    pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        self.keys.schema_sql(dialect)
    }

    /// Create the table and its expiry index if they do not exist.
    pub fn create_schema(&self) -> Result<()> {
        self.with_conn("create the idempotency table", |c| run(self.keys.create_schema(&Blocking(c))))
    }

    /// Remove keys past their retention; how many were removed. Nothing on
    /// the handling path deletes (a delete there is contention on the one
    /// table every message touches), so schedule this; the index on
    /// `expires_at` keeps it from scanning the table.
    pub fn purge_expired(&self) -> Result<u64> {
        self.with_conn("purge expired idempotency keys", |c| run(self.keys.purge_expired(&Blocking(c))))
    }

    /// [`first_time`](IdempotencyStore::first_time) for each key, in one
    /// transaction: one commit instead of one per key, for a consumer that
    /// takes deliveries in batches. Each key follows exactly the one-message
    /// rules (insert, else take over a stale claim), in order, so a key
    /// repeated in the batch is claimed once. Opens its own transaction, so
    /// do not call it inside one on the same connection.
    pub fn claim_batch(&self, keys: &[&str]) -> Result<Vec<bool>> {
        self.with_conn("claim idempotency keys", |c| run(self.keys.claim_batch(&Blocking(c), keys)))
    }

    /// [`confirm`](IdempotencyStore::confirm) each key in one transaction.
    pub fn confirm_batch(&self, keys: &[&str]) -> Result<()> {
        self.with_conn("confirm idempotency keys", |c| run(self.keys.confirm_batch(&Blocking(c), keys)))
    }

    fn with_conn<R>(&self, doing: &str, f: impl FnOnce(&dyn SqlConnection) -> Result<R>) -> Result<R> {
        let mut f = Some(f);
        let mut out = None;
        self.source
            .with_connection(&mut |c| {
                let f = f.take().ok_or_else(|| Error::store("connection source called the store twice"))?;
                out = Some(f(c)?);
                Ok(())
            })
            .map_err(|e| self.keys.failed(doing, e))?;
        out.ok_or_else(|| Error::store(format!("cannot {doing}: the connection source never lent a connection")))
    }
}

impl<C: ConnectionSource> IdempotencyStore for SqlIdempotencyStore<C> {
    fn claim_timeout(&self) -> Option<Duration> {
        Some(self.options().claim_timeout)
    }

    /// The INSERT (and any takeover) commits on its own only if the
    /// connection is not inside a transaction: give the store a connection
    /// outside the handler's transaction, or the claim rolls back with the work.
    fn first_time(&self, key: &str) -> Result<bool> {
        self.with_conn("claim an idempotency key", |c| run(self.keys.first_time(&Blocking(c), key)))
    }

    fn confirm(&self, key: &str) -> Result<()> {
        self.with_conn("confirm an idempotency key", |c| run(self.keys.confirm(&Blocking(c), key)))
    }

    fn forget(&self, key: &str) -> Result<()> {
        self.with_conn("forget an idempotency key", |c| run(self.keys.forget(&Blocking(c), key)))
    }

    fn confirmed(&self, key: &str) -> Result<bool> {
        self.with_conn("read an idempotency key", |c| run(self.keys.confirmed(&Blocking(c), key)))
    }

    /// One transaction for the whole batch: [`claim_batch`](Self::claim_batch).
    fn first_time_many(&self, keys: &[&str]) -> Result<Vec<bool>> {
        self.claim_batch(keys)
    }

    /// One transaction for the whole batch: [`confirm_batch`](Self::confirm_batch).
    fn confirm_many(&self, keys: &[&str]) -> Result<()> {
        self.confirm_batch(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::tests::TempDb;
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
        for table in ["", "a b", "x;DROP TABLE y", "1abc", "public.t"] {
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
        let s = Statements::new("acemq_idempotency", Dialect::Postgres);
        assert_eq!(
            s.create_table,
            "CREATE TABLE IF NOT EXISTS acemq_idempotency (message_id TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL, \
             claimed_by TEXT, recorded_at BIGINT NOT NULL, expires_at BIGINT NOT NULL)"
        );
        assert_eq!(s.create_index, "CREATE INDEX IF NOT EXISTS acemq_idempotency_expiry ON acemq_idempotency (expires_at)");
        assert_eq!(
            s.claim,
            "INSERT INTO acemq_idempotency (message_id, state, claimed_by, recorded_at, expires_at) \
             VALUES ($1, 'CLAIMED', $2, $3, $4) ON CONFLICT (message_id) DO NOTHING"
        );
        assert_eq!(
            s.take_over,
            "UPDATE acemq_idempotency SET claimed_by = $1, recorded_at = $2, expires_at = $3 \
             WHERE message_id = $4 AND state = 'CLAIMED' AND recorded_at < $5"
        );
        assert_eq!(s.confirm, "UPDATE acemq_idempotency SET state = 'CONFIRMED' WHERE message_id = $1");
        assert_eq!(
            s.forget,
            "DELETE FROM acemq_idempotency WHERE message_id = $1 AND state = 'CLAIMED' AND claimed_by = $2"
        );
        assert_eq!(s.state, "SELECT state FROM acemq_idempotency WHERE message_id = $1");
        assert_eq!(s.purge, "DELETE FROM acemq_idempotency WHERE expires_at < $1");
        for sql in [&s.claim, &s.take_over, &s.confirm, &s.forget, &s.state, &s.purge] {
            assert!(!sql.contains('?'), "{sql}");
        }
    }

    #[test]
    fn sqlite_sql_text() {
        let s = Statements::new("t", Dialect::Sqlite);
        assert!(s.create_table.contains("recorded_at INTEGER NOT NULL, expires_at INTEGER NOT NULL"));
        assert_eq!(s.claim.matches('?').count(), 4);
        assert_eq!(s.take_over.matches('?').count(), 5);
        assert!(!s.claim.contains('$'));
    }

    /// A connection that says it is PostgreSQL and answers as `pg` does
    /// (every column a string), checking the store sends what PostgreSQL expects.
    struct FakePg(std::cell::RefCell<Vec<(String, Vec<SqlValue>)>>);

    impl SqlConnection for FakePg {
        fn dialect(&self) -> Dialect {
            Dialect::Postgres
        }
        fn execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64> {
            self.0.borrow_mut().push((sql.into(), params.to_vec()));
            // The INSERT conflicts; the takeover wins.
            Ok(if sql.starts_with("INSERT") { 0 } else { 1 })
        }
        fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<crate::sql::Row>> {
            self.0.borrow_mut().push((sql.into(), params.to_vec()));
            Ok(vec![vec![SqlValue::Text("CONFIRMED".into())]])
        }
    }

    #[test]
    fn postgres_dialect_binds_keys_as_text_and_times_as_integers() {
        let clock = ManualClock::new(1_000_000);
        let s = SqlIdempotencyStore::new(FakePg(Default::default()), opts("w1")).unwrap().with_clock(clock);
        assert!(s.first_time("k").unwrap(), "a conflicting insert followed by a takeover is a claim");
        assert!(s.confirmed("k").unwrap());
        let calls = s.source.0.borrow();
        assert!(calls[0].0.contains("$4") && calls[1].0.contains("$5"));
        assert_eq!(
            calls[0].1,
            vec![
                SqlValue::Text("k".into()),
                SqlValue::Text("w1".into()),
                SqlValue::Int(1_000_000),
                SqlValue::Int(1_000_000 + 3_600_000)
            ]
        );
        assert_eq!(calls[1].1[4], SqlValue::Int(1_000_000 - 10_000));
    }
}
