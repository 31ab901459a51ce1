//! Tests across the guard, the wrapper and both stores, and the helpers the
//! store tests share.

use super::*;
use crate::ack::{Ack, Outcome};
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::message::Message;
use crate::sql::SqliteConnection;
use futures_lite::future::block_on;
use serde_json::json;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

mod options;
mod sql_store;

/// A SQLite file of its own in the temp dir, removed (with its WAL files)
/// when dropped.
pub(super) struct TempDb {
    pub path: String,
}

impl TempDb {
    pub fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let unique = format!(
            "acemq-idem-{name}-{}-{}-{}.sqlite3",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst),
            SystemClock.now_millis()
        );
        let path = std::env::temp_dir().join(unique).to_string_lossy().into_owned();
        TempDb { path }
    }

    pub fn connect(&self) -> SqliteConnection {
        SqliteConnection::open(&self.path).unwrap()
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path));
        }
    }
}

fn sql_store(db: &TempDb, worker: &str) -> SqlIdempotencyStore<SqliteConnection> {
    let opts = SqlIdempotencyOptions { worker: Some(worker.into()), ..Default::default() };
    let store = SqlIdempotencyStore::new(db.connect(), opts).unwrap();
    store.create_schema().unwrap();
    store
}

fn message(id: &str) -> Message {
    Message::new(json!({"order_id": "A-1"}), Envelope::new().with_id(id))
}

/// A store whose every call fails, like a database that is down.
struct BrokenStore;

impl IdempotencyStore for BrokenStore {
    fn first_time(&self, _: &str) -> Result<bool> {
        Err(Error::store("connection refused"))
    }
    fn confirm(&self, _: &str) -> Result<()> {
        Err(Error::store("connection refused"))
    }
    fn forget(&self, _: &str) -> Result<()> {
        Err(Error::store("connection refused"))
    }
    fn confirmed(&self, _: &str) -> Result<bool> {
        Err(Error::store("connection refused"))
    }
}

/// A Ruby-style store answering only first_time: remembers keys in a set.
#[derive(Default)]
struct FirstTimeOnly {
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
    confirms: Cell<u32>,
}

impl IdempotencyStore for FirstTimeOnly {
    fn first_time(&self, key: &str) -> Result<bool> {
        Ok(self.seen.lock().unwrap().insert(key.to_string()))
    }
    fn confirm(&self, _: &str) -> Result<()> {
        self.confirms.set(self.confirms.get() + 1);
        Err(Error::store("not supported"))
    }
    fn forget(&self, _: &str) -> Result<()> {
        Err(Error::store("not supported"))
    }
    fn confirmed(&self, _: &str) -> Result<bool> {
        Ok(false)
    }
    fn supports_confirm(&self) -> bool {
        false
    }
    fn supports_forget(&self) -> bool {
        false
    }
}

/// Runs the wrapper over `store` with a handler returning `outcome`,
/// counting handler runs.
fn wrapped<S: IdempotencyStore>(
    store: S,
    runs: Arc<AtomicUsize>,
    outcome: Outcome,
) -> Idempotent<S, impl Fn(Message) -> std::future::Ready<Outcome>> {
    Idempotent::new(store, move |_m: Message| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(outcome.clone())
    })
}

#[test]
fn duplicate_is_accepted_without_running_and_counted() {
    let db = TempDb::new("dup");
    let runs = Arc::new(AtomicUsize::new(0));
    let h = wrapped(sql_store(&db, "w1"), runs.clone(), Outcome::Ack(Ack::Accept));
    for _ in 0..3 {
        assert_eq!(block_on(h.handle(message("m-1"))), Outcome::Ack(Ack::Accept));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "three deliveries, one run");
    let stats = h.guard().stats();
    assert_eq!((stats.runs, stats.duplicates, stats.confirmed), (1, 2, 1));
    assert!(h.store().confirmed("m-1").unwrap());
}

#[test]
fn handler_that_does_not_accept_forgets_so_the_retry_runs() {
    let outcomes = [
        Outcome::Ack(Ack::retry("later")),
        Outcome::Ack(Ack::reject("never")),
        Outcome::Raised { class: "RuntimeError".into(), message: "boom".into(), fatal: false },
        Outcome::Raised { class: "AceMQ::AMQP::FatalError".into(), message: "no".into(), fatal: true },
        Outcome::NotAnAck { what: "nil".into() },
    ];
    for outcome in outcomes {
        let db = TempDb::new("forget");
        let runs = Arc::new(AtomicUsize::new(0));
        let h = wrapped(sql_store(&db, "w1"), runs.clone(), outcome.clone());
        assert_eq!(block_on(h.handle(message("m-1"))), outcome);
        assert_eq!(block_on(h.handle(message("m-1"))), outcome, "the retry ran again");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{outcome:?}");
        assert!(!h.store().confirmed("m-1").unwrap());
        assert_eq!(h.guard().stats().forgotten, 2);
        assert_eq!(h.guard().stats().duplicates, 0);
    }
}

#[test]
fn in_memory_store_behaves_the_same_under_the_wrapper() {
    let runs = Arc::new(AtomicUsize::new(0));
    let h = wrapped(InMemoryIdempotencyStore::default(), runs.clone(), Outcome::Ack(Ack::retry("x")));
    block_on(h.handle(message("m-1")));
    block_on(h.handle(message("m-1")));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let h = wrapped(InMemoryIdempotencyStore::default(), runs.clone(), Outcome::Ack(Ack::Accept));
    block_on(h.handle(message("m-2")));
    block_on(h.handle(message("m-2")));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[test]
fn missing_key_is_a_fatal_reject_and_the_handler_does_not_run() {
    let runs = Arc::new(AtomicUsize::new(0));
    let h = wrapped(InMemoryIdempotencyStore::default(), runs.clone(), Outcome::Ack(Ack::Accept));
    // A foreign publisher's message without a message id: the default key is empty.
    let out = block_on(h.handle(message("")));
    match &out {
        Outcome::Raised { class, message, fatal } => {
            assert_eq!(class, MISSING_KEY_CLASS);
            assert!(*fatal);
            assert!(message.contains("key is missing") && message.contains("key function"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(out.settlement(), crate::ack::Settlement::Reject { .. }));
    // A key function that finds nothing.
    let h = h.with_key(|m| m.payload.get("customer").and_then(|v| v.as_str()).map(|c| format!("c:{c}")));
    assert!(matches!(block_on(h.handle(message("m-1"))), Outcome::Raised { fatal: true, .. }));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(h.guard().stats().missing_keys, 2);
    assert!(h.store().is_empty());
}

#[test]
fn key_function_keys_the_business_event() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let key: KeyFn = Arc::new(|m: &Message| m.payload["order_id"].as_str().map(|o| format!("charge:{o}")));
    let h = idempotent(InMemoryIdempotencyStore::default(), Some(key), move |_m| {
        r.fetch_add(1, Ordering::SeqCst);
        async { Outcome::Ack(Ack::Accept) }
    });
    // Two publishes of one order: two message ids, one business event.
    block_on(h.handle(message("m-1")));
    block_on(h.handle(message("m-2")));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(h.store().confirmed("charge:A-1").unwrap());
}

#[test]
fn failing_store_is_a_wait_that_spends_no_attempt_and_the_handler_does_not_run() {
    let runs = Arc::new(AtomicUsize::new(0));
    let h = wrapped(BrokenStore, runs.clone(), Outcome::Ack(Ack::Accept));
    match block_on(h.handle(message("m-1"))) {
        Outcome::Wait { reason, up_to } => {
            assert!(reason.contains("connection refused"), "{reason}");
            assert_eq!(up_to, crate::idempotency::STORE_OUTAGE_WAIT);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(h.guard().stats().store_errors, 1);
}

#[test]
fn sql_store_error_names_the_table_and_what_to_do() {
    let db = TempDb::new("noschema");
    let store = SqlIdempotencyStore::new(db.connect(), SqlIdempotencyOptions::default()).unwrap();
    let e = store.first_time("k").unwrap_err();
    assert_eq!(e.kind(), &crate::error::ErrorKind::Store);
    assert!(e.message().contains("acemq_idempotency") && e.message().contains("create_schema"), "{e}");
}

#[test]
fn outcome_stands_when_confirm_or_forget_fail() {
    // A store whose claim works but whose confirm and forget fail.
    struct HalfBroken(InMemoryIdempotencyStore);
    impl IdempotencyStore for HalfBroken {
        fn first_time(&self, key: &str) -> Result<bool> {
            self.0.first_time(key)
        }
        fn confirm(&self, _: &str) -> Result<()> {
            Err(Error::store("gone"))
        }
        fn forget(&self, _: &str) -> Result<()> {
            Err(Error::store("gone"))
        }
        fn confirmed(&self, key: &str) -> Result<bool> {
            self.0.confirmed(key)
        }
    }
    let guard = Guard::new();
    let store = HalfBroken(InMemoryIdempotencyStore::default());
    let Before::Run { key } = guard.before(&store, Some("k1")) else { panic!() };
    assert!(guard.after(&store, &key, &Outcome::Ack(Ack::Accept)).is_err());
    let Before::Run { key } = guard.before(&store, Some("k2")) else { panic!() };
    assert!(guard.after(&store, &key, &Outcome::Ack(Ack::retry("x"))).is_err());
    let s = guard.stats();
    assert_eq!((s.confirm_errors, s.forget_errors, s.confirmed, s.forgotten), (1, 1, 0, 0));
    // Through the wrapper the handler's accept is what is settled.
    let runs = Arc::new(AtomicUsize::new(0));
    let h = wrapped(HalfBroken(InMemoryIdempotencyStore::default()), runs, Outcome::Ack(Ack::Accept));
    assert_eq!(block_on(h.handle(message("m"))), Outcome::Ack(Ack::Accept));
}

#[test]
fn store_without_confirm_or_forget_is_never_asked_to() {
    let store = FirstTimeOnly::default();
    let guard = Guard::new();
    let Before::Run { key } = guard.before(&store, Some("k")) else { panic!() };
    guard.after(&store, &key, &Outcome::Ack(Ack::Accept)).unwrap();
    assert_eq!(store.confirms.get(), 0);
    assert_eq!(guard.before(&store, Some("k")), Before::Duplicate);
    let Before::Run { key } = guard.before(&store, Some("j")) else { panic!() };
    guard.after(&store, &key, &Outcome::Ack(Ack::retry("x"))).unwrap();
    assert_eq!(guard.stats().forgotten, 0);
}

#[test]
fn step_by_step_as_the_extension_drives_it() {
    let db = TempDb::new("steps");
    let store = sql_store(&db, "w1");
    let dyn_store: &dyn IdempotencyStore = &store;
    let guard = Guard::new();
    assert!(guard.before(dyn_store, None).outcome_without_running().is_some());
    let before = guard.before(dyn_store, Some("m-1"));
    assert_eq!(before, Before::Run { key: "m-1".into() });
    assert_eq!(before.outcome_without_running(), None);
    // Claimed and not confirmed: somebody is (or was) working on it. Retried,
    // not accepted, so a handler that died does not take the message with it.
    match guard.before(dyn_store, Some("m-1")) {
        Before::InProgress { reason, .. } => assert!(reason.contains("has not finished"), "{reason}"),
        other => panic!("expected a retry while the claim is live, got {other:?}"),
    }
    guard.after(dyn_store, "m-1", &Outcome::Ack(Ack::Accept)).unwrap();
    assert!(store.confirmed("m-1").unwrap());
    assert_eq!(guard.before(dyn_store, Some("m-1")), Before::Duplicate);
    assert_eq!(
        guard.before(dyn_store, Some("m-1")).outcome_without_running(),
        Some(Outcome::Ack(Ack::Accept))
    );
    assert_eq!(guard.stats().duplicates, 2);
    assert_eq!(guard.stats().claimed_elsewhere, 1);
}

#[test]
fn a_redelivery_while_a_dead_handlers_claim_is_live_is_retried_then_runs_after_the_timeout() {
    let clock = ManualClock::default();
    let store = InMemoryIdempotencyStore::new(std::time::Duration::from_secs(3600))
        .with_claim_timeout(std::time::Duration::from_secs(300))
        .with_clock(clock.clone());
    let guard = Guard::new();
    // A consumer claims the key and dies without confirm or forget.
    assert!(matches!(guard.before(&store, Some("k")), Before::Run { .. }));
    // The broker redelivers at once to another consumer: not dropped.
    assert!(matches!(guard.before(&store, Some("k")), Before::InProgress { .. }));
    // The retry ladder brings it back after the claim expired: it runs.
    clock.advance(std::time::Duration::from_secs(301));
    assert!(matches!(guard.before(&store, Some("k")), Before::Run { .. }));
}

#[test]
fn dropped_or_panicking_handler_forgets_its_claim() {
    let store = Arc::new(InMemoryIdempotencyStore::default());
    // Dropped mid-await: the future is polled once, then dropped.
    let h = Idempotent::new(store.clone(), |_m: Message| futures_lite::future::pending::<Outcome>());
    {
        let mut fut = Box::pin(h.handle(message("m-1")));
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(h.guard().stats().abandoned, 1);
    assert!(store.is_empty(), "the claim was forgotten, the redelivery will run");

    let h = Idempotent::new(store.clone(), |_m: Message| async { panic!("handler bug") as Outcome });
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_on(h.handle(message("m-2")))));
    assert!(r.is_err());
    assert!(store.is_empty());
}

use std::future::Future;

#[test]
fn wrapper_over_a_sqlite_store_is_send_for_tokio_spawn() {
    fn assert_send<T: Send>(_: &T) {}
    let db = TempDb::new("send");
    let h = Idempotent::new(sql_store(&db, "w1"), |_m: Message| async { Outcome::Ack(Ack::Accept) });
    let fut = h.handle(message("m-1"));
    assert_send(&fut);
    assert_eq!(block_on(fut), Outcome::Ack(Ack::Accept));
}

#[test]
fn a_batch_is_decided_exactly_as_one_message_at_a_time() {
    let db = TempDb::new("many");
    let store = sql_store(&db, "w1");
    let guard = Guard::new();
    // k1 handled before; k2 claimed by a live handler elsewhere; k3 new,
    // twice in the batch; one message without a key.
    let Before::Run { key } = guard.before(&store, Some("k1")) else { panic!() };
    guard.after(&store, &key, &Outcome::Ack(Ack::Accept)).unwrap();
    let other = sql_store(&db, "w2");
    assert!(other.first_time("k2").unwrap());
    let decided = guard.before_many(&store, &[Some("k1"), Some("k2"), Some("k3"), None, Some("k3")]);
    assert_eq!(decided[0], Before::Duplicate);
    assert!(matches!(decided[1], Before::InProgress { .. }));
    assert_eq!(decided[2], Before::Run { key: "k3".into() });
    assert!(matches!(&decided[3], Before::Settle(Outcome::Raised { fatal: true, .. })));
    assert!(matches!(decided[4], Before::InProgress { .. }), "the same key twice in one batch runs once");
    guard.after_many(&store, &[("k3", &Outcome::Ack(Ack::Accept))]).unwrap();
    assert!(store.confirmed("k3").unwrap());
    assert_eq!(guard.before(&store, Some("k3")), Before::Duplicate);
}

#[test]
fn after_many_confirms_the_accepted_and_forgets_the_rest() {
    let db = TempDb::new("after-many");
    let store = sql_store(&db, "w1");
    let guard = Guard::new();
    let decided = guard.before_many(&store, &[Some("a"), Some("b"), Some("c")]);
    assert!(decided.iter().all(|b| matches!(b, Before::Run { .. })));
    let retry = Outcome::Ack(Ack::retry("later"));
    let raised = Outcome::Raised { class: "RuntimeError".into(), message: "x".into(), fatal: false };
    guard.after_many(&store, &[("a", &Outcome::Ack(Ack::Accept)), ("b", &retry), ("c", &raised)]).unwrap();
    assert!(store.confirmed("a").unwrap());
    assert!(store.first_time("b").unwrap(), "forgotten: its retry runs");
    assert!(store.first_time("c").unwrap(), "forgotten: its retry runs");
    assert_eq!(guard.stats().confirmed, 1);
    assert_eq!(guard.stats().forgotten, 2);
}

#[test]
fn a_failing_store_has_the_whole_batch_wait_unrun() {
    let guard = Guard::new();
    let decided = guard.before_many(&BrokenStore, &[Some("a"), Some("b")]);
    assert!(decided.iter().all(|b| matches!(b, Before::Settle(Outcome::Wait { .. }))));
    assert_eq!(guard.stats().store_errors, 2);
}
