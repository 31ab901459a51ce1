//! The hand-off between the I/O side and whoever handles deliveries: async
//! tasks (Rust) or plain threads that must not hold a lock while they wait
//! (Ruby threads that released the GVL).

use crate::wire::RawDelivery;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Default)]
struct Inner {
    items: VecDeque<RawDelivery>,
    closed: bool,
    /// Threads blocked in `pop_blocking`: a push with none waiting skips the
    /// condvar (a futex syscall per delivery otherwise).
    blocked: usize,
}

/// A multi-producer, multi-consumer queue of deliveries that can be waited on
/// from async code or from a blocking thread, and closed.
#[derive(Default)]
pub(crate) struct DeliveryQueue {
    inner: Mutex<Inner>,
    ready: Condvar,
    notify: Notify,
}

/// What a wait produced. A blocking reader's delivery comes shared
/// (`Pop<Arc<RawDelivery>>`, see [`super::Link::pop_blocking`]): that is
/// what its settler keeps, and a pointer is all that moves on the way there.
pub(crate) enum Pop<T = RawDelivery> {
    Item(T),
    Empty,
    Closed,
}

impl DeliveryQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, d: RawDelivery) {
        let blocked = {
            let mut g = self.lock();
            if g.closed {
                return;
            }
            g.items.push_back(d);
            g.blocked > 0
        };
        if blocked {
            self.ready.notify_one();
        }
        self.notify.notify_one();
    }

    /// No more deliveries: waiters wake and see `Closed` once the queue drains.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Drop what is buffered (the broker requeues unacked deliveries itself
    /// when the channel goes away) and return how many there were.
    pub(crate) fn drain(&self) -> Vec<RawDelivery> {
        self.lock().items.drain(..).collect()
    }

    pub(crate) fn try_pop(&self) -> Pop {
        let mut g = self.lock();
        match g.items.pop_front() {
            Some(d) => Pop::Item(d),
            None if g.closed => Pop::Closed,
            None => Pop::Empty,
        }
    }

    /// Closed and drained: a reader would get `Closed`.
    pub(crate) fn is_closed(&self) -> bool {
        let g = self.lock();
        g.closed && g.items.is_empty()
    }

    /// Block this thread for at most `timeout`.
    pub(crate) fn pop_blocking(&self, timeout: Duration) -> Pop {
        let mut g = self.lock();
        if g.items.is_empty() && !g.closed && !timeout.is_zero() {
            g.blocked += 1;
            g = self.ready.wait_timeout(g, timeout).unwrap_or_else(|p| p.into_inner()).0;
            g.blocked -= 1;
        }
        match g.items.pop_front() {
            Some(d) => Pop::Item(d),
            None if g.closed => Pop::Closed,
            None => Pop::Empty,
        }
    }

    /// Wake every blocked thread (an unblock function: the thread is being
    /// interrupted and will check why).
    pub(crate) fn wake_all(&self) {
        let _g = self.lock();
        self.ready.notify_all();
    }

    /// Wait for the next delivery. Cancel safe: nothing is taken unless returned.
    pub(crate) async fn pop(&self) -> Option<RawDelivery> {
        loop {
            let notified = self.notify.notified();
            match self.try_pop() {
                Pop::Item(d) => return Some(d),
                Pop::Closed => return None,
                Pop::Empty => notified.await,
            }
        }
    }
}
