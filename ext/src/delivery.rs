//! AceMQ::AMQP::NativeDelivery: one delivery as a Ruby handler reads it, and
//! the one function that turns what a handler produced back into core's
//! `Outcome`.
//!
//! A delivery crosses into Ruby as this object, not as values by position:
//! lib/acemq/amqp/message.rb reads it through its readers, and each reader
//! converts only its own field, when it is first asked for. The payload is
//! parsed once: core checks that the body is JSON (it decides whether a
//! delivery is a message at all) without building anything, and the first
//! `payload` read builds Ruby objects straight from the bytes (Message keeps
//! them). A handler that never reads it, such as a duplicate the idempotent
//! guard settles unrun, never pays for it.

use acemq::{Ack, Body, Message, Outcome};
use magnus::value::Lazy;
use magnus::{method, prelude::*, Error, ExceptionClass, RClass, RHash, RModule, RString, Ruby, Symbol, Value};

#[magnus::wrap(class = "AceMQ::AMQP::NativeDelivery", free_immediately, size)]
pub struct RbDelivery {
    tag: u64,
    message: Message,
    /// The body as it arrived (shared with the delivery core settles, not
    /// copied), checked to be JSON by core and built into Ruby objects only
    /// when read (`json::body_to_ruby`).
    body: Body,
}

impl RbDelivery {
    pub(crate) fn new(tag: u64, message: Message, body: Body) -> Self {
        RbDelivery { tag, message, body }
    }

    pub(crate) fn tag(&self) -> u64 {
        self.tag
    }

    /// The payload as Ruby objects, as `JSON.parse` would build them. A new
    /// object every call: Message keeps the first.
    fn payload(ruby: &Ruby, rb_self: &Self) -> Result<Value, Error> {
        let props = &rb_self.message.delivery.properties;
        if props.content_encoding.is_some() {
            // gzip or deflate: core has read it decompressed; so does this
            // (never an error: core hands a delivery out only once it reads).
            let body = acemq::decoded_body(props, rb_self.body.as_ref()).map_err(|e| crate::json::not_json(ruby, e))?;
            let text = std::str::from_utf8(&body).map_err(|e| crate::json::not_json(ruby, e))?;
            return crate::json::body_to_ruby(ruby, text);
        }
        // Never None: core hands a delivery out only once its body is JSON.
        let Some(text) = rb_self.body.text() else { return Err(crate::json::not_json(ruby, "invalid UTF-8")) };
        crate::json::body_to_ruby(ruby, text)
    }

    /// The envelope id, nil for a foreign message without one.
    fn id(&self) -> Option<String> {
        let id = &self.message.envelope.id;
        (!id.is_empty()).then(|| id.clone())
    }

    fn kind(&self) -> Option<String> {
        self.message.envelope.kind.clone()
    }

    fn origin(&self) -> Option<String> {
        self.message.envelope.origin.clone()
    }

    /// Seconds since the epoch, nil when the publisher set none.
    fn timestamp(&self) -> Option<u64> {
        self.message.envelope.timestamp
    }

    fn attempt(&self) -> u32 {
        self.message.envelope.attempt
    }

    /// The application headers (no `x-acemq-*` envelope ones), a new Hash.
    fn headers(ruby: &Ruby, rb_self: &Self) -> Result<Value, Error> {
        let h = crate::json::map_to_ruby(ruby, &rb_self.message.envelope.headers)?;
        binary_headers(ruby, &rb_self.message.delivery.properties, h)
    }

    /// Every AMQP property as a Hash of Symbol to value (nil where unset),
    /// `headers` with every header as it arrived, the envelope's included.
    /// lib/acemq/amqp/properties.rb makes it an `AceMQ::AMQP::Properties`.
    fn properties(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        let p = &rb_self.message.delivery.properties;
        let h = ruby.hash_new();
        h.aset(ruby.to_symbol("content_type"), p.content_type.as_deref())?;
        h.aset(ruby.to_symbol("content_encoding"), p.content_encoding.as_deref())?;
        let headers = binary_headers(ruby, p, crate::json::map_to_ruby(ruby, p.headers())?)?;
        h.aset(ruby.to_symbol("headers"), headers)?;
        h.aset(ruby.to_symbol("delivery_mode"), p.delivery_mode)?;
        h.aset(ruby.to_symbol("priority"), p.priority)?;
        h.aset(ruby.to_symbol("correlation_id"), p.correlation_id.as_deref())?;
        h.aset(ruby.to_symbol("reply_to"), p.reply_to.as_deref())?;
        h.aset(ruby.to_symbol("expiration"), p.expiration.as_deref())?;
        h.aset(ruby.to_symbol("message_id"), p.message_id.as_deref())?;
        h.aset(ruby.to_symbol("timestamp"), p.timestamp)?;
        h.aset(ruby.to_symbol("type"), p.kind.as_deref())?;
        h.aset(ruby.to_symbol("user_id"), p.user_id.as_deref())?;
        h.aset(ruby.to_symbol("app_id"), p.app_id.as_deref())?;
        h.aset(ruby.to_symbol("cluster_id"), p.cluster_id.as_deref())?;
        Ok(h)
    }

    fn queue(&self) -> String {
        self.message.delivery.queue.clone()
    }

    fn exchange(&self) -> String {
        self.message.delivery.exchange.clone()
    }

    fn routing_key(&self) -> String {
        self.message.delivery.routing_key.clone()
    }

    fn redelivered(&self) -> bool {
        self.message.delivery.redelivered
    }
}

/// `headers` (a Ruby Hash converted from JSON) with each header that arrived
/// as an AMQP byte array replaced by its bytes as a binary (ASCII-8BIT)
/// String: JSON has no bytes, and as text they would be U+FFFD wherever they
/// are not UTF-8. Top-level headers only (core's `byte_array_headers`).
fn binary_headers(ruby: &Ruby, props: &acemq::Props, headers: Value) -> Result<Value, Error> {
    let names = props.byte_array_headers();
    if names.is_empty() {
        return Ok(headers);
    }
    let Some(hash) = RHash::from_value(headers) else { return Ok(headers) };
    for name in names {
        if hash.get(name.as_str()).is_none() {
            continue; // an envelope header, left out of this Hash
        }
        if let Some(bytes) = props.header_bytes(&name) {
            hash.aset(name.as_str(), ruby.str_from_slice(&bytes))?;
        }
    }
    Ok(headers)
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
                Outcome::Wait { reason, up_to: crate::connection::seconds(ruby, "wait", up_to)? }
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

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class = amqp.define_class("NativeDelivery", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("payload", method!(RbDelivery::payload, 0))?;
    class.define_method("id", method!(RbDelivery::id, 0))?;
    class.define_method("type", method!(RbDelivery::kind, 0))?;
    class.define_method("origin", method!(RbDelivery::origin, 0))?;
    class.define_method("timestamp", method!(RbDelivery::timestamp, 0))?;
    class.define_method("attempt", method!(RbDelivery::attempt, 0))?;
    class.define_method("headers", method!(RbDelivery::headers, 0))?;
    class.define_method("properties", method!(RbDelivery::properties, 0))?;
    class.define_method("queue", method!(RbDelivery::queue, 0))?;
    class.define_method("exchange", method!(RbDelivery::exchange, 0))?;
    class.define_method("routing_key", method!(RbDelivery::routing_key, 0))?;
    class.define_method("redelivered?", method!(RbDelivery::redelivered, 0))?;
    class.define_method("tag", method!(RbDelivery::tag, 0))?;
    Ok(())
}
