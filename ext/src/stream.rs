//! AceMQ::AMQP::NativeStream: core's `PublishStream` for a Ruby batch made
//! with `stream: true` (lib/acemq/amqp/batch.rb). Each publish is built here
//! and pushed while the block goes on building; the stream sends them in
//! order on the engine's task, in its own chunks, and `_finish` waits for
//! every confirm.

use crate::errors::IntoRuby;
use crate::gvl;
use acemq::PublishStream;
use magnus::{method, prelude::*, Error, RHash, RModule, RString, Ruby, Value};
use std::sync::Mutex;

#[magnus::wrap(class = "AceMQ::AMQP::NativeStream", free_immediately, size)]
pub struct RbStream {
    /// None once finished.
    inner: Mutex<Option<PublishStream>>,
    /// Whose `envelope_for` makes each message's envelope.
    conn: acemq::Connection,
}

impl RbStream {
    pub(crate) fn new(conn: &acemq::Connection) -> Self {
        RbStream { inner: Mutex::new(Some(conn.stream())), conn: conn.clone() }
    }

    fn finished(ruby: &Ruby) -> Error {
        Error::new(ruby.exception_runtime_error(), "this batch has been sent: publish in a new one")
    }

    /// Build the message `body` and `options` describe (as `Outgoing._build`
    /// does) and push it. Returns at once while the stream has room; waits
    /// without the GVL otherwise. Returns the Ruby Envelope the publish
    /// returns.
    fn push(ruby: &Ruby, rb_self: &Self, body: RString, options: RHash) -> Result<Value, Error> {
        let message = crate::outgoing::message(ruby, &rb_self.conn, body, options)?;
        let envelope = crate::outgoing::envelope_to_ruby(ruby, &message.envelope)?;
        let mut guard = rb_self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let stream = guard.as_mut().ok_or_else(|| Self::finished(ruby))?;
        // Taken, and its chunk handed over if it completed one, in one call:
        // no thread switch while the stream keeps up.
        if stream.try_push(message).rb(ruby)? {
            return Ok(envelope);
        }
        // Full: wait for room without the GVL, the stream taken out while
        // it waits and put back however the wait ends (an interrupt drops
        // the future, and the batch with it: nothing more is handed over).
        let mut stream = guard.take().expect("checked above");
        drop(guard);
        let (sent, stream) = gvl::block_on(ruby, async {
            let r = stream.flush().await;
            (r, stream)
        })?;
        *rb_self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(stream);
        sent.rb(ruby)?;
        Ok(envelope)
    }

    /// Wait for every confirm; the number handed over, or the first failure.
    fn finish(ruby: &Ruby, rb_self: &Self) -> Result<usize, Error> {
        let stream = rb_self.inner.lock().unwrap_or_else(|p| p.into_inner()).take().ok_or_else(|| Self::finished(ruby))?;
        gvl::block_on(ruby, stream.finish())?.rb(ruby)
    }
}

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class = amqp.define_class("NativeStream", ruby.class_object())?;
    class.undef_default_alloc_func();
    // The stream's chunk, core's rule: for specs that cross a chunk's edge.
    class.const_set("CHUNK", acemq::STREAM_CHUNK)?;
    class.define_method("_push", method!(RbStream::push, 2))?;
    class.define_method("_finish", method!(RbStream::finish, 0))?;
    Ok(())
}
