//! How many restarts one supervised thing has left: a consumer in a
//! runner, or a worker process under `acemq run --processes N`'s parent
//! (the Ruby parent runs no engine, and calls this through the extension).

use super::RestartPolicy;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The restarts spent within a [`RestartPolicy`]'s window. [`spend`]
/// answers the pause before the next restart, doubling from
/// `initial_backoff` to `max_backoff`, or `None` once `max_restarts` were
/// spent within `window`: the caller gives up.
///
/// [`spend`]: RestartBudget::spend
///
/// ```
/// use acemq::runner::{RestartBudget, RestartPolicy};
/// use std::time::{Duration, Instant};
///
/// let policy = RestartPolicy { max_restarts: 2, ..RestartPolicy::default() };
/// let mut budget = RestartBudget::default();
/// let now = Instant::now();
/// assert_eq!(budget.spend(&policy, now), Some(Duration::from_secs(1)));
/// assert_eq!(budget.spend(&policy, now), Some(Duration::from_secs(2)));
/// assert_eq!(budget.spend(&policy, now), None, "2 within the window: give up");
/// assert_eq!((budget.recent(), budget.total()), (2, 2));
/// ```
#[derive(Debug, Clone, Default)]
pub struct RestartBudget {
    recent: VecDeque<Instant>,
    total: u64,
}

impl RestartBudget {
    /// One more failure at `now`: the pause before restarting, or `None`
    /// when the budget is spent (nothing is recorded then).
    pub fn spend(&mut self, policy: &RestartPolicy, now: Instant) -> Option<Duration> {
        while self.recent.front().is_some_and(|t| now.saturating_duration_since(*t) > policy.window) {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 >= policy.max_restarts {
            return None;
        }
        let n = self.recent.len() as u32;
        self.recent.push_back(now);
        self.total += 1;
        Some(policy.initial_backoff.saturating_mul(2u32.saturating_pow(n)).min(policy.max_backoff))
    }

    /// Restarts within the window, as of the last [`spend`](Self::spend).
    pub fn recent(&self) -> usize {
        self.recent.len()
    }

    /// Every restart so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RestartPolicy {
        RestartPolicy {
            max_restarts: 3,
            window: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(250),
        }
    }

    #[test]
    fn pauses_double_to_the_cap_and_the_budget_is_spent_within_the_window() {
        let mut b = RestartBudget::default();
        let t = Instant::now();
        let pauses: Vec<_> = (0..4).map(|_| b.spend(&policy(), t)).collect();
        assert_eq!(pauses, [Some(Duration::from_millis(100)), Some(Duration::from_millis(200)), Some(Duration::from_millis(250)), None]);
        assert_eq!((b.recent(), b.total()), (3, 3), "the refusal records nothing");
    }

    #[test]
    fn restarts_older_than_the_window_are_forgotten_and_the_pause_starts_over() {
        let mut b = RestartBudget::default();
        let t = Instant::now();
        for _ in 0..3 {
            b.spend(&policy(), t);
        }
        assert_eq!(b.spend(&policy(), t + Duration::from_secs(10)), None, "at the window's edge: still counted");
        assert_eq!(b.spend(&policy(), t + Duration::from_secs(11)), Some(Duration::from_millis(100)));
        assert_eq!((b.recent(), b.total()), (1, 4));
    }

    #[test]
    fn a_policy_of_no_restarts_gives_up_at_once() {
        let mut b = RestartBudget::default();
        assert_eq!(b.spend(&RestartPolicy { max_restarts: 0, ..policy() }, Instant::now()), None);
    }
}
