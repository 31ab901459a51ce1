//! The throttle shared across processes, from Ruby: core's
//! `SqlThrottleStore` over the application's SQL connection adapter.
//!
//! Core asks for a lease while a handler thread waits for its next delivery,
//! and that thread has let go of the GVL. A Ruby driver can be used only on
//! a Ruby thread holding it, so the source takes the GVL back for the length
//! of the lease (`rb_thread_call_with_gvl`), on that same thread: the
//! adapter runs on the calling Ruby thread, as the idempotency store's does.

use crate::sql::RbSource;
use acemq::sql::{ConnectionSource, SqlConnection};
use acemq::throttle::{SharedStore, SqlThrottleStore};
use acemq::ErrorKind;
use magnus::{Error, Ruby, Value};
use std::ffi::c_void;

/// A Ruby adapter as a source the throttle can call with or without the GVL.
struct WithGvl(RbSource);

struct Call<'a> {
    source: &'a RbSource,
    f: &'a mut dyn FnMut(&dyn SqlConnection) -> acemq::Result<()>,
    result: Option<acemq::Result<()>>,
}

unsafe extern "C" fn with_gvl(data: *mut c_void) -> *mut c_void {
    let call = &mut *(data as *mut Call<'_>);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.source.with_connection(call.f)));
    call.result = Some(r.unwrap_or_else(|_| Err(acemq::Error::new(ErrorKind::Store, "the throttle store's SQL call panicked"))));
    std::ptr::null_mut()
}

impl ConnectionSource for WithGvl {
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> acemq::Result<()>) -> acemq::Result<()> {
        if Ruby::get().is_ok() {
            return self.0.with_connection(f);
        }
        // SAFETY: ruby_native_thread_p only reads the current thread's state.
        if unsafe { rb_sys::ruby_native_thread_p() } == 0 {
            return Err(acemq::Error::new(
                ErrorKind::Store,
                "the throttle store's Ruby connection was asked for a lease off a Ruby thread (a bug in acemq)",
            ));
        }
        let mut call = Call { source: &self.0, f, result: None };
        // SAFETY: a Ruby thread that let go of the GVL (checked above: not
        // holding it, and a Ruby thread) takes it back for the call.
        unsafe { rb_sys::rb_thread_call_with_gvl(Some(with_gvl), &mut call as *mut Call<'_> as *mut c_void) };
        call.result.unwrap_or_else(|| Err(acemq::Error::new(ErrorKind::Store, "the throttle store's SQL call did not run")))
    }
}

/// The store for `adapter` (what `SQL.connect` returned), kept alive by the
/// Ruby caller (the subscription holds it).
pub(crate) fn store(ruby: &Ruby, adapter: Value) -> Result<SharedStore, Error> {
    Ok(SharedStore::new(SqlThrottleStore::new(WithGvl(RbSource::new(ruby, adapter)?))))
}
