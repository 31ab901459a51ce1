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
//! [`PublishStream::send`], so memory stays bounded however long it runs.

use crate::connection::{Connection, JsonMessage};
use crate::envelope::Envelope;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::Confirm;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore, TryAcquireError};

/// Messages handed to a stream and not yet sent, at most. Past it `send`
/// waits. Large enough that the broker is never idle while the caller builds
/// the next chunk (at 15-30k/s here, 4096 messages are 130-270 ms of work);
/// small enough that a stream of a million 1 KiB messages holds a few MiB.
pub const STREAM_WINDOW: usize = 4096;

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

/// Publishes sent as they are handed over, confirmed together: see the
/// module documentation. Made by [`Connection::stream`].
pub struct PublishStream {
    /// Chunks to send, each with the room it took (given back once sent).
    chunks: Option<mpsc::UnboundedSender<(u32, Vec<OutgoingMessage>)>>,
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
                let messages: Vec<JsonMessage<'_>> = chunk
                    .iter()
                    .map(|m| JsonMessage { body: &m.body, exchange: &m.exchange, routing_key: &m.routing_key, envelope: &m.envelope })
                    .collect();
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
        PublishStream { chunks: Some(tx), room, task }
    }
}

impl PublishStream {
    /// Hand `messages` over to be sent, in order after everything handed
    /// over before. Returns at once while the stream has room for them
    /// (fewer than [`STREAM_WINDOW`] unsent); otherwise waits until enough
    /// are sent. A chunk larger than the window waits for the whole window.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a future dropped while waiting for room has handed over
    /// nothing.
    pub async fn send(&mut self, messages: Vec<OutgoingMessage>) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let want = Self::room_for(&messages);
        let permit = self.room.acquire_many(want).await.map_err(|_| gone())?;
        permit.forget();
        self.hand_over(want, messages)
    }

    /// [`PublishStream::send`] without waiting: when the stream has no room
    /// for `messages` now, nothing is handed over and they come back
    /// (`Ok(Some(messages))`), for a [`PublishStream::send`] that waits.
    pub fn try_send(&mut self, messages: Vec<OutgoingMessage>) -> Result<Option<Vec<OutgoingMessage>>> {
        if messages.is_empty() {
            return Ok(None);
        }
        let want = Self::room_for(&messages);
        match self.room.try_acquire_many(want) {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::NoPermits) => return Ok(Some(messages)),
            Err(TryAcquireError::Closed) => return Err(gone()),
        }
        self.hand_over(want, messages).map(|()| None)
    }

    fn room_for(messages: &[OutgoingMessage]) -> u32 {
        messages.len().min(STREAM_WINDOW) as u32
    }

    fn hand_over(&mut self, took: u32, messages: Vec<OutgoingMessage>) -> Result<()> {
        let chunks = self.chunks.as_ref().ok_or_else(gone)?;
        chunks.send((took, messages)).map_err(|_| gone())
    }

    /// Wait until everything handed over has been sent and confirmed.
    /// Returns how many were handed over, or the first failure among them
    /// once every confirm has been waited for (so what did go out is known
    /// to have gone out).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense of [`Confirm::wait`]: a dropped future loses
    /// only the answers; what was handed over is sent, and stored or not,
    /// whether anyone waits.
    pub async fn finish(mut self) -> Result<usize> {
        self.chunks = None;
        (&mut self.task)
            .await
            .map_err(|e| Error::new(ErrorKind::Closed, format!("the publish stream's task ended without its confirms: {e}")))?
    }
}

fn gone() -> Error {
    Error::new(ErrorKind::Closed, "this publish stream has finished: start another with Connection::stream")
}
