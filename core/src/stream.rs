//! A publish stream: messages sent in order as they are made, their confirms
//! awaited together at the end.
//!
//! [`Connection::send_json_batch`] takes a batch that is whole before anything
//! is sent, so a caller that builds a batch and then fails has sent nothing
//! (the Ruby gem's `mq.batch` promises that). The price is that the broker
//! waits while the batch is built, and that the batch is held in memory
//! whole. A stream is the other choice: what is handed to it goes out at once
//! on a task of the engine's, in order, while the caller builds the next,
//! and [`PublishStream::finish`] waits for every confirm and reports the
//! first failure. What was handed to a stream before its caller failed has
//! been sent. At most [`STREAM_WINDOW`] messages wait to be sent at a time;
//! a caller that builds faster than the broker takes them waits in
//! [`PublishStream::push`], so memory stays bounded however long it runs.
//! How a stream is cut into chunks ([`STREAM_CHUNK`]) is the stream's rule,
//! not its callers'.

use crate::connection::{Connection, JsonMessage};
use crate::envelope::Envelope;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::Confirm;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore, TryAcquireError};

/// Messages handed to a stream and not yet sent, at most. Past it `send`
/// waits. Large enough that the broker is never idle while the caller builds
/// the next chunk (a window holds many chunks of [`STREAM_CHUNK`]); small
/// enough that a stream of a million 1 KiB messages holds a few MiB.
pub const STREAM_WINDOW: usize = 4096;

/// Messages handed to the engine's task at a time: enough that a handover
/// (a channel send, a wake-up of the task) is a small share of building
/// them, few enough that the broker has the first ones while the caller
/// builds the rest.
pub const STREAM_CHUNK: usize = 128;

/// One message for a stream: owned, since it is sent after the call that
/// handed it over has returned.
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    /// The body, already JSON.
    pub body: Vec<u8>,
    /// The exchange; empty for the default exchange.
    pub exchange: String,
    /// The routing key (the queue name on the default exchange).
    pub routing_key: String,
    /// The envelope, as [`Connection::envelope_for`] made it.
    pub envelope: Envelope,
}

impl OutgoingMessage {
    /// Borrowed as [`Connection::send_json_batch`] takes it.
    pub fn as_json(&self) -> JsonMessage<'_> {
        JsonMessage { body: &self.body, exchange: &self.exchange, routing_key: &self.routing_key, envelope: &self.envelope }
    }
}

/// Publishes sent as they are handed over, confirmed together: see the
/// module documentation. Made by [`Connection::stream`].
pub struct PublishStream {
    /// Chunks to send, each with the room it took (given back once sent).
    chunks: Option<mpsc::UnboundedSender<(u32, Vec<OutgoingMessage>)>>,
    /// Pushed, not yet handed over: fewer than [`STREAM_CHUNK`], or a full
    /// chunk waiting for room.
    chunk: Vec<OutgoingMessage>,
    /// Room for messages handed over and not yet sent: [`STREAM_WINDOW`]
    /// permits, one a message, so the channel's bound is in messages.
    room: Arc<Semaphore>,
    task: tokio::task::JoinHandle<Result<usize>>,
}

impl Connection {
    /// A publish stream on this connection's publishing channel (see
    /// [`PublishStream`]).
    pub fn stream(&self) -> PublishStream {
        let (tx, mut rx) = mpsc::unbounded_channel::<(u32, Vec<OutgoingMessage>)>();
        let room = Arc::new(Semaphore::new(STREAM_WINDOW));
        let conn = self.clone();
        let freed = room.clone();
        let task = crate::runtime::handle().spawn(async move {
            let mut pending: std::collections::VecDeque<Result<Confirm>> = std::collections::VecDeque::new();
            let (mut waited, mut first_error) = (0usize, None);
            while let Some((took, chunk)) = rx.recv().await {
                let messages: Vec<JsonMessage<'_>> = chunk.iter().map(OutgoingMessage::as_json).collect();
                pending.extend(conn.send_json_batch(&messages).await);
                // Sent (its frames are lapin's now): the room it took is free.
                freed.add_permits(took as usize);
                // The oldest confirms are in by now, most likely: settle them
                // so that a long stream does not hold a confirm per message.
                while pending.len() > 2 * STREAM_WINDOW {
                    let oldest = pending.pop_front().expect("more than a window pending");
                    waited += 1;
                    if let (Err(e), None) = (Confirm::wait_all([oldest]).await, &first_error) {
                        first_error = Some(e);
                    }
                }
            }
            let rest = Confirm::wait_all(pending).await;
            match (first_error, rest) {
                (Some(e), _) | (None, Err(e)) => Err(e),
                (None, Ok(n)) => Ok(waited + n),
            }
        });
        PublishStream { chunks: Some(tx), chunk: Vec::with_capacity(STREAM_CHUNK), room, task }
    }
}

impl Connection {
    /// Send every message of a held batch, in order, then wait for every
    /// confirm: how many were published, or the first failure once every
    /// confirm has been waited for ([`Confirm::wait_all`]), so that what did
    /// go out is known to have gone out. A stream ([`Connection::stream`])
    /// sends while the batch is still being built; this sends nothing before
    /// it is called.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: as [`Connection::send_json_batch`], a dropped future
    /// may have sent some of the messages, in order, with no answer for them.
    pub async fn send_all(&self, messages: &[OutgoingMessage]) -> Result<usize> {
        let borrowed: Vec<JsonMessage<'_>> = messages.iter().map(OutgoingMessage::as_json).collect();
        Confirm::wait_all(self.send_json_batch(&borrowed).await).await
    }
}

impl PublishStream {
    /// Hand `message` over to be sent, in order after everything handed
    /// over before. Messages go to the engine's task [`STREAM_CHUNK`] at a
    /// time; this returns at once while the stream has room for a chunk
    /// (fewer than [`STREAM_WINDOW`] unsent), and otherwise waits until
    /// enough are sent.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe once polled: from its first poll `message` is the
    /// stream's (sent at the next push, flush or finish), and a future
    /// dropped while waiting for room has handed nothing more over. A future
    /// dropped before it was ever polled drops `message` unsent.
    pub async fn push(&mut self, message: OutgoingMessage) -> Result<()> {
        if self.try_push(message)? {
            Ok(())
        } else {
            self.flush().await
        }
    }

    /// [`PublishStream::push`] without waiting. `Ok(true)`: taken, and
    /// nothing is waiting for room. `Ok(false)`: taken, and the chunk it
    /// completed waits for room; call [`PublishStream::flush`] (which waits)
    /// before the next push.
    pub fn try_push(&mut self, message: OutgoingMessage) -> Result<bool> {
        if self.chunks.is_none() {
            return Err(gone());
        }
        self.chunk.push(message);
        if self.chunk.len() < STREAM_CHUNK {
            return Ok(true);
        }
        let want = Self::room_for(self.chunk.len());
        match self.room.try_acquire_many(want) {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::NoPermits) => return Ok(false),
            Err(TryAcquireError::Closed) => return Err(gone()),
        }
        self.hand_over(want).map(|()| true)
    }

    /// Hand over what has been pushed and not yet handed over, waiting for
    /// room. [`PublishStream::finish`] does this first; call it to have a
    /// partial chunk sent now.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a future dropped while waiting for room has handed over
    /// nothing, and the messages stay the stream's.
    pub async fn flush(&mut self) -> Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let want = Self::room_for(self.chunk.len());
        let permit = self.room.acquire_many(want).await.map_err(|_| gone())?;
        permit.forget();
        self.hand_over(want)
    }

    /// Room a chunk of `len` takes. A chunk larger than the window (only
    /// [`STREAM_CHUNK`] > [`STREAM_WINDOW`] could make one) waits for the
    /// whole window.
    fn room_for(len: usize) -> u32 {
        len.min(STREAM_WINDOW) as u32
    }

    fn hand_over(&mut self, took: u32) -> Result<()> {
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(STREAM_CHUNK));
        let chunks = self.chunks.as_ref().ok_or_else(gone)?;
        chunks.send((took, chunk)).map_err(|_| gone())
    }

    /// Hand over what is left, then wait until everything has been sent and
    /// confirmed. Returns how many were pushed, or the first failure among
    /// them once every confirm has been waited for (so what did go out is
    /// known to have gone out).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense of [`Confirm::wait`]: a dropped future loses
    /// only the answers; what was handed over is sent, and stored or not,
    /// whether anyone waits.
    pub async fn finish(mut self) -> Result<usize> {
        self.flush().await?;
        self.chunks = None;
        (&mut self.task)
            .await
            .map_err(|e| Error::new(ErrorKind::Closed, format!("the publish stream's task ended without its confirms: {e}")))?
    }
}

fn gone() -> Error {
    Error::new(ErrorKind::Closed, "this publish stream has finished: start another with Connection::stream")
}
