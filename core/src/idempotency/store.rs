//! The store contract: what the guard asks of whatever remembers keys.

use crate::error::Result;
use std::sync::Arc;

/// Remembers which idempotency keys have been handled.
///
/// The contract is the seed's: an object answering `first_time?(key)`, and
/// optionally `confirm(key)` and `forget(key)`. A store that cannot confirm or
/// forget says so with [`supports_confirm`](Self::supports_confirm) /
/// [`supports_forget`](Self::supports_forget) returning false, and the guard
/// then never calls those methods. That is how a Ruby object answering only
/// `first_time?` is adapted.
///
/// Keys are `&str`: valid UTF-8 by construction, so the "binary string stored
/// as a BLOB never equals the same text" problem cannot arise here. The Ruby
/// adapter converts binary strings to UTF-8 text before they reach core.
///
/// Methods are blocking and take `&self`; the trait is object safe so the
/// guard works on `&dyn IdempotencyStore`, and it has no `Send` bound because
/// a store over a Ruby connection must stay on a Ruby thread.
pub trait IdempotencyStore {
    /// Claim `key`. True exactly once per key while it is remembered: the
    /// caller is the first and must run the handler. False means somebody
    /// claimed or handled it already (and their claim has not gone stale).
    fn first_time(&self, key: &str) -> Result<bool>;

    /// The handler finished: turn the claim into a fact that no stale-claim
    /// takeover can touch. Idempotent.
    fn confirm(&self, key: &str) -> Result<()>;

    /// The handler did not finish: drop this worker's own live claim so the
    /// retry really runs. Never removes a confirmed key.
    fn forget(&self, key: &str) -> Result<()>;

    /// Has `key` been confirmed? For tests and operations; not on the
    /// handling path.
    fn confirmed(&self, key: &str) -> Result<bool>;

    /// Whether [`confirm`](Self::confirm) does anything. The guard skips it
    /// when false.
    fn supports_confirm(&self) -> bool {
        true
    }

    /// Whether [`forget`](Self::forget) does anything. The guard skips it
    /// when false.
    fn supports_forget(&self) -> bool {
        true
    }

    /// Whether [`confirmed`](Self::confirmed) answers. When it does (and
    /// confirm is supported), a key that is claimed but not confirmed is
    /// retried rather than accepted as a duplicate.
    fn supports_confirmed(&self) -> bool {
        true
    }

    /// How long a claim lives before another worker may take it over, for a
    /// store whose claims expire. The guard lets a message whose key is
    /// claimed wait that long without spending its attempts (a handler that
    /// died holding the claim is taken over then, and the message runs).
    fn claim_timeout(&self) -> Option<std::time::Duration> {
        None
    }

    /// [`first_time`](Self::first_time) for several keys, in order. A store
    /// that can claim them in one transaction (the SQL store) overrides this:
    /// one commit for a whole prefetch batch instead of one per message. The
    /// answer for each key is exactly what `first_time` would have said,
    /// in this order (the same key twice: the second is not first).
    fn first_time_many(&self, keys: &[&str]) -> Result<Vec<bool>> {
        keys.iter().map(|k| self.first_time(k)).collect()
    }

    /// [`confirm`](Self::confirm) for several keys; one commit where the
    /// store can.
    fn confirm_many(&self, keys: &[&str]) -> Result<()> {
        keys.iter().try_for_each(|k| self.confirm(k))
    }
}

// Forwarding impls, so one store can be shared by several guarded handlers
// (the table is shared by every consumer in an application anyway).
macro_rules! forward {
    ($($ty:ty),*) => {$(
        impl<S: IdempotencyStore + ?Sized> IdempotencyStore for $ty {
            fn first_time(&self, key: &str) -> Result<bool> { (**self).first_time(key) }
            fn confirm(&self, key: &str) -> Result<()> { (**self).confirm(key) }
            fn forget(&self, key: &str) -> Result<()> { (**self).forget(key) }
            fn confirmed(&self, key: &str) -> Result<bool> { (**self).confirmed(key) }
            fn supports_confirm(&self) -> bool { (**self).supports_confirm() }
            fn supports_forget(&self) -> bool { (**self).supports_forget() }
            fn supports_confirmed(&self) -> bool { (**self).supports_confirmed() }
            fn claim_timeout(&self) -> Option<std::time::Duration> { (**self).claim_timeout() }
            fn first_time_many(&self, keys: &[&str]) -> Result<Vec<bool>> { (**self).first_time_many(keys) }
            fn confirm_many(&self, keys: &[&str]) -> Result<()> { (**self).confirm_many(keys) }
        }
    )*};
}
forward!(&S, Box<S>, Arc<S>);
