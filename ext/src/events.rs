//! AceMQ::Events' native half: core's events carried to Ruby, and the
//! metrics text.
//!
//! Core calls its subscribers on whatever thread produced the event, mostly
//! tokio workers that may not touch Ruby. So the bridge subscriber only
//! copies the event into a bounded queue (never blocking: a full queue drops
//! the event and counts it), and one Ruby thread (lib/acemq/events.rb's
//! dispatcher) drains it, waiting without the GVL. Idempotency events are
//! not queued: core's guard emits them on the handler's own Ruby thread,
//! inside a NativeGuard call, and the bridge hands each to that call
//! (`capturing`), which delivers it inline with the Ruby message in hand
//! (idempotency/guard.rs). Core is their one emitter.

use crate::gvl;
use acemq::events::{self, Event, Idempotency, SubscriberId};
use magnus::{function, prelude::*, Error, IntoValue, RArray, RModule, Ruby, Value};
use serde_json::Value as Json;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Events waiting for the dispatcher at most. A dispatcher this far behind
/// is a subscriber too slow for the load; the engine must not wait for it.
const QUEUE: usize = 10_000;

/// Events handed to Ruby per `_next` call at most.
const BATCH: usize = 256;

struct Bridge {
    id: SubscriberId,
    rx: Arc<Mutex<Receiver<Event>>>,
}

static BRIDGE: Mutex<Option<Bridge>> = Mutex::new(None);
static DROPPED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The idempotency events core emitted on this thread during the
    /// NativeGuard call running on it, if one is (`capturing`).
    static CAPTURED: RefCell<Option<Vec<Idempotency>>> = const { RefCell::new(None) };
}

/// Run `f`, a guard call on this Ruby thread, and return with its result the
/// idempotency events core emitted meanwhile (none while nobody listens in
/// Ruby: the bridge is what catches them). Core's guard runs on the calling
/// thread (a blocking store's rules finish in one poll), so what it emits is
/// this call's.
pub(crate) fn capturing<R>(f: impl FnOnce() -> R) -> (R, Vec<Idempotency>) {
    /// Puts back what was capturing before, also when `f` unwinds.
    struct Restore(Option<Vec<Idempotency>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CAPTURED.with(|c| *c.borrow_mut() = self.0.take());
        }
    }
    let before = CAPTURED.with(|c| c.borrow_mut().replace(Vec::new()));
    let restore = Restore(before);
    let r = f();
    let got = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    drop(restore);
    (r, got)
}

/// Start bridging core's events to the queue (idempotent).
fn listen() {
    let mut bridge = BRIDGE.lock().unwrap_or_else(|p| p.into_inner());
    if bridge.is_some() {
        return;
    }
    let (tx, rx) = sync_channel::<Event>(QUEUE);
    let id = events::subscribe(move |event| {
        if let Event::Idempotency(i) = event {
            // Emitted outside a NativeGuard call (a Rust guard in this
            // process): there is no Ruby message to deliver it with.
            CAPTURED.with(|c| c.borrow_mut().as_mut().map(|v| v.push(i.clone())));
            return;
        }
        match tx.try_send(event.clone()) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                acemq::metrics::dropped(1);
            }
        }
    });
    *bridge = Some(Bridge { id, rx: Arc::new(Mutex::new(rx)) });
}

/// Stop bridging: from here on the engine pays nothing for Ruby.
fn unlisten() {
    if let Some(b) = BRIDGE.lock().unwrap_or_else(|p| p.into_inner()).take() {
        events::unsubscribe(b.id);
    }
}

fn listening() -> bool {
    BRIDGE.lock().unwrap_or_else(|p| p.into_inner()).is_some()
}

/// Up to BATCH events as `[{ name:, payload: }, …]`, read by name, waiting
/// (without the GVL) at most `timeout` seconds for the first; nil when none
/// came. Raises StopIteration when not listening: there will be no more.
fn next(ruby: &Ruby, timeout: f64) -> Result<Value, Error> {
    let Some(rx) = BRIDGE.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|b| b.rx.clone()) else {
        return Err(Error::new(ruby.exception_stop_iteration(), "nobody listens to AceMQ's events"));
    };
    let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
    let mut got: Vec<Event> = Vec::new();
    loop {
        let slice = deadline.saturating_duration_since(Instant::now()).min(gvl::SLICE);
        let waiting = rx.clone();
        let first = gvl::without_gvl(
            ruby,
            move || {
                let rx = waiting.lock().unwrap_or_else(|p| p.into_inner());
                match rx.recv_timeout(slice) {
                    Ok(e) => {
                        let mut batch = vec![e];
                        while batch.len() < BATCH {
                            match rx.try_recv() {
                                Ok(e) => batch.push(e),
                                Err(_) => break,
                            }
                        }
                        Some(batch)
                    }
                    Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
                }
            },
            // recv_timeout cannot be woken early: a slice is short enough.
            || {},
        )?;
        if let Some(batch) = first {
            got = batch;
            break;
        }
        ruby.thread_check_ints()?;
        if Instant::now() >= deadline {
            break;
        }
    }
    if got.is_empty() {
        return Ok(ruby.qnil().into_value_with(ruby));
    }
    let (name, payload) = (ruby.to_symbol("name"), ruby.to_symbol("payload"));
    let out = ruby.ary_new_capa(got.len());
    for e in got {
        let event = ruby.hash_new();
        event.aset(name, format!("{}.acemq", e.name()))?;
        event.aset(payload, to_ruby(ruby, &e.payload())?)?;
        out.push(event)?;
    }
    Ok(out.into_value_with(ruby))
}

/// A payload as Ruby: hashes with symbol keys, all the way down.
pub(crate) fn to_ruby(ruby: &Ruby, v: &Json) -> Result<Value, Error> {
    Ok(match v {
        Json::Object(map) => {
            let h = ruby.hash_new();
            for (k, v) in map {
                h.aset(ruby.to_symbol(k), to_ruby(ruby, v)?)?;
            }
            h.into_value_with(ruby)
        }
        Json::Array(items) => {
            let a: RArray = ruby.ary_new_capa(items.len());
            for v in items {
                a.push(to_ruby(ruby, v)?)?;
            }
            a.into_value_with(ruby)
        }
        other => crate::json::to_ruby(ruby, other)?,
    })
}

fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

fn metrics() -> String {
    acemq::metrics::render()
}

fn metrics_enable() {
    acemq::metrics::enable()
}

pub fn init(ruby: &Ruby, acemq: RModule) -> Result<(), Error> {
    let m = acemq.define_module("Events")?;
    m.define_module_function("_listen", function!(listen, 0))?;
    m.define_module_function("_unlisten", function!(unlisten, 0))?;
    m.define_module_function("_listening?", function!(listening, 0))?;
    m.define_module_function("_next", function!(next, 1))?;
    m.define_module_function("_dropped", function!(dropped, 0))?;
    m.define_module_function("_metrics", function!(metrics, 0))?;
    m.define_module_function("_metrics_enable", function!(metrics_enable, 0))?;
    let _ = ruby;
    Ok(())
}
