//! Shutdown for a Rust service: the signals that ask for it, and the drain
//! that the Ruby runner does, with the same deadline.
//!
//! The order is the runner's (lib/acemq/runner.rb): stop every consumer
//! taking deliveries first, then wait for the handlers running now until
//! the supervisor's deadline ([`Supervisor::stopping`]), then close. What
//! has not finished by then is never acknowledged: closing gives it back to
//! the broker, which delivers it again.

use super::Supervisor;
use crate::consumer::ConsumerHandle;
use crate::error::{Error, Result};

/// Kept here, its old path: the consumer's drain returns it.
pub use crate::consumer::Drained;

/// Which signal asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: what Kubernetes, ECS, Heroku and systemd send.
    Terminate,
    /// SIGINT: Ctrl-C.
    Interrupt,
}

impl Signal {
    /// `"TERM"` or `"INT"`, as the runner logs it.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Terminate => "TERM",
            Signal::Interrupt => "INT",
        }
    }
}

/// SIGTERM and SIGINT, listened for from the moment this is made.
///
/// Make it at boot, before consuming: until it exists a SIGTERM kills the
/// process at once (the default action), handlers and all.
pub struct StopSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Start listening. Must be called within a tokio runtime.
    pub fn listen() -> Result<StopSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind| {
                signal(kind).map_err(|e| Error::invalid(format!("cannot listen for stop signals ({e}); call StopSignals::listen within a tokio runtime")))
            };
            Ok(StopSignals { term: listen(SignalKind::terminate())?, int: listen(SignalKind::interrupt())? })
        }
        #[cfg(not(unix))]
        {
            Ok(StopSignals {})
        }
    }

    /// Wait for the next SIGTERM or SIGINT.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal that arrives while nothing waits is kept for
    /// the next call.
    pub async fn recv(&mut self) -> Signal {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => Signal::Terminate,
                _ = self.int.recv() => Signal::Interrupt,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Interrupt
        }
    }
}

impl std::fmt::Debug for StopSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StopSignals(TERM, INT)")
    }
}

/// Shut consumers down as the runner does: mark the supervisor stopping,
/// stop every consumer taking deliveries, then let the handlers in
/// progress finish until the supervisor's deadline (now plus
/// [`RunnerOptions::shutdown_timeout`](super::RunnerOptions::shutdown_timeout),
/// 25 s by default), abandoning what is still running then, and close each
/// consumer ([`ConsumerHandle::drain`]). The supervisor is stopped at the
/// end. Close the relay and the connections after it; exit with
/// [`Supervisor::exit_code`].
///
/// # Cancel safety
///
/// Not cancel safe: see [`ConsumerHandle::drain`].
pub async fn drain(supervisor: &Supervisor, consumers: Vec<ConsumerHandle>) -> Drained {
    let deadline = supervisor.stopping();
    // Every consumer first: waiting for one while the others still take
    // deliveries would start work that the deadline then abandons.
    for c in &consumers {
        c.stop_taking().await;
    }
    let mut drained = Drained::default();
    for c in consumers {
        drained = drained + c.drain(deadline).await;
    }
    supervisor.stopped();
    drained
}

impl Supervisor {
    /// The process's exit status after a shutdown: 0 when it was clean, 1
    /// when the supervisor gave up or handlers had to be abandoned (their
    /// messages went back to the queue), so the orchestrator and whoever
    /// reads its logs see that the deadline was too short for the work.
    pub fn exit_code(&self, drained: &Drained) -> i32 {
        if self.failure().is_some() || !drained.is_clean() {
            1
        } else {
            0
        }
    }

    /// [`Supervisor::exit_code`] as what `main` returns:
    /// `async fn main() -> std::process::ExitCode`.
    pub fn exit_status(&self, drained: &Drained) -> std::process::ExitCode {
        std::process::ExitCode::from(self.exit_code(drained) as u8)
    }
}
