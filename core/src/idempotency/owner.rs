//! Whether the worker that holds a claim is provably dead, so that its claim
//! may be taken over at once instead of after the claim timeout.
//!
//! A claim records its worker (`claimed_by`), by default `hostname:pid`
//! ([`default_worker_id`]). On the same host, a pid that no longer exists, or
//! whose process has exited and not been reaped yet (a zombie), cannot
//! confirm, forget or run anything: its claim is dead, and the work it
//! stood for was either committed (then the claim is CONFIRMED, which no
//! takeover touches) or never will be. Everything else is *not* proof:
//!
//! - another host: its pids are not ours to look at;
//! - a pid that exists: the claimant itself, or a new process that reused
//!   its pid. Both are treated as alive (the conservative answer: the claim
//!   is then waited out, as before);
//! - a worker id that was given (`worker:`), or is this process's own.
//!
//! So a takeover here happens only when death is certain, and a zombie
//! that still runs (its connection to the broker lost, its handler still
//! working) is never taken over early: its claim lasts its claim timeout.
//! The one assumption is that a hostname names one pid namespace: two
//! containers that share a hostname but not their pids must each be given a
//! `worker:` id (which turns this off for them).

use crate::sql::default_worker_id;

/// The pid in `owner` when it is a default worker id of this host other
/// than this process: `hostname:pid` with this host's name (as
/// [`default_worker_id`] writes it, shortened the same way).
fn local_pid(owner: &str) -> Option<u32> {
    let me = default_worker_id();
    let (my_host, my_pid) = me.rsplit_once(':')?;
    let (host, pid) = owner.rsplit_once(':')?;
    if host != my_host || pid == my_pid || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

/// Whether the process `pid` of this host has exited: no `/proc/<pid>`, or
/// a zombie (state `Z` or `X`) waiting to be reaped. False when it cannot
/// tell (no procfs).
#[cfg(target_os = "linux")]
fn exited(pid: u32) -> bool {
    if !std::path::Path::new("/proc/self/stat").exists() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": comm may hold spaces and parentheses, so the
        // state is the first field after the last ')'.
        Ok(stat) => {
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
            matches!(state, Some("Z" | "X"))
        }
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

#[cfg(not(target_os = "linux"))]
fn exited(_pid: u32) -> bool {
    false
}

/// Whether the worker `owner` is provably dead (see the module's doc).
pub(crate) fn provably_dead(owner: &str) -> bool {
    local_pid(owner).is_some_and(exited)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> String {
        default_worker_id().rsplit_once(':').unwrap().0.to_owned()
    }

    #[test]
    fn only_an_exited_pid_of_this_host_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited but not reaped: a zombie is dead.
        while !exited(pid) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(provably_dead(&format!("{}:{pid}", host())));
        child.wait().unwrap();
        assert!(provably_dead(&format!("{}:{pid}", host())), "reaped: no /proc entry");
        assert!(!provably_dead(&format!("another-host:{pid}")), "another host's pid is not ours to look at");
        assert!(!provably_dead(&default_worker_id()), "this process");
        assert!(!provably_dead(&format!("{}:1", host())), "a live pid");
        assert!(!provably_dead("relay-1"), "a given worker id");
        assert!(!provably_dead(&format!("{}:12x", host())));
        assert!(!provably_dead(&format!("{}:", host())));
    }
}
