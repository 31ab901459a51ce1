//! Ruby <-> core value conversions that more than one class's file needs:
//! seconds as a `Duration`, the `AceMQ::AMQP` constants lib/acemq defines,
//! and a handler's result as core's `Outcome` (and back, as the Ack the
//! guard hands out). Each class's own fields stay in its file.

use acemq::{Ack, Outcome};
use magnus::value::Lazy;
use magnus::{prelude::*, Error, ExceptionClass, RClass, RModule, RString, Ruby, Symbol, Value};
use std::time::Duration;

/// Seconds given from Ruby as a `Duration`; negative, NaN or too large is a
/// ConfigurationError naming `what`.
pub(crate) fn seconds(ruby: &Ruby, what: &str, secs: f64) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        Error::new(
            ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
            format!("{what} must be a number of seconds, zero or more (got {secs})"),
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
static FATAL_ERROR: Lazy<ExceptionClass> = Lazy::new(|ruby| amqp_const(ruby, "FatalError"));
/// `Ack.accept`, one frozen object: what nearly every handler returns, told
/// by identity before anything is read of it.
static ACCEPT: Lazy<Value> = Lazy::new(|ruby| ruby.get_inner(&ACK).const_get("ACCEPT").expect("Ack::ACCEPT is defined"));

/// `AceMQ::AMQP::FatalError`, by the name its class has.
pub(crate) fn fatal_error_name(ruby: &Ruby) -> Result<String, Error> {
    ruby.get_inner(&FATAL_ERROR).funcall("name", ())
}

/// What a handler produced, as core's `Outcome`: the one place a Ruby result
/// is read. An `Ack` is itself (one naming an error class is what that error
/// raised would be); a StandardError is `Raised`, fatal for a FatalError;
/// anything else is `NotAnAck`, described. Core's `Outcome::settlement`
/// decides what each does on the broker.
pub(crate) fn outcome(ruby: &Ruby, result: Value) -> Result<Outcome, Error> {
    if result.is_kind_of(ruby.get_inner(&ACK)) {
        // rb_equal answers identity before calling Ack#==.
        if result.equal(ruby.get_inner(&ACCEPT))? {
            return Ok(Outcome::Ack(Ack::Accept));
        }
        let kind: Symbol = result.funcall("kind", ())?;
        let reason: Option<String> = result.funcall("reason", ())?;
        let error_class: Option<String> = result.funcall("error_class", ())?;
        let reason = reason.unwrap_or_default();
        let kind = kind.name()?;
        return Ok(match (&*kind, error_class) {
            ("accept", _) => Outcome::Ack(Ack::Accept),
            ("retry", None) => Outcome::Ack(Ack::retry(reason)),
            ("reject", None) => Outcome::Ack(Ack::reject(reason)),
            ("retry", Some(class)) => Outcome::Raised { class, message: reason, fatal: false },
            ("reject", Some(class)) => Outcome::Raised { class, message: reason, fatal: true },
            ("wait", _) => {
                let up_to: f64 = result.funcall("up_to", ())?;
                Outcome::Wait { reason, up_to: seconds(ruby, "wait", up_to)? }
            }
            (other, _) => Outcome::NotAnAck { what: format!("an Ack of unknown kind {other:?}") },
        });
    }
    if result.is_kind_of(ruby.exception_standard_error()) {
        let class: Option<String> = result.class().funcall("name", ())?;
        let message: RString = result.funcall("message", ())?;
        return Ok(Outcome::Raised {
            class: class.unwrap_or_else(|| "StandardError".into()),
            message: text(message),
            fatal: result.is_kind_of(ruby.get_inner(&FATAL_ERROR)),
        });
    }
    Ok(Outcome::NotAnAck { what: describe(result)? })
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
/// back for a message it does not run.
pub(crate) fn ack(ruby: &Ruby, outcome: Outcome) -> Result<Value, Error> {
    let class = ruby.get_inner(&ACK);
    let (kind, reason, error_class, up_to): (&str, Option<String>, Option<String>, Option<f64>) = match outcome {
        Outcome::Ack(Ack::Accept) => return class.funcall("accept", ()),
        Outcome::Ack(Ack::Retry { reason }) => ("retry", Some(reason), None, None),
        Outcome::Ack(Ack::Reject { reason }) => ("reject", Some(reason), None, None),
        Outcome::Raised { class, message, fatal } => (if fatal { "reject" } else { "retry" }, Some(message), Some(class), None),
        Outcome::NotAnAck { what } => ("reject", Some(what), None, None),
        Outcome::Wait { reason, up_to } => ("wait", Some(reason), None, Some(up_to.as_secs_f64())),
    };
    // Ack.new is private to Ruby callers; this is the engine building one.
    class.funcall("new", (ruby.to_symbol(kind), reason, error_class, up_to))
}
