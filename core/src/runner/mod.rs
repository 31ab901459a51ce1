//! What a long-running consumer process decides, whatever language drives
//! it: the state it reports to an orchestrator, when a subscription that
//! stopped working is restarted and when the process gives up instead, and
//! how long a shutdown may drain.
//!
//! The Ruby runner (`acemq run`, `bin/rails acemq:run`) and a Rust service
//! both hold one [`Supervisor`]: they register each consumer, look at it on
//! every tick ([`Supervisor::observe`]) and do what the verdict says. Signals,
//! threads and logging are theirs; the rules are here.
//!
//! ```no_run
//! use acemq::runner::{Observation, RunnerOptions, Supervisor, Verdict};
//! use std::sync::Arc;
//!
//! # async fn run() -> acemq::Result<()> {
//! let supervisor = Arc::new(Supervisor::new(RunnerOptions::default()));
//! let payments = supervisor.register("PaymentsConsumer", "shop.payments", 4, 32);
//! let health = acemq::runner::serve_health("127.0.0.1:9394".parse().unwrap(), supervisor.clone()).await?;
//! supervisor.running();
//! loop {
//!     supervisor.beat();
//!     match supervisor.observe(payments, Observation::default()) {
//!         Verdict::Healthy => {}
//!         Verdict::Restart { after, .. } => { tokio::time::sleep(after).await; /* subscribe again */ supervisor.restarted(payments); }
//!         Verdict::GiveUp { reason } => { eprintln!("{reason}"); std::process::exit(1); }
//!     }
//!     # break;
//! }
//! health.close();
//! # Ok(())
//! # }
//! ```

mod budget;
mod control;
mod health;
mod shutdown;

pub use budget::RestartBudget;
pub use health::{authorize_control, serve_health, HealthServer};
pub use shutdown::{drain, Drained, Signal, StopSignals};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a runner behaves.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// How long a shutdown lets running handlers finish. 25 s by default:
    /// under the 30 s that Kubernetes, ECS and Heroku give a process between
    /// SIGTERM and SIGKILL, so the runner settles and closes before it is
    /// killed mid-handler.
    pub shutdown_timeout: Duration,
    /// How long a subscription may go without a channel (the broker
    /// unreachable, the queue gone) before it counts as failed. 60 s by
    /// default: a broker restart or failover takes seconds, and a consumer
    /// that has not been able to subscribe for a minute is a silently dead
    /// consumer unless something says so.
    pub recovery_bound: Duration,
    /// When a failed consumer is started again.
    pub restart: RestartPolicy,
    /// How often the runner beats. It is not live once it has missed three
    /// beats in a row: the loop that watches the consumers is stuck.
    pub heartbeat: Duration,
    /// What the health endpoint's control requests (`POST
    /// /consumers/NAME/pause`, `/resume`) must carry as `Authorization:
    /// Bearer TOKEN`. None: they are taken from the loopback interface only
    /// (`acemq ctl` on the same host, the `--processes` parent), refused
    /// from anywhere else.
    pub control_token: Option<String>,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            shutdown_timeout: Duration::from_secs(25),
            recovery_bound: Duration::from_secs(60),
            restart: RestartPolicy::default(),
            heartbeat: Duration::from_secs(1),
            control_token: None,
        }
    }
}

/// Restarts of one consumer: at most `max_restarts` within `window`, each
/// after a pause doubling from `initial_backoff` to `max_backoff`. Past that
/// the runner gives up and exits non-zero, so the orchestrator restarts the
/// whole process and somebody sees it, rather than a consumer that restarts
/// in a loop for ever while nothing is handled.
#[derive(Debug, Clone)]
pub struct RestartPolicy {
    /// Restarts allowed within `window` (default 5).
    pub max_restarts: u32,
    /// The window restarts are counted in (default 5 minutes).
    pub window: Duration,
    /// The pause before the first restart (default 1 s).
    pub initial_backoff: Duration,
    /// The longest pause (default 30 s).
    pub max_backoff: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 5,
            window: Duration::from_secs(300),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Where a runner is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerState {
    /// Loading the application, declaring topology, subscribing.
    Booting,
    /// Every consumer is subscribed and handling.
    Running,
    /// Taking no new deliveries (SIGTSTP), still alive.
    Quiet,
    /// Shutting down: handlers in progress are finishing.
    Stopping,
    /// Shut down.
    Stopped,
    /// Gave up (see [`Supervisor::failure`]).
    Failed,
}

impl RunnerState {
    /// The lowercase name used in logs and the health endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerState::Booting => "booting",
            RunnerState::Running => "running",
            RunnerState::Quiet => "quiet",
            RunnerState::Stopping => "stopping",
            RunnerState::Stopped => "stopped",
            RunnerState::Failed => "failed",
        }
    }
}

/// Where one of the runner's dead-letter ingesters is (the Ruby runner's
/// `c.dead_letter_store`; a Rust service's [`crate::dead_letters::Ingester`]),
/// as `/status` shows it. None of them makes the runner unready: a standby
/// is what every runner but one is, by design.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IngesterState {
    /// Not yet consuming its DLQ.
    Starting,
    /// Consuming its DLQ: this process is the one ingester of it.
    Ingesting,
    /// Another ingester, on this host or another, has the DLQ (the broker
    /// refused a second exclusive consume); this one asks again.
    Standby,
    /// It could not consume or write (the broker, the database) and tries
    /// again; `last_error` says why.
    Retrying,
    /// Stopped at shutdown.
    Stopped,
}

impl IngesterState {
    /// The lowercase name used in logs and the health endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            IngesterState::Starting => "starting",
            IngesterState::Ingesting => "ingesting",
            IngesterState::Standby => "standby",
            IngesterState::Retrying => "retrying",
            IngesterState::Stopped => "stopped",
        }
    }

    /// The state named by [`IngesterState::as_str`], if any.
    pub fn parse(name: &str) -> Option<IngesterState> {
        [Self::Starting, Self::Ingesting, Self::Standby, Self::Retrying, Self::Stopped].into_iter().find(|s| s.as_str() == name)
    }
}

#[derive(Debug)]
struct IngesterSlot {
    dlq: String,
    state: IngesterState,
    received: u64,
    last_error: Option<String>,
}

/// What the runner saw of one consumer on this tick.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// The subscription ended without being asked to (the broker cancelled
    /// it, or its delivery stream closed): why.
    pub ended: Option<String>,
    /// Handler threads (or tasks) that died.
    pub dead_workers: usize,
    /// How long the subscription has been without a channel, if it is.
    pub down_for: Option<Duration>,
    /// The last error the subscription recorded, for the reason.
    pub last_error: Option<String>,
}

/// What to do about a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing.
    Healthy,
    /// Close it and start it again after the pause; call
    /// [`Supervisor::restarted`] once it is subscribed.
    Restart {
        /// The pause before subscribing again.
        after: Duration,
        /// Why, for the log.
        reason: String,
    },
    /// Stop the process and exit non-zero: the reason is the failure.
    GiveUp {
        /// Why, for the log and the exit.
        reason: String,
    },
}

#[derive(Debug)]
struct Slot {
    name: String,
    queue: String,
    concurrency: usize,
    prefetch: u16,
    up: bool,
    /// Paused by an operator: not down, not restarted, taking nothing.
    paused: bool,
    restarts: RestartBudget,
    last_failure: Option<String>,
}

#[derive(Debug)]
struct Inner {
    state: RunnerState,
    failure: Option<String>,
    slots: Vec<Slot>,
    ingesters: Vec<IngesterSlot>,
    stopping_since: Option<Instant>,
}

/// A runner's state, shared by the loop that watches the consumers and the
/// health endpoint. Thread-safe.
#[derive(Debug)]
pub struct Supervisor {
    options: RunnerOptions,
    inner: Mutex<Inner>,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last beat.
    beat: AtomicU64,
    /// Each slot's consumer now, for pause and resume.
    attached: control::Attached,
}

impl Supervisor {
    /// A supervisor in [`RunnerState::Booting`].
    pub fn new(options: RunnerOptions) -> Self {
        Supervisor {
            options,
            inner: Mutex::new(Inner { state: RunnerState::Booting, failure: None, slots: Vec::new(), ingesters: Vec::new(), stopping_since: None }),
            epoch: Instant::now(),
            beat: AtomicU64::new(0),
            attached: control::Attached::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The options it was built with.
    pub fn options(&self) -> &RunnerOptions {
        &self.options
    }

    /// Add a consumer; the index names it in [`Supervisor::observe`].
    pub fn register(&self, name: &str, queue: &str, concurrency: usize, prefetch: u16) -> usize {
        let mut inner = self.lock();
        inner.slots.push(Slot {
            name: name.to_owned(),
            queue: queue.to_owned(),
            concurrency,
            prefetch,
            up: true,
            paused: false,
            restarts: RestartBudget::default(),
            last_failure: None,
        });
        inner.slots.len() - 1
    }

    /// [`Supervisor::register`] with the concurrency and prefetch the
    /// consumer is opened with, read from its options rather than repeated.
    pub fn register_consumer(&self, name: &str, queue: &str, options: &crate::ConsumeOptions) -> usize {
        self.register(name, queue, options.concurrency, options.prefetch)
    }

    /// Booted: every consumer is subscribed. Also the way back from quiet.
    pub fn running(&self) {
        let mut inner = self.lock();
        let changed = matches!(inner.state, RunnerState::Booting | RunnerState::Quiet);
        if changed {
            inner.state = RunnerState::Running;
        }
        drop(inner);
        self.beat();
        if changed {
            crate::events::runner("running", None);
        }
    }

    /// Taking no new deliveries. Not ready, still live.
    pub fn quiet(&self) {
        let mut inner = self.lock();
        let changed = matches!(inner.state, RunnerState::Booting | RunnerState::Running);
        if changed {
            inner.state = RunnerState::Quiet;
        }
        drop(inner);
        if changed {
            crate::events::runner("quiet", None);
        }
    }

    /// Shutting down: returns the deadline by which running handlers must
    /// have finished (now plus `shutdown_timeout`, counted from the first
    /// call). What has not finished by then is left unacknowledged, and the
    /// broker delivers it again: never acknowledged unrun.
    pub fn stopping(&self) -> Instant {
        let mut inner = self.lock();
        let changed = !matches!(inner.state, RunnerState::Failed | RunnerState::Stopped | RunnerState::Stopping);
        if changed {
            inner.state = RunnerState::Stopping;
        }
        let deadline = *inner.stopping_since.get_or_insert_with(Instant::now) + self.options.shutdown_timeout;
        drop(inner);
        if changed {
            crate::events::runner("stopping", None);
        }
        deadline
    }

    /// Shut down.
    pub fn stopped(&self) {
        let mut inner = self.lock();
        let changed = !matches!(inner.state, RunnerState::Failed | RunnerState::Stopped);
        if changed {
            inner.state = RunnerState::Stopped;
        }
        drop(inner);
        if changed {
            crate::events::runner("stopped", None);
        }
    }

    /// Give up, with the reason (also what [`Verdict::GiveUp`] does).
    pub fn fail(&self, reason: &str) {
        let mut inner = self.lock();
        let changed = inner.state != RunnerState::Failed;
        inner.state = RunnerState::Failed;
        inner.failure.get_or_insert_with(|| reason.to_owned());
        drop(inner);
        if changed {
            crate::events::runner("failed", Some(reason));
        }
    }

    /// The state now.
    pub fn state(&self) -> RunnerState {
        self.lock().state
    }

    /// Why it failed, once it has.
    pub fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    /// The watching loop is alive. Call it on every tick.
    pub fn beat(&self) {
        self.beat.store(self.epoch.elapsed().as_millis() as u64, Ordering::Release);
    }

    /// Live: not failed, and the watching loop beat within three heartbeats.
    /// An orchestrator restarts a process that is not live.
    pub fn live(&self) -> bool {
        let inner = self.lock();
        self.live_locked(&inner)
    }

    /// Ready: running (not booting, quiet or stopping) with every consumer
    /// subscribed. An orchestrator sends no traffic to, and a rolling deploy
    /// waits for, a process that is not ready.
    pub fn ready(&self) -> bool {
        let inner = self.lock();
        inner.state == RunnerState::Running && inner.slots.iter().all(|s| s.up) && self.live_locked(&inner)
    }

    fn live_locked(&self, inner: &Inner) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let since = now.saturating_sub(self.beat.load(Ordering::Acquire));
        inner.state != RunnerState::Failed && Duration::from_millis(since) <= self.options.heartbeat * 3
    }

    /// Decide about consumer `index` from what the runner saw of it. While
    /// quiet or shutting down, consumers stop on purpose and nothing is
    /// decided. A consumer that ended, lost a worker, or has been without a
    /// channel past `recovery_bound` is restarted, until it has been
    /// restarted `max_restarts` times within `window`: then the runner gives
    /// up.
    pub fn observe(&self, index: usize, seen: Observation) -> Verdict {
        let mut inner = self.lock();
        if inner.state != RunnerState::Running && inner.state != RunnerState::Booting {
            return Verdict::Healthy;
        }
        let bound = self.options.recovery_bound;
        let Some(slot) = inner.slots.get_mut(index) else {
            return Verdict::Healthy;
        };
        let detail = seen.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
        let reason = if let Some(why) = seen.ended {
            format!("{} on {}: the subscription ended ({why})", slot.name, slot.queue)
        } else if seen.dead_workers > 0 {
            format!("{} on {}: {} of {} handler threads died{detail}", slot.name, slot.queue, seen.dead_workers, slot.concurrency)
        } else if let Some(down) = seen.down_for.filter(|d| *d > bound) {
            format!("{} on {}: could not subscribe for {}s (recovery bound {}s){detail}", slot.name, slot.queue, down.as_secs(), bound.as_secs())
        } else {
            slot.up = seen.down_for.is_none();
            return Verdict::Healthy;
        };
        slot.up = false;
        slot.last_failure = Some(reason.clone());
        let policy = &self.options.restart;
        let Some(after) = slot.restarts.spend(policy, Instant::now()) else {
            let reason = format!("{reason}; restarted {} times within {}s, giving up", slot.restarts.recent(), policy.window.as_secs());
            inner.state = RunnerState::Failed;
            inner.failure.get_or_insert_with(|| reason.clone());
            drop(inner);
            crate::events::runner("failed", Some(&reason));
            return Verdict::GiveUp { reason };
        };
        Verdict::Restart { after, reason }
    }

    /// Record where the ingester of `dlq` is, for `/status`: deliveries it
    /// has received (committed, then acknowledged) and its last error. The
    /// first report of a DLQ adds it.
    pub fn ingester(&self, dlq: &str, state: IngesterState, received: u64, last_error: Option<&str>) {
        let mut inner = self.lock();
        let last_error = last_error.map(str::to_owned);
        match inner.ingesters.iter_mut().find(|i| i.dlq == dlq) {
            Some(slot) => {
                slot.state = state;
                slot.received = received;
                slot.last_error = last_error;
            }
            None => inner.ingesters.push(IngesterSlot { dlq: dlq.to_owned(), state, received, last_error }),
        }
    }

    /// Consumer `index` is subscribed again after a restart.
    pub fn restarted(&self, index: usize) {
        if let Some(slot) = self.lock().slots.get_mut(index) {
            slot.up = true;
        }
    }

    /// The state as JSON, for the health endpoint's `/status` and for logs:
    /// `{"state","live","ready","failure","consumers":[{"name","queue",
    /// "concurrency","prefetch","up","restarts","last_failure","paused",
    /// "breaker"}],"dead_letters":[{"dlq","state","received","last_error"}]}`
    /// (`breaker`: null, or closed, open, half_open, trying; `state`: an
    /// [`IngesterState`]).
    pub fn status_json(&self) -> String {
        let inner = self.lock();
        let consumers: Vec<serde_json::Value> = inner
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({
                    "name": s.name, "queue": s.queue, "concurrency": s.concurrency, "prefetch": s.prefetch,
                    "up": s.up, "restarts": s.restarts.total(), "last_failure": s.last_failure,
                    "paused": s.paused, "breaker": self.attached.breaker(i).map(crate::BreakerState::as_str),
                })
            })
            .collect();
        let dead_letters: Vec<serde_json::Value> = inner
            .ingesters
            .iter()
            .map(|i| {
                serde_json::json!({
                    "dlq": i.dlq, "state": i.state.as_str(), "received": i.received, "last_error": i.last_error,
                })
            })
            .collect();
        let live = self.live_locked(&inner);
        let ready = live && inner.state == RunnerState::Running && inner.slots.iter().all(|s| s.up);
        serde_json::json!({
            "state": inner.state.as_str(), "live": live, "ready": ready, "failure": inner.failure, "consumers": consumers,
            "dead_letters": dead_letters,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests;
