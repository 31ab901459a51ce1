//! Pausing and resuming a runner's consumers by name, at run time: what the
//! health endpoint's `POST /consumers/NAME/pause` and `acemq ctl pause NAME`
//! reach. The supervisor keeps each slot's wish (paused or not) and the
//! consumer serving the slot now; a consumer attached after a restart is
//! paused before it takes anything if its slot is.

use super::Supervisor;
use crate::error::{Error, ErrorKind, Result};
use crate::Consumer;
use std::sync::{Arc, Mutex, Weak};

/// Each slot's consumer now.
#[derive(Default)]
pub(super) struct Attached(Mutex<Vec<(usize, Weak<Consumer>)>>);

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Attached({})", self.lock().len())
    }
}

impl Attached {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(usize, Weak<Consumer>)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn of(&self, index: usize) -> Vec<Arc<Consumer>> {
        let mut all = self.lock();
        all.retain(|(_, w)| w.strong_count() > 0);
        all.iter().filter(|(i, _)| *i == index).filter_map(|(_, w)| w.upgrade()).collect()
    }

    pub(super) fn breaker(&self, index: usize) -> Option<crate::BreakerState> {
        self.of(index).iter().find_map(|c| c.breaker_state())
    }
}

impl Supervisor {
    /// `consumer` serves slot `index` from now on (at boot, and after each
    /// restart): pause and resume reach it, and it is paused here, before it
    /// hands anything out, when its slot is paused.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Consumer::pause`].
    pub async fn attach(&self, index: usize, consumer: &Arc<Consumer>) {
        {
            let mut all = self.attached.lock();
            all.retain(|(i, w)| *i != index && w.strong_count() > 0);
            all.push((index, Arc::downgrade(consumer)));
        }
        // The sizes it really runs with, for the status: a slot registered
        // before its subscription knew only what was asked (a prefetch of
        // 0 for "the default"; issue 49's `/status` said `"prefetch": 0`).
        let paused = {
            let mut inner = self.lock();
            let slot = inner.slots.get_mut(index);
            if let Some(s) = slot {
                s.concurrency = consumer.options().concurrency;
                s.prefetch = consumer.options().prefetch;
                s.paused
            } else {
                false
            }
        };
        if paused {
            consumer.pause().await;
        }
    }

    /// The slots named `name`, or an error listing the names there are.
    fn named(&self, name: &str) -> Result<Vec<usize>> {
        let inner = self.lock();
        let found: Vec<usize> = inner.slots.iter().enumerate().filter(|(_, s)| s.name == name).map(|(i, _)| i).collect();
        if found.is_empty() {
            let names: Vec<&str> = inner.slots.iter().map(|s| s.name.as_str()).collect();
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("no consumer named {name:?} runs here (these do: {}); give the class name", names.join(", ")),
            ));
        }
        Ok(found)
    }

    /// Pause the consumer named `name` (its class name): it takes nothing
    /// more, what it buffered goes back to the queue unspent, what its
    /// handlers hold finishes. It stays paused across a restart of its
    /// subscription, until [`Supervisor::resume`]; a paused consumer is
    /// reported as paused, and the runner stays ready.
    pub async fn pause(&self, name: &str) -> Result<()> {
        self.set_paused(name, true).await
    }

    /// Take deliveries again after [`Supervisor::pause`].
    pub async fn resume(&self, name: &str) -> Result<()> {
        self.set_paused(name, false).await
    }

    /// The slots' wish first (a consumer attached meanwhile follows it),
    /// then each consumer serving them now.
    async fn set_paused(&self, name: &str, paused: bool) -> Result<()> {
        let slots = self.named(name)?;
        {
            let mut inner = self.lock();
            for &i in &slots {
                inner.slots[i].paused = paused;
            }
        }
        for i in slots {
            for c in self.attached.of(i) {
                if paused {
                    c.pause().await;
                } else {
                    c.resume().await?;
                }
            }
        }
        Ok(())
    }

    /// Whether the consumer named `name` is paused; an error when none is.
    pub fn is_paused(&self, name: &str) -> Result<bool> {
        let slots = self.named(name)?;
        let inner = self.lock();
        Ok(slots.iter().all(|&i| inner.slots[i].paused))
    }
}
