//! How the blocking stores run the one set of async rules: over a
//! [`SqlConnection`] whose statements finish when they are called.

use super::{AsyncSqlConnection, Dialect, Row, SqlConnection, SqlValue};
use crate::error::{Error, Result};
use std::future::{ready, Future};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// A blocking connection seen through the async seam. Each statement runs
/// when it is called, on the caller's thread, and its future is already
/// complete; so the rules written over [`AsyncSqlConnection`] never suspend
/// and [`run`] finishes them in one poll.
pub(crate) struct Blocking<'c>(pub(crate) &'c dyn SqlConnection);

impl AsyncSqlConnection for Blocking<'_> {
    fn dialect(&self) -> Dialect {
        self.0.dialect()
    }
    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a {
        ready(self.0.execute(sql, params))
    }
    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        ready(self.0.query(sql, params))
    }
}

/// Finish a future that cannot suspend: the rules over [`Blocking`] (or over
/// a blocking store). A future that does suspend is a bug in the caller.
pub(crate) fn run<T>(f: impl Future<Output = T>) -> T {
    match try_run(f) {
        Some(v) => v,
        None => unreachable!("a blocking store's rules suspended: something in them awaits more than a statement"),
    }
}

/// Poll `f` once: its output if that finished it.
pub(crate) fn try_run<T>(f: impl Future<Output = T>) -> Option<T> {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Run blocking work on tokio's blocking pool when there is a runtime, so a
/// runtime worker never waits on SQLite's locks; inline when there is none (a
/// future driven by another executor).
pub(crate) async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => match handle.spawn_blocking(f).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::closed(format!("the store's blocking task was cancelled ({e}); is the runtime shutting down?"))),
        },
        Err(_) => f(),
    }
}
