//! A consumer's `circuit_breaker:` as core's `CircuitBreaker`. Ruby checks
//! the keys and matches a handler's exception against `on:` and `ignore:`
//! itself, on the handler's thread (lib/acemq/amqp/circuit_breaker.rb), and
//! tells core the answer with the settlement (`Guarded::counts`); what is
//! left here is the failures that are not exceptions: `:retry` (Ack.retry)
//! and `:timeout` (an overrun), which core meets where no Ruby runs (a
//! deadline is settled on the runtime).

use crate::convert::seconds;
use acemq::{CircuitBreaker, Failed};
use magnus::{Error, Ruby};

/// What Ruby sends: [failures, within, pause, probe (nil: core's default),
/// the kinds `on:` names (nil: no `on:`), the kinds `ignore:` names].
pub(crate) type Spec = (u32, f64, f64, Option<f64>, Option<Vec<String>>, Vec<String>);

/// Whether `failed` is one of `kinds` ("retry", "timeout"). A raise never
/// is: Ruby decided it.
fn of_kind(kinds: &[String], failed: &Failed<'_>) -> bool {
    match failed {
        Failed::Retry { .. } => kinds.iter().any(|k| k == "retry"),
        Failed::Timeout => kinds.iter().any(|k| k == "timeout"),
        _ => false,
    }
}

/// The breaker `spec` describes; core checks the values.
pub(crate) fn circuit_breaker(ruby: &Ruby, spec: Spec) -> Result<CircuitBreaker, Error> {
    let (failures, within, pause, probe, on, ignore) = spec;
    let mut b = CircuitBreaker::new(failures, seconds(ruby, "circuit_breaker within", within)?, seconds(ruby, "circuit_breaker pause", pause)?);
    if let Some(probe) = probe {
        b = b.probe(seconds(ruby, "circuit_breaker probe", probe)?);
    }
    if let Some(on) = on {
        b = b.on(move |f| of_kind(&on, f));
    }
    if !ignore.is_empty() {
        b = b.ignore(move |f| of_kind(&ignore, f));
    }
    Ok(b)
}
