//! The idempotency decision, written once: claim, run, then confirm or forget.
//!
//! The Rust wrapper ([`Idempotent`](super::Idempotent)) and the Ruby extension
//! both drive a [`Guard`]: [`Guard::before`] says whether to run the handler,
//! the handler runs (Rust future or Ruby block, on the caller's thread), and
//! [`Guard::after`] settles the key from the handler's outcome.
//!
//! The decisions are written once, as async code over
//! [`AsyncIdempotencyStore`]: `before_async` and the rest await a store over
//! PostgreSQL without blocking the task; `before` and the rest run the same
//! code over a blocking store, whose answers are ready at once.

use super::store::{AsyncIdempotencyStore, IdempotencyStore};
use crate::ack::{Ack, Guarded, Outcome, Verdict};
use crate::error::Result;
use crate::sql::blocking::run;
use std::sync::atomic::{AtomicU64, Ordering};

/// The error class of the outcome for a message with no key. Fatal, because
/// the same key function produces the same nothing on every retry. (The Ruby
/// layer settles it as its own `AceMQ::AMQP::FatalError`, with a Ruby
/// example in the message.)
pub const MISSING_KEY_CLASS: &str = "MissingIdempotencyKey";

/// The error class of the outcome for a key the store refuses as such (a
/// MySQL table's message_id holds 255 bytes): fatal, as a missing key is,
/// since the same key comes back on every retry; the message is the store's.
pub const INVALID_KEY_CLASS: &str = "InvalidIdempotencyKey";

/// The message of that outcome: what happened and what to do about it.
pub const MISSING_KEY_MESSAGE: &str = "idempotency key is missing: give the guard a key function that finds one \
     (for instance \"charge:\" followed by the payload's order_id, and none when the payload has no order_id), \
     or publish the message with an id \
     (a message from another client without message_id has no envelope id)";

/// How long a delivery waits, without spending attempts, while the
/// idempotency store fails: long enough to outlast a database restart or a
/// managed failover (usually well under a minute), short enough that a store
/// that stays broken (a table that was never migrated) still ends in the DLQ,
/// through the attempts the ladder has left, within the hour.
pub const STORE_OUTAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The decision when the store fails: the handler does not run (carrying on
/// could be the duplicate the store exists to prevent), and the message
/// waits round the ladder without spending attempts for up to
/// [`STORE_OUTAGE_WAIT`]: the database is what is away, not the message, so
/// a valid message is never dead-lettered because its store was down for a
/// while. Past that it is an ordinary retry.
fn store_failed(e: &crate::error::Error) -> Before {
    // Not the store failing: the key. Waiting for it to get better would
    // only delay the DLQ by STORE_OUTAGE_WAIT.
    if e.is_invalid_argument() {
        return Before::Settle(Outcome::Raised { class: INVALID_KEY_CLASS.to_string(), message: e.message().to_string(), fatal: true });
    }
    Before::Settle(Outcome::Wait {
        reason: format!("idempotency store failed, so the handler was not run: {e}"),
        up_to: STORE_OUTAGE_WAIT,
    })
}

/// The first wait of a delivery held in place ([`Guard::recheck_async`]):
/// short, because the usual reason for a claim elsewhere on a partition is
/// a runner that was just killed, and its claim is taken over as soon as
/// its process has exited (see [`SqlIdempotencyStore`](super::SqlIdempotencyStore)).
pub const HOLD_POLL_FIRST: std::time::Duration = std::time::Duration::from_millis(50);

/// The longest wait between two looks of a delivery held in place: a claim
/// confirmed, forgotten or expired is seen within this much (two statements
/// a look, one held delivery per partition at most).
pub const HOLD_POLL_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a delivery is held in place at most when its key is claimed by
/// another worker that is not provably dead: the claim's lease (a claim
/// lives at most `claim_timeout` from when it was written, so from now too)
/// and one more look. A claim still live after that was written after the
/// hold began (somebody else claimed the key meanwhile), and the delivery
/// then goes round the ladder as before.
pub fn hold_limit(claim_timeout: std::time::Duration) -> std::time::Duration {
    claim_timeout.saturating_add(HOLD_POLL_MAX)
}

/// The wait before the next look of a held delivery, after waiting
/// `previous` (None before the first): doubling from [`HOLD_POLL_FIRST`]
/// to [`HOLD_POLL_MAX`].
pub fn next_hold_poll(previous: Option<std::time::Duration>) -> std::time::Duration {
    previous.map_or(HOLD_POLL_FIRST, |p| p.saturating_mul(2).min(HOLD_POLL_MAX))
}

/// What to do with a delivery, decided before the handler runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Before {
    /// First time this key is seen: run the handler, then call
    /// [`Guard::after`] with this key and the handler's outcome.
    Run {
        /// The key that was claimed.
        key: String,
    },
    /// Handled already (confirmed, or not first with a store that cannot
    /// tell): settle with `Ack::Accept` without running the handler. A
    /// duplicate is the broker doing its job, not an error, so it is accepted
    /// rather than filling the DLQ with handled messages.
    Duplicate,
    /// Claimed by a handler that has not finished (or died): settle with
    /// `Ack::retry(reason)` without running, so the message comes back —
    /// a duplicate once the claim is confirmed, or to run once it is stale.
    InProgress {
        /// The retry's reason.
        reason: String,
        /// The store's claim timeout: the message waits (without spending
        /// attempts) at most this long. None for a store whose claims do not
        /// expire: an ordinary retry.
        wait: Option<std::time::Duration>,
    },
    /// Settle with this outcome without running the handler: a missing key
    /// (a fatal reject) or a failing store (a wait, see [`STORE_OUTAGE_WAIT`]).
    Settle(Outcome),
}

impl Before {
    /// The outcome to settle with when the handler must not run; `None` for
    /// [`Before::Run`].
    pub fn outcome_without_running(&self) -> Option<Outcome> {
        match self {
            Before::Run { .. } => None,
            Before::Duplicate => Some(Outcome::Ack(Ack::Accept)),
            Before::InProgress { reason, wait: Some(up_to) } => Some(Outcome::Wait { reason: reason.clone(), up_to: *up_to }),
            Before::InProgress { reason, wait: None } => Some(Outcome::Ack(Ack::retry(reason.clone()))),
            Before::Settle(o) => Some(o.clone()),
        }
    }

    /// What the guard decided, for the settlement's `process` event: a
    /// duplicate or a key in progress; `None` for the rest.
    pub fn verdict(&self) -> Option<Verdict> {
        match self {
            Before::Duplicate => Some(Verdict::Duplicate),
            Before::InProgress { .. } => Some(Verdict::InProgress),
            Before::Run { .. } | Before::Settle(_) => None,
        }
    }

    /// [`outcome_without_running`](Self::outcome_without_running) with the
    /// [`verdict`](Self::verdict) beside it: what to settle with
    /// ([`Consumer::settle_guarded`](crate::Consumer::settle_guarded)) so
    /// that the `process` event says `duplicate` or `in_progress`.
    pub fn guarded_without_running(&self) -> Option<Guarded> {
        self.outcome_without_running().map(|o| Guarded::new(o, self.verdict()))
    }
}

/// Counters kept by a [`Guard`], read with [`Guard::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuardStats {
    /// Times `first_time` answered false: the counter worth graphing. Normally
    /// near zero; a spike is a redelivery storm, usually consumers killed
    /// before they acknowledge (a shutdown timeout shorter than the handlers).
    pub duplicates: u64,
    /// Times the handler was run (the key was claimed).
    pub runs: u64,
    /// Messages settled as a fatal reject because they had no key.
    pub missing_keys: u64,
    /// Times `first_time` failed, so the message waited unhandled.
    pub store_errors: u64,
    /// Keys confirmed after an accepting handler.
    pub confirmed: u64,
    /// Keys forgotten after a handler that did not accept (or was abandoned).
    pub forgotten: u64,
    /// Times `confirm` failed after the handler accepted. The message is
    /// still accepted; the claim stays CLAIMED, and a redelivery after the
    /// claim timeout could run the handler again.
    pub confirm_errors: u64,
    /// Times `forget` failed after the handler did not accept. The claim
    /// stays until the claim timeout, and a redelivery before that is settled
    /// as a duplicate without running: alert on this one.
    pub forget_errors: u64,
    /// Handlers that never finished (a Rust future dropped or panicking, a
    /// Ruby thread killed): their key was forgotten.
    pub abandoned: u64,
    /// Deliveries of a keep_order consumer held in place because their key
    /// was claimed by another worker ([`Guard::hold_started`]): waited for,
    /// polling the store, instead of going round the ladder behind later
    /// messages of their key.
    pub held: u64,
    /// Deliveries that found their key claimed by another handler (live,
    /// unconfirmed): sent round the ladder to wait rather than accepted, so
    /// that if that handler died the message still runs once its claim
    /// expires. A count of such deliveries since the guard was made, not
    /// the number waiting now.
    pub claimed_elsewhere: u64,
    /// The old name of [`GuardStats::claimed_elsewhere`], which it equals.
    #[deprecated(note = "a count of deliveries, not a live gauge: read `claimed_elsewhere`")]
    pub in_progress: u64,
}

/// The idempotency decision and its counters. One per guarded handler;
/// share it (e.g. in an `Arc`) with whatever exports metrics.
///
/// Counters are relaxed atomics: each is exact, but a snapshot taken while
/// messages are being handled is not one instant across all of them.
#[derive(Debug, Default)]
pub struct Guard {
    duplicates: AtomicU64,
    runs: AtomicU64,
    missing_keys: AtomicU64,
    store_errors: AtomicU64,
    confirmed: AtomicU64,
    forgotten: AtomicU64,
    confirm_errors: AtomicU64,
    forget_errors: AtomicU64,
    abandoned: AtomicU64,
    in_progress: AtomicU64,
    held: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Guard {
    /// A guard with all counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decide whether the handler runs for a message whose key is `key`.
    ///
    /// - no key (`None` or empty, which is what the default key gives for a
    ///   message with no id): [`Before::Settle`] with a fatal
    ///   [`MISSING_KEY_CLASS`], because retrying produces the same
    ///   nothing and a guard that cannot key a message is not guarding it;
    /// - the store fails: [`Before::Settle`] with a wait that spends no
    ///   attempts (up to [`STORE_OUTAGE_WAIT`]), because the store is what is
    ///   broken, not the message, and carrying on could be the duplicate the
    ///   store exists to prevent;
    /// - not the first time: [`Before::Duplicate`];
    /// - the first time: [`Before::Run`], and the key is now claimed.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped after the store claimed the key and before
    /// this returns, the key stays claimed with nobody to run or forget it;
    /// its redeliveries wait until the claim expires, then run.
    pub async fn before_async<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: Option<&str>) -> Before {
        let key = match key {
            Some(k) if !k.is_empty() => k,
            _ => {
                bump(&self.missing_keys);
                crate::events::idempotency("missing_key", None, Some(MISSING_KEY_MESSAGE.to_string()));
                return Before::Settle(Outcome::Raised {
                    class: MISSING_KEY_CLASS.to_string(),
                    message: MISSING_KEY_MESSAGE.to_string(),
                    fatal: true,
                });
            }
        };
        self.claim(store, key, false).await
    }

    /// A delivery held in place asks again ([`Before::InProgress`] from
    /// [`before_async`](Self::before_async), on a keep_order consumer):
    /// the same decision, except that a key still claimed elsewhere is not
    /// counted or reported again. Called every [`next_hold_poll`] for at
    /// most [`hold_limit`], by the Rust [`Idempotent`](super::Idempotent)
    /// with `keep_order` and by the Ruby guard with `keep_order: true`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, as [`before_async`](Self::before_async).
    pub async fn recheck_async<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: &str) -> Before {
        self.claim(store, key, true).await
    }

    /// Count and report a delivery held in place (once per hold).
    pub fn hold_started(&self, key: &str) {
        bump(&self.held);
        crate::events::idempotency("held", Some(key), None);
    }

    async fn claim<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: &str, again: bool) -> Before {
        match store.first_time_async(key).await {
            Ok(true) => {
                bump(&self.runs);
                Before::Run { key: key.to_string() }
            }
            Ok(false) => self.not_first(store, key, again).await,
            Err(e) => {
                bump(&self.store_errors);
                crate::events::idempotency("store_error", Some(key), Some(e.to_string()));
                store_failed(&e)
            }
        }
    }

    /// `first_time` said no. A confirmed key is a message that really was
    /// handled: a duplicate, accepted. A key that is only claimed is a
    /// handler still running — or one that died mid-handler, whose claim
    /// nothing has taken over yet. Accepting that would drop the message
    /// (the broker redelivers a dead consumer's message at once, long before
    /// its claim expires), so it is retried: the ladder brings it back, and
    /// once the claim is confirmed it is a duplicate, or once it has expired
    /// it is taken over and runs. A store that cannot say what is confirmed
    /// (one answering only `first_time?`) gets the seed's two-state rule:
    /// not first is a duplicate.
    /// `again`: a held delivery asking again, whose claim elsewhere was
    /// counted and reported the first time.
    async fn not_first<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: &str, again: bool) -> Before {
        if !(store.can_confirm() && store.answers_confirmed()) {
            bump(&self.duplicates);
            crate::events::idempotency("duplicate", Some(key), None);
            return Before::Duplicate;
        }
        match store.confirmed_async(key).await {
            Ok(true) => {
                bump(&self.duplicates);
                crate::events::idempotency("duplicate", Some(key), None);
                Before::Duplicate
            }
            Ok(false) => {
                if !again {
                    bump(&self.in_progress);
                    crate::events::idempotency("in_progress", Some(key), None);
                }
                Before::InProgress {
                    reason: format!(
                        "idempotency key {key:?} is claimed by a handler that has not finished; waiting (without spending an attempt) so that it runs if that handler died (its claim expires after the claim timeout)"
                    ),
                    wait: store.claim_expiry(),
                }
            }
            Err(e) => {
                bump(&self.store_errors);
                crate::events::idempotency("store_error", Some(key), Some(e.to_string()));
store_failed(&e)
            }
        }
    }

    /// [`before`](Self::before) for a batch of deliveries at once: the keys
    /// are claimed together ([`IdempotencyStore::first_time_many`], one
    /// transaction on a SQL store) and each gets exactly the decision
    /// `before` would have given it. The handlers then run one by one, and
    /// [`after_many`](Self::after_many) settles their keys together; only
    /// after that are the deliveries acknowledged, so a duplicate arriving
    /// later finds its key confirmed. A process that dies part way through a
    /// batch leaves the unrun keys claimed: their redeliveries are retried
    /// (in progress) until the claim is stale, then run — later, never twice.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, as [`before_async`](Self::before_async): keys
    /// claimed before the drop stay claimed until their claims expire.
    pub async fn before_many_async<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, keys: &[Option<&str>]) -> Vec<Before> {
        let mut out: Vec<Option<Before>> = vec![None; keys.len()];
        let mut present: Vec<(usize, &str)> = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match key {
                Some(k) if !k.is_empty() => present.push((i, k)),
                _ => out[i] = Some(self.before_async(store, None).await),
            }
        }
        let claim: Vec<&str> = present.iter().map(|(_, k)| *k).collect();
        match store.first_time_many_async(&claim).await {
            Ok(firsts) => {
                for ((i, key), first) in present.iter().zip(firsts) {
                    out[*i] = Some(if first {
                        bump(&self.runs);
                        Before::Run { key: key.to_string() }
                    } else {
                        self.not_first(store, key, false).await
                    });
                }
            }
            // One key the store refuses (too long for its table) must not
            // hold back the batch: each is decided alone, that one rejected.
            Err(e) if e.is_invalid_argument() => {
                for (i, key) in &present {
                    out[*i] = Some(self.before_async(store, Some(key)).await);
                }
            }
            Err(e) => {
                for (i, key) in &present {
                    bump(&self.store_errors);
                    crate::events::idempotency("store_error", Some(key), Some(e.to_string()));
                    out[*i] = Some(store_failed(&e));
                }
            }
        }
        out.into_iter().map(|b| b.expect("every key decided")).collect()
    }

    /// [`after`](Self::after) for a batch: the accepted keys are confirmed
    /// together ([`IdempotencyStore::confirm_many`]), the others forgotten
    /// one by one. Returns the first error; the outcomes stand either way.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped part way, some keys are confirmed or
    /// forgotten and the rest stay claimed until their claims expire (a
    /// redelivery waits, then runs). Await it before acknowledging.
    pub async fn after_many_async<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, settled: &[(&str, &Outcome)]) -> Result<()> {
        let accepted: Vec<&str> =
            settled.iter().filter(|(_, o)| matches!(o, Outcome::Ack(Ack::Accept))).map(|(k, _)| *k).collect();
        let mut first_error = None;
        if !accepted.is_empty() && store.can_confirm() {
            match store.confirm_many_async(&accepted).await {
                Ok(()) => self.confirmed.fetch_add(accepted.len() as u64, Ordering::Relaxed),
                Err(e) => {
                    self.confirm_errors.fetch_add(accepted.len() as u64, Ordering::Relaxed);
                    for k in &accepted {
                        crate::events::idempotency("confirm_failed", Some(k), Some(e.to_string()));
                    }
                    first_error = Some(e);
                    0
                }
            };
        }
        for (key, outcome) in settled {
            if !matches!(outcome, Outcome::Ack(Ack::Accept)) {
                if let Err(e) = self.release(store, key).await {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Settle the key after the handler ran with `outcome`: confirm it when
    /// the handler accepted, otherwise forget it so the retry really runs.
    ///
    /// The handler's outcome stands whatever this returns: the work has been
    /// done (or not) and settling differently would only add a second
    /// problem. An error is for logging and is counted:
    /// - confirm failed: accept anyway; the row stays CLAIMED and a
    ///   redelivery after the claim timeout could run the handler again
    ///   (confirm inside the handler's own transaction to close that gap);
    /// - forget failed: the row stays CLAIMED until the claim timeout, and a
    ///   redelivery before then is settled as a duplicate without running.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped before the store answered, the key stays
    /// claimed until its claim expires (a redelivery waits, then runs).
    pub async fn after_async<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: &str, outcome: &Outcome) -> Result<()> {
        if matches!(outcome, Outcome::Ack(Ack::Accept)) {
            if !store.can_confirm() {
                return Ok(());
            }
            store.confirm_async(key).await.map(|()| bump(&self.confirmed)).inspect_err(|e| {
                bump(&self.confirm_errors);
                crate::events::idempotency("confirm_failed", Some(key), Some(e.to_string()));
            })
        } else {
            self.release(store, key).await
        }
    }

    /// The handler never produced an outcome (its future was dropped, it
    /// panicked, its Ruby thread was killed): forget the key, because the
    /// message was not handled and will be redelivered.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped before the store answered, the key stays
    /// claimed until its claim expires; it is counted as abandoned either
    /// way. From a destructor use [`abandon_now_or_later`](Self::abandon_now_or_later).
    pub async fn abandon_async<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: &str) -> Result<()> {
        bump(&self.abandoned);
        self.release(store, key).await
    }

    async fn release<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: &str) -> Result<()> {
        if !store.can_forget() {
            return Ok(());
        }
        store.forget_async(key).await.map(|()| bump(&self.forgotten)).inspect_err(|e| {
            bump(&self.forget_errors);
            crate::events::idempotency("forget_failed", Some(key), Some(e.to_string()));
        })
    }

    /// Decide whether the handler runs, with a blocking store: exactly
    /// [`before_async`](Self::before_async), which see.
    pub fn before(&self, store: &dyn IdempotencyStore, key: Option<&str>) -> Before {
        run(self.before_async(store, key))
    }

    /// [`recheck_async`](Self::recheck_async) with a blocking store.
    pub fn recheck(&self, store: &dyn IdempotencyStore, key: &str) -> Before {
        run(self.recheck_async(store, key))
    }

    /// [`before_many_async`](Self::before_many_async) with a blocking store.
    pub fn before_many(&self, store: &dyn IdempotencyStore, keys: &[Option<&str>]) -> Vec<Before> {
        run(self.before_many_async(store, keys))
    }

    /// [`after_many_async`](Self::after_many_async) with a blocking store.
    pub fn after_many(&self, store: &dyn IdempotencyStore, settled: &[(&str, &Outcome)]) -> Result<()> {
        run(self.after_many_async(store, settled))
    }

    /// [`after_async`](Self::after_async) with a blocking store.
    pub fn after(&self, store: &dyn IdempotencyStore, key: &str, outcome: &Outcome) -> Result<()> {
        run(self.after_async(store, key, outcome))
    }

    /// [`abandon_async`](Self::abandon_async) with a blocking store.
    pub fn abandon(&self, store: &dyn IdempotencyStore, key: &str) -> Result<()> {
        run(self.abandon_async(store, key))
    }

    /// [`abandon`](Self::abandon) from a destructor, where nothing can be
    /// awaited: the key is forgotten at once by a blocking store, or by a
    /// task the store spawns ([`AsyncIdempotencyStore::forget_now_or_later`]);
    /// `forgotten` and `forget_errors` count only what was done at once.
    pub fn abandon_now_or_later<S: AsyncIdempotencyStore + ?Sized>(&self, store: &S, key: String) {
        bump(&self.abandoned);
        if !store.can_forget() {
            return;
        }
        match store.forget_now_or_later(key) {
            Some(Ok(())) => bump(&self.forgotten),
            Some(Err(_)) => bump(&self.forget_errors),
            None => {}
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> GuardStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        GuardStats {
            duplicates: get(&self.duplicates),
            runs: get(&self.runs),
            missing_keys: get(&self.missing_keys),
            store_errors: get(&self.store_errors),
            confirmed: get(&self.confirmed),
            forgotten: get(&self.forgotten),
            confirm_errors: get(&self.confirm_errors),
            forget_errors: get(&self.forget_errors),
            abandoned: get(&self.abandoned),
            held: get(&self.held),
            claimed_elsewhere: get(&self.in_progress),
            #[allow(deprecated)]
            in_progress: get(&self.in_progress),
        }
    }
}
