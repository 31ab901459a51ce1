//! AceMQ::AMQP::NativeBatch: the engine's side of a Ruby `Connection#batch`
//! (lib/acemq/amqp/batch.rb), held or streamed. Each `_push` encodes the
//! payload straight into the message's body (`json::encode`: no Ruby String
//! in between) and builds the message as a publish does
//! (`outgoing::message`); a held batch keeps it here until `_finish` sends
//! them all, a streamed one hands it to core's `PublishStream`, which sends
//! in its own chunks while the block goes on building. `_finish` waits for
//! every confirm.

use crate::errors::IntoRuby;
use crate::gvl;
use acemq::{OutgoingMessage, PublishStream};
use magnus::{method, prelude::*, Error, RHash, RModule, Ruby, Value};
use std::sync::Mutex;

/// What a batch has taken and not sent, or handed over.
enum Pending {
    /// Nothing goes out before `_finish`: a block that raises sends nothing.
    Held(Vec<OutgoingMessage>),
    /// Sent while the block builds.
    Streamed(PublishStream),
}

#[magnus::wrap(class = "AceMQ::AMQP::NativeBatch", free_immediately, size)]
pub struct RbBatch {
    /// None once finished or discarded.
    inner: Mutex<Option<Pending>>,
    /// Whose `envelope_for` makes each message's envelope.
    conn: acemq::Connection,
}

impl RbBatch {
    pub(crate) fn new(conn: &acemq::Connection, stream: bool) -> Self {
        let pending = if stream { Pending::Streamed(conn.stream()) } else { Pending::Held(Vec::new()) };
        RbBatch { inner: Mutex::new(Some(pending)), conn: conn.clone() }
    }

    fn finished(ruby: &Ruby) -> Error {
        Error::new(ruby.exception_runtime_error(), "this batch has been sent: publish in a new one")
    }

    /// Build the message `payload` and `options` describe (the options
    /// `Connection#publish_options` makes, as `Outgoing._build` reads them) and take
    /// it. A held batch only keeps it; a stream returns at once while it has
    /// room and waits without the GVL otherwise. Returns the Ruby Envelope
    /// the publish returns.
    fn push(ruby: &Ruby, rb_self: &Self, payload: Value, options: RHash) -> Result<Value, Error> {
        let body = crate::json::encode(ruby, payload)?;
        let message = crate::outgoing::message(ruby, &rb_self.conn, body, options)?;
        let envelope = crate::outgoing::envelope_to_ruby(ruby, &message.envelope)?;
        let mut guard = rb_self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let stream = match guard.as_mut().ok_or_else(|| Self::finished(ruby))? {
            Pending::Held(messages) => {
                messages.push(message);
                return Ok(envelope);
            }
            Pending::Streamed(stream) => stream,
        };
        // Taken, and its chunk handed over if it completed one, in one call:
        // no thread switch while the stream keeps up.
        if stream.try_push(message).rb(ruby)? {
            return Ok(envelope);
        }
        // Full: wait for room without the GVL, the stream taken out while
        // it waits and put back however the wait ends (an interrupt drops
        // the future, and the batch with it: nothing more is handed over).
        let Some(Pending::Streamed(mut stream)) = guard.take() else { unreachable!("a stream, matched above") };
        drop(guard);
        let (sent, stream) = gvl::block_on(ruby, async {
            let r = stream.flush().await;
            (r, stream)
        })?;
        *rb_self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(Pending::Streamed(stream));
        sent.rb(ruby)?;
        Ok(envelope)
    }

    /// Send what is held, or the rest of the stream, and wait for every
    /// confirm; the number published, or the first failure once every
    /// confirm has been waited for.
    fn finish(ruby: &Ruby, rb_self: &Self) -> Result<usize, Error> {
        let pending = rb_self.inner.lock().unwrap_or_else(|p| p.into_inner()).take().ok_or_else(|| Self::finished(ruby))?;
        let conn = &rb_self.conn;
        match pending {
            Pending::Held(held) => gvl::block_on(ruby, conn.send_all(&held))?.rb(ruby),
            Pending::Streamed(stream) => gvl::block_on(ruby, stream.finish())?.rb(ruby),
        }
    }

    /// The block raised: drop what a held batch holds (nothing was sent).
    /// A stream is finished instead (`_finish`): what it took has gone out.
    fn discard(&self) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*guard, Some(Pending::Held(_))) {
            *guard = None;
        }
    }
}

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class = amqp.define_class("NativeBatch", ruby.class_object())?;
    class.undef_default_alloc_func();
    // The stream's chunk, core's rule: for specs that cross a chunk's edge.
    class.const_set("CHUNK", acemq::STREAM_CHUNK)?;
    class.define_method("_push", method!(RbBatch::push, 2))?;
    class.define_method("_finish", method!(RbBatch::finish, 0))?;
    class.define_method("_discard", method!(RbBatch::discard, 0))?;
    Ok(())
}
