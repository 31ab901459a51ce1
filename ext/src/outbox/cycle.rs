//! AceMQ::AMQP::Patterns::OutboxRelay::Cycle: the Ruby-thread driver of
//! core's relay `Cycle`. The cycle decides; this does what it is told on the
//! calling Ruby thread: the store's SQL there (GVL held for a Ruby
//! connection, released for a `path:` file), the publish and its confirms
//! without the GVL, and the wait between sweeps (core's, the Rust relay's).
//! lib/acemq/amqp/patterns/outbox_relay.rb keeps the threads (the relay's
//! and its LISTEN's) and `on_error`.

use super::failure::RbFailure;
use super::store::RbOutboxStore;
use crate::connection::RbConnection;
use crate::errors::IntoRuby;
use crate::gvl;
use acemq::outbox::{Action, Confirms, Cycle, Failure, Input, LocalWake, OutboxPublisher, RelayOptions, Swept};
use magnus::{function, method, prelude::*, Error, RArray, RClass, RModule, Ruby, Value};
use std::sync::Mutex;

/// One relay's cycle, between its sweeps: what it holds and has in flight
/// (core's) and the confirms of the batch in flight. Dropped (the relay's thread killed, the object
/// collected), the rows in flight or held stay leased and are published
/// again after their lease.
#[magnus::wrap(class = "AceMQ::AMQP::Patterns::OutboxRelay::Cycle", free_immediately, size)]
pub struct RbCycle {
    state: Mutex<State>,
    batch_size: usize,
    wake: LocalWake,
    wakes_on_add: bool,
    /// True once the relay closes: ends its wait between sweeps at once.
    stop: tokio::sync::watch::Sender<bool>,
}

struct State {
    cycle: Cycle,
    confirms: Option<Confirms>,
}

/// Where a drive stopped.
enum Pause {
    Again,
    Wait,
    Finished(acemq::Result<Swept>),
}

impl RbCycle {
    fn new(store: &RbOutboxStore, batch_size: usize) -> Self {
        RbCycle {
            state: Mutex::new(State { cycle: Cycle::started(batch_size), confirms: None }),
            batch_size,
            wake: store.wake().clone(),
            wakes_on_add: store.wakes_on_add(),
            stop: tokio::sync::watch::channel(false).0,
        }
    }

    /// The state, or an error rather than a wait: the Ruby relay serialises
    /// its calls, and a thread blocked here holding the GVL would deadlock
    /// with the owner waiting for the GVL after a publish.
    fn state(&self, ruby: &Ruby) -> Result<std::sync::MutexGuard<'_, State>, Error> {
        match self.state.try_lock() {
            Ok(s) => Ok(s),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(Error::new(
                ruby.exception_thread_error(),
                "this outbox relay's cycle is in use by another thread (call it under the relay's lock)",
            )),
        }
    }

    /// One sweep of the started cycle: true to sweep again at once, false
    /// to wait. `woken` answers whether a wake-up came during the sweep;
    /// each failure is added to `failures` (an Array of Failure) for the
    /// relay to hand to `on_error` once its lock is let go.
    fn step(
        ruby: &Ruby,
        rb_self: &Self,
        store: &RbOutboxStore,
        mq: &RbConnection,
        woken: Value,
        failures: RArray,
    ) -> Result<bool, Error> {
        let mut state = rb_self.state(ruby)?;
        Ok(matches!(drive(ruby, &mut state, store, mq, Input::Next, Some(woken), failures)?, Pause::Again))
    }

    /// Stop: the batch in flight settled, what is held deleted.
    fn stop(ruby: &Ruby, rb_self: &Self, store: &RbOutboxStore, mq: &RbConnection, failures: RArray) -> Result<(), Error> {
        let mut state = rb_self.state(ruby)?;
        loop {
            match drive(ruby, &mut state, store, mq, Input::Stop, None, failures)? {
                Pause::Finished(Ok(_)) => return Ok(()),
                Pause::Finished(Err(e)) => {
                    return failures.push(RbFailure(Failure { error: e, exchange: None, routing_key: None }));
                }
                Pause::Again | Pause::Wait => {}
            }
        }
    }

    /// One sweep on a cycle of its own (`OutboxRelay#sweep`): how many the
    /// broker confirmed; a database error raised. Nothing is held or left
    /// in flight.
    fn sweep(ruby: &Ruby, rb_self: &Self, store: &RbOutboxStore, mq: &RbConnection, failures: RArray) -> Result<usize, Error> {
        // Held so that this sweep and the relay's thread never run at once.
        let _state = rb_self.state(ruby)?;
        let mut once = State { cycle: Cycle::once(rb_self.batch_size), confirms: None };
        match drive(ruby, &mut once, store, mq, Input::Next, None, failures)? {
            Pause::Finished(r) => r.map(|s| s.confirmed).rb(ruby),
            // A one-off cycle never pauses.
            Pause::Again | Pause::Wait => Ok(0),
        }
    }

    /// The wake-up counter now: read before a sweep, waited past after it.
    fn wake_seen(&self) -> u64 {
        self.wake.seen()
    }

    /// Whether an add in this process wakes this relay. Only a `path:`
    /// store's: its claim waits for the adder's commit on SQLite's write
    /// lock without the GVL. A claim through the sqlite3 gem waits holding
    /// the GVL, so the adding thread could never commit (a stall until the
    /// busy timeout); such a relay waits out its interval.
    fn wakes_on_add(&self) -> bool {
        self.wakes_on_add
    }

    /// Rows were committed (the Ruby relay's LISTEN heard a NOTIFY, or
    /// listens again after losing its connection): wake the relays of this
    /// table in this process.
    fn notify(&self) {
        self.wake.rows_added();
    }

    /// The wait between two sweeps, core's (`LocalWake::between_sweeps`),
    /// without the GVL: until the wake-up moves past `seen` (nil: not
    /// watched), the relay closes (`_interrupt`), or `interval` seconds.
    /// Whether the wake-up moved.
    fn wait(ruby: &Ruby, rb_self: &Self, seen: Option<u64>, interval: f64) -> Result<bool, Error> {
        let interval = crate::convert::seconds(ruby, "interval", interval)?;
        let wake = rb_self.wake.clone();
        let mut stop = rb_self.stop.subscribe();
        gvl::block_on(ruby, async move { wake.between_sweeps(seen, interval, &mut stop).await })
    }

    /// The relay is closing: a wait in progress ends, and every later one
    /// returns at once.
    fn interrupt(&self) {
        self.stop.send_replace(true);
    }
}

/// Drive the cycle from `input` to its next pause. A Ruby interrupt
/// (Thread#kill, Ctrl-C) raised by a step is raised untouched, and the
/// cycle forgets the batch in progress: its rows stay leased and go out
/// again after their lease, never deleted unconfirmed.
fn drive(
    ruby: &Ruby,
    state: &mut State,
    store: &RbOutboxStore,
    mq: &RbConnection,
    input: Input,
    woken: Option<Value>,
    failures: RArray,
) -> Result<Pause, Error> {
    let r = drive_until_pause(ruby, state, store, mq, input, woken, failures);
    if r.is_err() {
        state.cycle.abandon();
    }
    r
}

fn drive_until_pause(
    ruby: &Ruby,
    state: &mut State,
    store: &RbOutboxStore,
    mq: &RbConnection,
    mut input: Input,
    woken: Option<Value>,
    failures: RArray,
) -> Result<Pause, Error> {
    loop {
        input = match state.cycle.step(input) {
            Action::Claim { done, batch_size } => Input::Claimed(store.relay_claim(ruby, &done, batch_size)?),
            Action::Send(records) => {
                state.confirms = Some(gvl::block_on(ruby, mq.inner.send_batch(&records))?);
                Input::Sent(records)
            }
            Action::Settle => Input::Confirmed(match state.confirms.take() {
                Some(confirms) => gvl::block_on(ruby, confirms)?,
                // None only after a driver bug; no result is a failure, retried.
                None => Vec::new(),
            }),
            Action::Complete(completions) => Input::Completed(store.relay_complete(ruby, &completions)?),
            Action::Delete(ids) => Input::Deleted(store.relay_delete(ruby, &ids)?),
            Action::Woken => Input::Woken(match woken {
                Some(woken) => woken.funcall::<_, _, Value>("call", ())?.to_bool(),
                None => false,
            }),
            Action::Report(mut report) => {
                // The event carries the backlog as it is now, read from the
                // store; no event (nobody listens, or the sweep failed as a
                // whole), no read.
                let backlog = if report.has_event() && acemq::events::enabled() { store.relay_backlog(ruby)? } else { None };
                report.emit(backlog);
                for failure in report.failures {
                    failures.push(RbFailure(failure))?;
                }
                Input::Next
            }
            Action::Again => return Ok(Pause::Again),
            Action::Wait => return Ok(Pause::Wait),
            Action::Finished(r) => return Ok(Pause::Finished(r)),
            _ => return Ok(Pause::Wait),
        };
    }
}

/// The Ruby relay's checked options, read by name.
#[magnus::wrap(class = "AceMQ::AMQP::Patterns::OutboxRelay::Options", free_immediately, size)]
struct Options(RelayOptions);

impl Options {
    /// Seconds between polls.
    fn interval(&self) -> f64 {
        self.0.interval.as_secs_f64()
    }

    fn batch_size(&self) -> usize {
        self.0.batch_size
    }
}

/// The Ruby relay's interval and batch size: nil is core's default, and
/// core's RelayOptions::validate refuses what cannot work.
fn relay_options(ruby: &Ruby, interval: Option<f64>, batch_size: Option<i64>) -> Result<Options, Error> {
    let mut o = RelayOptions::default();
    if let Some(s) = interval {
        o.interval = crate::convert::seconds(ruby, "interval", s)?;
    }
    if let Some(n) = batch_size {
        // A negative count is as unworkable as zero: let core say so.
        o.batch_size = usize::try_from(n).unwrap_or(0);
    }
    o.validate().rb(ruby)?;
    Ok(Options(o))
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let relay: RClass = patterns.define_class("OutboxRelay", ruby.class_object())?;
    relay.define_singleton_method("_options", function!(relay_options, 2))?;
    let options = relay.define_class("Options", ruby.class_object())?;
    options.undef_default_alloc_func();
    options.define_method("interval", method!(Options::interval, 0))?;
    options.define_method("batch_size", method!(Options::batch_size, 0))?;
    // Core's defaults, for the Rails configuration's outbox_interval.
    relay.const_set("DEFAULT_INTERVAL", crate::runner::whole_seconds(ruby, RelayOptions::DEFAULT_INTERVAL))?;
    relay.const_set("DEFAULT_BATCH_SIZE", RelayOptions::DEFAULT_BATCH_SIZE)?;
    let class = relay.define_class("Cycle", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_singleton_method("_new", function!(RbCycle::new, 2))?;
    class.define_method("_step", method!(RbCycle::step, 4))?;
    class.define_method("_stop", method!(RbCycle::stop, 3))?;
    class.define_method("_sweep", method!(RbCycle::sweep, 3))?;
    class.define_method("wake_seen", method!(RbCycle::wake_seen, 0))?;
    class.define_method("wakes_on_add?", method!(RbCycle::wakes_on_add, 0))?;
    class.define_method("_notify", method!(RbCycle::notify, 0))?;
    class.define_method("_wait", method!(RbCycle::wait, 2))?;
    class.define_method("_interrupt", method!(RbCycle::interrupt, 0))?;
    super::failure::init(ruby, relay)?;
    Ok(())
}
