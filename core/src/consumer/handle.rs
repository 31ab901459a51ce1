//! The push consumer: handler tasks on the runtime, and how they stop; and
//! the connection's ways to open a consumer.

use crate::ack::{Guarded, Outcome};
use super::{ConsumeOptions, Consumer};
use crate::connection::Connection;
use crate::error::Result;
use std::sync::Arc;

/// A handler's result, a panic settled as a retry.
fn unwound(done: std::thread::Result<Guarded>) -> Guarded {
    done.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".to_owned());
        Outcome::Raised { class: "panic".into(), message: format!("the handler panicked: {what}"), fatal: false }.into()
    })
}

/// What a drain left behind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use = "a drain that abandoned handlers should exit non-zero"]
pub struct Drained {
    /// Handlers still running at the deadline. Their messages were not
    /// settled and go back to the queue.
    pub abandoned: usize,
}

impl Drained {
    /// Every handler finished and settled.
    pub fn is_clean(&self) -> bool {
        self.abandoned == 0
    }
}

impl std::ops::Add for Drained {
    type Output = Drained;
    fn add(self, other: Drained) -> Drained {
        Drained { abandoned: self.abandoned + other.abandoned }
    }
}

/// A running push consumer. Dropping it does not stop it; call
/// [`ConsumerHandle::cancel`].
pub struct ConsumerHandle {
    consumer: Arc<Consumer>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ConsumerHandle {
    pub(crate) fn spawn<H: crate::Handler>(consumer: Consumer, handler: H) -> ConsumerHandle {
        let consumer = Arc::new(consumer);
        consumer.watch_deadlines();
        let handler = Arc::new(handler);
        let tasks = (0..consumer.options.concurrency)
            .map(|_| {
                let c = consumer.clone();
                let h = handler.clone();
                tokio::spawn(async move {
                    while let Some(mut d) = c.next().await {
                        // The handler runs on this worker's task, polled in
                        // place (a task of its own per delivery cost a
                        // spawn and a cross-thread wake-up each). Past its
                        // deadline the same future, never dropped mid-await,
                        // moves to a task of its own to finish there, its
                        // outcome discarded, and this worker goes on to the
                        // next delivery. A panic is caught where it happens
                        // and settled as a retry.
                        use futures_lite::FutureExt as _;
                        let (h, message) = (h.clone(), d.take_message());
                        let mut running = Box::pin(std::panic::AssertUnwindSafe(tracing::Instrument::instrument(
                            async move { h.handle_guarded(message).await },
                            d.span().clone(),
                        ))
                        .catch_unwind());
                        // A handler that is done at its first poll (it
                        // awaited nothing that was not ready) settles
                        // without a deadline timer registered and cancelled
                        // for it.
                        if let Some(done) = futures_lite::future::poll_once(&mut running).await {
                            c.settle_later_guarded(d, unwound(done));
                            continue;
                        }
                        let deadline = tokio::time::Instant::from_std(d.settler.watch.deadline());
                        tokio::select! {
                            biased;
                            done = &mut running => c.settle_later_guarded(d, unwound(done)),
                            _ = tokio::time::sleep_until(deadline) => {
                                let c = c.clone();
                                tokio::spawn(async move {
                                    let outcome = unwound(running.await);
                                    c.settle_later_guarded(d, outcome);
                                });
                            }
                        }
                    }
                })
            })
            .collect();
        ConsumerHandle { consumer, tasks }
    }

    /// The consumer, for its counters.
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    /// Stop taking deliveries, and nothing else: handlers in progress go on
    /// and settle. What a shutdown does to every consumer first, before it
    /// waits for any of them ([`crate::runner::drain`]), so that one slow
    /// consumer does not keep the others taking work meanwhile.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the consumer is stopped as soon as this is first polled.
    pub async fn stop_taking(&self) {
        self.consumer.stop().await;
    }

    /// Stop, let the handlers in progress finish until `deadline`, then
    /// close. A handler still running at the deadline is abandoned: its task
    /// is aborted at its next await, its delivery is never settled, and
    /// closing the subscription gives the message back to the broker, which
    /// delivers it again. Never acknowledged unrun, never lost.
    ///
    /// A handler that blocks its thread instead of awaiting cannot be
    /// aborted until it yields; closing does not wait for it.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped drain leaves the handlers running and the
    /// subscription open (stopped). Drain to the end; shorten the deadline
    /// instead.
    pub async fn drain(self, deadline: std::time::Instant) -> Drained {
        self.consumer.stop().await;
        let mut abandoned = 0;
        for mut task in self.tasks {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if tokio::time::timeout(left, &mut task).await.is_err() {
                task.abort();
                abandoned += 1;
            }
        }
        self.consumer.close().await;
        Drained { abandoned }
    }

    /// Stop, let the handlers in progress finish and settle, then close.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped cancel leaves the handlers running and the
    /// subscription open (stopped). Use [`ConsumerHandle::drain`] to bound
    /// the wait.
    pub async fn cancel(self) {
        self.consumer.stop().await;
        for t in self.tasks {
            let _ = t.await;
        }
        self.consumer.close().await;
    }
}

/// Opening consumers: here, beside what they open, so that the connection
/// below needs nothing of the consumer.
impl Connection {
    /// Open a pull consumer on `queue`: [`Consumer::next`] and
    /// [`Consumer::settle`]. Declares the queue's retry ladder and DLQ.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, but safe to repeat: a dropped future may have
    /// declared the ladder and DLQ (idempotent) and subscribed; nothing it
    /// was delivered is acknowledged, so the broker puts it back when that
    /// channel or the connection closes.
    pub async fn consumer(&self, queue: &str, options: ConsumeOptions) -> Result<Consumer> {
        self.check_open()?;
        Consumer::open(self.clone(), queue, options).await
    }

    /// Run `handler` for every message on `queue`, `options.concurrency` at a
    /// time, until the returned handle is cancelled. A closure or any
    /// [`crate::Handler`]; a guarded one ([`crate::idempotency::Idempotent`])
    /// brings its claim timeout, which becomes the handler deadline when it
    /// is shorter ([`ConsumeOptions::guarded_by`]), unless `options` were
    /// guarded already.
    ///
    /// # Cancel safety
    ///
    /// As [`Connection::consumer`], which it awaits before anything runs: no
    /// handler has been called when a dropped future returns.
    pub async fn consume<H: crate::Handler>(&self, queue: &str, mut options: ConsumeOptions, handler: H) -> Result<ConsumerHandle> {
        if let (None, Some(claim)) = (options.claim_timeout, handler.claim_timeout()) {
            options = options.guarded_by(claim);
        }
        let consumer = self.consumer(queue, options).await?;
        Ok(ConsumerHandle::spawn(consumer, handler))
    }
}
