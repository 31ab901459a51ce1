//! AceMQ::AMQP::NativeStream: core's `PublishStream` for a Ruby batch made
//! with `stream: true` (lib/acemq/amqp/batch.rb). Chunks of Outgoing
//! messages are handed over while the block goes on building; the engine
//! sends them in order on a task of its own and `_finish` waits for every
//! confirm.

use crate::errors::IntoRuby;
use crate::gvl;
use crate::outgoing::RbOutgoing;
use acemq::{OutgoingMessage, PublishStream};
use magnus::{method, prelude::*, Error, RArray, RModule, Ruby};
use std::sync::Mutex;

#[magnus::wrap(class = "AceMQ::AMQP::NativeStream", free_immediately, size)]
pub struct RbStream {
    /// None once finished.
    inner: Mutex<Option<PublishStream>>,
}

impl RbStream {
    pub(crate) fn new(stream: PublishStream) -> Self {
        RbStream { inner: Mutex::new(Some(stream)) }
    }

    fn finished(ruby: &Ruby) -> Error {
        Error::new(ruby.exception_runtime_error(), "this batch has been sent: publish in a new one")
    }

    /// Hand `items` (Outgoing messages, in order) over to be sent. Returns
    /// at once while the stream has room; waits without the GVL otherwise.
    fn send(ruby: &Ruby, rb_self: &Self, items: RArray) -> Result<(), Error> {
        let mut messages = Vec::with_capacity(items.len());
        for item in items.into_iter() {
            let out: &RbOutgoing = magnus::TryConvert::try_convert(item)?;
            // Copied: the task sends it after this call has returned.
            messages.push(OutgoingMessage::clone(&out.inner));
        }
        let mut guard = rb_self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let stream = guard.as_mut().ok_or_else(|| Self::finished(ruby))?;
        // The room is checked, and the chunk handed over, in one call: no
        // thread switch while the stream keeps up.
        let Some(messages) = stream.try_send(messages).rb(ruby)? else { return Ok(()) };
        // Full: wait for room without the GVL, the stream taken out while
        // it waits and put back however the wait ends (an interrupt drops
        // the future, and the batch with it: nothing more is handed over).
        let mut stream = guard.take().expect("checked above");
        drop(guard);
        let (sent, stream) = gvl::block_on(ruby, async {
            let r = stream.send(messages).await;
            (r, stream)
        })?;
        *rb_self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(stream);
        sent.rb(ruby)
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
    class.define_method("_send", method!(RbStream::send, 1))?;
    class.define_method("_finish", method!(RbStream::finish, 0))?;
    Ok(())
}
