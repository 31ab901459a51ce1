//! Waiting without the GVL.
//!
//! Every call that waits on the broker runs here: the GVL is released so
//! other Ruby threads run, the wait is cut into slices so that signals,
//! `Thread#kill`, `Thread#raise` and `Timeout` are seen between them (on Ruby
//! 3.1 a thread parked with a custom unblock function may otherwise never see
//! Ctrl-C), and the unblock function ends the current slice at once.

use magnus::{Error, Ruby};
use std::ffi::c_void;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long one slice waits before Ruby gets to check for interrupts.
pub const SLICE: Duration = Duration::from_millis(200);

struct Call<F, R> {
    func: Option<F>,
    result: Option<std::thread::Result<R>>,
}

unsafe extern "C" fn trampoline<F: FnOnce() -> R, R>(data: *mut c_void) -> *mut c_void {
    let call = &mut *(data as *mut Call<F, R>);
    if let Some(f) = call.func.take() {
        // A panic must not unwind into Ruby's C frames: catch it here and
        // raise it on the Ruby thread instead.
        call.result = Some(catch_unwind(AssertUnwindSafe(f)));
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn unblock<U: Fn()>(data: *mut c_void) {
    let u = &*(data as *const U);
    u();
}

/// Run `f` without the GVL. `interrupt` is called (from another thread) when
/// Ruby wants this thread back; `f` must then return promptly.
pub fn without_gvl<F, R, U>(ruby: &Ruby, f: F, interrupt: U) -> Result<R, Error>
where
    F: FnOnce() -> R,
    U: Fn(),
{
    let mut call = Call { func: Some(f), result: None };
    loop {
        // The `2` variant: it does not run Ruby's interrupts when it takes
        // the GVL back. `rb_thread_call_without_gvl` does, and an exception
        // raised there (Timeout.timeout, Thread#kill, Thread#raise) jumps
        // over every Rust frame above without running their destructors:
        // block_on's future was never dropped, so a first request cut while
        // it held the reply channel's lock kept it for ever, and every later
        // request on the connection hung past its own timeout, and a cut
        // request's waiter was never removed (its reply not counted late,
        // its memory never freed). Here the interrupts are run by
        // `thread_check_ints`, which returns an exception as an Err, so
        // everything above is dropped in order.
        unsafe {
            rb_sys::rb_thread_call_without_gvl2(
                Some(trampoline::<F, R>),
                &mut call as *mut Call<F, R> as *mut c_void,
                Some(unblock::<U>),
                &interrupt as *const U as *mut c_void,
            );
        }
        match call.result.take() {
            Some(Ok(r)) => return Ok(r),
            Some(Err(panic)) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                return Err(Error::new(ruby.exception_runtime_error(), format!("acemq: internal panic: {msg}")));
            }
            // An interrupt was pending, so `f` was not run: Ruby's
            // interrupts run (an exception among them is returned), and
            // then `f` is tried again. Most are not exceptions: the thread
            // scheduler's timer is one.
            None => ruby.thread_check_ints()?,
        }
    }
}

/// Drive `future` to completion on the process runtime from this Ruby
/// thread, without the GVL, in slices; between slices Ruby runs its
/// interrupts, and an interrupt that raises drops the future.
pub fn block_on<F: Future>(ruby: &Ruby, future: F) -> Result<F::Output, Error> {
    let handle = acemq::runtime::handle();
    let mut future = Box::pin(future);
    let cancel = Arc::new(Notify::new());
    loop {
        let slice = {
            let cancel_wait = cancel.clone();
            let cancel_ubf = cancel.clone();
            let fut = &mut future;
            let handle = handle.clone();
            without_gvl(
                ruby,
                move || {
                    handle.block_on(async {
                        tokio::select! {
                            biased;
                            r = fut => Some(r),
                            _ = cancel_wait.notified() => None,
                            _ = tokio::time::sleep(SLICE) => None,
                        }
                    })
                },
                move || cancel_ubf.notify_one(),
            )?
        };
        if let Some(r) = slice {
            return Ok(r);
        }
        ruby.thread_check_ints()?;
    }
}
