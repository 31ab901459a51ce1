//! AceMQ::AMQP::NativeSupervisor::Verdict: what core's supervisor decided
//! about one consumer, for the runner's tick. Named readers rather than a
//! positional row, so a field added is one edit.

use acemq::runner::Verdict;
use magnus::{method, prelude::*, Error, RClass, Ruby};

#[magnus::wrap(class = "AceMQ::AMQP::NativeSupervisor::Verdict", free_immediately, size)]
pub struct RbVerdict(pub(crate) Verdict);

impl RbVerdict {
    fn healthy(&self) -> bool {
        matches!(self.0, Verdict::Healthy)
    }

    /// Close the subscription and subscribe again after `after` seconds.
    fn restart(&self) -> bool {
        matches!(self.0, Verdict::Restart { .. })
    }

    /// Stop the process and exit non-zero.
    fn give_up(&self) -> bool {
        matches!(self.0, Verdict::GiveUp { .. })
    }

    /// Seconds to wait before subscribing again; 0.0 unless a restart.
    fn after(&self) -> f64 {
        match &self.0 {
            Verdict::Restart { after, .. } => after.as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Why, for the log; nil when healthy.
    fn reason(&self) -> Option<String> {
        match &self.0 {
            Verdict::Healthy => None,
            Verdict::Restart { reason, .. } | Verdict::GiveUp { reason } => Some(reason.clone()),
        }
    }

    fn inspect(&self) -> String {
        let name = match self.0 {
            Verdict::Healthy => "healthy",
            Verdict::Restart { .. } => "restart",
            Verdict::GiveUp { .. } => "give_up",
        };
        match self.reason() {
            Some(reason) if self.restart() => format!("#<Verdict {name} after={:.3}s {reason:?}>", self.after()),
            Some(reason) => format!("#<Verdict {name} {reason:?}>"),
            None => format!("#<Verdict {name}>"),
        }
    }
}

pub fn init(ruby: &Ruby, supervisor: RClass) -> Result<(), Error> {
    let class = supervisor.define_class("Verdict", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("healthy?", method!(RbVerdict::healthy, 0))?;
    class.define_method("restart?", method!(RbVerdict::restart, 0))?;
    class.define_method("give_up?", method!(RbVerdict::give_up, 0))?;
    class.define_method("after", method!(RbVerdict::after, 0))?;
    class.define_method("reason", method!(RbVerdict::reason, 0))?;
    class.define_method("inspect", method!(RbVerdict::inspect, 0))?;
    Ok(())
}
