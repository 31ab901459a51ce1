//! SqlOutboxStore against real SQLite files.

use super::support::{add_committed, record, scalar, Borrowed, TempDb};
use crate::sql::{ConnectionSource, PerCall};
use crate::outbox::{default_worker_id, Completion, OutboxStoreOptions, SqlOutboxStore};
use crate::sql::{SqlConnection, SqlValue, SqliteConnection};
use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[test]
fn add_in_a_rolled_back_transaction_leaves_no_row() {
    let db = TempDb::new("rollback");
    let store = db.store("w1");
    let mut app = rusqlite::Connection::open(db.path()).unwrap();
    app.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)").unwrap();

    let tx = app.transaction().unwrap();
    tx.execute("INSERT INTO orders (total) VALUES (42)", []).unwrap();
    store.add(&record("orders-events", "order.placed", 1), &Borrowed(&tx)).unwrap();
    tx.rollback().unwrap();

    assert_eq!(store.backlog().unwrap().count, 0);
    assert!(store.claim(10).unwrap().is_empty());
}

#[test]
fn add_in_a_committed_transaction_keeps_the_row_with_its_envelope() {
    let db = TempDb::new("commit");
    let store = db.store("w1");
    let mut app = rusqlite::Connection::open(db.path()).unwrap();
    let original = record("orders-events", "order.placed", 1);

    let tx = app.transaction().unwrap();
    let id = store.add(&original, &Borrowed(&tx)).unwrap();
    tx.commit().unwrap();

    let claimed = store.claim(10).unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0], crate::outbox::OutboxRecord { id: Some(id), ..original });
}

#[test]
fn add_neither_commits_nor_ends_the_callers_transaction() {
    let db = TempDb::new("no-commit");
    let store = db.store("w1");
    let app = db.connect();

    app.execute("BEGIN", &[]).unwrap();
    store.add(&record("orders-events", "order.placed", 1), &app).unwrap();
    // Not visible to the store's own connection until the caller commits...
    assert_eq!(store.backlog().unwrap().count, 0);
    // ...and the caller's transaction is still open: COMMIT succeeds.
    app.execute("COMMIT", &[]).unwrap();
    assert_eq!(store.backlog().unwrap().count, 1);
}

#[test]
fn create_schema_can_run_twice() {
    let db = TempDb::new("schema");
    let store = db.store("w1");
    store.create_schema().unwrap();
    let index = scalar(
        store.source(),
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'acemq_outbox_due'",
        &[],
    );
    assert_eq!(index, SqlValue::Int(1));
}

#[test]
fn a_table_name_that_is_not_an_identifier_is_refused() {
    let db = TempDb::new("bad-table");
    let options = OutboxStoreOptions { table: "outbox; DROP TABLE users".into(), ..OutboxStoreOptions::default() };
    let error = SqlOutboxStore::new(db.connect(), options).unwrap_err();
    assert!(error.message().contains("plain identifier"), "{error}");
}

#[test]
fn claim_returns_due_rows_oldest_first_and_leases_them() {
    let db = TempDb::new("claim-order");
    let store = db.store("w1");
    let app = db.connect();
    let ids: Vec<i64> = (0..5).map(|n| add_committed(&store, &app, &record("ex", "rk", n))).collect();

    let first = store.claim(3).unwrap();
    assert_eq!(first.iter().map(|r| r.id.unwrap()).collect::<Vec<_>>(), ids[..3]);
    let second = store.claim(10).unwrap();
    assert_eq!(second.iter().map(|r| r.id.unwrap()).collect::<Vec<_>>(), ids[3..]);
    // Everything is leased now.
    assert!(store.claim(10).unwrap().is_empty());
    let owner = scalar(&app, "SELECT claimed_by FROM acemq_outbox WHERE id = ?", &[SqlValue::Int(ids[0])]);
    assert_eq!(owner, SqlValue::Text("w1".into()));
}

#[test]
fn complete_deletes_confirmed_rows() {
    let db = TempDb::new("complete");
    let store = db.store("w1");
    let app = db.connect();
    for n in 0..3 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let claimed = store.claim(10).unwrap();
    let completions: Vec<Completion> = claimed.iter().map(Completion::confirmed).collect();
    assert_eq!(store.complete(&completions).unwrap(), 3);
    assert_eq!(store.backlog().unwrap().count, 0);
}

#[test]
fn a_failure_counts_the_attempt_keeps_the_error_backs_off_and_releases_the_lease() {
    let db = TempDb::new("failure");
    let store = db.store_with(OutboxStoreOptions {
        worker_id: Some("w1".into()),
        base_backoff: Duration::from_secs(10),
        ..OutboxStoreOptions::default()
    });
    let app = db.connect();
    let id = add_committed(&store, &app, &record("missing", "rk", 1));

    let claimed = store.claim(10).unwrap();
    store.complete(&[Completion::failed(&claimed[0], "no exchange 'missing'")]).unwrap();

    let row = app
        .query(
            "SELECT attempts, last_error, next_attempt_at - CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), \
             claimed_by, claimed_until FROM acemq_outbox WHERE id = ?",
            &[SqlValue::Int(id)],
        )
        .unwrap()
        .remove(0);
    assert_eq!(row[0], SqlValue::Int(1));
    assert_eq!(row[1], SqlValue::Text("no exchange 'missing'".into()));
    let SqlValue::Int(wait) = row[2] else { panic!("{row:?}") };
    assert!((9_000..=10_000).contains(&wait), "backoff {wait} ms");
    assert_eq!((&row[3], &row[4]), (&SqlValue::Null, &SqlValue::Null));
    // Waiting out its backoff: not claimable yet.
    assert!(store.claim(10).unwrap().is_empty());

    // Due again: the second failure doubles the wait.
    app.execute("UPDATE acemq_outbox SET next_attempt_at = 0", &[]).unwrap();
    let claimed = store.claim(10).unwrap();
    store.complete(&[Completion::failed(&claimed[0], "still missing")]).unwrap();
    let wait = scalar(
        &app,
        "SELECT next_attempt_at - CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) FROM acemq_outbox",
        &[],
    );
    let SqlValue::Int(wait) = wait else { panic!() };
    assert!((19_000..=20_000).contains(&wait), "backoff {wait} ms");
}

#[test]
fn backoff_doubles_and_is_capped() {
    let options = OutboxStoreOptions {
        base_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(60),
        ..OutboxStoreOptions::default()
    };
    let waits: Vec<u64> = (1..=8).map(|n| options.backoff(n).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(options.backoff(u32::MAX), Duration::from_secs(60));
}

#[test]
fn a_failed_row_does_not_block_rows_behind_it() {
    let db = TempDb::new("no-block");
    let store = db.store("w1");
    let app = db.connect();
    let stuck = add_committed(&store, &app, &record("missing", "rk", 1));
    let behind = add_committed(&store, &app, &record("ok", "rk", 2));

    let first = store.claim(1).unwrap();
    assert_eq!(first[0].id, Some(stuck));
    store.complete(&[Completion::failed(&first[0], "404")]).unwrap();

    let next = store.claim(1).unwrap();
    assert_eq!(next[0].id, Some(behind));
}

#[test]
fn several_stores_claiming_from_several_threads_never_share_a_row() {
    let db = TempDb::new("concurrent");
    let seed = db.store("seed");
    let app = db.connect();
    const ROWS: usize = 300;
    app.execute("BEGIN", &[]).unwrap();
    for n in 0..ROWS {
        seed.add(&record("ex", "rk", n), &app).unwrap();
    }
    app.execute("COMMIT", &[]).unwrap();

    const RELAYS: usize = 4;
    let barrier = Arc::new(Barrier::new(RELAYS));
    let threads: Vec<_> = (0..RELAYS)
        .map(|i| {
            let path = db.path().to_owned();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let options = OutboxStoreOptions { worker_id: Some(format!("relay-{i}")), ..Default::default() };
                let store = SqlOutboxStore::new(SqliteConnection::open(&path).unwrap(), options).unwrap();
                barrier.wait();
                let mut mine = Vec::new();
                loop {
                    let batch = store.claim(7).unwrap();
                    if batch.is_empty() {
                        return mine;
                    }
                    mine.extend(batch.iter().map(|r| r.id.unwrap()));
                    // A publish takes time; without it one thread can take
                    // every batch before the others wake from SQLite's busy wait.
                    std::thread::sleep(Duration::from_millis(3));
                    // Half the batches are confirmed, half left leased, so
                    // claims run against both deleted and leased rows.
                    if mine.len() % 2 == 0 {
                        store.complete(&batch.iter().map(Completion::confirmed).collect::<Vec<_>>()).unwrap();
                    }
                }
            })
        })
        .collect();
    let claims: Vec<Vec<i64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    let all: Vec<i64> = claims.iter().flatten().copied().collect();
    let distinct: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), distinct.len(), "a row was claimed twice");
    assert_eq!(distinct.len(), ROWS, "every row was claimed once");
    assert!(claims.iter().filter(|c| !c.is_empty()).count() > 1, "more than one relay took part");
}

#[test]
fn a_crashed_relays_rows_are_claimed_again_once_its_lease_runs_out() {
    let db = TempDb::new("lease");
    let short = |worker: &str| OutboxStoreOptions {
        worker_id: Some(worker.into()),
        lease: Duration::from_millis(300),
        ..OutboxStoreOptions::default()
    };
    let crashed = db.store_with(short("crashed"));
    let survivor = db.store_with(short("survivor"));
    let app = db.connect();
    add_committed(&crashed, &app, &record("ex", "rk", 1));

    let lost = crashed.claim(10).unwrap();
    assert_eq!(lost.len(), 1);
    assert!(survivor.claim(10).unwrap().is_empty(), "the lease keeps others off");

    std::thread::sleep(Duration::from_millis(400));
    let retaken = survivor.claim(10).unwrap();
    assert_eq!(retaken.iter().map(|r| r.id).collect::<Vec<_>>(), [lost[0].id]);

    // The first relay comes back late: the row is no longer its to settle,
    // neither to delete nor to fail.
    assert_eq!(crashed.complete(&[Completion::confirmed(&lost[0])]).unwrap(), 0);
    crashed.complete(&[Completion::failed(&lost[0], "late")]).unwrap();
    assert_eq!(scalar(&app, "SELECT attempts FROM acemq_outbox", &[]), SqlValue::Int(0));
    assert_eq!(survivor.complete(&[Completion::confirmed(&retaken[0])]).unwrap(), 1);
}

#[test]
fn backlog_counts_rows_their_age_and_the_stuck_ones() {
    let db = TempDb::new("backlog");
    let store = db.store("w1");
    let app = db.connect();
    assert_eq!(store.backlog().unwrap(), crate::outbox::Backlog { count: 0, oldest_age: None, stuck: 0 });

    add_committed(&store, &app, &record("missing", "order.placed", 1));
    for n in 2..5 {
        add_committed(&store, &app, &record("ok", "rk", n));
    }
    // Make the first row an hour old.
    app.execute("UPDATE acemq_outbox SET created_at = created_at - 3600000 WHERE message_id = 'msg-1'", &[]).unwrap();
    let claimed = store.claim(1).unwrap();
    store.complete(&[Completion::failed(&claimed[0], "no exchange 'missing'")]).unwrap();

    let backlog = store.backlog().unwrap();
    assert_eq!(backlog.count, 4);
    assert_eq!(backlog.stuck, 1);
    let age = backlog.oldest_age.unwrap();
    assert!(age >= Duration::from_secs(3600) && age < Duration::from_secs(3660), "{age:?}");

    let stuck = store.stuck(10).unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!((stuck[0].exchange.as_str(), stuck[0].routing_key.as_str()), ("missing", "order.placed"));
    assert_eq!(stuck[0].message_id, "msg-1");
    assert_eq!(stuck[0].attempts, 1);
    assert_eq!(stuck[0].last_error.as_deref(), Some("no exchange 'missing'"));
}

#[test]
fn a_row_that_cannot_be_read_is_failed_instead_of_stopping_the_sweep() {
    let db = TempDb::new("unreadable");
    let store = db.store("w1");
    let app = db.connect();
    let broken = add_committed(&store, &app, &record("ex", "rk", 1));
    let fine = add_committed(&store, &app, &record("ex", "rk", 2));
    app.execute("UPDATE acemq_outbox SET headers = 'not json' WHERE id = ?", &[SqlValue::Int(broken)]).unwrap();

    let claimed = store.claim(10).unwrap();
    assert_eq!(claimed.iter().map(|r| r.id).collect::<Vec<_>>(), [Some(fine)]);
    let stuck = store.stuck(10).unwrap();
    assert_eq!(stuck[0].id, broken);
    assert!(stuck[0].last_error.as_deref().unwrap().contains("headers are not a JSON object"), "{stuck:?}");
}

#[test]
fn a_store_can_borrow_a_connection_per_call() {
    let db = TempDb::new("per-call");
    let path = db.path().to_owned();
    let source = PerCall(move || SqliteConnection::open(&path));
    let store = SqlOutboxStore::new(source, OutboxStoreOptions::default()).unwrap();
    store.create_schema().unwrap();
    let app = db.connect();
    app.execute("BEGIN", &[]).unwrap();
    store.add(&record("ex", "rk", 1), &app).unwrap();
    app.execute("COMMIT", &[]).unwrap();

    // Claim and complete each run their transaction on one lent connection.
    let claimed = store.claim(10).unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(store.complete(&[Completion::confirmed(&claimed[0])]).unwrap(), 1);
}

#[test]
fn a_boxed_connection_that_is_not_send_works_for_the_three_steps() {
    let db = TempDb::new("boxed");
    let conn: Box<dyn SqlConnection> = Box::new(db.connect());
    // The default store type, as the Ruby extension builds it.
    let source: Box<dyn ConnectionSource> = Box::new(conn);
    let store: SqlOutboxStore = SqlOutboxStore::new(source, OutboxStoreOptions::default()).unwrap();
    store.create_schema().unwrap();
    let app = db.connect();
    store.add(&record("ex", "rk", 1), &app).unwrap();
    let claimed = store.claim(10).unwrap();
    assert_eq!(store.complete(&[Completion::confirmed(&claimed[0])]).unwrap(), 1);
}

#[test]
fn the_default_worker_id_is_hostname_and_pid() {
    let id = default_worker_id();
    let (host, pid) = id.rsplit_once(':').unwrap();
    assert!(!host.is_empty());
    assert_eq!(pid, std::process::id().to_string());
    let db = TempDb::new("worker");
    let store = SqlOutboxStore::new(db.connect(), OutboxStoreOptions::default()).unwrap();
    assert_eq!(store.worker_id(), id);
}

#[test]
fn delete_then_claim_deletes_only_our_held_rows_and_claims_the_next_ones() {
    let db = TempDb::new("held");
    let store = db.store("w1");
    let other = db.store("w2");
    let app = db.connect();
    for n in 0..4 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let first: Vec<i64> = store.claim(2).unwrap().iter().filter_map(|r| r.id).collect();
    let theirs: Vec<i64> = other.claim(1).unwrap().iter().filter_map(|r| r.id).collect();
    // Our two held back, and one of w2's passed in by mistake: not ours, not deleted.
    let mut done = first.clone();
    done.extend(&theirs);
    let next = store.delete_then_claim(&done, 10).unwrap();
    assert_eq!(next.len(), 1, "the one row nobody holds");
    assert!(next.iter().all(|r| !first.contains(&r.id.unwrap()) && !theirs.contains(&r.id.unwrap())));
    assert_eq!(store.backlog().unwrap().count, 2, "our two held rows deleted, w2's and the new claim kept");
    assert_eq!(store.delete_confirmed(&[next[0].id.unwrap()]).unwrap(), 1);
    assert_eq!(store.delete_confirmed(&[]).unwrap(), 0);
}

/// A connection that fails the statements starting with `verb` with the
/// words MariaDB uses for a deadlock, `conflicts` times, then runs them:
/// what a relay sees when the database picks its transaction as the
/// victim of a lock conflict with another relay's.
struct Conflicting {
    inner: SqliteConnection,
    verb: &'static str,
    error: &'static str,
    counts: Arc<Counts>,
}

/// How many more statements fail, and how many ran (failed or not).
#[derive(Default)]
struct Counts {
    conflicts: std::sync::atomic::AtomicUsize,
    runs: std::sync::atomic::AtomicUsize,
}

impl Counts {
    fn runs(&self) -> usize {
        self.runs.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Conflicting {
    const DEADLOCK: &'static str =
        "the SQL connection's execute raised Mysql2::Error: Deadlock found when trying to get lock; try restarting transaction";

    fn store(db: &TempDb, verb: &'static str, conflicts: usize, error: &'static str) -> (SqlOutboxStore<Conflicting>, Arc<Counts>) {
        let counts = Arc::new(Counts { conflicts: conflicts.into(), ..Counts::default() });
        let conn = Conflicting { inner: db.connect(), verb, error, counts: counts.clone() };
        let options = OutboxStoreOptions { worker_id: Some("w1".into()), ..OutboxStoreOptions::default() };
        let store = SqlOutboxStore::new(conn, options).unwrap();
        store.create_schema().unwrap();
        (store, counts)
    }

    fn check(&self, sql: &str) -> crate::error::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if !sql.trim_start().starts_with(self.verb) {
            return Ok(());
        }
        self.counts.runs.fetch_add(1, SeqCst);
        if self.counts.conflicts.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(crate::error::Error::store(self.error));
        }
        Ok(())
    }
}

impl SqlConnection for Conflicting {
    fn dialect(&self) -> crate::sql::Dialect {
        self.inner.dialect()
    }
    fn execute(&self, sql: &str, params: &[SqlValue]) -> crate::error::Result<u64> {
        self.check(sql)?;
        self.inner.execute(sql, params)
    }
    fn query(&self, sql: &str, params: &[SqlValue]) -> crate::error::Result<Vec<crate::sql::Row>> {
        self.check(sql)?;
        self.inner.query(sql, params)
    }
}

#[test]
fn a_claim_the_database_rolls_back_for_a_deadlock_runs_again() {
    let db = TempDb::new("conflict-claim");
    let (store, counts) = Conflicting::store(&db, "UPDATE", 2, Conflicting::DEADLOCK);
    let app = db.connect();
    let ids: Vec<i64> = (0..3).map(|n| add_committed(&store, &app, &record("ex", "rk", n))).collect();

    let claimed = store.claim(10).unwrap();
    assert_eq!(claimed.iter().map(|r| r.id.unwrap()).collect::<Vec<_>>(), ids);
    assert_eq!(counts.runs(), 3, "two rolled back, the third ran");
}

#[test]
fn a_delete_and_claim_rolled_back_for_a_deadlock_runs_again_as_one_transaction() {
    let db = TempDb::new("conflict-delete-claim");
    let (store, counts) = Conflicting::store(&db, "DELETE", 1, Conflicting::DEADLOCK);
    let app = db.connect();
    for n in 0..4 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let first = store.claim(2).unwrap();
    let done: Vec<i64> = first.iter().map(|r| r.id.unwrap()).collect();

    let next = store.delete_then_claim(&done, 10).unwrap();
    assert_eq!(next.len(), 2, "the other two rows, claimed in the transaction that ran again");
    assert_eq!(store.backlog().unwrap().count, 2, "the two confirmed rows deleted once");
    assert_eq!(counts.runs(), 2);
}

#[test]
fn a_completion_with_failures_rolled_back_for_a_lock_wait_timeout_runs_again() {
    let db = TempDb::new("conflict-complete");
    let (store, counts) = Conflicting::store(&db, "DELETE", 1, "ERROR 1205 (HY000): Lock wait timeout exceeded; try restarting transaction");
    let app = db.connect();
    for n in 0..2 {
        add_committed(&store, &app, &record("ex", "rk", n));
    }
    let claimed = store.claim(10).unwrap();
    let completions = [Completion::confirmed(&claimed[0]), Completion::failed(&claimed[1], "nacked")];
    assert_eq!(store.complete(&completions).unwrap(), 1);
    let attempts = scalar(&app, "SELECT attempts FROM acemq_outbox WHERE id = ?", &[SqlValue::Int(claimed[1].id.unwrap())]);
    assert_eq!(attempts, SqlValue::Int(1), "the failure recorded once, by the transaction that committed");
    assert_eq!(counts.runs(), 2);
}

#[test]
fn a_step_that_keeps_deadlocking_gives_up_with_the_databases_words_and_the_store_works_after() {
    let db = TempDb::new("conflict-give-up");
    let (store, counts) = Conflicting::store(&db, "UPDATE", 100, Conflicting::DEADLOCK);
    let app = db.connect();
    add_committed(&store, &app, &record("ex", "rk", 1));

    let err = store.claim(10).unwrap_err();
    assert!(err.to_string().contains("Deadlock found"), "{err}");
    assert_eq!(counts.runs(), 5);
    counts.conflicts.store(0, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(store.claim(10).unwrap().len(), 1);
}

#[test]
fn any_other_error_is_not_run_again() {
    let db = TempDb::new("conflict-other");
    let (store, counts) = Conflicting::store(&db, "UPDATE", 1, "ERROR 1146 (42S02): Table 'test.acemq_outbox' doesn't exist");
    let app = db.connect();
    add_committed(&store, &app, &record("ex", "rk", 1));
    assert!(store.claim(10).is_err());
    assert_eq!(counts.runs(), 1);
}
