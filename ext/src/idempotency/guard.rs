//! AceMQ::AMQP::Patterns::NativeGuard: core's `Guard` (the decision and its
//! counters) for lib/acemq/amqp/patterns/idempotency.rb, which runs the
//! handler between `_before` and `_after` on the consumer's Ruby thread.
//!
//! The store is passed per call: the library's own stores are used directly
//! (a SQLite file without the GVL), anything else through `RbStore`.

use super::memory::RbInMemoryStore;
use super::ruby_store::RbStore;
use super::sql_store::RbSqlStore;
use crate::sql;
use acemq::idempotency::{Before, Guard, IdempotencyStore};
use acemq::{Ack, Outcome};
use magnus::{function, method, prelude::*, typed_data::Obj, Error, RArray, RHash, RModule, Ruby, Value};

#[magnus::wrap(class = "AceMQ::AMQP::Patterns::NativeGuard", free_immediately, size)]
pub struct RbGuard {
    inner: Guard,
}

/// `f` with `store` as core sees it.
fn with_store<R>(ruby: &Ruby, store: Value, f: impl FnOnce(&dyn IdempotencyStore) -> R) -> Result<R, Error> {
    if let Ok(s) = Obj::<RbInMemoryStore>::try_convert(store) {
        return Ok(f(&s.inner));
    }
    if let Ok(s) = Obj::<RbSqlStore>::try_convert(store) {
        return s.run(ruby, f);
    }
    let s = RbStore::new(ruby, store)?;
    sql::begin();
    let r = f(&s);
    sql::finish(ruby, Ok(r))
}

fn outcome(kind: &str) -> Outcome {
    match kind {
        "accept" => Outcome::Ack(Ack::Accept),
        "retry" => Outcome::Ack(Ack::retry("")),
        "reject" => Outcome::Ack(Ack::reject("")),
        "raised" => Outcome::Raised { class: String::new(), message: String::new(), fatal: false },
        other => Outcome::NotAnAck { what: other.to_string() },
    }
}

/// A decision as the Ruby middleware reads it: `[verdict, detail, class,
/// wait]`, where wait is how long (seconds) an in-progress message may wait
/// without spending attempts (the store's claim timeout), else nil.
type Verdict = (String, Option<String>, Option<String>, Option<f64>);

fn verdict(before: Before) -> Verdict {
    if let Before::InProgress { reason, wait } = before {
        return ("in_progress".into(), Some(reason), None, wait.map(|w| w.as_secs_f64()));
    }
    let (v, detail, class) = plain_verdict(before);
    (v, detail, class, None)
}

fn plain_verdict(before: Before) -> (String, Option<String>, Option<String>) {
    match before {
        Before::Run { key } => ("run".into(), Some(key), None),
        Before::Duplicate => ("duplicate".into(), None, None),
        Before::InProgress { reason, .. } => ("in_progress".into(), Some(reason), None),
        Before::Settle(Outcome::Ack(Ack::Retry { reason })) => ("retry".into(), Some(reason), None),
        Before::Settle(Outcome::Ack(Ack::Reject { reason })) => ("reject".into(), Some(reason), None),
        Before::Settle(Outcome::Raised { class, message, fatal: true }) => ("reject".into(), Some(message), Some(class)),
        Before::Settle(Outcome::Raised { class, message, fatal: false }) => ("retry".into(), Some(message), Some(class)),
        Before::Settle(Outcome::Ack(Ack::Accept)) => ("duplicate".into(), None, None),
        Before::Settle(Outcome::NotAnAck { what }) => ("reject".into(), Some(what), None),
        Before::Settle(Outcome::Wait { reason, .. }) => ("retry".into(), Some(reason), None),
    }
}

impl RbGuard {
    fn new() -> Self {
        RbGuard { inner: Guard::new() }
    }

    /// `["run", key]`, `["duplicate", nil, nil]`, `["retry", reason, nil]` or
    /// `["reject", reason, error_class]`.
    fn before(ruby: &Ruby, rb_self: &Self, store: Value, key: Value) -> Result<Verdict, Error> {
        let key = super::key(ruby, key)?;
        let before = with_store(ruby, store, |s| rb_self.inner.before(s, key.as_deref()))?;
        Ok(verdict(before))
    }

    /// Settle the key after the handler: `kind` is what it did (accept,
    /// retry, reject, raised, or what it returned). Nil, or the message of a
    /// confirm/forget that failed (the handler's outcome stands either way).
    fn after(ruby: &Ruby, rb_self: &Self, store: Value, key: String, kind: String) -> Result<Option<String>, Error> {
        let r = with_store(ruby, store, |s| rb_self.inner.after(s, &key, &outcome(&kind)))?;
        Ok(r.err().map(|e| e.to_string()))
    }

    /// The handler never finished (its thread was killed): forget the key.
    fn abandon(ruby: &Ruby, rb_self: &Self, store: Value, key: String) -> Result<Option<String>, Error> {
        let r = with_store(ruby, store, |s| rb_self.inner.abandon(s, &key))?;
        Ok(r.err().map(|e| e.to_string()))
    }

    /// `_before` for a batch: the keys claimed together (one transaction on
    /// a SQL store), one decision each, in order.
    fn before_many(ruby: &Ruby, rb_self: &Self, store: Value, keys: RArray) -> Result<Vec<Verdict>, Error> {
        let keys: Vec<Option<String>> = keys.into_iter().map(|k| super::key(ruby, k)).collect::<Result<_, _>>()?;
        let refs: Vec<Option<&str>> = keys.iter().map(|k| k.as_deref()).collect();
        let decided = with_store(ruby, store, |s| rb_self.inner.before_many(s, &refs))?;
        Ok(decided.into_iter().map(verdict).collect())
    }

    /// `_after` for a batch of `[key, kind]`: the accepted confirmed
    /// together, the rest forgotten. Nil, or the first failure's message.
    fn after_many(ruby: &Ruby, rb_self: &Self, store: Value, settled: Vec<(String, String)>) -> Result<Option<String>, Error> {
        let outcomes: Vec<Outcome> = settled.iter().map(|(_, kind)| outcome(kind)).collect();
        let pairs: Vec<(&str, &Outcome)> = settled.iter().zip(&outcomes).map(|((k, _), o)| (k.as_str(), o)).collect();
        let r = with_store(ruby, store, |s| rb_self.inner.after_many(s, &pairs))?;
        Ok(r.err().map(|e| e.to_string()))
    }

    fn stats(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        let s = rb_self.inner.stats();
        let h = ruby.hash_new();
        for (name, n) in [
            ("duplicates", s.duplicates),
            ("runs", s.runs),
            ("missing_keys", s.missing_keys),
            ("store_errors", s.store_errors),
            ("confirmed", s.confirmed),
            ("forgotten", s.forgotten),
            ("confirm_errors", s.confirm_errors),
            ("forget_errors", s.forget_errors),
            ("abandoned", s.abandoned),
            ("in_progress", s.in_progress),
        ] {
            h.aset(ruby.to_symbol(name), n)?;
        }
        Ok(h)
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("NativeGuard", ruby.class_object())?;
    class.define_singleton_method("new", function!(RbGuard::new, 0))?;
    class.define_method("_before", method!(RbGuard::before, 2))?;
    class.define_method("_after", method!(RbGuard::after, 3))?;
    class.define_method("_abandon", method!(RbGuard::abandon, 2))?;
    class.define_method("_before_many", method!(RbGuard::before_many, 2))?;
    class.define_method("_after_many", method!(RbGuard::after_many, 2))?;
    class.define_method("stats", method!(RbGuard::stats, 0))?;
    Ok(())
}
