//! What the delay cascade holds, for `Connection#delayed` (core's
//! `delay::waiting`).

use crate::connection::RbConnection;
use crate::errors::IntoRuby;
use crate::gvl;
use magnus::{method, prelude::*, Error, RClass, RModule, Ruby};

/// Each level's queue and how many delayed messages wait in it, level 0
/// first.
fn delayed_waiting(ruby: &Ruby, rb_self: &RbConnection) -> Result<Vec<(String, u64)>, Error> {
    let counts = gvl::block_on(ruby, acemq::delay::waiting(&rb_self.inner))?.rb(ruby)?;
    Ok(counts.into_iter().enumerate().map(|(k, n)| (acemq::delay::level_name(k as u32), n)).collect())
}

pub fn init(_ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class: RClass = amqp.const_get("Connection")?;
    class.define_private_method("_delayed_waiting", method!(delayed_waiting, 0))?;
    Ok(())
}
