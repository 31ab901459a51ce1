//! A store written in Ruby — any object answering `first_time?(key)`, and
//! optionally `confirm(key)`, `forget(key)` and `confirmed?(key)` — as core's
//! `IdempotencyStore`, so core's guard drives it with the same rules as the
//! native stores. Built per call on the calling Ruby thread (the GVL held);
//! an exception from the object is a store error (so `first_time?` raising
//! is a retry), and one that is not a StandardError is raised untouched.

use crate::sql;
use acemq::idempotency::IdempotencyStore;
use acemq::ErrorKind;
use magnus::{prelude::*, Error, Ruby, Value};

pub(crate) struct RbStore<'a> {
    ruby: &'a Ruby,
    obj: Value,
    confirm: bool,
    forget: bool,
    confirmed: bool,
}

impl<'a> RbStore<'a> {
    pub(crate) fn new(ruby: &'a Ruby, obj: Value) -> Result<Self, Error> {
        Ok(RbStore {
            ruby,
            obj,
            confirm: obj.respond_to("confirm", false)?,
            forget: obj.respond_to("forget", false)?,
            confirmed: obj.respond_to("confirmed?", false)?,
        })
    }
}

impl IdempotencyStore for RbStore<'_> {
    fn first_time(&self, key: &str) -> acemq::Result<bool> {
        let v: Value = sql::call(self.ruby, self.obj, "first_time?", (key,), "the store's first_time?")?;
        Ok(v.to_bool())
    }

    fn confirm(&self, key: &str) -> acemq::Result<()> {
        sql::call::<Value, _>(self.ruby, self.obj, "confirm", (key,), "the store's confirm").map(drop)
    }

    fn forget(&self, key: &str) -> acemq::Result<()> {
        sql::call::<Value, _>(self.ruby, self.obj, "forget", (key,), "the store's forget").map(drop)
    }

    fn confirmed(&self, key: &str) -> acemq::Result<bool> {
        if !self.obj.respond_to("confirmed?", false).unwrap_or(false) {
            return Err(acemq::Error::new(ErrorKind::Store, "this store does not answer confirmed?"));
        }
        let v: Value = sql::call(self.ruby, self.obj, "confirmed?", (key,), "the store's confirmed?")?;
        Ok(v.to_bool())
    }

    fn supports_confirm(&self) -> bool {
        self.confirm
    }

    fn supports_forget(&self) -> bool {
        self.forget
    }

    fn supports_confirmed(&self) -> bool {
        self.confirmed
    }

    /// A store answering `claim_timeout` (seconds), as the shipped ones do.
    fn claim_timeout(&self) -> Option<std::time::Duration> {
        if !self.obj.respond_to("claim_timeout", false).unwrap_or(false) {
            return None;
        }
        let secs: f64 = self.obj.funcall("claim_timeout", ()).ok()?;
        std::time::Duration::try_from_secs_f64(secs).ok()
    }
}
