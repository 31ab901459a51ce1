//! Core errors become the Ruby classes declared in lib/acemq/errors.rb,
//! looked up once and mapped in one function.

use acemq::ErrorKind;
use magnus::value::Lazy;
use magnus::{prelude::*, Error, ExceptionClass, RModule, Ruby};

fn class(ruby: &Ruby, name: &str) -> ExceptionClass {
    let amqp: RModule = ruby
        .class_object()
        .const_get::<_, RModule>("AceMQ")
        .and_then(|m| m.const_get("AMQP"))
        .expect("lib/acemq/errors.rb is loaded before the extension");
    amqp.const_get(name).unwrap_or_else(|_| panic!("AceMQ::AMQP::{name} is defined in lib/acemq/errors.rb"))
}

macro_rules! error_class {
    ($static:ident, $name:literal) => {
        pub(crate) static $static: Lazy<ExceptionClass> = Lazy::new(|ruby| class(ruby, $name));
    };
}

error_class!(ERROR, "Error");
error_class!(CONFIGURATION_ERROR, "ConfigurationError");
pub(crate) use self::CONFIGURATION_ERROR as CONFIGURATION_ERROR_CLASS;
error_class!(INVALID_URL, "InvalidURL");
error_class!(CONNECTION_FAILED, "ConnectionFailed");
error_class!(TLS_ERROR, "TLSError");
error_class!(AUTHENTICATION_FAILED, "AuthenticationFailed");
error_class!(CONNECTION_CLOSED, "ConnectionClosed");
error_class!(BROKER_ERROR, "BrokerError");
error_class!(NOT_FOUND, "NotFound");
error_class!(PRECONDITION_FAILED, "PreconditionFailed");
error_class!(ACCESS_REFUSED, "AccessRefused");
error_class!(UNROUTABLE, "Unroutable");
error_class!(PUBLISH_NACKED, "PublishNacked");
error_class!(TIMEOUT, "TimeoutError");
error_class!(ENCODING_ERROR, "EncodingError");
error_class!(STORE_ERROR, "StoreError");
error_class!(BLOCKED, "Blocked");
error_class!(REMOTE_ERROR, "RemoteError");

/// Make sure every class exists now, at require time, rather than at the
/// first error.
pub fn init(ruby: &Ruby) -> Result<(), Error> {
    for l in [
        &ERROR, &CONFIGURATION_ERROR, &INVALID_URL, &CONNECTION_FAILED, &TLS_ERROR, &AUTHENTICATION_FAILED, &CONNECTION_CLOSED,
        &BROKER_ERROR, &NOT_FOUND, &PRECONDITION_FAILED, &ACCESS_REFUSED, &UNROUTABLE, &PUBLISH_NACKED, &TIMEOUT,
        &ENCODING_ERROR, &STORE_ERROR, &BLOCKED, &REMOTE_ERROR,
    ] {
        Lazy::force(l, ruby);
    }
    Ok(())
}

/// The Ruby exception for a core error.
pub fn to_ruby(ruby: &Ruby, e: acemq::Error) -> Error {
    let class = match e.kind() {
        ErrorKind::InvalidUrl => &INVALID_URL,
        ErrorKind::ConnectionFailed => &CONNECTION_FAILED,
        ErrorKind::Tls => &TLS_ERROR,
        ErrorKind::AuthenticationFailed => &AUTHENTICATION_FAILED,
        ErrorKind::Closed => &CONNECTION_CLOSED,
        ErrorKind::Broker { reply_code: 404 } => &NOT_FOUND,
        ErrorKind::Broker { reply_code: 406 } => &PRECONDITION_FAILED,
        ErrorKind::Broker { reply_code: 403 } => &ACCESS_REFUSED,
        ErrorKind::Broker { .. } => &BROKER_ERROR,
        ErrorKind::Unroutable => &UNROUTABLE,
        ErrorKind::Nacked => &PUBLISH_NACKED,
        ErrorKind::Timeout => &TIMEOUT,
        ErrorKind::Encoding => &ENCODING_ERROR,
        ErrorKind::InvalidArgument => &CONFIGURATION_ERROR,
        ErrorKind::Store => &STORE_ERROR,
        ErrorKind::Blocked => &BLOCKED,
        ErrorKind::Remote => &REMOTE_ERROR,
        _ => &ERROR,
    };
    if let Some(remote) = e.remote() {
        return remote_error(ruby, ruby.get_inner(class), remote);
    }
    let class = ruby.get_inner(class);
    match class.new_instance((e.to_string(),)) {
        Ok(exc) => {
            if let Some(code) = e.reply_code() {
                let _: Result<magnus::Value, _> = exc.funcall("instance_variable_set", ("@reply_code", code));
            }
            Error::from(exc)
        }
        Err(_) => Error::new(class, e.to_string()),
    }
}

/// A request's error reply as `RemoteError`: its message the responder's
/// own, with `remote_class` and `remote_backtrace` (Connection#request puts
/// those frames at the top of its backtrace).
fn remote_error(ruby: &Ruby, class: ExceptionClass, remote: &acemq::RemoteFailure) -> Error {
    let frames = ruby.ary_new();
    for line in remote.backtrace().map(|b| b.as_str().lines().collect::<Vec<_>>()).unwrap_or_default() {
        let _ = frames.push(line);
    }
    match class.new_instance((remote.message(),)) {
        Ok(exc) => {
            let _: Result<magnus::Value, _> = exc.funcall("instance_variable_set", ("@remote_class", remote.class()));
            let _: Result<magnus::Value, _> = exc.funcall("instance_variable_set", ("@remote_backtrace", frames));
            Error::from(exc)
        }
        Err(_) => Error::new(class, remote.message().to_owned()),
    }
}

/// The Ruby exception object for a core error, to hand over rather than raise.
pub fn exception(ruby: &Ruby, e: acemq::Error) -> magnus::Value {
    to_ruby(ruby, e).value().unwrap_or_else(|| ruby.qnil().as_value())
}

/// `Result<T, acemq::Error>` into a Ruby-raising result.
pub trait IntoRuby<T> {
    fn rb(self, ruby: &Ruby) -> Result<T, Error>;
}

impl<T> IntoRuby<T> for acemq::Result<T> {
    fn rb(self, ruby: &Ruby) -> Result<T, Error> {
        self.map_err(|e| to_ruby(ruby, e))
    }
}
