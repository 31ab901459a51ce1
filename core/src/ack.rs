//! What a handler says about a message, and what the consumer does about it.

use crate::backtrace::Backtrace;

/// A handler's verdict on one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// Handled. The delivery is acknowledged and the message is gone.
    Accept,
    /// Not handled this time: try again after the next rung's delay, or
    /// dead-letter it when the attempts are used up.
    Retry {
        /// Why, kept on the message as `x-acemq-reason`.
        reason: String,
    },
    /// Never going to work: dead-letter it to `{queue}.dlq` at once.
    Reject {
        /// Why, kept on the dead-lettered copy as `x-acemq-reason`.
        reason: String,
    },
}

impl Ack {
    /// `Ack::Accept`.
    pub fn accept() -> Self {
        Ack::Accept
    }
    /// `Ack::Retry` with a reason.
    pub fn retry(reason: impl Into<String>) -> Self {
        Ack::Retry { reason: reason.into() }
    }
    /// `Ack::Reject` with a reason.
    pub fn reject(reason: impl Into<String>) -> Self {
        Ack::Reject { reason: reason.into() }
    }
    /// Is this an accept?
    pub fn is_accept(&self) -> bool {
        matches!(self, Ack::Accept)
    }
    /// Is this a retry?
    pub fn is_retry(&self) -> bool {
        matches!(self, Ack::Retry { .. })
    }
    /// Is this a reject?
    pub fn is_reject(&self) -> bool {
        matches!(self, Ack::Reject { .. })
    }
    /// The reason, for retry and reject.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Ack::Accept => None,
            Ack::Retry { reason } | Ack::Reject { reason } => Some(reason),
        }
    }
}

/// Everything a handler can produce, including the ways it can fail. The
/// consumer turns this into a [`Settlement`] with [`Outcome::settlement`]:
/// that mapping is the one place the rules live, for Rust and Ruby alike.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The handler returned an [`Ack`].
    Ack(Ack),
    /// The handler failed: raised, returned an error, panicked.
    /// `fatal` is true for an error that says retrying cannot help (the
    /// Ruby layer sets it for `AceMQ::AMQP::FatalError` and its subclasses).
    Raised {
        /// The error's class or type name.
        class: String,
        /// The error's message.
        message: String,
        /// A fatal error is a reject; any other is a retry.
        fatal: bool,
    },
    /// The handler returned something that is not an Ack; `what` describes it.
    NotAnAck {
        /// A description of the value, e.g. `nil` or `"ok" (String)`.
        what: String,
    },
    /// Not now, and not the message's fault: another handler holds its
    /// idempotency claim. It goes round the ladder without spending an
    /// attempt, for at most `up_to` (the store's claim timeout, after which
    /// the claim is taken over and the message runs); past that it is an
    /// ordinary retry. The idempotent guard is what produces it.
    Wait {
        /// Why, kept on the copy as `x-acemq-reason`.
        reason: String,
        /// How long waiting may go on in all.
        up_to: std::time::Duration,
    },
}

/// What the idempotency guard decided about a delivery it settled without
/// running the handler, when that is not what its [`Outcome`] alone says:
/// the `process` event names the settlement by it (`duplicate` rather than
/// `accepted`, `in_progress` rather than `retried`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Its key was confirmed: accepted unrun.
    Duplicate,
    /// Its key is claimed by a handler that has not finished: sent round
    /// again unrun.
    InProgress,
}

/// An [`Outcome`] with the guard's [`Verdict`] travelling beside it, from
/// the guard to the settlement ([`Consumer::settle_guarded`](crate::Consumer::settle_guarded),
/// [`Handler::handle_guarded`](crate::Handler::handle_guarded)): the
/// verdict goes with the delivery it is about, never through a table.
///
/// A failure's [`Backtrace`] travels beside it the same way, from the
/// handler (a [`Failure`](crate::Failure) made from an error, a Ruby
/// exception) to the copy's `x-acemq-backtrace`.
///
/// Beside, not inside: `Outcome` is matched exhaustively outside this crate,
/// so a variant for it would break those matches, and a field on
/// `Outcome::Raised` every construction of it; an `Outcome` converts into a
/// `Guarded` with no verdict and no backtrace, so every path that settles
/// an `Outcome` goes on doing so.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Guarded {
    /// What settles the delivery.
    pub outcome: Outcome,
    /// What the guard decided, when it settled the delivery unrun.
    pub verdict: Option<Verdict>,
    /// Whether its failure counts toward the consumer's circuit breaker,
    /// when the side that holds the error decided (a Ruby exception is
    /// matched against `on:` and `ignore:` on the handler's thread). None:
    /// the breaker's own predicates decide ([`CircuitBreaker::counts`](crate::CircuitBreaker::counts)).
    pub counts: Option<bool>,
    /// Where the failure happened, for an [`Outcome::Raised`] that says:
    /// written on its copy as `x-acemq-backtrace` (and ignored for any other
    /// outcome).
    pub backtrace: Option<Backtrace>,
}

impl Guarded {
    /// The same, with whether its failure counts toward the circuit breaker
    /// (see [`Guarded::counts`]).
    pub fn counting(self, counts: Option<bool>) -> Self {
        Guarded { counts, ..self }
    }

    /// `outcome` with the guard's `verdict`.
    pub fn new(outcome: Outcome, verdict: Option<Verdict>) -> Self {
        Guarded { outcome, verdict, counts: None, backtrace: None }
    }

    /// The same, with the failure's backtrace beside it.
    pub fn with_backtrace(self, backtrace: Option<Backtrace>) -> Self {
        Guarded { backtrace, ..self }
    }
}

impl From<Outcome> for Guarded {
    fn from(outcome: Outcome) -> Self {
        Guarded { outcome, verdict: None, counts: None, backtrace: None }
    }
}

impl From<Ack> for Guarded {
    fn from(ack: Ack) -> Self {
        Outcome::Ack(ack).into()
    }
}

/// What the consumer does on the broker for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Acknowledge.
    Accept,
    /// Copy to the next rung (or the DLQ past the last attempt), then acknowledge.
    Retry {
        /// Why.
        reason: String,
        /// The error class, when an error caused it.
        error_class: Option<String>,
    },
    /// Copy to the DLQ, then acknowledge.
    Reject {
        /// Why.
        reason: String,
        /// The error class, when an error caused it.
        error_class: Option<String>,
    },
    /// Copy to a rung without counting an attempt (see [`Outcome::Wait`]),
    /// then acknowledge; a retry once `up_to` has passed since the first wait.
    Wait {
        /// Why.
        reason: String,
        /// How long waiting may go on in all.
        up_to: std::time::Duration,
    },
}

impl Outcome {
    /// A retry that names the error class that caused it: kept on the copy
    /// as `x-acemq-error-class` (and in the events' `error_class`), with
    /// `"{error_class}: {reason}"` as its reason. It is what an error of that
    /// class raised is ([`Outcome::Raised`], not fatal), and settles the same.
    ///
    /// An [`Ack`] carries no error class: a field on `Ack::Retry { reason }`
    /// would break every pattern and construction of it outside this crate,
    /// so a retry with a class is this outcome instead (the Ruby gem's
    /// `Ack.retry(reason, error:)` is read as it).
    pub fn retry_because(error_class: impl Into<String>, reason: impl Into<String>) -> Self {
        Outcome::Raised { class: error_class.into(), message: reason.into(), fatal: false }
    }

    /// A reject that names the error class that caused it: to the DLQ at
    /// once, with the class as `x-acemq-error-class`; what a fatal error of
    /// that class raised is. See [`Outcome::retry_because`] for why this is
    /// an `Outcome` and not a field on [`Ack::Reject`].
    pub fn reject_because(error_class: impl Into<String>, reason: impl Into<String>) -> Self {
        Outcome::Raised { class: error_class.into(), message: reason.into(), fatal: true }
    }

    /// The rules: an Ack is itself; a raised error is a retry with its class
    /// and message as the reason, unless it is fatal, which is a reject;
    /// anything that is not an Ack is a reject that names what it was.
    pub fn settlement(self) -> Settlement {
        match self {
            Outcome::Ack(Ack::Accept) => Settlement::Accept,
            Outcome::Ack(Ack::Retry { reason }) => Settlement::Retry { reason, error_class: None },
            Outcome::Ack(Ack::Reject { reason }) => Settlement::Reject { reason, error_class: None },
            Outcome::Raised { class, message, fatal } => {
                let reason = format!("{class}: {message}");
                if fatal {
                    Settlement::Reject { reason, error_class: Some(class) }
                } else {
                    Settlement::Retry { reason, error_class: Some(class) }
                }
            }
            Outcome::NotAnAck { what } => Settlement::Reject {
                reason: format!("handler returned {what}, not an Ack: return an accept, a retry or a reject (each with its reason)"),
                error_class: None,
            },
            Outcome::Wait { reason, up_to } => Settlement::Wait { reason, up_to },
        }
    }
}

impl From<Ack> for Outcome {
    fn from(ack: Ack) -> Self {
        Outcome::Ack(ack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_is_retry_and_fatal_is_reject() {
        let r = Outcome::Raised { class: "RuntimeError".into(), message: "boom".into(), fatal: false };
        assert_eq!(
            r.settlement(),
            Settlement::Retry { reason: "RuntimeError: boom".into(), error_class: Some("RuntimeError".into()) }
        );
        let f = Outcome::Raised { class: "BadOrder".into(), message: "no".into(), fatal: true };
        assert!(matches!(f.settlement(), Settlement::Reject { .. }));
    }

    #[test]
    fn a_retry_or_reject_because_of_a_class_carries_it() {
        assert_eq!(
            Outcome::retry_because("ArgumentError", "bad amount").settlement(),
            Settlement::Retry { reason: "ArgumentError: bad amount".into(), error_class: Some("ArgumentError".into()) }
        );
        assert_eq!(
            Outcome::reject_because("BadOrder", "no such order").settlement(),
            Settlement::Reject { reason: "BadOrder: no such order".into(), error_class: Some("BadOrder".into()) }
        );
    }

    #[test]
    fn not_an_ack_is_reject_naming_the_value() {
        match (Outcome::NotAnAck { what: "nil".into() }).settlement() {
            Settlement::Reject { reason, .. } => assert!(reason.contains("nil")),
            other => panic!("{other:?}"),
        }
    }
}
