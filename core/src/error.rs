//! One error type for the crate, with a kind that says what went wrong and a
//! message that says what to do about it.

use crate::backtrace::Backtrace;
use std::fmt;

/// What went wrong. Match on it; new kinds may be added.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The URL is not `amqp://`, `amqps://` or `memory://`, or does not parse.
    InvalidUrl,
    /// The broker could not be reached within the connect timeout.
    ConnectionFailed,
    /// An `amqps://` connection failed in TLS: the broker's certificate was
    /// not trusted, had expired or named another host, or the broker refused
    /// ours. Dialling again will not help until a setting or a certificate
    /// changes; the message says which.
    Tls,
    /// The broker refused the credentials (AMQP 403 on connect).
    AuthenticationFailed,
    /// The connection or channel is closed.
    Closed,
    /// The broker answered a method with a channel or connection error.
    Broker {
        /// The AMQP reply code (404, 406, 403, ...).
        reply_code: u16,
    },
    /// The broker negatively acknowledged a publish (nack): it was not stored.
    Nacked,
    /// A mandatory publish matched no queue: the broker returned it. Nothing
    /// was stored; bind a queue or check the routing key.
    Unroutable,
    /// A broker round trip did not finish within its timeout.
    Timeout,
    /// A payload could not be serialized, or a body is not JSON.
    Encoding,
    /// An argument was invalid (bad retry policy, empty queue name, ...).
    InvalidArgument,
    /// A store (idempotency, outbox) or its SQL connection failed.
    Store,
    /// A handler's result could not be used.
    Handler,
    /// The broker is blocking publishers on this connection (a memory or
    /// disk alarm) and did not lift it within the publish's deadline.
    /// Nothing was sent.
    Blocked,
    /// A request's responder failed (its handler raised, returned an error
    /// or rejected the request) and sent back an error reply:
    /// [`Error::remote`] has its class, message and first frames.
    Remote,
}

/// The crate's error: a [`ErrorKind`] and a lowercase message.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// What the responder sent back, for [`ErrorKind::Remote`]: boxed, so
    /// every other error stays two words bigger at most.
    remote: Option<Box<RemoteFailure>>,
}

/// What a failed responder sent back in its error reply: the requester's
/// [`Error::remote`] when its kind is [`ErrorKind::Remote`].
///
/// Read from headers any publisher can set, so each field is only what
/// could be read as text, bounded: a class that is not a string is None, a
/// message or class past its limit is cut, and the backtrace is bounded
/// again here ([`Backtrace`]'s 20 frames and 4 KiB), whatever was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFailure {
    pub(crate) class: Option<String>,
    pub(crate) message: String,
    pub(crate) backtrace: Option<Backtrace>,
}

impl RemoteFailure {
    /// The responder's error class (`RuntimeError`, `billing::GatewayDown`);
    /// None when its handler rejected the request itself (`Ack::reject`),
    /// or the reply named none.
    pub fn class(&self) -> Option<&str> {
        self.class.as_deref()
    }

    /// The error's message, or the handler's reason.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The responder's first frames, innermost first, when it sent any.
    pub fn backtrace(&self) -> Option<&Backtrace> {
        self.backtrace.as_ref()
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with `message` (lowercase, saying what to do).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), remote: None }
    }

    /// A request's error reply (see [`ErrorKind::Remote`]).
    pub(crate) fn remote_failure(message: impl Into<String>, failure: RemoteFailure) -> Self {
        Self { kind: ErrorKind::Remote, message: message.into(), remote: Some(Box::new(failure)) }
    }

    /// What the responder sent back, when a request's responder failed
    /// ([`ErrorKind::Remote`]): its error's class, message and backtrace.
    pub fn remote(&self) -> Option<&RemoteFailure> {
        self.remote.as_deref()
    }

    /// A request's responder failed (see [`ErrorKind::Remote`]).
    pub fn is_remote(&self) -> bool {
        self.kind == ErrorKind::Remote
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The AMQP reply code, when the broker sent one.
    pub fn reply_code(&self) -> Option<u16> {
        match self.kind {
            ErrorKind::Broker { reply_code } => Some(reply_code),
            ErrorKind::AuthenticationFailed => Some(403),
            _ => None,
        }
    }

    /// An argument the engine refuses (a name past 255 bytes, a setting
    /// that cannot work): a bug in the caller, not the broker.
    pub fn is_invalid_argument(&self) -> bool {
        self.kind == ErrorKind::InvalidArgument
    }

    /// The broker said the exchange or queue does not exist (404).
    pub fn is_not_found(&self) -> bool {
        self.reply_code() == Some(404)
    }

    /// The broker said a declaration conflicts with an existing one (406).
    pub fn is_precondition_failed(&self) -> bool {
        matches!(self.kind, ErrorKind::Broker { reply_code: 406 })
    }

    /// The connection could not be made or was lost.
    pub fn is_connection(&self) -> bool {
        matches!(self.kind, ErrorKind::ConnectionFailed | ErrorKind::Tls | ErrorKind::Closed | ErrorKind::Timeout)
    }

    /// An `amqps://` connection failed in TLS (see [`ErrorKind::Tls`]).
    pub fn is_tls(&self) -> bool {
        self.kind == ErrorKind::Tls
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn closed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Closed, message)
    }

    pub(crate) fn store(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Store, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::new(ErrorKind::Encoding, format!("payload is not valid JSON: {e}"))
    }
}
