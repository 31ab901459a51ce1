//! Fault injection for the specs that prove "copy first, then acknowledge"
//! and "confirm first, then delete".
//!
//! With `ACEMQ_FAULT_INJECT=<name>` in its environment a process exits
//! (status 86, no cleanup) when it reaches the point of that name, which is
//! the window a crash can hit:
//!
//! - `exit-after-copy`: a retry or dead-letter copy is confirmed and the
//!   original not yet acknowledged;
//! - `exit-after-publish`: an outbox batch is confirmed and its rows not yet
//!   deleted.
//!
//! - `refuse-channel-open`: the next channel the process opens on RabbitMQ is
//!   refused as lapin refuses one when its record of the connection's
//!   channels went wrong (ChannelsLimitReached), once; the process goes on.
//!   What core/tests/failed_operations.rs replaces the connection on.
//!
//! Read once; without the variable each point is one branch on a cached value.

use once_cell::sync::Lazy;

static FAULT: Lazy<Option<String>> = Lazy::new(|| std::env::var("ACEMQ_FAULT_INJECT").ok());

pub(crate) fn point(name: &str) {
    if FAULT.as_deref() == Some(name) {
        std::process::exit(86);
    }
}

static REFUSED_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `refuse-channel-open`: lapin's own refusal, the first time it is asked.
pub(crate) fn refuse_channel_open() -> Option<lapin::Error> {
    if FAULT.as_deref() == Some("refuse-channel-open") && !REFUSED_ONCE.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return Some(lapin::ErrorKind::ChannelsLimitReached.into());
    }
    None
}
