//! Futures run together, polled in the order given.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Run `futures` together and return their outputs in the order given.
/// Every pass polls them in that order, so futures that send a frame when
/// first polled (a publish taking its delivery tag, a declaration) put their
/// frames on the channel in that order, and the channel answers in it.
pub(crate) async fn in_order<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (future, slot) in pending.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(r) => *slot = Some(r),
                    Poll::Pending => all = false,
                }
            }
        }
        if all {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter().map(|r| r.expect("every future finished")).collect()
}
