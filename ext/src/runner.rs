//! AceMQ::AMQP::NativeSupervisor: core's runner rules (the state, restart
//! verdicts, the shutdown deadline, the health endpoint) for the Ruby runner
//! in lib/acemq/runner.rb, which owns signals, threads and logging.

mod budget;
mod verdict;

use crate::convert::seconds;
use crate::errors::IntoRuby;
use crate::gvl;
use crate::keywords::Keywords;
use acemq::runner::{authorize_control, serve_health, HealthServer, IngesterState, Observation, RestartPolicy, RunnerOptions, Supervisor};
use magnus::{function, method, prelude::*, Error, RHash, RModule, Ruby};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use verdict::RbVerdict;

#[magnus::wrap(class = "AceMQ::AMQP::NativeSupervisor", free_immediately, size)]
pub struct RbSupervisor {
    inner: Arc<Supervisor>,
    health: Mutex<Option<HealthServer>>,
}

impl RbSupervisor {
    /// The runner's options by name, each absent or nil for core's default:
    /// shutdown_timeout, recovery_bound, restart_window and heartbeat in
    /// seconds, max_restarts, control_token (empty reads as none).
    fn new(ruby: &Ruby, options: RHash) -> Result<Self, Error> {
        const KNOWN: &[&str] =
            &["shutdown_timeout", "recovery_bound", "max_restarts", "restart_window", "heartbeat", "control_token"];
        let kw = Keywords::read(ruby, options, "NativeSupervisor._new", KNOWN)?;
        let secs = |name: &str| kw.get::<f64>(name)?.map(|s| seconds(ruby, name, s)).transpose();
        let mut options = RunnerOptions::default();
        let mut restart = RestartPolicy::default();
        if let Some(d) = secs("shutdown_timeout")? {
            options.shutdown_timeout = d;
        }
        if let Some(d) = secs("recovery_bound")? {
            options.recovery_bound = d;
        }
        if let Some(n) = kw.whole("max_restarts", "max_restarts", u32::MAX.into())? {
            restart.max_restarts = n as u32;
        }
        if let Some(d) = kw.seconds("restart_window", "restart_window")? {
            restart.window = d;
        }
        if let Some(d) = secs("heartbeat")? {
            options.heartbeat = d;
        }
        options.restart = restart;
        options.control_token = kw.get::<String>("control_token")?.filter(|t| !t.is_empty());
        Ok(RbSupervisor { inner: Arc::new(Supervisor::new(options)), health: Mutex::new(None) })
    }

    fn register(&self, name: String, queue: String, concurrency: usize, prefetch: u16) -> usize {
        self.inner.register(&name, &queue, concurrency, prefetch)
    }

    /// What to do about the consumer in slot `index`: a Verdict. What was
    /// seen, by name (core's Observation), each absent or nil for nothing
    /// seen: ended (why its subscription ended), dead_workers (how many),
    /// down_for (seconds without its channel), last_error.
    fn observe(ruby: &Ruby, rb_self: &Self, index: usize, seen: RHash) -> Result<RbVerdict, Error> {
        const KNOWN: &[&str] = &["ended", "dead_workers", "down_for", "last_error"];
        let kw = Keywords::read(ruby, seen, "NativeSupervisor#_observe", KNOWN)?;
        let seen = Observation {
            ended: kw.get("ended")?,
            dead_workers: kw.get_or("dead_workers", 0)?,
            down_for: kw.get::<f64>("down_for")?.map(|s| std::time::Duration::from_secs_f64(s.max(0.0))),
            last_error: kw.get("last_error")?,
        };
        Ok(RbVerdict(rb_self.inner.observe(index, seen)))
    }

    fn restarted(&self, index: usize) {
        self.inner.restarted(index)
    }

    /// `consumer` serves slot `index` now (boot, and each restart): paused
    /// here when its slot is.
    fn attach(ruby: &Ruby, rb_self: &Self, index: usize, consumer: &crate::consumer::RbConsumer) -> Result<(), Error> {
        let (supervisor, consumer) = (rb_self.inner.clone(), consumer.core());
        gvl::block_on(ruby, async move { supervisor.attach(index, &consumer).await })
    }

    /// Pause the consumer class named `name` (core's Supervisor::pause).
    fn pause(ruby: &Ruby, rb_self: &Self, name: String) -> Result<(), Error> {
        let supervisor = rb_self.inner.clone();
        gvl::block_on(ruby, async move { supervisor.pause(&name).await })?.rb(ruby)
    }

    fn resume(ruby: &Ruby, rb_self: &Self, name: String) -> Result<(), Error> {
        let supervisor = rb_self.inner.clone();
        gvl::block_on(ruby, async move { supervisor.resume(&name).await })?.rb(ruby)
    }

    fn is_paused(ruby: &Ruby, rb_self: &Self, name: String) -> Result<bool, Error> {
        rb_self.inner.is_paused(&name).rb(ruby)
    }

    fn running(&self) {
        self.inner.running()
    }

    fn quiet(&self) {
        self.inner.quiet()
    }

    /// Seconds left until the shutdown deadline (core starts the clock on
    /// the first call).
    fn stopping(&self) -> f64 {
        self.inner.stopping().saturating_duration_since(Instant::now()).as_secs_f64()
    }

    fn stopped(&self) {
        self.inner.stopped()
    }

    fn fail(&self, reason: String) {
        self.inner.fail(&reason)
    }

    fn beat(&self) {
        self.inner.beat()
    }

    fn state(&self) -> &'static str {
        self.inner.state().as_str()
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    fn live(&self) -> bool {
        self.inner.live()
    }

    fn ready(&self) -> bool {
        self.inner.ready()
    }

    fn status_json(&self) -> String {
        self.inner.status_json()
    }

    /// Where the ingester of `dlq` is: state is an IngesterState's name.
    fn ingester(ruby: &Ruby, rb_self: &Self, dlq: String, state: String, received: u64, last_error: Option<String>) -> Result<(), Error> {
        let state = IngesterState::parse(&state).ok_or_else(|| {
            Error::new(ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS), format!("no ingester state {state:?}"))
        })?;
        rb_self.inner.ingester(&dlq, state, received, last_error.as_deref());
        Ok(())
    }

    /// Serve /live, /ready and /status on host:port; returns the port bound.
    fn serve_health(ruby: &Ruby, rb_self: &Self, host: String, port: u16) -> Result<u16, Error> {
        let addr = format!("{host}:{port}").parse().map_err(|_| {
            Error::new(
                ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
                format!("health_host {host:?} is not an IP address (use 0.0.0.0 or 127.0.0.1)"),
            )
        })?;
        let supervisor = rb_self.inner.clone();
        let server = gvl::block_on(ruby, async move { serve_health(addr, supervisor).await })?.rb(ruby)?;
        let port = server.local_addr().port();
        if let Some(old) = rb_self.health.lock().unwrap_or_else(|p| p.into_inner()).replace(server) {
            old.close();
        }
        Ok(port)
    }

    fn close_health(&self) {
        if let Some(server) = self.health.lock().unwrap_or_else(|p| p.into_inner()).take() {
            server.close();
        }
    }
}

/// Core's check of a control request (runner/health.rs), for the
/// `--processes` parent's endpoint: nil when `request` (its head) may change
/// the runner, else the 403 body. An empty token reads as none.
fn authorize(token: Option<String>, request: String, loopback: bool) -> Option<&'static str> {
    authorize_control(token.as_deref().filter(|t| !t.is_empty()), &request, loopback).err()
}

/// A default in seconds as Ruby shows it to a user (a configuration
/// reader, a log line): an Integer when whole (25, not 25.0), else a Float.
pub(crate) fn whole_seconds(ruby: &Ruby, d: std::time::Duration) -> magnus::Value {
    use magnus::IntoValue;
    if d.subsec_nanos() == 0 {
        d.as_secs().into_value_with(ruby)
    } else {
        d.as_secs_f64().into_value_with(ruby)
    }
}

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class = amqp.define_class("NativeSupervisor", ruby.class_object())?;
    class.define_singleton_method("_new", function!(RbSupervisor::new, 1))?;
    class.define_method("_register", method!(RbSupervisor::register, 4))?;
    class.define_method("_observe", method!(RbSupervisor::observe, 2))?;
    class.define_method("_restarted", method!(RbSupervisor::restarted, 1))?;
    class.define_method("_attach", method!(RbSupervisor::attach, 2))?;
    class.define_method("_pause", method!(RbSupervisor::pause, 1))?;
    class.define_method("_resume", method!(RbSupervisor::resume, 1))?;
    class.define_method("_paused?", method!(RbSupervisor::is_paused, 1))?;
    class.define_method("_running", method!(RbSupervisor::running, 0))?;
    class.define_method("_quiet", method!(RbSupervisor::quiet, 0))?;
    class.define_method("_stopping", method!(RbSupervisor::stopping, 0))?;
    class.define_method("_stopped", method!(RbSupervisor::stopped, 0))?;
    class.define_method("_fail", method!(RbSupervisor::fail, 1))?;
    class.define_method("_beat", method!(RbSupervisor::beat, 0))?;
    class.define_method("state", method!(RbSupervisor::state, 0))?;
    class.define_method("failure", method!(RbSupervisor::failure, 0))?;
    class.define_method("live?", method!(RbSupervisor::live, 0))?;
    class.define_method("ready?", method!(RbSupervisor::ready, 0))?;
    class.define_method("status_json", method!(RbSupervisor::status_json, 0))?;
    class.define_method("_ingester", method!(RbSupervisor::ingester, 4))?;
    class.define_method("_serve_health", method!(RbSupervisor::serve_health, 2))?;
    class.define_method("_close_health", method!(RbSupervisor::close_health, 0))?;
    class.define_singleton_method("authorize_control", function!(authorize, 3))?;
    budget::init(ruby, amqp)?;
    // Core's restart rules, for `acemq run --processes N`'s parent, which
    // supervises its workers by the same rules without starting the engine.
    let restart = RestartPolicy::default();
    let defaults = ruby.hash_new();
    defaults.aset(ruby.to_symbol("max_restarts"), restart.max_restarts)?;
    defaults.aset(ruby.to_symbol("window"), restart.window.as_secs_f64())?;
    defaults.aset(ruby.to_symbol("initial_backoff"), restart.initial_backoff.as_secs_f64())?;
    defaults.aset(ruby.to_symbol("max_backoff"), restart.max_backoff.as_secs_f64())?;
    defaults.freeze();
    class.const_set("RESTART_DEFAULTS", defaults)?;
    // Core's runner defaults, for AceMQ::Rails::Configuration and the
    // --processes parent to read rather than repeat.
    let runner = RunnerOptions::default();
    let defaults = ruby.hash_new();
    defaults.aset(ruby.to_symbol("shutdown_timeout"), whole_seconds(ruby, runner.shutdown_timeout))?;
    defaults.aset(ruby.to_symbol("heartbeat"), whole_seconds(ruby, runner.heartbeat))?;
    defaults.freeze();
    class.const_set("RUNNER_DEFAULTS", defaults)?;
    verdict::init(ruby, class)?;
    Ok(())
}
