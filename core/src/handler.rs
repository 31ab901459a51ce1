//! What `consume` runs for each message: the [`Handler`] trait, which
//! closures implement, and what a handler may return.
//!
//! A handler returns anything that converts into an [`Outcome`]: an
//! [`Ack`](crate::Ack), an `Outcome`, or a `Result` whose error says what went wrong.
//! `Err` is a failed handler in the consumer's terms: a retry with the
//! error's type name as `x-acemq-error-class` and its message in the
//! reason, or a dead-letter at once when it is marked fatal
//! ([`Failure::fatal`]). So `?` works in a handler, and the mapping from
//! errors to retries is core's, written once.
//!
//! ```no_run
//! use acemq::{Ack, ConsumeOptions, Connection, Failure, Handler, Message};
//!
//! #[derive(Debug)]
//! struct GatewayDown;
//! impl std::fmt::Display for GatewayDown {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("the payment gateway did not answer")
//!     }
//! }
//! impl std::error::Error for GatewayDown {}
//!
//! /// A handler with state of its own, borrowed for each message.
//! struct Charge {
//!     gateway: String,
//! }
//!
//! impl Handler for Charge {
//!     type Output = Result<Ack, Failure>;
//!
//!     async fn handle(&self, message: Message) -> Result<Ack, Failure> {
//!         let Some(cents) = message.payload["amount"].as_i64() else {
//!             // Never going to work: straight to the DLQ.
//!             return Ok(Ack::reject("amount missing"));
//!         };
//!         if self.gateway.is_empty() {
//!             return Err(GatewayDown.into()); // a retry, class "…::GatewayDown"
//!         }
//!         println!("charging {cents} through {}", self.gateway);
//!         Ok(Ack::accept())
//!     }
//! }
//!
//! # async fn run(mq: Connection) -> acemq::Result<()> {
//! let charges = mq.consume("payments", ConsumeOptions::default(), Charge { gateway: "stripe".into() }).await?;
//! // A closure is a handler too, returning any of the same things.
//! let audits = mq.consume("audits", ConsumeOptions::default(), |_m: Message| async { Ack::accept() }).await?;
//! # charges.cancel().await; audits.cancel().await; Ok(()) }
//! ```

use crate::ack::{Guarded, Outcome};
use crate::backtrace::Backtrace;
use crate::message::Message;
use std::future::Future;
use std::time::Duration;

/// Handles one message at a time, any number at once: `&self`, so its state
/// is shared by every worker of the consumer (put what needs `&mut` behind a
/// lock), and a named type, so a struct can hold it.
///
/// `Fn(Message) -> impl Future` closures are handlers; so is
/// [`Idempotent`](crate::idempotency::Idempotent), which wraps one.
pub trait Handler: Send + Sync + 'static {
    /// What [`Handler::handle`] returns: an [`Ack`](crate::Ack), an [`Outcome`], or a
    /// `Result<Ack, E>` (see the [module](self)). Each converts into a
    /// [`Guarded`], which keeps an error's [`Backtrace`] beside its outcome.
    type Output: Into<Guarded>;

    /// Handle one message.
    fn handle(&self, message: Message) -> impl Future<Output = Self::Output> + Send;

    /// How long this handler's idempotency claims last, when it is guarded
    /// by a store (the [`Idempotent`](crate::idempotency::Idempotent) guard
    /// answers its store's): `consume` lowers the handler deadline to it
    /// ([`ConsumeOptions::guarded_by`](crate::ConsumeOptions::guarded_by)),
    /// unless the options were guarded already. Default `None`.
    fn claim_timeout(&self) -> Option<Duration> {
        None
    }

    /// What `consume` calls: [`Handler::handle`]'s outcome, with the
    /// idempotency guard's [`Verdict`](crate::Verdict) beside it when the
    /// guard settled the message unrun ([`Guarded`]), so that the `process`
    /// event says `duplicate` or `in_progress`. The default has no verdict;
    /// the [`Idempotent`](crate::idempotency::Idempotent) guard answers its
    /// own. A handler of your own has no reason to implement it.
    fn handle_guarded(&self, message: Message) -> impl Future<Output = Guarded> + Send {
        let handling = self.handle(message);
        async move { handling.await.into() }
    }
}

impl<F, Fut> Handler for F
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: Into<Guarded>,
{
    type Output = Fut::Output;

    fn handle(&self, message: Message) -> impl Future<Output = Self::Output> + Send {
        self(message)
    }
}

/// A failed handler, from any error: what `?` turns an error into in a
/// handler returning `Result<Ack, Failure>`. It keeps the error's type
/// name (the class on the retried or dead-lettered copy) and its message;
/// [`Failure::fatal`] marks one that retrying cannot help. One made from an
/// error keeps its chain of sources as its [`Backtrace`], which the copy
/// carries as `x-acemq-backtrace`.
///
/// Like `anyhow::Error` it is not itself a `std::error::Error`, which is
/// what lets every error convert into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    class: String,
    message: String,
    fatal: bool,
    backtrace: Option<Backtrace>,
}

impl Failure {
    /// A failure with `class` and `message` of your choosing (a retry).
    pub fn new(class: impl Into<String>, message: impl Into<String>) -> Self {
        Failure { class: class.into(), message: message.into(), fatal: false, backtrace: None }
    }

    /// The same failure with `backtrace` as where it happened (the lines of
    /// your choosing: [`Backtrace::from_frames`]).
    pub fn with_backtrace(self, backtrace: Option<Backtrace>) -> Self {
        Failure { backtrace, ..self }
    }

    /// Where it happened: an error's chain of sources, or what
    /// [`Failure::with_backtrace`] gave.
    pub fn backtrace(&self) -> Option<&Backtrace> {
        self.backtrace.as_ref()
    }

    /// `error` as a fatal failure: the message is dead-lettered at once, as
    /// [`Ack::reject`](crate::Ack::reject) does, with the error's class and message on the copy.
    pub fn fatal(error: impl Into<Failure>) -> Self {
        Failure { fatal: true, ..error.into() }
    }

    /// The class: the error's type name.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The error's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Is retrying pointless?
    pub fn is_fatal(&self) -> bool {
        self.fatal
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class, self.message)
    }
}

/// The type name of `E`, as a class: `billing::GatewayDown`.
fn class_of<E: ?Sized>() -> String {
    std::any::type_name::<E>().to_owned()
}

impl<E: std::error::Error + 'static> From<E> for Failure {
    fn from(error: E) -> Self {
        let class = class_of::<E>();
        let backtrace = Some(Backtrace::of_error(&class, &error));
        Failure { class, message: error.to_string(), fatal: false, backtrace }
    }
}

/// The failure without its backtrace (an [`Outcome`] has no room for one:
/// see [`Guarded`]).
impl From<Failure> for Outcome {
    fn from(failure: Failure) -> Self {
        Outcome::Raised { class: failure.class, message: failure.message, fatal: failure.fatal }
    }
}

/// The failure with its backtrace beside it: what a handler's `Err` settles as.
impl From<Failure> for Guarded {
    fn from(mut failure: Failure) -> Self {
        let backtrace = failure.backtrace.take();
        Guarded::from(Outcome::from(failure)).with_backtrace(backtrace)
    }
}

/// As the `Outcome` of the same `Result`, with the error's backtrace.
impl<T: Into<Outcome>, E: std::error::Error + 'static> From<Result<T, E>> for Guarded {
    fn from(result: Result<T, E>) -> Self {
        result.map_or_else(|e| Failure::from(e).into(), |ok| Guarded::from(ok.into()))
    }
}

/// As the `Outcome` of the same `Result`, with the failure's backtrace.
impl<T: Into<Outcome>> From<Result<T, Failure>> for Guarded {
    fn from(result: Result<T, Failure>) -> Self {
        result.map_or_else(Into::into, |ok| Guarded::from(ok.into()))
    }
}

/// `Ok` is what it holds; `Err` is a retry with the error's type name as
/// the class (never fatal: return a [`Failure`] to mark one).
impl<T: Into<Outcome>, E: std::error::Error + 'static> From<Result<T, E>> for Outcome {
    fn from(result: Result<T, E>) -> Self {
        result.map_or_else(|e| Failure::from(e).into(), Into::into)
    }
}

/// `Ok` is what it holds; `Err` is the failure, fatal or not.
impl<T: Into<Outcome>> From<Result<T, Failure>> for Outcome {
    fn from(result: Result<T, Failure>) -> Self {
        result.map_or_else(Into::into, Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ack::{Ack, Settlement};

    // Any error type will do; this one's name and message are known.
    use std::fmt::Error as GatewayDown;

    #[test]
    fn an_error_is_a_retry_named_by_its_type_and_a_fatal_one_a_reject() {
        let typed: Outcome = Err::<Ack, _>(GatewayDown).into();
        let class = "core::fmt::Error".to_owned();
        let reason = format!("{class}: {GatewayDown}");
        assert_eq!(typed.settlement(), Settlement::Retry { reason: reason.clone(), error_class: Some(class.clone()) });
        let fatal: Outcome = Err::<Ack, _>(Failure::fatal(GatewayDown)).into();
        assert_eq!(fatal.settlement(), Settlement::Reject { reason, error_class: Some(class) });
        let named: Outcome = Err::<Ack, Failure>(Failure::fatal(Failure::new("BadOrder", "no amount"))).into();
        assert!(matches!(named.settlement(), Settlement::Reject { reason, .. } if reason == "BadOrder: no amount"));
    }

    #[test]
    fn ok_is_what_it_holds() {
        assert_eq!(Outcome::from(Ok::<_, Failure>(Ack::retry("later"))), Outcome::Ack(Ack::retry("later")));
        assert_eq!(Outcome::from(Ok::<_, GatewayDown>(Outcome::Ack(Ack::Accept))), Outcome::Ack(Ack::Accept));
    }

    fn question_mark(fail: bool) -> Result<Ack, Failure> {
        let parsed: Result<u8, std::num::ParseIntError> = if fail { "x".parse() } else { "1".parse() };
        parsed?;
        Ok(Ack::accept())
    }

    #[test]
    fn question_mark_converts_any_error() {
        let outcome: Outcome = question_mark(true).into();
        assert!(matches!(outcome, Outcome::Raised { ref class, fatal: false, .. } if class == "core::num::error::ParseIntError"));
        assert_eq!(Outcome::from(question_mark(false)), Outcome::Ack(Ack::Accept));
    }
}
