//! The one tokio runtime a process uses, rebuilt in a forked child.
//!
//! Puma, Unicorn and Spring fork after boot. A tokio runtime does not survive
//! `fork`: its worker threads are not copied, so a child that uses the
//! parent's runtime hangs on the first await. The runtime is therefore tagged
//! with the pid that built it, and a child builds its own. The parent's copy is
//! leaked in the child on purpose: dropping it would try to join threads that
//! do not exist there.

use once_cell::sync::Lazy;
use std::sync::Mutex;
use tokio::runtime::{Builder, Handle, Runtime};

struct Owned {
    pid: u32,
    runtime: &'static Runtime,
}

static RUNTIME: Lazy<Mutex<Option<Owned>>> = Lazy::new(|| Mutex::new(None));

/// The process's runtime, built on first use (and again after a fork).
///
/// Rust services that already run inside their own tokio runtime do not need
/// this: every async function in the crate runs on whichever runtime awaits it.
/// It exists for callers with no runtime of their own, such as the Ruby
/// extension.
pub fn handle() -> Handle {
    let pid = std::process::id();
    let mut guard = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(owned) = guard.as_ref() {
        if owned.pid == pid {
            return owned.runtime.handle().clone();
        }
    }
    let threads = std::env::var("ACEMQ_RUNTIME_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2usize);
    let runtime = Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("acemq-io")
        .enable_all()
        .build()
        .expect("acemq: cannot start the tokio runtime");
    // Leaked: see the module docs. One per process lifetime (per fork).
    let runtime: &'static Runtime = Box::leak(Box::new(runtime));
    let handle = runtime.handle().clone();
    *guard = Some(Owned { pid, runtime });
    handle
}

/// Run `future` on the process runtime and block this (non-runtime) thread
/// until it finishes.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    handle().block_on(future)
}
