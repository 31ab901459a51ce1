//! What the delay cascade holds, for `Connection#delayed` (core's
//! `delay::waiting`).

use crate::connection::RbConnection;
use crate::errors::IntoRuby;
use crate::gvl;
use magnus::{method, prelude::*, Error, RArray, RClass, RModule, Ruby};

/// One level of the cascade: its number, its queue, how long it holds a
/// message, and how many wait in it.
#[magnus::wrap(class = "AceMQ::AMQP::Connection::DelayLevel", free_immediately, size)]
struct DelayLevel {
    level: u32,
    waiting: u64,
}

impl DelayLevel {
    fn level(&self) -> u32 {
        self.level
    }

    fn queue(&self) -> String {
        acemq::delay::level_name(self.level)
    }

    /// Seconds a message spends in this level: 2^level.
    fn seconds(&self) -> u64 {
        1u64 << self.level.min(63)
    }

    fn waiting(&self) -> u64 {
        self.waiting
    }
}

/// Every level, level 0 first.
fn delayed_waiting(ruby: &Ruby, rb_self: &RbConnection) -> Result<RArray, Error> {
    let counts = gvl::block_on(ruby, acemq::delay::waiting(&rb_self.inner))?.rb(ruby)?;
    let out = ruby.ary_new_capa(counts.len());
    for (level, waiting) in counts.into_iter().enumerate() {
        out.push(DelayLevel { level: level as u32, waiting })?;
    }
    Ok(out)
}

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class: RClass = amqp.const_get("Connection")?;
    class.define_private_method("_delayed_waiting", method!(delayed_waiting, 0))?;
    let level = class.define_class("DelayLevel", ruby.class_object())?;
    level.undef_default_alloc_func();
    level.define_method("level", method!(DelayLevel::level, 0))?;
    level.define_method("queue", method!(DelayLevel::queue, 0))?;
    level.define_method("seconds", method!(DelayLevel::seconds, 0))?;
    level.define_method("waiting", method!(DelayLevel::waiting, 0))?;
    Ok(())
}
