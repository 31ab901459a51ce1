//! AceMQ::AMQP::Message::Consumed (once NativeDelivery): one delivery as a Ruby handler reads it,
//! and the one owner of what settles it (core's `Settler`) until its
//! consumer's `_settle` takes that. What a handler produced is read back
//! into core's `Outcome` in convert.rs.
//!
//! A delivery crosses into Ruby as this object, not as values by position:
//! lib/acemq/amqp/message.rb reads it through its readers, and each reader
//! converts only its own field, when it is first asked for. The payload is
//! the exception: its body is read once, by the consumer's `_next`, which
//! builds the Ruby objects and so learns whether the body is JSON at all
//! (core makes every other check, and dead-letters what is not JSON with
//! its own reason). A check in core and a build here would read each body
//! twice on the handler thread, the consumer's hot path; the cost of the
//! one read is that a payload its handler never reads (a duplicate the
//! idempotent guard settles unrun) costs a build it did not need.

use acemq::{Body, Envelope, Message, Settler};
use magnus::typed_data::DataTypeFunctions;
use magnus::value::Opaque;
use magnus::{method, prelude::*, Error, IntoValue, RHash, RModule, Ruby, Value};
use std::cell::Cell;
use std::sync::{Arc, Mutex};

#[derive(magnus::TypedData)]
#[magnus(class = "AceMQ::AMQP::Message::Consumed", free_immediately, size, mark)]
pub struct RbDelivery {
    tag: u64,
    /// Its envelope. Of the rest of core's `Message`, the payload is built
    /// here from `body`, and where it came from is read off `body` and
    /// `queue`: 120 bytes kept, not the Message's 536, which the delivery
    /// was moved through on its way to Ruby.
    envelope: Envelope,
    /// The body as it arrived (shared with the delivery core settles, not
    /// copied): built again only for a payload `_next` left to its first
    /// read (`json::Built::Later`), and for a reply's. Also its exchange,
    /// routing key and properties.
    body: Body,
    /// The queue it was consumed from (its consumer's, shared).
    queue: Arc<str>,
    /// What settles it, until it is settled (None after, and for a reply,
    /// which nothing settles): the delivery in flight is held here and
    /// nowhere else in the extension.
    settler: Mutex<Option<Settler>>,
    /// What Message::Consumed has read of it, each made on its first read
    /// (`_payload`, `_read`) and kept here, marked: the message is then its
    /// delivery alone, and one whose handler reads only the payload
    /// allocates no Hash to remember it. Read and written with the GVL held.
    payload_read: Cell<Option<Opaque<Value>>>,
    read: Cell<Option<Opaque<RHash>>>,
}

impl DataTypeFunctions for RbDelivery {
    fn mark(&self, marker: &magnus::gc::Marker) {
        if let Some(v) = self.payload_read.get() {
            marker.mark(v);
        }
        if let Some(h) = self.read.get() {
            marker.mark(h);
        }
    }
}

impl crate::convert::KnownType for RbDelivery {
    fn known() -> &'static std::sync::atomic::AtomicPtr<rb_sys::rb_data_type_t> {
        static KNOWN: std::sync::atomic::AtomicPtr<rb_sys::rb_data_type_t> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
        &KNOWN
    }
}

impl RbDelivery {
    /// A message no consumer handed out (a reply): nothing to settle.
    pub(crate) fn new(tag: u64, message: Message, body: Body) -> Self {
        let queue = Arc::from(message.delivery.queue.as_str());
        let envelope = message.envelope;
        RbDelivery { tag, envelope, body, queue, settler: Mutex::new(None), payload_read: Cell::new(None), read: Cell::new(None) }
    }

    /// A consumer's delivery: the message for its readers, its payload as
    /// built from the body (None: built when first read), the settler for
    /// `_settle`. The caller keeps `payload` on its stack until this is a
    /// Ruby object, which marks it from then on.
    pub(crate) fn handed_out(message: Message, settler: Settler, payload: Option<Value>, queue: Arc<str>) -> Self {
        RbDelivery {
            tag: settler.tag(),
            body: settler.shared_body(),
            queue,
            envelope: message.envelope,
            settler: Mutex::new(Some(settler)),
            payload_read: Cell::new(payload.map(Opaque::from)),
            read: Cell::new(None),
        }
    }

    pub(crate) fn tag(&self) -> u64 {
        self.tag
    }

    /// The Ruby object: the handler's message itself (Message::Consumed),
    /// frozen as a message built by hand is. What it has read so far it
    /// keeps in its own struct (`payload_read`, `read`), not in Ruby.
    pub(crate) fn into_message(self, ruby: &Ruby) -> Value {
        let v = self.into_value_with(ruby);
        v.freeze();
        v
    }

    /// The settler, taken to settle with: None once settled.
    pub(crate) fn take_settler(&self) -> Option<Settler> {
        self.settler.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// A settler taken and not used (it belongs to another consumer), put back.
    pub(crate) fn put_back(&self, settler: Settler) {
        *self.settler.lock().unwrap_or_else(|p| p.into_inner()) = Some(settler);
    }

    /// Whether core's deadline has settled it (as a retry) while its handler
    /// still runs: the subscription replaces that handler's thread.
    fn is_overdue(&self) -> bool {
        self.settler.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(Settler::is_overdue)
    }

    /// Count the handler deadline from now (core's
    /// `Settler::restart_deadline`): the idempotent guard held this delivery
    /// in place and its handler only starts now. False when the deadline
    /// has already settled it, or it is not handed out by a consumer.
    fn restart_deadline(&self) -> bool {
        self.settler.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(Settler::restart_deadline)
    }

    /// The payload as Ruby objects, as `JSON.parse` would build them. A new
    /// object every call: `kept_payload` keeps the first.
    fn payload(ruby: &Ruby, rb_self: &Self) -> Result<Value, Error> {
        let props = rb_self.body.properties();
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

    /// The payload, built on the first call and the same object after:
    /// Message::Consumed#payload (and #_payload, its old name).
    fn kept_payload(ruby: &Ruby, rb_self: crate::convert::Typed<Self>) -> Result<Value, Error> {
        if let Some(v) = rb_self.payload_read.get() {
            return Ok(ruby.get_inner(v));
        }
        let v = Self::payload(ruby, &rb_self)?;
        rb_self.payload_read.set(Some(v.into()));
        Ok(v)
    }

    /// The Hash in which Message::Consumed keeps the other fields it has
    /// converted (the envelope, headers...), made on the first call.
    fn read(ruby: &Ruby, rb_self: &Self) -> RHash {
        if let Some(h) = rb_self.read.get() {
            return ruby.get_inner(h);
        }
        let h = ruby.hash_new();
        rb_self.read.set(Some(h.into()));
        h
    }

    /// The envelope id, nil for a foreign message without one.
    fn id(&self) -> Option<String> {
        let id = &self.envelope.id;
        (!id.is_empty()).then(|| id.clone())
    }

    fn kind(&self) -> Option<String> {
        self.envelope.kind.clone()
    }

    fn origin(&self) -> Option<String> {
        self.envelope.origin.clone()
    }

    /// Seconds since the epoch, nil when the publisher set none.
    fn timestamp(&self) -> Option<u64> {
        self.envelope.timestamp
    }

    fn attempt(&self) -> u32 {
        self.envelope.attempt
    }

    /// The application headers (no `x-acemq-*` envelope ones), a new Hash.
    fn headers(ruby: &Ruby, rb_self: &Self) -> Result<Value, Error> {
        let h = crate::json::map_to_ruby(ruby, &rb_self.envelope.headers)?;
        binary_headers(ruby, rb_self.body.properties(), h)
    }

    /// Every AMQP property as a Hash of Symbol to value (nil where unset),
    /// `headers` with every header as it arrived, the envelope's included.
    /// lib/acemq/amqp/properties.rb makes it an `AceMQ::AMQP::Properties`.
    fn properties(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        let p = rb_self.body.properties();
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
        self.queue.to_string()
    }

    fn exchange(&self) -> String {
        self.body.exchange().to_owned()
    }

    fn routing_key(&self) -> String {
        self.body.routing_key().to_owned()
    }

    fn redelivered(&self) -> bool {
        self.body.redelivered()
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

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    // The delivery is the handler's message: Message::Consumed, made here
    // (lib/acemq/amqp/message.rb reopens both classes and adds the readers
    // that build the envelope and delivery). NativeDelivery is its old name.
    let message = amqp.define_class("Message", ruby.class_object())?;
    let class = message.define_class("Consumed", message)?;
    amqp.const_set("NativeDelivery", class)?;
    class.undef_default_alloc_func();
    class.define_method("payload", method!(RbDelivery::kept_payload, 0))?;
    class.define_method("_payload", method!(RbDelivery::kept_payload, 0))?;
    class.define_method("_read", method!(RbDelivery::read, 0))?;
    class.define_method("_id", method!(RbDelivery::id, 0))?;
    class.define_method("_type", method!(RbDelivery::kind, 0))?;
    class.define_method("_origin", method!(RbDelivery::origin, 0))?;
    class.define_method("_timestamp", method!(RbDelivery::timestamp, 0))?;
    class.define_method("attempt", method!(RbDelivery::attempt, 0))?;
    class.define_method("_headers", method!(RbDelivery::headers, 0))?;
    class.define_method("_properties", method!(RbDelivery::properties, 0))?;
    class.define_method("_queue", method!(RbDelivery::queue, 0))?;
    class.define_method("_exchange", method!(RbDelivery::exchange, 0))?;
    class.define_method("_routing_key", method!(RbDelivery::routing_key, 0))?;
    class.define_method("_redelivered?", method!(RbDelivery::redelivered, 0))?;
    class.define_method("tag", method!(RbDelivery::tag, 0))?;
    class.define_method("_overdue?", method!(RbDelivery::is_overdue, 0))?;
    class.define_method("_restart_deadline", method!(RbDelivery::restart_deadline, 0))?;
    Ok(())
}
