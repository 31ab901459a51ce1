//! Request/reply for `Connection#request` and `Connection#reply`: the message
//! is built as a publish's (`Outgoing._build`), and core does the rest
//! (`acemq::Connection::send_request`, `send_reply`).

use crate::connection::RbConnection;
use crate::delivery::RbDelivery;
use crate::errors::IntoRuby;
use crate::gvl;
use crate::outgoing::RbOutgoing;
use magnus::{method, prelude::*, Error, RClass, RModule, Ruby, Value};

/// Send the request `out` and wait up to `timeout` seconds for its reply,
/// returned as the reply's Message::Consumed. `retry_safe`: the request
/// may be handled more than once (`RequestOptions::retry_safe`).
fn request(ruby: &Ruby, rb_self: &RbConnection, out: &RbOutgoing, timeout: f64, retry_safe: bool) -> Result<Value, Error> {
    let timeout = crate::convert::seconds(ruby, "timeout:", timeout)?;
    let options = acemq::RequestOptions { timeout, retry_safe, ..Default::default() };
    let (conn, out) = (&rb_self.inner, &out.inner);
    let (message, body) =
        gvl::block_on(ruby, conn.send_request(&out.body, &out.exchange, &out.routing_key, &out.envelope, &options))?.rb(ruby)?;
    Ok(RbDelivery::new(0, message, body).into_message(ruby))
}

/// Send `out` as the reply to a request's `reply_to` and `correlation_id`.
fn reply(ruby: &Ruby, rb_self: &RbConnection, out: &RbOutgoing, reply_to: Option<String>, correlation_id: Option<String>) -> Result<(), Error> {
    let (conn, out) = (&rb_self.inner, &out.inner);
    gvl::block_on(ruby, conn.send_reply(&out.body, reply_to.as_deref(), correlation_id.as_deref(), &out.envelope))?.rb(ruby)
}

fn late_replies(rb_self: &RbConnection) -> u64 {
    rb_self.inner.late_replies()
}

pub fn init(_ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class: RClass = amqp.const_get("Connection")?;
    class.define_private_method("_request", method!(request, 3))?;
    class.define_private_method("_reply", method!(reply, 3))?;
    class.define_method("late_replies", method!(late_replies, 0))?;
    Ok(())
}
