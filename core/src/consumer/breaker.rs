//! The circuit breaker: which failures say a downstream is down, and the
//! state machine that pauses a consumer while they keep coming and probes,
//! one message at a time, for the downstream's return. The consumer applies
//! what it decides (flow/breaker.rs).

use crate::ack::Outcome;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often an open breaker lets one message through when no probe
/// interval is given (or `pause`, when that is shorter): a returning
/// downstream is seen within this much, and a downstream still down costs
/// one message's attempt per interval.
pub const DEFAULT_BREAKER_PROBE: Duration = Duration::from_secs(5);

/// A handler's failure, as a breaker's predicates see it
/// ([`CircuitBreaker::on`], [`CircuitBreaker::ignore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failed<'a> {
    /// The handler raised, or returned an error.
    Raised {
        /// The error's class: a Rust error's type name (what
        /// [`Failure`](crate::Failure) keeps, `std::any::type_name`), a Ruby
        /// exception's class name.
        class: &'a str,
        /// The error's message.
        message: &'a str,
    },
    /// The handler asked for a retry ([`Ack::Retry`](crate::Ack::Retry)).
    Retry {
        /// The reason it gave.
        reason: &'a str,
    },
    /// The handler ran past its deadline
    /// ([`ConsumeOptions::timeout`](super::ConsumeOptions::timeout)).
    Timeout,
}

impl Failed<'_> {
    /// The error's class, for a handler that raised.
    pub fn class(&self) -> Option<&str> {
        match self {
            Failed::Raised { class, .. } => Some(class),
            _ => None,
        }
    }

    /// The handler raised an `E`: its class is `E`'s type name, which is
    /// what a handler's `Err(E)` (or `?`) settles with. Type names are
    /// compared, so say `E` as the error's own type, not an alias of a
    /// trait object.
    pub fn is<E: ?Sized>(&self) -> bool {
        self.class() == Some(std::any::type_name::<E>())
    }

    /// The failure's words: an error's message, a retry's reason.
    pub fn message(&self) -> Option<&str> {
        match self {
            Failed::Raised { message, .. } => Some(message),
            Failed::Retry { reason } => Some(reason),
            Failed::Timeout => None,
        }
    }

    /// What an outcome's failure is, when it is one a breaker may count:
    /// a non-fatal raise or a retry. A reject, a fatal raise (a reject too)
    /// and a value that is not an Ack are about the message; an accept and
    /// a wait (not now, not the message's fault, no attempt spent) are not
    /// failures.
    pub(crate) fn of(outcome: &Outcome) -> Option<Failed<'_>> {
        match outcome {
            Outcome::Raised { class, message, fatal: false } => Some(Failed::Raised { class, message }),
            Outcome::Ack(crate::Ack::Retry { reason }) => Some(Failed::Retry { reason }),
            _ => None,
        }
    }
}

type Predicate = Arc<dyn Fn(&Failed<'_>) -> bool + Send + Sync>;

/// When a consumer's handlers keep failing because a downstream is down,
/// stop taking messages rather than send valid messages round the retry
/// ladder into the DLQ.
///
/// Which failures count: with neither [`on`](CircuitBreaker::on) nor
/// [`ignore`](CircuitBreaker::ignore), every one (a handler that raised,
/// asked for a retry or ran past its deadline; never a reject, which is
/// about the message). With `on`, only those it is true for; `ignore` takes
/// out those it is true for. A failure that does not count takes the ladder
/// as it would without a breaker, and changes nothing here.
///
/// `failures` counted failures within `within` open the breaker: the
/// consumer pauses, and what it had buffered goes back to the queue with no
/// attempt counted. Every `probe` after that (from the moment it opened) it
/// lets one message through (half-open): success closes the breaker and
/// consumption resumes; a counted failure opens it for another `probe`,
/// and that message goes round the ladder without spending an attempt
/// (it is settled as an [`Outcome::Wait`]: the downstream is down, the
/// message is not at fault).
/// So a downstream's return is seen within one probe interval, whatever
/// `pause` is: `pause` is the longest the interval may be, and its default
/// ([`DEFAULT_BREAKER_PROBE`] when `pause` is longer).
#[derive(Clone)]
pub struct CircuitBreaker {
    /// Counted failures that open it. At least 1.
    pub failures: u32,
    /// The window they are counted in.
    pub within: Duration,
    /// The longest an open breaker goes without trying a message: the
    /// probe interval's ceiling and, at most [`DEFAULT_BREAKER_PROBE`], its default.
    pub pause: Duration,
    probe: Option<Duration>,
    on: Option<Predicate>,
    ignore: Option<Predicate>,
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("failures", &self.failures)
            .field("within", &self.within)
            .field("pause", &self.pause)
            .field("probe", &self.probe_interval())
            .field("on", &self.on.as_ref().map(|_| "fn"))
            .field("ignore", &self.ignore.as_ref().map(|_| "fn"))
            .finish()
    }
}

impl CircuitBreaker {
    /// A breaker: `failures` within `within` open it; it tries a message
    /// every `pause` or [`DEFAULT_BREAKER_PROBE`], whichever is shorter, until one
    /// succeeds. Every failure counts until [`on`](Self::on) or
    /// [`ignore`](Self::ignore) say otherwise.
    pub fn new(failures: u32, within: Duration, pause: Duration) -> Self {
        CircuitBreaker { failures, within, pause, probe: None, on: None, ignore: None }
    }

    /// Count only the failures `predicate` is true for: the ones that say
    /// the downstream is down (`|f| f.is::<std::io::Error>()`, or
    /// `matches!(f, Failed::Timeout)`). A handler's bug, or a message its
    /// handler cannot take, then goes round the ladder into the DLQ without
    /// pausing the consumer. Called on the thread that settles, once per
    /// failure: keep it quick, and do not panic in it.
    pub fn on(self, predicate: impl Fn(&Failed<'_>) -> bool + Send + Sync + 'static) -> Self {
        CircuitBreaker { on: Some(Arc::new(predicate)), ..self }
    }

    /// Never count the failures `predicate` is true for, even those
    /// [`on`](Self::on) is true for.
    pub fn ignore(self, predicate: impl Fn(&Failed<'_>) -> bool + Send + Sync + 'static) -> Self {
        CircuitBreaker { ignore: Some(Arc::new(predicate)), ..self }
    }

    /// Try a message every `interval` while open (positive, at most
    /// `pause`).
    pub fn probe(self, interval: Duration) -> Self {
        CircuitBreaker { probe: Some(interval), ..self }
    }

    /// How long an open breaker waits before each trial.
    pub fn probe_interval(&self) -> Duration {
        self.probe.unwrap_or(DEFAULT_BREAKER_PROBE.min(self.pause))
    }

    /// Whether `failed` counts toward opening it. `told`: the answer of the
    /// side that holds the error itself (a Ruby exception, matched against
    /// the consumer's `on:` and `ignore:` on the handler's thread), which
    /// stands for the predicates; the predicates decide the rest.
    pub fn counts(&self, failed: &Failed<'_>, told: Option<bool>) -> bool {
        if let Some(told) = told {
            return told;
        }
        if self.ignore.as_ref().is_some_and(|p| p(failed)) {
            return false;
        }
        self.on.as_ref().is_none_or(|p| p(failed))
    }

    /// The rules a breaker must meet, checked by `open` and, through the
    /// extension, by Ruby's `BreakerOptions` and the Rails DSL as they are
    /// given: failures at least 1, within and pause positive, the probe
    /// interval above zero and at most pause.
    pub fn validate(&self) -> crate::Result<()> {
        let probe = self.probe_interval();
        if self.failures == 0 || self.within.is_zero() || self.pause.is_zero() || probe.is_zero() || probe > self.pause {
            return Err(crate::Error::invalid(format!(
                "circuit_breaker needs failures of at least 1, a positive within and pause, and a probe interval \
                 above zero and at most pause (got failures {}, within {}s, pause {}s, probe {}s)",
                self.failures,
                self.within.as_secs_f64(),
                self.pause.as_secs_f64(),
                probe.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Taking messages, counting failures.
    Closed,
    /// Paused until the probe interval is over.
    Open,
    /// The probe interval is over: the next message handed out is the trial.
    HalfOpen,
    /// The trial is in a handler; nothing else is taken until it settles.
    Trying,
}

impl BreakerState {
    /// The lowercase name in events, metrics and the runner's status.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Trying => "trying",
        }
    }
}

/// How a delivery settled, as the breaker reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Accepted or rejected: the handler reached its downstream, or found
    /// the message at fault.
    Fine,
    /// A failure that counts: the downstream looks down.
    Counted,
    /// A failure that does not count (a bug, a wait): it says nothing
    /// about the downstream either way.
    Other,
}

#[derive(Debug)]
enum State {
    Closed { failures: VecDeque<Instant> },
    Open { until: Instant },
    HalfOpen,
    Trying { id: u64 },
}

/// A breaker's state machine. Thread-safe; the consumer calls it when it
/// hands a delivery out and when one settles, and applies what it returns.
#[derive(Debug)]
pub(crate) struct Breaker {
    pub(crate) options: CircuitBreaker,
    state: Mutex<State>,
}

/// A transition, for the event and for the consumer to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) to: BreakerState,
    pub(crate) reason: String,
    /// The trial failed in a way that counts: its message goes round
    /// without spending an attempt (see [`Breaker::settled`]).
    pub(crate) trial_failed: bool,
}

impl Transition {
    fn to(to: BreakerState, reason: impl Into<String>) -> Self {
        Transition { to, reason: reason.into(), trial_failed: false }
    }
}

impl Breaker {
    pub(crate) fn new(options: CircuitBreaker) -> Self {
        Breaker { options, state: Mutex::new(State::Closed { failures: VecDeque::new() }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn state(&self) -> BreakerState {
        match *self.lock() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen => BreakerState::HalfOpen,
            State::Trying { .. } => BreakerState::Trying,
        }
    }

    /// Whether the consumer should be paused for the breaker's sake.
    pub(crate) fn holds(&self) -> bool {
        matches!(*self.lock(), State::Open { .. } | State::Trying { .. })
    }

    /// When an open breaker's wait ends.
    pub(crate) fn open_until(&self) -> Option<Instant> {
        match *self.lock() {
            State::Open { until } => Some(until),
            _ => None,
        }
    }

    /// What a settlement means here: `failed` is its failure (None: it was
    /// not one) and `told` the handler side's answer for it.
    pub(crate) fn reading(&self, failed: Option<&Failed<'_>>, told: Option<bool>) -> Reading {
        match failed {
            None => Reading::Fine,
            Some(f) if self.options.counts(f, told) => Reading::Counted,
            Some(_) => Reading::Other,
        }
    }

    /// A delivery (watch id `id`) is about to be handed out: false when it
    /// must go back (open, or a trial already out). The first one after the
    /// wait is the trial.
    pub(crate) fn admit(&self, id: u64) -> (bool, Option<Transition>) {
        let mut st = self.lock();
        match *st {
            State::Closed { .. } => (true, None),
            State::HalfOpen => {
                *st = State::Trying { id };
                (true, Some(Transition::to(BreakerState::Trying, "one message let through to try the handler")))
            }
            State::Open { .. } | State::Trying { .. } => (false, None),
        }
    }

    /// Delivery `id` settled as `reading` says. A trial that fails in a
    /// way that counts says the downstream is still down, not that its
    /// message is at fault: the transition says so (`trial_failed`), and
    /// the consumer sends that message round without spending an attempt,
    /// so that a long outage over a quiet queue does not use up the
    /// attempts of the few messages it keeps trying.
    pub(crate) fn settled(&self, id: u64, reading: Reading, now: Instant) -> Option<Transition> {
        let o = &self.options;
        let probe = o.probe_interval();
        let mut st = self.lock();
        match &mut *st {
            State::Closed { failures } => {
                if reading != Reading::Counted {
                    return None;
                }
                failures.push_back(now);
                while failures.front().is_some_and(|t| now.duration_since(*t) > o.within) {
                    failures.pop_front();
                }
                if failures.len() < o.failures as usize {
                    return None;
                }
                *st = State::Open { until: now + probe };
                Some(Transition::to(
                    BreakerState::Open,
                    format!(
                        "{} failures within {}: paused, trying one message every {}",
                        o.failures,
                        crate::checks::human(o.within),
                        crate::checks::human(probe)
                    ),
                ))
            }
            State::Trying { id: trial } if *trial == id => match reading {
                Reading::Counted => {
                    *st = State::Open { until: now + probe };
                    let reason = format!("the trial message failed: trying another in {}", crate::checks::human(probe));
                    Some(Transition { trial_failed: true, ..Transition::to(BreakerState::Open, reason) })
                }
                Reading::Fine => {
                    *st = State::Closed { failures: VecDeque::new() };
                    Some(Transition::to(BreakerState::Closed, "the trial message succeeded"))
                }
                // A bug says nothing about the downstream: the next message
                // is the trial, at once.
                Reading::Other => {
                    *st = State::HalfOpen;
                    Some(Transition::to(BreakerState::HalfOpen, "the trial message failed in a way that is not counted: the next message is a trial"))
                }
            },
            // Settlements of deliveries handed out before it opened change
            // nothing: the breaker already decided.
            _ => None,
        }
    }

    /// The wait is over at `now`: half-open.
    pub(crate) fn tick(&self, now: Instant) -> Option<Transition> {
        let mut st = self.lock();
        match *st {
            State::Open { until } if until <= now => {
                *st = State::HalfOpen;
                Some(Transition::to(BreakerState::HalfOpen, "the probe interval is over: the next message is a trial"))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNTED: Reading = Reading::Counted;
    const FINE: Reading = Reading::Fine;

    #[test]
    fn a_breaker_opens_at_the_failures_within_its_window_and_closes_after_a_good_trial() {
        let b = Breaker::new(CircuitBreaker::new(3, Duration::from_secs(10), Duration::from_secs(5)));
        let t0 = Instant::now();
        assert_eq!(b.settled(1, COUNTED, t0), None);
        // A failure outside the window no longer counts.
        assert_eq!(b.settled(2, COUNTED, t0 + Duration::from_secs(11)), None);
        assert_eq!(b.settled(3, FINE, t0 + Duration::from_secs(11)), None);
        assert_eq!(b.settled(4, COUNTED, t0 + Duration::from_secs(12)), None);
        let opened = b.settled(5, COUNTED, t0 + Duration::from_secs(13)).unwrap();
        assert_eq!((opened.to, opened.trial_failed), (BreakerState::Open, false));
        assert!(b.holds());
        assert_eq!(b.admit(6), (false, None));
        assert_eq!(b.tick(t0 + Duration::from_secs(17)), None);
        assert_eq!(b.tick(t0 + Duration::from_secs(18)).unwrap().to, BreakerState::HalfOpen);
        assert!(!b.holds());
        assert_eq!(b.admit(7).1.unwrap().to, BreakerState::Trying);
        assert_eq!(b.admit(8), (false, None));
        // A straggler from before does not decide the trial.
        assert_eq!(b.settled(6, COUNTED, t0 + Duration::from_secs(18)), None);
        assert_eq!(b.settled(7, FINE, t0 + Duration::from_secs(19)).unwrap().to, BreakerState::Closed);
        assert_eq!(b.admit(9), (true, None));
    }

    #[test]
    fn a_failed_trial_opens_the_breaker_for_one_probe_interval_not_the_pause() {
        let b = Breaker::new(CircuitBreaker::new(1, Duration::from_secs(10), Duration::from_secs(60)).probe(Duration::from_secs(2)));
        let t0 = Instant::now();
        b.settled(1, COUNTED, t0).unwrap();
        // The first trial comes after the probe interval, not the pause.
        assert_eq!(b.open_until(), Some(t0 + Duration::from_secs(2)));
        b.tick(t0 + Duration::from_secs(2)).unwrap();
        b.admit(2);
        let reopened = b.settled(2, COUNTED, t0 + Duration::from_secs(3)).unwrap();
        assert_eq!((reopened.to, reopened.trial_failed), (BreakerState::Open, true));
        assert_eq!(b.open_until(), Some(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn a_trial_that_fails_without_counting_lets_the_next_message_try() {
        let b = Breaker::new(CircuitBreaker::new(1, Duration::from_secs(10), Duration::from_secs(5)));
        let t0 = Instant::now();
        b.settled(1, COUNTED, t0).unwrap();
        b.tick(t0 + Duration::from_secs(5)).unwrap();
        b.admit(2);
        assert_eq!(b.settled(2, Reading::Other, t0 + Duration::from_secs(6)).unwrap().to, BreakerState::HalfOpen);
        assert_eq!(b.admit(3).1.unwrap().to, BreakerState::Trying);
    }

    #[test]
    fn only_counted_failures_open_it() {
        let b = Breaker::new(CircuitBreaker::new(1, Duration::from_secs(10), Duration::from_secs(5)));
        assert_eq!(b.settled(1, Reading::Other, Instant::now()), None);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn on_and_ignore_decide_what_counts_and_the_handler_side_answer_stands() {
        let raised = Failed::Raised { class: "std::io::error::Error", message: "refused" };
        let bug = Failed::Raised { class: "NoMethodError", message: "undefined method" };
        let every = CircuitBreaker::new(1, Duration::from_secs(1), Duration::from_secs(1));
        assert!(every.counts(&bug, None) && every.counts(&Failed::Timeout, None) && every.counts(&Failed::Retry { reason: "x" }, None));
        let on = every.clone().on(|f| f.is::<std::io::Error>() || matches!(f, Failed::Timeout));
        assert!(on.counts(&raised, None));
        assert!(on.counts(&Failed::Timeout, None));
        assert!(!on.counts(&bug, None));
        assert!(!on.counts(&Failed::Retry { reason: "x" }, None));
        assert!(on.counts(&bug, Some(true)), "the handler side's answer stands for the predicates");
        let ignored = on.ignore(|f| f.message() == Some("refused"));
        assert!(!ignored.counts(&raised, None));
        let only_ignore = every.ignore(|f| f.class() == Some("NoMethodError"));
        assert!(!only_ignore.counts(&bug, None));
        assert!(only_ignore.counts(&Failed::Retry { reason: "x" }, None));
    }

    #[test]
    fn what_an_outcome_fails_with() {
        let raised = Outcome::Raised { class: "E".into(), message: "m".into(), fatal: false };
        assert_eq!(Failed::of(&raised), Some(Failed::Raised { class: "E", message: "m" }));
        assert_eq!(Failed::of(&Outcome::Ack(crate::Ack::retry("r"))), Some(Failed::Retry { reason: "r" }));
        assert_eq!(Failed::of(&Outcome::Raised { class: "E".into(), message: "m".into(), fatal: true }), None);
        assert_eq!(Failed::of(&Outcome::Ack(crate::Ack::reject("r"))), None);
        assert_eq!(Failed::of(&Outcome::NotAnAck { what: "nil".into() }), None);
    }

    #[test]
    fn bad_settings_are_refused_with_what_to_give() {
        assert!(CircuitBreaker::new(0, Duration::from_secs(1), Duration::from_secs(1)).validate().is_err());
        assert!(CircuitBreaker::new(1, Duration::ZERO, Duration::from_secs(1)).validate().is_err());
        let base = CircuitBreaker::new(1, Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(base.probe_interval(), DEFAULT_BREAKER_PROBE);
        assert!(base.clone().probe(Duration::ZERO).validate().is_err());
        assert!(base.clone().probe(Duration::from_secs(61)).validate().is_err());
        assert!(base.probe(Duration::from_secs(1)).validate().is_ok());
        assert_eq!(CircuitBreaker::new(1, Duration::from_secs(1), Duration::from_secs(2)).probe_interval(), Duration::from_secs(2));
    }
}
