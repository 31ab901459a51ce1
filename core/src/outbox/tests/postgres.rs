//! The PostgreSQL SQL as the Ruby side sends it, checked without a server:
//! the blocking store runs against a connection that records every statement
//! and answers as `PG::Connection` does without a type map (every column as
//! text). That is what a real server cannot show: the exact statement text
//! and parameters, and that text-typed answers are read, as the pg gem gives
//! them (tokio-postgres answers typed). A real server runs the same rules in
//! core/tests/sql_stores.rs (through tokio-postgres, when `DATABASE_URL` is
//! set and the `postgres` feature is on) and in the Ruby integration specs
//! (through the pg gem).

use super::support::record;
use crate::error::Result;
use crate::sql::ConnectionSource;
use crate::outbox::{Completion, OutboxStoreOptions, SqlOutboxStore};
use crate::sql::{Dialect, Row, SqlConnection, SqlValue};
use std::cell::RefCell;

#[derive(Default)]
struct Recording {
    log: RefCell<Vec<(String, Vec<SqlValue>)>>,
}

fn t(s: &str) -> SqlValue {
    SqlValue::Text(s.to_owned())
}

impl SqlConnection for Recording {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        self.log.borrow_mut().push((sql.to_owned(), params.to_vec()));
        Ok(1)
    }

    fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        self.log.borrow_mut().push((sql.to_owned(), params.to_vec()));
        let rows = if sql.contains("INSERT INTO") {
            vec![vec![t("7")]]
        } else if sql.starts_with("UPDATE acemq_outbox SET claimed_by") || sql.starts_with("WITH done AS") {
            vec![vec![
                t("7"),
                t("orders-events"),
                t("order.placed"),
                t(r#"{"n":1}"#),
                t("msg-1"),
                t("order.placed.v2"),
                SqlValue::Null,
                t("1700000000"),
                t(r#"{"tenant":"acme"}"#),
                t("0"),
            ]]
        } else if sql.starts_with("SELECT id, attempts") {
            vec![vec![t("8"), t("2")]]
        } else if sql.starts_with("SELECT COUNT(*)") {
            vec![vec![t("3"), t("1000"), t("1"), t("61000")]]
        } else if sql.starts_with("SELECT id, exchange, routing_key, message_id") {
            vec![vec![t("8"), t("missing"), t("rk"), t("msg-8"), t("3"), t("404"), t("5000"), t("1000")]]
        } else {
            Vec::new()
        };
        Ok(rows)
    }
}

/// `$1`..`$n`, each once and in order, as many as there are parameters, and
/// no `?` left over.
fn assert_numbered(sql: &str, params: usize) {
    assert!(!sql.contains('?'), "unnumbered placeholder in {sql}");
    let mut seen = Vec::new();
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let digits: String = sql[i + 1..].chars().take_while(|c| c.is_ascii_digit()).collect();
            assert!(!digits.is_empty(), "bare $ in {sql}");
            seen.push(digits.parse::<usize>().unwrap());
            i += digits.len();
        }
        i += 1;
    }
    assert_eq!(seen, (1..=params).collect::<Vec<_>>(), "placeholders of {sql}");
}

fn store() -> SqlOutboxStore<Recording> {
    SqlOutboxStore::new(Recording::default(), OutboxStoreOptions { worker_id: Some("w1".into()), ..Default::default() })
        .unwrap()
}

fn log(store: &SqlOutboxStore<Recording>) -> Vec<(String, Vec<SqlValue>)> {
    store.source().log.borrow_mut().drain(..).collect()
}

#[test]
fn postgres_schema_uses_bigserial_and_bigint_epoch_millis() {
    let store = store();
    store.create_schema().unwrap();
    let statements = log(&store);
    assert_eq!(statements.len(), 2, "one statement per call");
    let table = &statements[0].0;
    assert!(table.starts_with("CREATE TABLE IF NOT EXISTS acemq_outbox ("), "{table}");
    assert!(table.contains("id BIGSERIAL PRIMARY KEY"), "{table}");
    for column in ["created_at BIGINT NOT NULL", "next_attempt_at BIGINT NOT NULL", "claimed_until BIGINT", "\"timestamp\" BIGINT"] {
        assert!(table.contains(column), "{column} in {table}");
    }
    assert!(!table.contains("AUTOINCREMENT"));
    assert_eq!(statements[1].0, "CREATE INDEX IF NOT EXISTS acemq_outbox_due ON acemq_outbox (next_attempt_at, id)");
    assert!(store.schema_sql(Dialect::Sqlite)[0].contains("id INTEGER PRIMARY KEY AUTOINCREMENT"));
}

#[test]
fn postgres_add_returns_the_id_and_runs_nothing_else() {
    let store = store();
    let caller = Recording::default();
    assert_eq!(store.add(&record("orders-events", "order.placed", 1), &caller).unwrap(), 7);
    let statements = caller.log.take();
    assert_eq!(statements.len(), 1, "no BEGIN, no COMMIT: {statements:?}");
    let (sql, params) = &statements[0];
    assert!(sql.starts_with("WITH added AS (INSERT INTO acemq_outbox ") && sql.contains(" RETURNING id) "), "{sql}");
    // The notify that wakes listening relays at commit, in the same statement.
    assert!(sql.ends_with("SELECT id, CAST(pg_notify('acemq_outbox', '') AS TEXT) FROM added"), "{sql}");
    assert_numbered(sql, params.len());
    assert_eq!(params.len(), 8);
    assert!(log(&store).is_empty(), "the store's own connection is not used by add");
}

#[test]
fn postgres_claim_is_one_statement_that_locks_with_skip_locked() {
    let store = store();
    let claimed = store.claim(10).unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, Some(7));
    assert_eq!(claimed[0].envelope.timestamp, Some(1_700_000_000));
    assert_eq!(claimed[0].envelope.headers["tenant"], "acme");

    let statements = log(&store);
    assert_eq!(statements.len(), 1, "no BEGIN, no COMMIT, one statement: {statements:?}");
    let (claim, params) = &statements[0];
    assert!(claim.starts_with("UPDATE acemq_outbox SET claimed_by = $1, claimed_until = "), "{claim}");
    assert!(
        claim.contains("ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) due WHERE id = due_id AND set_config('synchronous_commit', 'off', true) IS NOT NULL RETURNING id, "),
        "{claim}"
    );
    assert!(claim.contains("next_attempt_at <= CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT)"), "{claim}");
    assert!(claim.contains("(claimed_until IS NULL OR claimed_until < "), "{claim}");
    assert_eq!(*params, [t("w1"), SqlValue::Int(60_000), SqlValue::Int(10)]);
    assert_numbered(claim, params.len());
}

#[test]
fn postgres_complete_of_confirmed_rows_is_one_delete() {
    let store = store();
    let mut a = record("ex", "rk", 7);
    a.id = Some(7);
    let mut b = record("ex", "rk", 9);
    b.id = Some(9);
    store.complete(&[Completion::confirmed(&a), Completion::confirmed(&b)]).unwrap();
    let statements = log(&store);
    assert_eq!(statements.len(), 1, "no BEGIN, no COMMIT: {statements:?}");
    assert_eq!(
        statements[0].0,
        "DELETE FROM acemq_outbox WHERE claimed_by = $1 AND id IN ($2, $3) AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
    );
    assert_eq!(statements[0].1, [t("w1"), SqlValue::Int(7), SqlValue::Int(9)]);
}

#[test]
fn postgres_complete_deletes_and_fails_only_its_own_rows() {
    let store = store();
    let mut failed = record("missing", "rk", 8);
    failed.id = Some(8);
    let mut confirmed = record("ex", "rk", 7);
    confirmed.id = Some(7);
    store.complete(&[Completion::confirmed(&confirmed), Completion::failed(&failed, "404")]).unwrap();

    let statements = log(&store);
    let sqls: Vec<&str> = statements.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(sqls.len(), 5, "{sqls:?}");
    assert_eq!(sqls[0], "BEGIN");
    assert!(sqls[1].starts_with("DELETE FROM acemq_outbox WHERE claimed_by = $1 AND id IN ($2)"), "{}", sqls[1]);
    assert_eq!(sqls[2], "SELECT id, attempts FROM acemq_outbox WHERE claimed_by = $1 AND id IN ($2)");
    assert!(sqls[3].starts_with("UPDATE acemq_outbox SET attempts = $1, last_error = $2, next_attempt_at = "), "{}", sqls[3]);
    assert!(sqls[3].ends_with("claimed_by = NULL, claimed_until = NULL WHERE id = $4 AND claimed_by = $5"), "{}", sqls[3]);
    // Third failure: 4 × the 1 s base.
    assert_eq!(statements[3].1, [SqlValue::Int(3), t("404"), SqlValue::Int(4000), SqlValue::Int(8), t("w1")]);
    assert_eq!(sqls[4], "COMMIT");
    for (sql, params) in &statements {
        assert_numbered(sql, params.len());
    }
}

#[test]
fn postgres_backlog_and_stuck_read_text_columns() {
    let store = store();
    let backlog = store.backlog().unwrap();
    assert_eq!((backlog.count, backlog.stuck), (3, 1));
    assert_eq!(backlog.oldest_age, Some(std::time::Duration::from_secs(60)));
    let stuck = store.stuck(5).unwrap();
    assert_eq!((stuck[0].id, stuck[0].attempts, stuck[0].last_error.as_deref()), (8, 3, Some("404")));
    for (sql, params) in log(&store) {
        assert_numbered(&sql, params.len());
    }
}

#[test]
fn sqlite_claim_is_one_update_returning_with_question_marks() {
    struct Sqlite(Recording);
    impl SqlConnection for Sqlite {
        fn dialect(&self) -> Dialect {
            Dialect::Sqlite
        }
        fn execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64> {
            self.0.execute(sql, params)
        }
        fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
            self.0.query(sql, params)
        }
    }
    let store = SqlOutboxStore::new(Sqlite(Recording::default()), OutboxStoreOptions::default()).unwrap();
    store.claim(10).unwrap();
    let statements = store.source().0.log.take();
    assert_eq!(statements.len(), 1, "{statements:?}");
    let claim = &statements[0].0;
    assert!(claim.starts_with("UPDATE acemq_outbox SET claimed_by = ?1, claimed_until = "), "{claim}");
    assert!(claim.contains("ORDER BY id LIMIT ?3) RETURNING id, "), "{claim}");
    assert!(!claim.contains('$'));
    // A completion with a failure is still one transaction, BEGIN IMMEDIATE.
    let mut failed = record("missing", "rk", 8);
    failed.id = Some(8);
    store.complete(&[Completion::failed(&failed, "404")]).unwrap();
    let statements = store.source().0.log.take();
    assert_eq!(statements[0].0, "BEGIN IMMEDIATE");
    assert_eq!(statements.last().unwrap().0, "COMMIT");
}

#[test]
fn a_boxed_source_is_the_default_store_type() {
    let source: Box<dyn ConnectionSource> = Box::new(Recording::default());
    let store: SqlOutboxStore = SqlOutboxStore::new(source, OutboxStoreOptions::default()).unwrap();
    assert_eq!(store.table(), "acemq_outbox");
}

#[test]
fn postgres_delete_then_claim_is_one_statement() {
    let store = store();
    let claimed = store.delete_then_claim(&[3, 4], 10).unwrap();
    assert_eq!(claimed.len(), 1, "read back like a claim");
    let statements = log(&store);
    assert_eq!(statements.len(), 1, "one statement, one commit: {statements:?}");
    let (sql, params) = &statements[0];
    assert!(sql.starts_with("WITH done AS (DELETE FROM acemq_outbox WHERE claimed_by = $1 AND id IN ($4, $5) AND set_config("), "{sql}");
    assert!(sql.contains(") UPDATE acemq_outbox SET claimed_by = $1"), "{sql}");
    assert_eq!(*params, [t("w1"), SqlValue::Int(60_000), SqlValue::Int(10), SqlValue::Int(3), SqlValue::Int(4)]);
}
