//! Who holds a claim or a lease: a name an operator can trace to a process.

use crate::error::{Error, Result};
use once_cell::sync::Lazy;

/// `hostname:pid` of the calling process, the default worker id of a store.
///
/// It is what `claimed_by` shows for a claimed key or a leased row, so
/// "which process is sitting on these rows" has an answer in a `SELECT`.
/// The hostname is read once (`/proc/sys/kernel/hostname`, then
/// `$HOSTNAME`, then `$COMPUTERNAME`, then `localhost`); the pid at every
/// call.
/// At most [`DEFAULT_WORKER_ID_MAX`] bytes: the hostname is shortened to
/// fit, so the id fits the migrations' `claimed_by` column (a string of 64).
pub fn default_worker_id() -> String {
    let pid = format!(":{}", std::process::id());
    let mut end = HOSTNAME.len().min(DEFAULT_WORKER_ID_MAX.saturating_sub(pid.len()));
    while !HOSTNAME.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{pid}", &HOSTNAME[..end])
}

/// The longest [`default_worker_id`], in bytes: the `claimed_by` column of
/// the Rails generator's migrations is a string of 64.
pub const DEFAULT_WORKER_ID_MAX: usize = 64;

static HOSTNAME: Lazy<String> = Lazy::new(|| {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .or_else(|| std::env::var("COMPUTERNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
});

/// A store's worker id: the one it was given, or `hostname:pid` read at
/// each call.
///
/// Read at each call because a forked child (Puma, Unicorn, a Sidekiq
/// swarm) is a different worker from its parent: the store is often built
/// before the fork, and children sharing one id could forget or complete
/// each other's claims, since `claimed_by = me` is what stands between them.
#[derive(Debug, Clone)]
pub(crate) struct WorkerId(Option<String>);

impl WorkerId {
    /// `given`, refused when empty; `None` for `hostname:pid`. `what` names
    /// the store in the message.
    pub(crate) fn new(what: &str, given: Option<String>) -> Result<Self> {
        if given.as_deref() == Some("") {
            return Err(Error::invalid(format!(
                "{what} worker id is empty: leave it unset for hostname:pid, or give this worker a name"
            )));
        }
        Ok(WorkerId(given))
    }

    /// The id to write now.
    pub(crate) fn current(&self) -> String {
        match &self.0 {
            Some(w) => w.clone(),
            None => default_worker_id(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_hostname_and_this_pid() {
        let id = WorkerId::new("outbox", None).unwrap().current();
        assert!(id.ends_with(&format!(":{}", std::process::id())), "{id}");
        assert!(!id.starts_with(':'), "{id}");
        assert_eq!(WorkerId::new("outbox", Some("relay-1".into())).unwrap().current(), "relay-1");
        let e = WorkerId::new("idempotency", Some(String::new())).unwrap_err();
        assert!(e.is_invalid_argument() && e.message().starts_with("idempotency worker id is empty"), "{e}");
    }
}
