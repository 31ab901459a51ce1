//! AceMQ::AMQP::RestartBudget: core's restart rule for one supervised
//! thing, for the `--processes` parent (lib/acemq/swarm.rb), which forks its
//! workers from a process that runs no engine. Nothing here starts one.

use crate::keywords::Keywords;
use acemq::runner::{RestartBudget, RestartPolicy};
use magnus::{function, method, prelude::*, Error, RClass, RHash, Ruby};
use std::sync::Mutex;
use std::time::Instant;

#[magnus::wrap(class = "AceMQ::AMQP::RestartBudget", free_immediately, size)]
pub struct RbRestartBudget {
    policy: RestartPolicy,
    budget: Mutex<RestartBudget>,
}

impl RbRestartBudget {
    /// max_restarts and window (seconds) by name, each absent or nil for
    /// core's default; the pauses are core's.
    fn new(ruby: &Ruby, options: RHash) -> Result<Self, Error> {
        let kw = Keywords::read(ruby, options, "RestartBudget.new", &["max_restarts", "window"])?;
        let mut policy = RestartPolicy::default();
        if let Some(n) = kw.whole("max_restarts", "max_restarts", u32::MAX.into())? {
            policy.max_restarts = n as u32;
        }
        if let Some(d) = kw.seconds("window", "restart_window")? {
            policy.window = d;
        }
        Ok(RbRestartBudget { policy, budget: Mutex::new(RestartBudget::default()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RestartBudget> {
        self.budget.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more failure now: the seconds to wait before restarting, or nil
    /// when the budget is spent (give up).
    fn spend(&self) -> Option<f64> {
        self.lock().spend(&self.policy, Instant::now()).map(|d| d.as_secs_f64())
    }

    fn recent(&self) -> usize {
        self.lock().recent()
    }

    fn total(&self) -> u64 {
        self.lock().total()
    }

    fn max_restarts(&self) -> u32 {
        self.policy.max_restarts
    }

    fn window(&self) -> f64 {
        self.policy.window.as_secs_f64()
    }
}

pub fn init(ruby: &Ruby, amqp: magnus::RModule) -> Result<RClass, Error> {
    let class = amqp.define_class("RestartBudget", ruby.class_object())?;
    class.define_singleton_method("_new", function!(RbRestartBudget::new, 1))?;
    class.define_method("spend", method!(RbRestartBudget::spend, 0))?;
    class.define_method("recent", method!(RbRestartBudget::recent, 0))?;
    class.define_method("total", method!(RbRestartBudget::total, 0))?;
    class.define_method("max_restarts", method!(RbRestartBudget::max_restarts, 0))?;
    class.define_method("window", method!(RbRestartBudget::window, 0))?;
    Ok(class)
}
