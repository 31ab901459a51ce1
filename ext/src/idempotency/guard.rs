//! AceMQ::AMQP::Patterns::NativeGuard: core's `Guard` (the decision and its
//! counters) for lib/acemq/amqp/patterns/idempotency.rb, which runs the
//! handler between `_before` and `_after` on the consumer's Ruby thread.
//!
//! The store is passed per call: the library's own stores are used directly
//! (a SQLite file without the GVL), anything else through `RbStore`.

use super::decision::{Decision, RbDecision};
use super::memory::RbInMemoryStore;
use super::ruby_store::RbStore;
use super::sql_store::RbSqlStore;
use crate::sql;
use acemq::idempotency::{Before, Guard, IdempotencyStore, MISSING_KEY_CLASS};
use acemq::Outcome;
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
    sql::on_ruby(ruby, || Ok(f(&s)))
}

/// The Ruby wording of core's missing-key rule: the same rule, with the
/// class a Ruby handler would raise for it and a Ruby key function as the
/// example of what to give.
const MISSING_KEY_RUBY: &str = "idempotency key is missing: give Patterns.idempotent a key: that finds one \
     (e.g. key: ->(m) { (id = m.payload[\"order_id\"]) && \"charge:#{id}\" }, which is nil when the field is), \
     or publish the message with an id \
     (a message from another client without message_id has no envelope id)";

/// What `_before` decided: run the handler with the claimed key, or settle
/// unrun with the Ack and the idempotency event that is. `why` replaces the
/// reason of a missing key (the Ruby side knows why its key: function found
/// none).
fn decided(ruby: &Ruby, before: Before, why: Option<String>) -> Result<RbDecision, Error> {
    let event = match &before {
        Before::Run { key } => return Ok(RbDecision(Decision::Run { key: key.clone() })),
        Before::Duplicate => "duplicate",
        Before::InProgress { .. } => "in_progress",
        Before::Settle(Outcome::Raised { class, .. }) if class == MISSING_KEY_CLASS => "missing_key",
        Before::Settle(_) => "store_error",
    };
    let mut outcome = before.outcome_without_running().expect("only Run runs the handler");
    if event == "missing_key" {
        let fatal = crate::convert::fatal_error_name(ruby)?;
        outcome = Outcome::Raised { class: fatal, message: why.unwrap_or_else(|| MISSING_KEY_RUBY.into()), fatal: true };
    }
    Ok(RbDecision(Decision::Settle { outcome, event }))
}

impl RbGuard {
    fn new() -> Self {
        RbGuard { inner: Guard::new() }
    }

    /// The Decision: run the handler, or settle unrun (see `decided`).
    fn before(ruby: &Ruby, rb_self: &Self, store: Value, key: Value, why: Option<String>) -> Result<RbDecision, Error> {
        let key = super::key(ruby, key)?;
        let before = with_store(ruby, store, |s| rb_self.inner.before(s, key.as_deref()))?;
        decided(ruby, before, why)
    }

    /// Settle the key after the handler: `result` is what it produced (an
    /// Ack, the StandardError it raised, anything else), read as the
    /// consumer reads it. Nil, or the message of a confirm/forget that
    /// failed (the handler's outcome stands either way).
    fn after(ruby: &Ruby, rb_self: &Self, store: Value, key: String, result: Value) -> Result<Option<String>, Error> {
        let outcome = crate::convert::outcome(ruby, result)?;
        let r = with_store(ruby, store, |s| rb_self.inner.after(s, &key, &outcome))?;
        Ok(r.err().map(|e| e.to_string()))
    }

    /// The handler never finished (its thread was killed): forget the key.
    fn abandon(ruby: &Ruby, rb_self: &Self, store: Value, key: String) -> Result<Option<String>, Error> {
        let r = with_store(ruby, store, |s| rb_self.inner.abandon(s, &key))?;
        Ok(r.err().map(|e| e.to_string()))
    }

    /// `_before` for a batch: the keys claimed together (one transaction on
    /// a SQL store), one Decision each, in order; `whys` as `_before`'s why.
    fn before_many(ruby: &Ruby, rb_self: &Self, store: Value, keys: RArray, whys: Vec<Option<String>>) -> Result<RArray, Error> {
        let keys: Vec<Option<String>> = keys.into_iter().map(|k| super::key(ruby, k)).collect::<Result<_, _>>()?;
        let refs: Vec<Option<&str>> = keys.iter().map(|k| k.as_deref()).collect();
        let decisions = with_store(ruby, store, |s| rb_self.inner.before_many(s, &refs))?;
        let out = ruby.ary_new_capa(decisions.len());
        let mut whys = whys.into_iter();
        for before in decisions {
            out.push(ruby.obj_wrap(decided(ruby, before, whys.next().flatten())?))?;
        }
        Ok(out)
    }

    /// `_after` for a batch: `settled` is `[key, result]` for each handler
    /// that finished (the accepted confirmed together, the rest forgotten),
    /// `abandoned` the keys of handlers that never did (killed, or never
    /// started after one was): forgotten and counted as abandoned. Nil, or
    /// the first failure's message.
    fn after_many(ruby: &Ruby, rb_self: &Self, store: Value, settled: RArray, abandoned: Vec<String>) -> Result<Option<String>, Error> {
        let mut keys = Vec::with_capacity(settled.len());
        let mut outcomes = Vec::with_capacity(settled.len());
        for pair in settled {
            let (key, result): (String, Value) = magnus::TryConvert::try_convert(pair)?;
            keys.push(key);
            outcomes.push(crate::convert::outcome(ruby, result)?);
        }
        let pairs: Vec<(&str, &Outcome)> = keys.iter().map(String::as_str).zip(&outcomes).collect();
        let r = with_store(ruby, store, |s| {
            let mut first = rb_self.inner.after_many(s, &pairs).err();
            for key in &abandoned {
                if let Err(e) = rb_self.inner.abandon(s, key) {
                    first.get_or_insert(e);
                }
            }
            first
        })?;
        Ok(r.map(|e| e.to_string()))
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
            ("in_progress", s.claimed_elsewhere),
        ] {
            h.aset(ruby.to_symbol(name), n)?;
        }
        Ok(h)
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("NativeGuard", ruby.class_object())?;
    class.define_singleton_method("new", function!(RbGuard::new, 0))?;
    class.define_method("_before", method!(RbGuard::before, 3))?;
    class.define_method("_after", method!(RbGuard::after, 3))?;
    class.define_method("_abandon", method!(RbGuard::abandon, 2))?;
    class.define_method("_before_many", method!(RbGuard::before_many, 3))?;
    class.define_method("_after_many", method!(RbGuard::after_many, 3))?;
    class.define_method("stats", method!(RbGuard::stats, 0))?;
    super::decision::init(ruby, class)?;
    Ok(())
}
