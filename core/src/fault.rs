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
//! Read once; without the variable each point is one branch on a cached value.

use once_cell::sync::Lazy;

static FAULT: Lazy<Option<String>> = Lazy::new(|| std::env::var("ACEMQ_FAULT_INJECT").ok());

pub(crate) fn point(name: &str) {
    if FAULT.as_deref() == Some(name) {
        std::process::exit(86);
    }
}
