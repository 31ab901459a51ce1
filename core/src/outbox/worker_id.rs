//! Who holds a lease: a name an operator can trace back to a process.

/// `hostname:pid`, the default worker id of a store.
///
/// It is what `claimed_by` shows for a leased row, so "which process is
/// sitting on these rows" has an answer in a `SELECT`. Read from
/// `/proc/sys/kernel/hostname`, then `$HOSTNAME`, then `localhost`.
pub fn default_worker_id() -> String {
    format!("{}:{}", hostname(), std::process::id())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}
