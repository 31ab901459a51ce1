//! Ruby <-> core value conversions that more than one class's file needs:
//! seconds as a `Duration`, the `AceMQ::AMQP` constants lib/acemq defines,
//! and a handler's result as core's `Outcome` (and back, as the Ack the
//! guard hands out). Each class's own fields stay in its file.

use acemq::{Ack, Backtrace, Guarded, Outcome, Verdict};
use magnus::rb_sys::AsRawValue;
use magnus::value::Lazy;
use magnus::{prelude::*, Error, ExceptionClass, RArray, RClass, RModule, RString, Ruby, Symbol, Value};
use std::time::Duration;

/// Seconds given from Ruby as a `Duration`; negative, NaN or too large is a
/// ConfigurationError naming `what`.
pub(crate) fn seconds(ruby: &Ruby, what: &str, secs: f64) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        Error::new(
            ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
            format!("{what} must be a number of seconds: zero or more, and below 2**64 (got {secs})"),
        )
    })
}

/// `AceMQ::AMQP::{name}`, for a `Lazy` of the extension's: lib/acemq
/// defines it before anything reaches the engine.
pub(crate) fn amqp_const<T: magnus::TryConvert>(ruby: &Ruby, name: &str) -> T {
    ruby.class_object()
        .const_get::<_, RModule>("AceMQ")
        .and_then(|m| m.const_get::<_, RModule>("AMQP"))
        .and_then(|m| m.const_get(name))
        .unwrap_or_else(|_| panic!("AceMQ::AMQP::{name} is defined before the engine uses it"))
}

static ACK: Lazy<RClass> = Lazy::new(|ruby| amqp_const(ruby, "Ack"));
/// `AceMQ::AMQP::GEM_FRAMES`: where the gem's own frames are (lib/acemq/).
static GEM_FRAMES: Lazy<RString> = Lazy::new(|ruby| amqp_const(ruby, "GEM_FRAMES"));
static FATAL_ERROR: Lazy<ExceptionClass> = Lazy::new(|ruby| amqp_const(ruby, "FatalError"));
/// `Ack.accept`, one frozen object: what nearly every handler returns, told
/// by identity before anything is read of it.
static ACCEPT: Lazy<Value> = Lazy::new(|ruby| ruby.get_inner(&ACK).const_get("ACCEPT").expect("Ack::ACCEPT is defined"));

/// `AceMQ::AMQP::FatalError`, by the name its class has.
pub(crate) fn fatal_error_name(ruby: &Ruby) -> Result<String, Error> {
    ruby.get_inner(&FATAL_ERROR).funcall("name", ())
}

/// What a handler produced, as core's `Outcome`: the one place a Ruby result
/// is read. An `Ack` is itself, and one naming an error class (`error:`)
/// core's retry or reject because of that class (`Outcome::retry_because`); a StandardError is `Raised`, fatal for a FatalError;
/// anything else is `NotAnAck`, described. Core's `Outcome::settlement`
/// decides what each does on the broker.
pub(crate) fn outcome(ruby: &Ruby, result: Value) -> Result<Outcome, Error> {
    Ok(guarded(ruby, result)?.outcome)
}

/// `outcome`, with the verdict the idempotency guard's Ack carries (`ack`)
/// beside it: what the consumer settles, so a duplicate is reported as one.
pub(crate) fn guarded(ruby: &Ruby, result: Value) -> Result<Guarded, Error> {
    if result.is_kind_of(ruby.get_inner(&ACK)) {
        // Identity, not Ack#== (which a guard's accept with a verdict also
        // answers true).
        if result.as_raw() == ruby.get_inner(&ACCEPT).as_raw() {
            return Ok(Outcome::Ack(Ack::Accept).into());
        }
        let verdict: Option<Symbol> = result.funcall("verdict", ())?;
        let verdict = match verdict.map(|v| v.name()).transpose()?.as_deref() {
            Some("duplicate") => Some(Verdict::Duplicate),
            Some("in_progress") => Some(Verdict::InProgress),
            _ => None,
        };
        let kind: Symbol = result.funcall("kind", ())?;
        // Read as bytes and made text here: a reason in another encoding
        // (a binary body's text, "café".b) or with invalid bytes was an
        // EncodingError that ended the handler thread (issue 49's hostile
        // run: a reject became three HandlerAborted retries).
        let reason: Option<RString> = result.funcall("reason", ())?;
        let error_class: Option<RString> = result.funcall("error_class", ())?;
        let reason = reason.map(text).unwrap_or_default();
        let error_class = error_class.map(text);
        let kind = kind.name()?;
        let outcome = match (&*kind, error_class) {
            ("accept", _) => Outcome::Ack(Ack::Accept),
            ("retry", None) => Outcome::Ack(Ack::retry(reason)),
            ("reject", None) => Outcome::Ack(Ack::reject(reason)),
            ("retry", Some(class)) => Outcome::retry_because(class, reason),
            ("reject", Some(class)) => Outcome::reject_because(class, reason),
            ("wait", _) => {
                let up_to: f64 = result.funcall("up_to", ())?;
                Outcome::Wait { reason, up_to: seconds(ruby, "wait", up_to)? }
            }
            (other, _) => Outcome::NotAnAck { what: format!("an Ack of unknown kind {other:?}") },
        };
        return Ok(Guarded::new(outcome, verdict));
    }
    if result.is_kind_of(ruby.exception_standard_error()) {
        return Ok(Guarded::from(Outcome::Raised {
            class: class_name(ruby, result),
            message: message_of(result),
            fatal: result.is_kind_of(ruby.get_inner(&FATAL_ERROR)),
        })
        .with_backtrace(backtrace(ruby, result)));
    }
    Ok(Outcome::NotAnAck { what: describe(result)? }.into())
}

/// An exception's backtrace as core bounds it (`Backtrace::from_frames`),
/// without the gem's frames at its bottom (`AceMQ::AMQP::GEM_FRAMES`), which
/// are the consumer loop that called the handler. None when it has none, or
/// when reading it fails: a `backtrace` overridden to raise or to return
/// something odd costs the header, never the settlement.
fn backtrace(ruby: &Ruby, exception: Value) -> Option<Backtrace> {
    let frames: RArray = exception.funcall::<_, _, Option<RArray>>("backtrace", ()).ok().flatten()?;
    // Safe: each frame's bytes are copied before Ruby runs again.
    let bytes = |i: usize| -> Vec<u8> {
        match frames.entry::<Value>(i as isize).ok().and_then(RString::from_value) {
            Some(s) => unsafe { s.as_slice().to_vec() },
            None => b"(not a String)".to_vec(),
        }
    };
    let gem = ruby.get_inner(&GEM_FRAMES);
    let gem = unsafe { gem.as_slice() }.to_vec();
    let n = frames.len();
    // Back from the bottom over the gem's frames; a backtrace all in the
    // gem keeps them all.
    let mut keep = n;
    while keep > 0 && bytes(keep - 1).starts_with(&gem) {
        keep -= 1;
    }
    if keep == 0 {
        keep = n;
    }
    Backtrace::from_frames((0..keep).map(bytes))
}

/// The name of an exception's class as Ruby's own `Module#name` gives it
/// (an override of `name` that raises, or returns something else, is not
/// asked), or its nearest named ancestor's for an anonymous class. Never
/// fails: whatever the class does, the failure keeps a class.
fn class_name(ruby: &Ruby, exception: Value) -> String {
    let name = |class: Value| -> Option<String> {
        let module = ruby.class_module();
        let unbound: Value = module.funcall("instance_method", (ruby.to_symbol("name"),)).ok()?;
        let named: Option<RString> = unbound.funcall("bind_call", (class,)).ok()?;
        named.map(text)
    };
    let mut class: Value = exception.class().as_value();
    for _ in 0..64 {
        if let Some(n) = name(class) {
            return n;
        }
        match class.funcall::<_, _, Option<Value>>("superclass", ()) {
            Ok(Some(up)) => class = up,
            _ => break,
        }
    }
    "StandardError".into()
}

/// An exception's message as text, whatever `message` does: nil is empty,
/// a value that is not a String is its `to_s`, and one that raises says so
/// (it was a TypeError inside the settlement, and the failure then a
/// HandlerAborted without its class or message).
fn message_of(exception: Value) -> String {
    match exception.funcall::<_, _, Value>("message", ()) {
        Ok(v) if v.is_nil() => String::new(),
        Ok(v) => match RString::from_value(v) {
            Some(s) => text(s),
            None => match v.funcall::<_, _, RString>("to_s", ()) {
                Ok(s) => text(s),
                Err(_) => "(its message is not text)".into(),
            },
        },
        Err(_) => "(its message raised)".into(),
    }
}

/// A Ruby string's text, copied at once (invalid bytes replaced).
fn text(s: RString) -> String {
    // Safe: the borrowed bytes are copied before Ruby runs again.
    unsafe { s.to_string_lossy().into_owned() }
}

/// A value that is not an Ack, for the reason its reject carries:
/// `nil (NilClass)`, `:ok (Symbol)`, its inspect cut at 120 characters.
fn describe(value: Value) -> Result<String, Error> {
    let class: Option<String> = value.class().funcall("name", ())?;
    let class = class.unwrap_or_else(|| "anonymous class".into());
    // An inspect that raises must not lose the delivery: its class says enough.
    let text = match value.funcall::<_, _, RString>("inspect", ()) {
        Ok(s) => text(s),
        Err(_) => format!("#<{class}>"),
    };
    let text = match text.char_indices().nth(120) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text,
    };
    Ok(format!("{text} ({class})"))
}

/// Core's outcome as the Ruby Ack that settles with it: what the guard hands
/// back for a message it does not run, carrying the guard's verdict (Ack#verdict)
/// to the consumer that settles it (`guarded`).
pub(crate) fn ack(ruby: &Ruby, guarded: Guarded) -> Result<Value, Error> {
    let class = ruby.get_inner(&ACK);
    let verdict = guarded.verdict.map(|v| {
        ruby.to_symbol(match v {
            Verdict::Duplicate => "duplicate",
            Verdict::InProgress => "in_progress",
            _ => "guarded",
        })
    });
    let (kind, reason, error_class, up_to): (&str, Option<String>, Option<String>, Option<f64>) = match guarded.outcome {
        Outcome::Ack(Ack::Accept) if verdict.is_none() => return class.funcall("accept", ()),
        Outcome::Ack(Ack::Accept) => ("accept", None, None, None),
        Outcome::Ack(Ack::Retry { reason }) => ("retry", Some(reason), None, None),
        Outcome::Ack(Ack::Reject { reason }) => ("reject", Some(reason), None, None),
        Outcome::Raised { class, message, fatal } => (if fatal { "reject" } else { "retry" }, Some(message), Some(class), None),
        Outcome::NotAnAck { what } => ("reject", Some(what), None, None),
        Outcome::Wait { reason, up_to } => ("wait", Some(reason), None, Some(up_to.as_secs_f64())),
    };
    // Ack.new is private to Ruby callers; this is the engine building one.
    class.funcall("new", (ruby.to_symbol(kind), reason, error_class, up_to, verdict))
}

/// A Ruby object wrapping a `T`, for the methods a consumer calls once or
/// twice per delivery (`_next`, `_settle`, `_payload`): checked against the
/// type Ruby recorded for it, without magnus's conversion, which runs Ruby's
/// check under `rb_protect` (a `setjmp`) in case it raises, on every
/// delivery's path, for an object that is ours and cannot raise. Anything
/// the fast check does not recognise goes through magnus's conversion, with
/// its TypeError.
pub(crate) struct Typed<'a, T>(&'a T);

impl<T> std::ops::Deref for Typed<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0
    }
}

/// Where the Ruby type of `Self`'s objects is kept, once one has been
/// converted by magnus (and so checked by Ruby).
pub(crate) trait KnownType: magnus::TypedData {
    fn known() -> &'static std::sync::atomic::AtomicPtr<rb_sys::rb_data_type_t>;
}

impl<T: KnownType> magnus::TryConvert for Typed<'_, T> {
    fn try_convert(val: Value) -> Result<Self, Error> {
        use rb_sys::stable_api::{get_default, StableApiDefinition};
        use std::sync::atomic::Ordering;
        let api = get_default();
        let raw = val.as_raw();
        let known = T::known().load(Ordering::Relaxed);
        // SAFETY: `raw` is a live object (an argument of the method being
        // called, GVL held); its type and flags are read only after it is
        // known to be a heap object of T_DATA, its typed-data fields only
        // after `rtypeddata_p`. A type pointer equal to the one Ruby checked
        // for `T` before means the data is a `T` magnus wrapped, so the data
        // pointer is a `T` that lives as long as the object.
        unsafe {
            if !known.is_null()
                && !api.special_const_p(raw)
                && api.builtin_type(raw) == rb_sys::ruby_value_type::RUBY_T_DATA
                && api.rtypeddata_p(raw)
                && std::ptr::eq(api.rtypeddata_type(raw), known)
            {
                if let Some(t) = api.rtypeddata_get_data(raw).cast::<T>().cast_const().as_ref() {
                    return Ok(Typed(t));
                }
            }
        }
        let t = <&T as magnus::TryConvert>::try_convert(val)?;
        // SAFETY: as above; magnus has just checked this object is a `T`.
        unsafe {
            if api.rtypeddata_p(raw) {
                T::known().store(api.rtypeddata_type(raw).cast_mut(), Ordering::Relaxed);
            }
        }
        Ok(Typed(t))
    }
}
