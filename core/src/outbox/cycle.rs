//! The relay's cycle, written once: claim, settle the batch before, send,
//! keep in flight or settle, complete, hold or delete. No I/O: a driver asks
//! [`Cycle::step`] for the next [`Action`], does it, and hands back its
//! [`Input`]. Two drivers: the tokio task of [`OutboxRelay`](super::OutboxRelay),
//! and the Ruby relay's thread in the extension, whose SQL must run on that
//! thread holding the GVL (a Ruby driver can be used nowhere else).

use super::{settle, Completion, OutboxRecord, Swept};
use crate::error::{Error, Result};
use crate::events::OutboxFailure;
use std::collections::VecDeque;

/// What the driver does next, asked of [`Cycle::step`]. Each says which
/// [`Input`] it is answered with.
#[derive(Debug)]
#[non_exhaustive]
pub enum Action {
    /// Claim up to `batch_size` due rows, deleting `done` (confirmed rows
    /// whose delete was held back) in the same commit:
    /// [`SqlOutboxStore::delete_then_claim`](super::SqlOutboxStore::delete_then_claim).
    /// Answered with [`Input::Claimed`].
    Claim {
        /// Ids to delete in the claim's commit.
        done: Vec<i64>,
        /// Rows to claim at most.
        batch_size: usize,
    },
    /// Send these records and keep the future of their confirms
    /// ([`OutboxPublisher::send_batch`](super::OutboxPublisher::send_batch)).
    /// Answered with [`Input::Sent`], the records handed back.
    Send(Vec<OutboxRecord>),
    /// Wait for the confirms of the batch sent last. Answered with
    /// [`Input::Confirmed`].
    Settle,
    /// Delete the confirmed rows and back off the failed ones
    /// ([`SqlOutboxStore::complete`](super::SqlOutboxStore::complete)).
    /// Answered with [`Input::Completed`].
    Complete(Vec<Completion>),
    /// Delete these confirmed rows
    /// ([`SqlOutboxStore::delete_confirmed`](super::SqlOutboxStore::delete_confirmed)).
    /// Answered with [`Input::Deleted`].
    Delete(Vec<i64>),
    /// Whether a wake-up (a row added or committed) came since this sweep's
    /// claim. Answered with [`Input::Woken`].
    Woken,
    /// Tell `on_error` and the event subscribers. Answered with [`Input::Next`].
    Report(Report),
    /// Sweep again at once (let the runtime breathe first). Answered with
    /// [`Input::Next`], or [`Input::Stop`] when the relay is closing.
    Again,
    /// Wait for a wake-up or the interval. Answered with [`Input::Next`], or
    /// [`Input::Stop`] when the relay is closing.
    Wait,
    /// Done: the counts of a one-off sweep, or the error that ended it; a
    /// started cycle finishes once stopped, with nothing left in flight or
    /// held. Every later step finishes again.
    Finished(Result<Swept>),
}

/// The result of the [`Action`] a driver was handed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Input {
    /// The answer to [`Action::Report`], [`Action::Again`] and
    /// [`Action::Wait`], and the first input of a cycle.
    Next,
    /// In place of [`Input::Next`]: the relay is closing. The batch in
    /// flight is settled, what is held is deleted, and the cycle finishes.
    Stop,
    /// The claim's rows, or why it failed.
    Claimed(Result<Vec<OutboxRecord>>),
    /// The records of [`Action::Send`], sent.
    Sent(Vec<OutboxRecord>),
    /// One result per record sent, in order (a missing one is a failure).
    Confirmed(Vec<Result<()>>),
    /// What [`Action::Complete`] did.
    Completed(Result<usize>),
    /// What [`Action::Delete`] did.
    Deleted(Result<usize>),
    /// Whether a wake-up came.
    Woken(bool),
}

/// One failure for `on_error`.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong.
    pub error: Error,
    /// The exchange of the record that failed; `None` when the sweep failed
    /// as a whole (the database).
    pub exchange: Option<String>,
    /// Its routing key; `None` with `exchange`.
    pub routing_key: Option<String>,
}

impl Failure {
    fn whole(error: Error) -> Self {
        Failure { error, exchange: None, routing_key: None }
    }
}

/// What to tell: failures for `on_error`, and a settled batch for the
/// `outbox.acemq` event.
#[derive(Debug, Default)]
pub struct Report {
    /// Each failure, in order.
    pub failures: Vec<Failure>,
    /// The counts of the batch settled, `None` for a sweep that failed as a
    /// whole (no event).
    pub swept: Option<Swept>,
    /// The event's failed destinations (empty when nobody listens).
    pub event_errors: Vec<OutboxFailure>,
}

impl Report {
    /// Emit the `outbox.acemq` event of the batch settled, if any, with the
    /// backlog as the driver read it (`None` where it did not).
    pub fn emit(&mut self, backlog: Option<(u64, Option<std::time::Duration>)>) {
        if let Some(swept) = self.swept {
            crate::events::outbox_swept(swept.claimed, swept.confirmed, std::mem::take(&mut self.event_errors), backlog);
        }
    }

    /// Whether `emit` sends an event: only then is a backlog worth
    /// reading. A sweep that failed as a whole has none, and reading the
    /// backlog from the database that just failed would only fail again.
    pub fn has_event(&self) -> bool {
        self.swept.is_some()
    }

    fn of(error: Error) -> Self {
        Report { failures: vec![Failure::whole(error)], ..Report::default() }
    }
}

/// Which batch a settle belongs to.
#[derive(Debug)]
enum Then {
    /// The batch in flight, settled after the claim that came back with `claimed`.
    Previous { claimed: Result<Vec<OutboxRecord>>, done: Vec<i64> },
    /// The batch this sweep sent.
    Current,
    /// The batch in flight of a relay stopping.
    Stopping,
}

#[derive(Debug)]
enum Stage {
    /// Between sweeps.
    Idle,
    Claiming { done: Vec<i64> },
    Sending { prior: Swept },
    Confirming { records: Vec<OutboxRecord>, then: Then },
    Completing { then: Then, swept: Swept, report: Report },
    Asking { swept: Swept, report: Report },
    Deleting { swept: Option<Swept>, report: Report },
    Finished,
}

/// The relay's cycle, one per relay (or per one-off sweep). See the module
/// docs and [`Action`].
///
/// A started cycle keeps two things between sweeps: confirmed ids whose
/// delete is held for the next claim ([`Swept::defer_delete`]), and a full
/// batch sent and not settled yet ([`Swept::keep_in_flight`]), settled after
/// the next claim so that claim runs while the broker confirms. Both stay
/// leased to this relay; dropped (a crash), they are published again after
/// the lease: a duplicate, never a loss.
#[derive(Debug)]
pub struct Cycle {
    batch_size: usize,
    started: bool,
    stopping: bool,
    held: Vec<i64>,
    in_flight: Option<Vec<OutboxRecord>>,
    stage: Stage,
    queue: VecDeque<Action>,
}

impl Cycle {
    /// One sweep, as `OutboxRelay::sweep` runs it: claim, send, settle,
    /// complete, then [`Action::Finished`] with the counts. Nothing is held
    /// or left in flight; a database error finishes it.
    pub fn once(batch_size: usize) -> Self {
        Self::new(batch_size, false)
    }

    /// Sweep after sweep until [`Input::Stop`], as a started relay does:
    /// again at once while batches are full and clean, deletes held for the
    /// next claim, a full batch in flight while the next is claimed, and a
    /// sweep that failed as a whole reported and waited out.
    pub fn started(batch_size: usize) -> Self {
        Self::new(batch_size, true)
    }

    fn new(batch_size: usize, started: bool) -> Self {
        Cycle {
            batch_size,
            started,
            stopping: false,
            held: Vec::new(),
            in_flight: None,
            stage: Stage::Idle,
            queue: VecDeque::new(),
        }
    }

    /// Rows sent and not settled yet (the batch in flight).
    pub fn in_flight(&self) -> usize {
        self.in_flight.as_ref().map_or(0, Vec::len)
    }

    /// Confirmed rows whose delete is held for the next claim.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The next action, given the result of the last one.
    pub fn step(&mut self, input: Input) -> Action {
        let input = match input {
            Input::Stop => {
                self.stopping = true;
                Input::Next
            }
            other => other,
        };
        if let Some(action) = self.queue.pop_front() {
            if !matches!(input, Input::Next) {
                return self.confused(&input);
            }
            return action;
        }
        match (std::mem::replace(&mut self.stage, Stage::Finished), input) {
            (Stage::Idle, Input::Next) => self.begin(),
            (Stage::Claiming { done }, Input::Claimed(claimed)) => match self.in_flight.take() {
                // The batch in flight is settled whatever the claim did.
                Some(records) => self.confirm(records, Then::Previous { claimed, done }),
                None => self.claimed(claimed, done, Swept::default(), Report::default()),
            },
            (Stage::Sending { prior }, Input::Sent(records)) => {
                if self.started && prior.keep_in_flight(records.len(), self.batch_size) {
                    self.in_flight = Some(records);
                    self.stage = Stage::Idle;
                    return Action::Again;
                }
                self.confirm(records, Then::Current)
            }
            (Stage::Confirming { records, then }, Input::Confirmed(results)) => {
                let settled = settle(&records, results);
                let swept = settled.swept;
                let report = Report {
                    event_errors: crate::events::outbox_failures(&settled.completions),
                    failures: settled
                        .failures
                        .into_iter()
                        .map(|(error, exchange, routing_key)| Failure {
                            error,
                            exchange: Some(exchange),
                            routing_key: Some(routing_key),
                        })
                        .collect(),
                    swept: Some(swept),
                };
                if swept.failed > 0 {
                    // Completing after the confirms, never before: a crash in
                    // between publishes these again, where deleting first
                    // would lose them.
                    self.stage = Stage::Completing { then, swept, report };
                    return Action::Complete(settled.completions);
                }
                let ids = settled.completions.iter().map(|c| c.id).collect();
                self.settled(then, swept, ids, report, None)
            }
            (Stage::Completing { then, swept, report }, Input::Completed(r)) => {
                self.settled(then, swept, Vec::new(), report, r.err())
            }
            (Stage::Asking { swept, report }, Input::Woken(woken)) => self.hold_or_delete(swept, report, woken),
            (Stage::Deleting { swept, mut report }, Input::Deleted(r)) => {
                let mut failed = false;
                match r {
                    Ok(_) => self.held.clear(),
                    Err(e) if !self.started => {
                        self.stage = Stage::Finished;
                        self.queue.push_back(Action::Finished(Err(e)));
                        return self.report(report);
                    }
                    Err(e) => {
                        // Kept for the next claim, waited for rather than
                        // tried at once; a relay stopping lets them go out
                        // again after their lease.
                        failed = true;
                        report.failures.push(Failure::whole(e));
                        if self.stopping {
                            self.held.clear();
                        }
                    }
                }
                let after = match swept {
                    Some(swept) => self.pause(swept, failed),
                    None => self.begin(),
                };
                self.queue.push_back(after);
                self.report(report)
            }
            (Stage::Finished, Input::Next) => {
                self.stage = Stage::Finished;
                Action::Finished(Ok(Swept::default()))
            }
            (stage, input) => {
                self.stage = stage;
                self.confused(&input)
            }
        }
    }

    /// The driver could not finish the action it was handed (a Ruby thread
    /// killed mid-publish): forget the batch in progress and go back to
    /// between sweeps. Its rows stay leased and are published again after
    /// the lease; ids already confirmed stay held, to be deleted by the next
    /// claim or at stop.
    pub fn abandon(&mut self) {
        self.queue.clear();
        match std::mem::replace(&mut self.stage, Stage::Idle) {
            // Deleted or not, deleting them again is harmless.
            Stage::Claiming { done } | Stage::Confirming { then: Then::Previous { done, .. }, .. } => {
                self.held.extend(done)
            }
            Stage::Finished => self.stage = Stage::Finished,
            _ => {}
        }
    }

    /// A sweep begins, or a stopping cycle settles what it still has.
    fn begin(&mut self) -> Action {
        if self.stopping {
            if let Some(records) = self.in_flight.take() {
                return self.confirm(records, Then::Stopping);
            }
            if !self.held.is_empty() {
                self.stage = Stage::Deleting { swept: None, report: Report::default() };
                return Action::Delete(self.held.clone());
            }
            self.stage = Stage::Finished;
            return Action::Finished(Ok(Swept::default()));
        }
        let done = std::mem::take(&mut self.held);
        self.stage = Stage::Claiming { done: done.clone() };
        Action::Claim { done, batch_size: self.batch_size }
    }

    fn confirm(&mut self, records: Vec<OutboxRecord>, then: Then) -> Action {
        self.stage = Stage::Confirming { records, then };
        Action::Settle
    }

    /// What the claim gave, once the batch before it (`prior`) is settled
    /// and told (`report`, handed out first).
    fn claimed(&mut self, claimed: Result<Vec<OutboxRecord>>, done: Vec<i64>, prior: Swept, mut report: Report) -> Action {
        let next = match claimed {
            Err(e) => {
                // The claim failed, so `done` was not deleted either.
                self.held.extend(done);
                if self.started {
                    report.failures.push(Failure::whole(e));
                    self.stage = Stage::Idle;
                    // Tried again after the interval, not at once.
                    Action::Wait
                } else {
                    self.stage = Stage::Finished;
                    Action::Finished(Err(e))
                }
            }
            Ok(records) if records.is_empty() => {
                self.stage = if self.started { Stage::Idle } else { Stage::Finished };
                if !self.started {
                    Action::Finished(Ok(Swept::default()))
                } else if !self.held.is_empty() {
                    // The previous batch's rows are deleted by the next claim, now.
                    Action::Again
                } else {
                    Action::Wait
                }
            }
            Ok(records) => {
                self.stage = Stage::Sending { prior };
                Action::Send(records)
            }
        };
        self.queue.push_back(next);
        self.report(report)
    }

    /// A batch settled (and completed when something failed): `ids` are its
    /// confirmed rows when nothing failed, to hold or delete.
    fn settled(&mut self, then: Then, swept: Swept, ids: Vec<i64>, mut report: Report, error: Option<Error>) -> Action {
        match then {
            Then::Previous { claimed, done } => {
                self.held.extend(ids);
                // A failed completion leaves its rows leased, to be published
                // again after the lease; it does not hold up this claim.
                report.failures.extend(error.map(Failure::whole));
                self.claimed(claimed, done, swept, report)
            }
            Then::Current => {
                if let Some(e) = error {
                    self.stage = if self.started { Stage::Idle } else { Stage::Finished };
                    if self.started {
                        report.failures.push(Failure::whole(e));
                        self.queue.push_back(Action::Wait);
                    } else {
                        self.queue.push_back(Action::Finished(Err(e)));
                    }
                    return self.report(report);
                }
                self.held.extend(ids);
                if self.started && swept.defer_delete(self.batch_size, false) {
                    return self.hold_or_delete(swept, report, false);
                }
                if self.started && swept.defer_delete(self.batch_size, true) {
                    // Only a wake-up would make the next claim come at once.
                    self.stage = Stage::Asking { swept, report };
                    return Action::Woken;
                }
                self.hold_or_delete(swept, report, false)
            }
            Then::Stopping => {
                self.held.extend(ids);
                report.failures.extend(error.map(Failure::whole));
                self.stage = Stage::Idle;
                let next = self.begin();
                self.queue.push_back(next);
                self.report(report)
            }
        }
    }

    /// Hold this sweep's confirmed ids for a claim that comes at once, or
    /// delete them (with any held before) now.
    fn hold_or_delete(&mut self, swept: Swept, report: Report, woken: bool) -> Action {
        if self.started && swept.defer_delete(self.batch_size, woken) {
            self.stage = Stage::Idle;
            self.queue.push_back(Action::Again);
            return self.report(report);
        }
        if self.held.is_empty() {
            let after = self.pause(swept, false);
            self.queue.push_back(after);
            return self.report(report);
        }
        // Reported once what it deletes is gone, so the event's backlog
        // no longer counts them.
        self.stage = Stage::Deleting { swept: Some(swept), report };
        Action::Delete(self.held.clone())
    }

    /// The end of a sweep.
    fn pause(&mut self, swept: Swept, failed: bool) -> Action {
        if !self.started {
            self.stage = Stage::Finished;
            return Action::Finished(Ok(swept));
        }
        self.stage = Stage::Idle;
        if swept.again(self.batch_size) && !failed {
            Action::Again
        } else {
            Action::Wait
        }
    }

    /// A report, skipped when there is nothing in it: the next queued action then.
    fn report(&mut self, report: Report) -> Action {
        if report.failures.is_empty() && report.swept.is_none() {
            return self.queue.pop_front().unwrap_or(Action::Finished(Ok(Swept::default())));
        }
        Action::Report(report)
    }

    /// An input that does not answer the action handed out: a driver bug.
    /// Said once, and the cycle goes back to between sweeps.
    fn confused(&mut self, input: &Input) -> Action {
        let answer = match input {
            Input::Next | Input::Stop => "next",
            Input::Claimed(_) => "claimed",
            Input::Sent(_) => "sent",
            Input::Confirmed(_) => "confirmed",
            Input::Completed(_) => "completed",
            Input::Deleted(_) => "deleted",
            Input::Woken(_) => "woken",
        };
        let wanted = match (&self.stage, self.queue.is_empty()) {
            (_, false) | (Stage::Idle | Stage::Finished, true) => "next",
            (Stage::Claiming { .. }, _) => "claimed",
            (Stage::Sending { .. }, _) => "sent",
            (Stage::Confirming { .. }, _) => "confirmed",
            (Stage::Completing { .. }, _) => "completed",
            (Stage::Asking { .. }, _) => "woken",
            (Stage::Deleting { .. }, _) => "deleted",
        };
        self.abandon();
        let e = Error::invalid(format!(
            "the outbox relay's driver answered {answer} where the cycle wanted {wanted}: this is a bug in acemq"
        ));
        if self.started {
            self.queue.push_back(Action::Wait);
            return self.report(Report::of(e));
        }
        self.stage = Stage::Finished;
        Action::Finished(Err(e))
    }
}
