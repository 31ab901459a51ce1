//! Flow: what decides whether a consumer takes deliveries now. An operator's
//! pause, a circuit breaker that pauses a consumer whose handlers keep
//! failing, and a throttle (messages per period). The consumer applies the
//! decision (consumer/mod.rs): a paused consumer cancels its subscription on the
//! broker and gives back what it had buffered, unspent.
//!
//! This file is the consumer's flow state; each part has a file of its own:
//! the operator's pause and how a pause reaches the link (`pause`), the
//! consumer's side of its circuit breaker (`breaker`), the local token
//! bucket (`throttle`) and the lease of tokens from a store shared across
//! processes (`lease`). Its part of `impl Consumer` here is only the name
//! the flow's events give.

use super::breaker::Breaker;
use super::Consumer;
use lease::Shared;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use throttle::Bucket;
use tokio::sync::Notify;

mod breaker;
mod lease;
mod pause;
mod throttle;

/// A consumer's flow state: what pauses it and what paces it.
#[derive(Debug, Default)]
pub(super) struct Flow {
    /// Paused by an operator ([`Consumer::pause`]).
    operator: AtomicBool,
    /// Whether the link is paused now; the lock orders the changes.
    applied: tokio::sync::Mutex<bool>,
    breaker: Option<Breaker>,
    bucket: Option<Bucket>,
    shared: Option<Arc<Shared>>,
    watching: AtomicBool,
    wake: Arc<Notify>,
}

impl Flow {
    pub(super) fn new(queue: &str, options: &super::ConsumeOptions) -> crate::Result<Flow> {
        if let Some(b) = &options.circuit_breaker {
            b.validate()?;
        }
        if let Some(t) = &options.throttle {
            t.validate()?;
        }
        Ok(Flow {
            breaker: options.circuit_breaker.clone().map(Breaker::new),
            bucket: options.throttle.map(Bucket::new),
            shared: match (&options.throttle, &options.throttle_store) {
                (Some(t), Some(store)) => {
                    Some(Arc::new(Shared::new(store.0.clone(), options.name.clone().unwrap_or_else(|| queue.to_owned()), *t, queue)))
                }
                (None, Some(_)) => {
                    return Err(crate::Error::invalid("a throttle store needs a throttle: give the limit and period it shares"))
                }
                _ => None,
            },
            ..Flow::default()
        })
    }
}

impl Consumer {
    /// The name its events give: the consumer's, or its queue's.
    pub(super) fn name(&self) -> String {
        self.options.name.clone().unwrap_or_else(|| self.queue.clone())
    }
}
