//! AceMQ::AMQP::Patterns::NativeGuard: core's `Guard` (the decision and its
//! counters) for lib/acemq/amqp/patterns/idempotency.rb, which runs the
//! handler between `_before` and `_after` on the consumer's Ruby thread.
//!
//! The store is passed per call: the library's own stores are used directly
//! (a SQLite file without the GVL), anything else through `RbStore`.
//!
//! The idempotency events are core's guard's, emitted once: each call takes
//! the ones core emitted during it (`events::capturing`) and delivers them
//! to Ruby's subscribers inline, on this thread, with the message they are
//! about (`deliver`), which is what the Ruby payload adds.

use super::decision::{Decision, RbDecision};
use super::memory::RbInMemoryStore;
use super::ruby_store::RbStore;
use super::sql_store::RbSqlStore;
use crate::sql;
use acemq::events::Idempotency;
use acemq::idempotency::{Before, Guard, IdempotencyStore, MISSING_KEY_CLASS};
use acemq::Outcome;
use magnus::value::Lazy;
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

/// `with_store`, with the idempotency events core emitted during it.
fn guarded<R>(ruby: &Ruby, store: Value, f: impl FnOnce(&dyn IdempotencyStore) -> R) -> Result<(R, Vec<Idempotency>), Error> {
    let (r, events) = crate::events::capturing(|| with_store(ruby, store, f));
    Ok((r?, events))
}

static PATTERNS: Lazy<RModule> = Lazy::new(|ruby| crate::convert::amqp_const(ruby, "Patterns"));

/// Hand core's idempotency events to Ruby's subscribers, inline on this
/// (the handler's) thread, through `Patterns._deliver`, which adds the
/// message's keys. `about` gives each event's message and, for a missing
/// key, the Ruby wording of its error (the reason the message is rejected
/// with, as `decided` words it).
fn deliver(ruby: &Ruby, events: Vec<Idempotency>, mut about: impl FnMut(&Idempotency) -> (Value, Option<String>)) -> Result<(), Error> {
    for event in events {
        let (message, wording) = about(&event);
        let payload = ruby.hash_new();
        payload.aset(ruby.to_symbol("verdict"), event.verdict)?;
        payload.aset(ruby.to_symbol("key"), event.key)?;
        payload.aset(ruby.to_symbol("error"), wording.or(event.error))?;
        let _: Value = ruby.get_inner(&PATTERNS).funcall("_deliver", (payload, message))?;
    }
    Ok(())
}

/// The reason a decision settles with, for a missing key's event.
fn missing_key_wording(decision: &RbDecision) -> Option<String> {
    match &decision.0 {
        Decision::Settle { outcome, event: "missing_key" } => match &outcome.outcome {
            Outcome::Raised { message, .. } => Some(message.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The key for `_before`, and why there is none: a key that is not text is
/// no key, with core's refusal as the reason (the Ruby side's `why`, for a
/// key: function that raised, otherwise).
fn guard_key(ruby: &Ruby, key: Value, why: Option<String>) -> Result<(Option<String>, Option<String>), Error> {
    Ok(match super::key_or_refusal(ruby, key)? {
        Ok(key) => (key, why),
        Err(refusal) => (None, Some(refusal)),
    })
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
    let mut outcome = before.guarded_without_running().expect("only Run runs the handler");
    if event == "missing_key" {
        let fatal = crate::convert::fatal_error_name(ruby)?;
        outcome = Outcome::reject_because(fatal, why.unwrap_or_else(|| MISSING_KEY_RUBY.into())).into();
    }
    Ok(RbDecision(Decision::Settle { outcome, event }))
}

impl RbGuard {
    fn new() -> Self {
        RbGuard { inner: Guard::new() }
    }

    /// The Decision: run the handler, or settle unrun (see `decided`).
    /// `message` is what its event, if any, is about.
    fn before(ruby: &Ruby, rb_self: &Self, store: Value, key: Value, why: Option<String>, message: Value) -> Result<RbDecision, Error> {
        let (key, why) = guard_key(ruby, key, why)?;
        let (before, events) = guarded(ruby, store, |s| rb_self.inner.before(s, key.as_deref()))?;
        let decision = decided(ruby, before, why)?;
        deliver(ruby, events, |_| (message, missing_key_wording(&decision)))?;
        Ok(decision)
    }

    /// A delivery held in place asks again (core's `Guard::recheck`): the
    /// Decision, with a claim still live elsewhere not counted or reported
    /// again. The first look of a hold counts it and reports it (`held`).
    fn recheck(ruby: &Ruby, rb_self: &Self, store: Value, key: Value, first: bool, message: Value) -> Result<RbDecision, Error> {
        let Ok(Some(key)) = super::key_or_refusal(ruby, key)? else {
            return Err(Error::new(ruby.exception_arg_error(), "_recheck: the key of a held delivery is text"));
        };
        let (before, events) = guarded(ruby, store, |s| {
            if first {
                rb_self.inner.hold_started(&key);
            }
            rb_self.inner.recheck(s, &key)
        })?;
        let decision = decided(ruby, before, None)?;
        deliver(ruby, events, |_| (message, None))?;
        Ok(decision)
    }

    /// Settle the key after the handler: `result` is what it produced (an
    /// Ack, the StandardError it raised, anything else), read as the
    /// consumer reads it. Nil, or the message of a confirm/forget that
    /// failed (the handler's outcome stands either way).
    fn after(ruby: &Ruby, rb_self: &Self, store: Value, key: String, result: Value, message: Value) -> Result<Option<String>, Error> {
        let outcome = crate::convert::outcome(ruby, result)?;
        let (r, events) = guarded(ruby, store, |s| rb_self.inner.after(s, &key, &outcome))?;
        deliver(ruby, events, |_| (message, None))?;
        Ok(r.err().map(|e| e.to_string()))
    }

    /// The handler never finished (its thread was killed): forget the key.
    fn abandon(ruby: &Ruby, rb_self: &Self, store: Value, key: String, message: Value) -> Result<Option<String>, Error> {
        let (r, events) = guarded(ruby, store, |s| rb_self.inner.abandon(s, &key))?;
        deliver(ruby, events, |_| (message, None))?;
        Ok(r.err().map(|e| e.to_string()))
    }

    /// `_before` for a batch: the keys claimed together (one transaction on
    /// a SQL store), one Decision each, in order; `whys` as `_before`'s why,
    /// `messages` the messages, in the same order.
    fn before_many(ruby: &Ruby, rb_self: &Self, store: Value, keys: RArray, whys: Vec<Option<String>>, messages: RArray) -> Result<RArray, Error> {
        let (keys, whys): (Vec<Option<String>>, Vec<Option<String>>) = keys
            .into_iter()
            .zip(whys.into_iter().chain(std::iter::repeat(None)))
            .map(|(k, why)| guard_key(ruby, k, why))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let refs: Vec<Option<&str>> = keys.iter().map(|k| k.as_deref()).collect();
        let (befores, events) = guarded(ruby, store, |s| rb_self.inner.before_many(s, &refs))?;
        let decisions: Vec<RbDecision> =
            befores.into_iter().zip(whys).map(|(before, why)| decided(ruby, before, why)).collect::<Result<_, _>>()?;
        // Each message has at most one event from the claim, so an event is
        // the first message not yet reported whose key it names (a missing
        // key names none).
        let mut reported = vec![false; decisions.len()];
        deliver(ruby, events, |event| {
            let key = event.key.as_deref().filter(|k| !k.is_empty());
            let found = (0..decisions.len()).find(|&i| !reported[i] && refs[i].filter(|k| !k.is_empty()) == key);
            let Some(i) = found else { return (ruby.qnil().as_value(), None) };
            reported[i] = true;
            (messages.entry(i as isize).unwrap_or_else(|_| ruby.qnil().as_value()), missing_key_wording(&decisions[i]))
        })?;
        let out = ruby.ary_new_capa(decisions.len());
        for decision in decisions {
            out.push(ruby.obj_wrap(decision))?;
        }
        Ok(out)
    }

    /// `_after` for a batch: `settled` is `[key, result]` for each handler
    /// that finished (the accepted confirmed together, the rest forgotten),
    /// `abandoned` the keys of handlers that never did (killed, or never
    /// started after one was): forgotten and counted as abandoned. Nil, or
    /// the first failure's message. `messages` is each key's message, for
    /// its events.
    fn after_many(ruby: &Ruby, rb_self: &Self, store: Value, settled: RArray, abandoned: Vec<String>, messages: RHash) -> Result<Option<String>, Error> {
        let mut keys = Vec::with_capacity(settled.len());
        let mut outcomes = Vec::with_capacity(settled.len());
        for pair in settled {
            let (key, result): (String, Value) = magnus::TryConvert::try_convert(pair)?;
            keys.push(key);
            outcomes.push(crate::convert::outcome(ruby, result)?);
        }
        let pairs: Vec<(&str, &Outcome)> = keys.iter().map(String::as_str).zip(&outcomes).collect();
        let (r, events) = guarded(ruby, store, |s| {
            let mut first = rb_self.inner.after_many(s, &pairs).err();
            for key in &abandoned {
                if let Err(e) = rb_self.inner.abandon(s, key) {
                    first.get_or_insert(e);
                }
            }
            first
        })?;
        deliver(ruby, events, |event| {
            let message = event.key.as_deref().and_then(|k| messages.get(k)).unwrap_or_else(|| ruby.qnil().as_value());
            (message, None)
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
            ("held", s.held),
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
    class.define_method("_before", method!(RbGuard::before, 4))?;
    class.define_method("_after", method!(RbGuard::after, 4))?;
    class.define_method("_recheck", method!(RbGuard::recheck, 4))?;
    // How a keep_order guard holds a delivery whose key is claimed
    // elsewhere: core's schedule, so Ruby and Rust wait alike.
    class.const_set("HOLD_POLL_FIRST", acemq::idempotency::HOLD_POLL_FIRST.as_secs_f64())?;
    class.const_set("HOLD_POLL_MAX", acemq::idempotency::HOLD_POLL_MAX.as_secs_f64())?;
    class.define_method("_abandon", method!(RbGuard::abandon, 3))?;
    class.define_method("_before_many", method!(RbGuard::before_many, 4))?;
    class.define_method("_after_many", method!(RbGuard::after_many, 4))?;
    class.define_method("stats", method!(RbGuard::stats, 0))?;
    super::decision::init(ruby, class)?;
    Ok(())
}
