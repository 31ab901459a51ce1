//! The store contract: what the guard asks of whatever remembers keys.

use crate::error::Result;
use std::future::{ready, Future};
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

/// The store contract for async code: [`IdempotencyStore`]'s methods,
/// returning futures, so a store over a network database (PostgreSQL) does
/// not block the task that handles the message.
///
/// Every [`IdempotencyStore`] is one (its answers are ready at once), so the
/// guard's decisions are written once, over this trait, and the blocking
/// [`Guard::before`](super::Guard::before) runs the same code as
/// [`Guard::before_async`](super::Guard::before_async).
/// [`AsyncSqlIdempotencyStore`](super::AsyncSqlIdempotencyStore) implements it
/// natively. The method names differ from [`IdempotencyStore`]'s (an `_async`
/// suffix, `can_*` for the `supports_*` flags) because every blocking store
/// implements both traits: with both imported, a call is never ambiguous.
pub trait AsyncIdempotencyStore {
    /// [`IdempotencyStore::first_time`].
    fn first_time_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<bool>> + Send + 'a;
    /// [`IdempotencyStore::confirm`].
    fn confirm_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<()>> + Send + 'a;
    /// [`IdempotencyStore::forget`].
    fn forget_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<()>> + Send + 'a;
    /// [`IdempotencyStore::confirmed`].
    fn confirmed_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<bool>> + Send + 'a;
    /// [`IdempotencyStore::first_time_many`]: several keys, in order, one
    /// commit where the store can.
    fn first_time_many_async<'a>(&'a self, keys: &'a [&'a str]) -> impl Future<Output = Result<Vec<bool>>> + Send + 'a;
    /// [`IdempotencyStore::confirm_many`].
    fn confirm_many_async<'a>(&'a self, keys: &'a [&'a str]) -> impl Future<Output = Result<()>> + Send + 'a;

    /// [`IdempotencyStore::supports_confirm`].
    fn can_confirm(&self) -> bool {
        true
    }
    /// [`IdempotencyStore::supports_forget`].
    fn can_forget(&self) -> bool {
        true
    }
    /// [`IdempotencyStore::supports_confirmed`].
    fn answers_confirmed(&self) -> bool {
        true
    }
    /// [`IdempotencyStore::claim_timeout`]: how long a redelivery of a
    /// claimed key may wait without spending attempts. Named apart so a
    /// blocking store, which has both traits, is never ambiguous.
    fn claim_expiry(&self) -> Option<std::time::Duration> {
        None
    }

    /// Forget `key` without awaiting: what a handler dropped mid-run (or
    /// panicking) does from a destructor, where nothing can be awaited.
    /// `Some` with the result when it was done at once; `None` when it was
    /// handed to a task (the async SQL store spawns one) or cannot be done,
    /// in which case the claim expires after the claim timeout. Default:
    /// `None`.
    fn forget_now_or_later(&self, key: String) -> Option<Result<()>> {
        let _ = key;
        None
    }
}

impl<S: IdempotencyStore + ?Sized> AsyncIdempotencyStore for S {
    fn first_time_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<bool>> + Send + 'a {
        ready(IdempotencyStore::first_time(self, key))
    }
    fn confirm_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<()>> + Send + 'a {
        ready(IdempotencyStore::confirm(self, key))
    }
    fn forget_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<()>> + Send + 'a {
        ready(IdempotencyStore::forget(self, key))
    }
    fn confirmed_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<bool>> + Send + 'a {
        ready(IdempotencyStore::confirmed(self, key))
    }
    fn first_time_many_async<'a>(&'a self, keys: &'a [&'a str]) -> impl Future<Output = Result<Vec<bool>>> + Send + 'a {
        ready(IdempotencyStore::first_time_many(self, keys))
    }
    fn confirm_many_async<'a>(&'a self, keys: &'a [&'a str]) -> impl Future<Output = Result<()>> + Send + 'a {
        ready(IdempotencyStore::confirm_many(self, keys))
    }
    fn can_confirm(&self) -> bool {
        IdempotencyStore::supports_confirm(self)
    }
    fn can_forget(&self) -> bool {
        IdempotencyStore::supports_forget(self)
    }
    fn answers_confirmed(&self) -> bool {
        IdempotencyStore::supports_confirmed(self)
    }
    fn claim_expiry(&self) -> Option<std::time::Duration> {
        IdempotencyStore::claim_timeout(self)
    }
    fn forget_now_or_later(&self, key: String) -> Option<Result<()>> {
        Some(IdempotencyStore::forget(self, &key))
    }
}
