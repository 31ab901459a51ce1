//! Deliveries read by whoever handles them, with no thread in between.
//!
//! A reader (an async handler task, or a Ruby thread that released the GVL)
//! takes the subscription's lapin stream and waits on it itself, so lapin's
//! I/O thread wakes the handler directly. A task in the middle that moved
//! each delivery from lapin's stream to a queue of ours cost a sleep and a
//! wake-up of a thread per delivery, on cores the broker shares.
//!
//! One reader holds the stream at a time; the others wait their turn, and a
//! reader hands the stream on as soon as it has a delivery, so handlers
//! with work do not hold it. The supervisor (supervisor.rs) no longer reads:
//! it waits for a reader to report that the stream ended, or for the channel
//! to go down while nobody was reading, and installs the next generation's
//! stream.

use crate::error::Error;
use crate::transport::queue::Pop;
use crate::wire::RawDelivery;
use futures_lite::StreamExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    /// The current generation's stream, when no reader holds it.
    stream: Option<lapin::Consumer>,
    /// The state of the current generation's channel, looked at before each
    /// delivery is handed out (see [`Feed::took`]).
    channel: Option<lapin::ChannelStatus>,
    /// The current generation's id (tags carry it).
    generation: u64,
    /// The current generation's stream ended under a reader.
    ended: bool,
    /// Stopped or closed: no more deliveries.
    closed: bool,
    /// Paused: readers leave the stream alone (the pause takes it, cancels
    /// the broker's consumer and gives back what it buffered).
    paused: bool,
    /// The stream after `close`, kept until `release`: dropping a lapin
    /// stream sends basic.cancel, and on a single-active-consumer queue a
    /// cancel before the channel's close hands the next consumer the
    /// messages behind the ones this channel still holds.
    parked: Option<lapin::Consumer>,
    /// Readers waiting for their turn: blocked threads, async tasks.
    waiting: usize,
    waiting_async: usize,
    /// Raised by every `wake_all`: a blocked reader that sees it changed
    /// returns empty-handed.
    wakes: u64,
}

/// What a turn on the stream produced: a delivery already made into what
/// its reader keeps (`T`), in the poll that took it off the stream. lapin's
/// `Delivery` (a few hundred bytes) would otherwise move through each step
/// after that, copied at each one.
enum Read<T> {
    Item(Option<lapin::Result<T>>),
    /// Woken by `wake_all` or `close`.
    Interrupted,
    TimedOut,
}

pub(super) struct Feed {
    state: Mutex<State>,
    turn: Condvar,
    turn_async: Notify,
    /// Wakes the reader waiting on the stream itself.
    interrupt: Notify,
    /// Tells the supervisor that a reader saw the stream end.
    pub(super) ended: Notify,
    /// Why the stream ended, as its reader saw it.
    failure: std::sync::Arc<Mutex<Option<Error>>>,
    queue: String,
    /// Tags: the generation in the high bits.
    shift: u32,
    mask: u64,
}

impl Feed {
    pub(super) fn new(queue: &str, failure: std::sync::Arc<Mutex<Option<Error>>>, shift: u32) -> Feed {
        Feed {
            state: Mutex::new(State::default()),
            turn: Condvar::new(),
            turn_async: Notify::new(),
            interrupt: Notify::new(),
            ended: Notify::new(),
            failure,
            queue: queue.to_owned(),
            shift,
            mask: (1 << shift) - 1,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new generation's stream, and its channel's state: readers take it
    /// from here.
    pub(super) fn install(&self, generation: u64, stream: lapin::Consumer, channel: lapin::ChannelStatus) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        st.generation = generation;
        st.stream = Some(stream);
        st.channel = Some(channel);
        st.ended = false;
        self.hand_on(&st);
    }

    /// Whether generation `id`'s stream has ended (a reader saw it).
    pub(super) fn ended(&self, id: u64) -> bool {
        let st = self.lock();
        st.generation != id || st.ended
    }

    /// The current generation is lost (its channel went down while nobody
    /// was reading): drop its stream. What lapin still buffers of it can
    /// never be acknowledged; the broker delivers it again.
    ///
    /// Returns why the channel went down, when the stream was here to ask
    /// (lapin queues the channel's error on it); a reader holding the stream
    /// sees that error itself and records it.
    pub(super) fn lose(&self, id: u64) -> Option<Error> {
        let mut st = self.lock();
        let stream = if st.generation == id {
            st.ended = true;
            st.stream.take()
        } else {
            None
        };
        drop(st);
        self.interrupt.notify_waiters();
        self.discard(stream?)
    }

    /// Drop what lapin still buffers of a lost channel's stream: deliveries
    /// that can never be acknowledged. Returns the error that ends it, if
    /// lapin has queued one yet.
    fn discard(&self, mut stream: lapin::Consumer) -> Option<Error> {
        for _ in 0..=u16::MAX {
            match futures_lite::future::block_on(futures_lite::future::poll_once(stream.next())) {
                Some(Some(Ok(_))) => continue,
                Some(Some(Err(e))) => return Some(super::map_error(&e, &format!("consuming from queue '{}'", self.queue))),
                _ => return None,
            }
        }
        None
    }

    /// Readers leave the stream alone from now, and one waiting on it gives
    /// it back: what [`Feed::take_paused`] waits for.
    pub(super) fn pause(&self) {
        self.lock().paused = true;
        self.interrupt.notify_waiters();
    }

    /// The current generation's stream once no reader holds it, while
    /// paused; None when it is another generation's or has ended.
    pub(super) fn take_paused(&self, generation: u64) -> Option<lapin::Consumer> {
        let mut st = self.lock();
        (st.paused && st.generation == generation && !st.ended).then(|| st.stream.take()).flatten()
    }

    /// Readers take the stream again.
    pub(super) fn resume(&self) {
        let mut st = self.lock();
        st.paused = false;
        self.hand_on(&st);
        drop(st);
        self.turn.notify_all();
        self.turn_async.notify_waiters();
    }

    /// Hand nothing more out, from now: blocked readers return closed, and
    /// a delivery a reader is taking off the stream is not handed out. The
    /// stream itself is left alone (the subscription's cancel goes out on
    /// it, then `close`). Without this, a stop handed out buffered
    /// deliveries until the broker's cancel-ok came back.
    pub(super) fn stop_handing_out(&self) {
        let mut st = self.lock();
        st.closed = true;
        drop(st);
        self.turn.notify_all();
        self.turn_async.notify_waiters();
    }

    /// No more deliveries: readers return closed, what lapin buffers is not
    /// handed out (the broker requeues it when the channel closes).
    pub(super) fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        if let Some(stream) = st.stream.take() {
            st.parked = Some(stream);
        }
        drop(st);
        self.turn.notify_all();
        self.turn_async.notify_waiters();
        self.interrupt.notify_waiters();
        self.ended.notify_one();
    }

    /// Drop the stream kept by `close` (its channel is closed by now).
    pub(super) fn release(&self) {
        let parked = self.lock().parked.take();
        drop(parked);
    }

    /// Wake every blocked reader: they return `Empty` (an unblock function:
    /// the thread is being interrupted and will check why).
    pub(super) fn wake_all(&self) {
        self.lock().wakes += 1;
        self.turn.notify_all();
        self.interrupt.notify_waiters();
    }

    /// Let the next waiting reader have its turn.
    fn hand_on(&self, st: &State) {
        if st.waiting > 0 {
            self.turn.notify_one();
        }
        if st.waiting_async > 0 {
            self.turn_async.notify_one();
        }
    }

    /// A reader is done with its turn: the stream goes back for the next,
    /// unless its generation is over.
    fn give_back(&self, generation: u64, stream: lapin::Consumer) {
        self.give_back_locked(&mut self.lock(), generation, stream);
    }

    fn give_back_locked(&self, st: &mut State, generation: u64, stream: lapin::Consumer) {
        if st.generation == generation && !st.ended && !st.closed {
            st.stream = Some(stream);
            self.hand_on(st);
        }
    }

    /// A delivery of `generation` as core keeps it (its tag made unique
    /// across the consumer's channels).
    fn raw(&self, d: lapin::message::Delivery, generation: u64) -> RawDelivery {
        super::supervisor::raw_delivery(d, generation, self.shift, self.mask)
    }

    /// What a turn read: a delivery of the current generation, or nothing
    /// (the stream ended, which the supervisor is told; or the delivery is
    /// from a channel already lost, which the broker delivers again).
    ///
    /// The channel's state is looked at here, for every delivery, because
    /// the stream does not end when the channel does: lapin queues the end
    /// (or the error) behind whatever it had already read off the socket,
    /// and that is a whole prefetch window when the consumer is busy. Those
    /// deliveries can never be acknowledged, and the broker has already
    /// taken them back to deliver again; handed out, every one of them runs
    /// twice (issue 30: 64 of 64 with a prefetch of 64). lapin marks the
    /// channel closed before it queues the end, so from the moment it reads
    /// the broker's close, nothing more of that channel reaches a handler.
    fn took<T>(&self, generation: u64, stream: lapin::Consumer, item: Option<lapin::Result<T>>) -> Option<T> {
        match item {
            Some(Ok(d)) => {
                // One lock per delivery: the stream goes back and the
                // generation and its channel are checked together.
                let mut st = self.lock();
                let current = st.generation == generation && !st.closed;
                if current && !st.channel.as_ref().is_some_and(lapin::ChannelStatus::connected) {
                    // Lost under a reader: the generation is over, as if
                    // the stream had ended here, and nothing it buffers is
                    // handed out.
                    st.ended = true;
                    drop(st);
                    drop(d);
                    if let Some(e) = self.discard(stream) {
                        self.record(e);
                    }
                    self.ended.notify_one();
                    return None;
                }
                self.give_back_locked(&mut st, generation, stream);
                drop(st);
                current.then_some(d)
            }
            end => {
                if let Some(Err(e)) = end {
                    self.record(super::map_error(&e, &format!("consuming from queue '{}'", self.queue)));
                }
                let mut st = self.lock();
                if st.generation == generation {
                    st.ended = true;
                }
                drop(st);
                self.ended.notify_one();
                None
            }
        }
    }

    /// Why the stream ended, as its reader saw it.
    fn record(&self, e: Error) {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    /// Stopped or closed: a reader would get `Closed`.
    pub(super) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Wait at most `timeout` on this thread (never a runtime thread) for
    /// the next delivery.
    pub(super) fn pop_blocking(&self, timeout: Duration) -> Pop<Arc<RawDelivery>> {
        let until = Instant::now() + timeout;
        let mut st = self.lock();
        let epoch = st.wakes;
        loop {
            if st.closed {
                return Pop::Closed;
            }
            if st.wakes != epoch {
                return Pop::Empty;
            }
            let left = until.saturating_duration_since(Instant::now());
            let Some(stream) = (if st.paused { None } else { st.stream.take() }) else {
                if left.is_zero() {
                    return Pop::Empty;
                }
                st.waiting += 1;
                st = self.turn.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
                st.waiting -= 1;
                continue;
            };
            let generation = st.generation;
            drop(st);
            let mut turn = Turn { feed: self, generation, stream: Some(stream) };
            let held = turn.stream.as_mut().expect("held for the turn");
            let read = wait_until(until, async {
                let interrupted = self.interrupt.notified();
                tokio::pin!(interrupted);
                interrupted.as_mut().enable();
                if self.lock().wakes != epoch {
                    return Read::Interrupted;
                }
                tokio::select! {
                    biased;
                    item = held.next() => Read::Item(item.map(|r| r.map(|d| Arc::new(self.raw(d, generation))))),
                    () = &mut interrupted => Read::Interrupted,
                }
            })
            .unwrap_or(Read::TimedOut);
            let stream = turn.stream.take().expect("held for the turn");
            match read {
                Read::Item(item) => {
                    if let Some(d) = self.took(generation, stream, item) {
                        return Pop::Item(d);
                    }
                }
                Read::Interrupted | Read::TimedOut => self.give_back(generation, stream),
            }
            st = self.lock();
            if Instant::now() >= until && !st.closed && st.wakes == epoch {
                return Pop::Empty;
            }
        }
    }

    /// Wait for the next delivery; None once closed.
    ///
    /// Cancel safe: lapin hands a delivery out only in the poll that returns
    /// it, and a turn dropped mid-wait gives the stream back.
    pub(super) async fn pop(&self) -> Option<RawDelivery> {
        loop {
            let (generation, stream) = loop {
                let turn = self.turn_async.notified();
                tokio::pin!(turn);
                turn.as_mut().enable();
                {
                    let mut st = self.lock();
                    if st.closed {
                        return None;
                    }
                    if let Some(s) = if st.paused { None } else { st.stream.take() } {
                        break (st.generation, s);
                    }
                    st.waiting_async += 1;
                }
                let waiting = Waiting(self);
                turn.await;
                drop(waiting);
            };
            let mut turn = Turn { feed: self, generation, stream: Some(stream) };
            let read = {
                let interrupted = self.interrupt.notified();
                tokio::pin!(interrupted);
                interrupted.as_mut().enable();
                let stream = turn.stream.as_mut().expect("held for the turn");
                tokio::select! {
                    biased;
                    item = stream.next() => Read::Item(item.map(|r| r.map(|d| self.raw(d, generation)))),
                    () = &mut interrupted => Read::Interrupted,
                }
            };
            let stream = turn.stream.take().expect("held for the turn");
            match read {
                Read::Item(item) => {
                    if let Some(d) = self.took(generation, stream, item) {
                        return Some(d);
                    }
                }
                Read::Interrupted | Read::TimedOut => self.give_back(generation, stream),
            }
        }
    }
}

/// Run `future` on this thread until it finishes or `until` passes,
/// parking the thread in between. Not tokio's timer: a timer registered
/// from outside the runtime wakes one of its threads to arm it, a context
/// switch per wait that this thread's own timed park does not cost.
fn wait_until<F: std::future::Future>(until: Instant, future: F) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    thread_local! {
        static WAKER: std::task::Waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    }
    let waker = WAKER.with(Clone::clone);
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}

/// A reader's turn on the stream: given back if the reader is dropped (an
/// async pop cancelled) or unwinds mid-wait.
struct Turn<'a> {
    feed: &'a Feed,
    generation: u64,
    stream: Option<lapin::Consumer>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            self.feed.give_back(self.generation, stream);
        }
    }
}

/// An async reader counted as waiting for its turn, uncounted however the
/// wait ends.
struct Waiting<'a>(&'a Feed);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().waiting_async -= 1;
    }
}
