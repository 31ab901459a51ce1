//! The relay's cycle on its own, no I/O: every path a driver can be led
//! down, the inputs made up.

use super::support::record;
use crate::error::Error;
use crate::outbox::{Action, Cycle, Input, OutboxRecord, Report, Swept};

fn rows(ids: std::ops::RangeInclusive<i64>) -> Vec<OutboxRecord> {
    ids.map(|id| {
        let mut r = record(if id % 100 == 13 { "missing" } else { "ex" }, "rk", id as usize);
        r.id = Some(id);
        r
    })
    .collect()
}

fn ok(n: usize) -> Vec<crate::error::Result<()>> {
    (0..n).map(|_| Ok(())).collect()
}

/// The action matching `pattern`, its `out` taken; anything else fails the test.
macro_rules! expect {
    ($action:expr, $pattern:pat => $out:expr) => {
        match $action {
            $pattern => $out,
            other => panic!("wanted {}, got {other:?}", stringify!($pattern)),
        }
    };
}

#[track_caller]
fn claim(a: Action) -> Vec<i64> {
    expect!(a, Action::Claim { done, batch_size: 3 } => done)
}

#[track_caller]
fn send(a: Action) -> Vec<OutboxRecord> {
    expect!(a, Action::Send(records) => records)
}

#[track_caller]
fn report(a: Action) -> Report {
    expect!(a, Action::Report(r) => r)
}

#[track_caller]
fn delete(a: Action) -> Vec<i64> {
    expect!(a, Action::Delete(ids) => ids)
}

#[track_caller]
fn finished(a: Action) -> Swept {
    expect!(a, Action::Finished(Ok(s)) => s)
}

#[track_caller]
fn is(a: &Action, what: &str) {
    let name = match a {
        Action::Settle => "settle",
        Action::Woken => "woken",
        Action::Again => "again",
        Action::Wait => "wait",
        Action::Complete(_) => "complete",
        Action::Finished(Ok(_)) => "finished",
        Action::Finished(Err(_)) => "failed",
        _ => "other",
    };
    assert_eq!(name, what, "{a:?}");
}

#[track_caller]
/// Lead `c` from between sweeps through a claim of `records` and their
/// send: the action after the send.
fn sent(c: &mut Cycle, records: Vec<OutboxRecord>) -> Action {
    claim(c.step(Input::Next));
    let records = send(c.step(Input::Claimed(Ok(records))));
    c.step(Input::Sent(records))
}

/// A report for `input`, and the action after it.
#[track_caller]
fn told(c: &mut Cycle, input: Input) -> (Report, Action) {
    let r = report(c.step(input));
    (r, c.step(Input::Next))
}

/// A started cycle with the full batch `first` in flight, led through the
/// next claim (`claimed`) to settling that batch.
#[track_caller]
fn in_flight_then(first: Vec<OutboxRecord>, claimed: crate::error::Result<Vec<OutboxRecord>>) -> Cycle {
    let mut c = Cycle::started(3);
    is(&sent(&mut c, first), "again");
    claim(c.step(Input::Next));
    is(&c.step(Input::Claimed(claimed)), "settle");
    c
}

/// A started cycle holding `records`' ids after a wake-up came while they
/// were published, at its next sweep.
#[track_caller]
fn held_after_a_wake_up(records: Vec<OutboxRecord>) -> Cycle {
    let mut c = Cycle::started(3);
    let n = records.len();
    is(&sent(&mut c, records), "settle");
    is(&c.step(Input::Confirmed(ok(n))), "woken");
    is(&told(&mut c, Input::Woken(true)).1, "again");
    c
}

#[test]
fn a_one_off_sweep_of_an_empty_table_finishes_with_nothing() {
    let mut c = Cycle::once(3);
    assert!(claim(c.step(Input::Next)).is_empty());
    assert_eq!(finished(c.step(Input::Claimed(Ok(vec![])))), Swept::default());
    assert_eq!(finished(c.step(Input::Next)), Swept::default(), "and again, whatever is asked");
}

#[test]
fn a_one_off_sweep_sends_settles_deletes_then_reports_and_holds_nothing() {
    let mut c = Cycle::once(3);
    is(&sent(&mut c, rows(1..=3)), "settle");
    assert_eq!(delete(c.step(Input::Confirmed(ok(3)))), [1, 2, 3], "a full clean batch is deleted, not held");
    let r = report(c.step(Input::Deleted(Ok(3))));
    assert_eq!(r.swept, Some(Swept { claimed: 3, confirmed: 3, failed: 0 }));
    assert!(r.failures.is_empty());
    assert_eq!(finished(c.step(Input::Next)).confirmed, 3);
    assert_eq!((c.in_flight(), c.held()), (0, 0));
}

#[test]
fn a_one_off_sweep_completes_failures_after_the_confirms_and_reports_each_destination() {
    let mut c = Cycle::once(3);
    is(&sent(&mut c, rows(12..=13)), "settle");
    let a = c.step(Input::Confirmed(vec![Ok(()), Err(Error::invalid("404"))]));
    let Action::Complete(completions) = a else { panic!("wanted complete, got {a:?}") };
    assert_eq!(completions.iter().map(|c| (c.id, c.result.is_ok())).collect::<Vec<_>>(), [(12, true), (13, false)]);
    let r = report(c.step(Input::Completed(Ok(2))));
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].exchange.as_deref(), Some("missing"));
    assert_eq!(r.failures[0].routing_key.as_deref(), Some("rk"));
    assert_eq!(finished(c.step(Input::Next)), Swept { claimed: 2, confirmed: 1, failed: 1 });
}

#[test]
fn a_one_off_sweep_finishes_with_the_database_error() {
    let mut c = Cycle::once(3);
    claim(c.step(Input::Next));
    is(&c.step(Input::Claimed(Err(Error::store("locked")))), "failed");

    let mut c = Cycle::once(3);
    sent(&mut c, rows(13..=13));
    c.step(Input::Confirmed(vec![Err(Error::invalid("404"))]));
    let r = report(c.step(Input::Completed(Err(Error::store("gone")))));
    assert_eq!(r.failures.len(), 1, "the row's failure is told; the database's is returned");
    is(&c.step(Input::Next), "failed");

    let mut c = Cycle::once(3);
    sent(&mut c, rows(1..=1));
    delete(c.step(Input::Confirmed(ok(1))));
    report(c.step(Input::Deleted(Err(Error::store("gone")))));
    is(&c.step(Input::Next), "failed");
}

#[test]
fn a_started_cycle_keeps_a_full_batch_in_flight_and_settles_it_after_the_next_claim() {
    let mut c = Cycle::started(3);
    is(&sent(&mut c, rows(1..=3)), "again");
    assert_eq!(c.in_flight(), 3);
    assert!(claim(c.step(Input::Next)).is_empty());
    // The claim came back: the batch in flight is settled before the next is sent.
    is(&c.step(Input::Claimed(Ok(rows(4..=5)))), "settle");
    let (r, next) = told(&mut c, Input::Confirmed(ok(3)));
    assert_eq!(r.swept, Some(Swept { claimed: 3, confirmed: 3, failed: 0 }));
    assert_eq!(c.held(), 3, "its delete is held for a later claim");
    let records = send(next);
    assert_eq!(records.len(), 2);
    is(&c.step(Input::Sent(records)), "settle");
    // Less than a batch: only a wake-up would bring the next claim at once.
    is(&c.step(Input::Confirmed(ok(2))), "woken");
    assert_eq!(delete(c.step(Input::Woken(false))), [1, 2, 3, 4, 5], "both batches in one statement");
    is(&told(&mut c, Input::Deleted(Ok(5))).1, "wait");
    assert_eq!((c.in_flight(), c.held()), (0, 0));
}

#[test]
fn a_wake_up_while_publishing_holds_the_delete_for_the_claim_it_brings() {
    let mut c = held_after_a_wake_up(rows(1..=2));
    assert_eq!(c.held(), 2);
    assert_eq!(claim(c.step(Input::Next)), [1, 2]);
    // Nothing more: nothing held, nothing to wait for but the interval.
    is(&c.step(Input::Claimed(Ok(vec![]))), "wait");
}

#[test]
fn an_empty_claim_after_a_settled_batch_sweeps_again_to_delete_what_it_holds() {
    let mut c = in_flight_then(rows(1..=3), Ok(vec![]));
    is(&told(&mut c, Input::Confirmed(ok(3))).1, "again");
    assert_eq!(claim(c.step(Input::Next)), [1, 2, 3]);
}

#[test]
fn after_a_batch_in_flight_failed_the_next_full_batch_is_settled_before_the_next_claim() {
    let mut c = in_flight_then(rows(11..=13), Ok(rows(14..=16)));
    is(&c.step(Input::Confirmed(vec![Ok(()), Ok(()), Err(Error::invalid("404"))])), "complete");
    let (r, next) = told(&mut c, Input::Completed(Ok(3)));
    assert_eq!(r.failures[0].exchange.as_deref(), Some("missing"));
    is(&c.step(Input::Sent(send(next))), "settle");
    assert_eq!(c.in_flight(), 0, "not left in flight after a failure");
    // Full and clean: held for the claim that comes at once.
    is(&told(&mut c, Input::Confirmed(ok(3))).1, "again");
    assert_eq!(claim(c.step(Input::Next)), [14, 15, 16]);
}

#[test]
fn a_batch_with_failures_is_completed_and_waits_rather_than_spinning() {
    let mut c = Cycle::started(3);
    sent(&mut c, rows(13..=13));
    is(&c.step(Input::Confirmed(vec![Err(Error::invalid("404"))])), "complete");
    let (r, next) = told(&mut c, Input::Completed(Ok(1)));
    assert_eq!(r.swept.map(|s| s.failed), Some(1));
    is(&next, "wait");
}

#[test]
fn a_failed_claim_is_reported_whole_waits_and_keeps_what_it_was_to_delete() {
    let mut c = in_flight_then(rows(1..=3), Err(Error::store("database is locked")));
    let (r, next) = told(&mut c, Input::Confirmed(ok(3)));
    assert_eq!(r.swept.map(|s| s.confirmed), Some(3), "the batch in flight is settled whatever the claim did");
    let whole = r.failures.iter().find(|f| f.exchange.is_none()).expect("the claim's failure, told whole");
    assert!(whole.error.to_string().contains("locked"));
    is(&next, "wait");
    assert_eq!(claim(c.step(Input::Next)), [1, 2, 3]);
}

#[test]
fn a_failed_delete_is_reported_and_the_ids_go_with_the_next_claim() {
    let mut c = Cycle::started(3);
    sent(&mut c, rows(1..=1));
    c.step(Input::Confirmed(ok(1)));
    delete(c.step(Input::Woken(false)));
    let (r, next) = told(&mut c, Input::Deleted(Err(Error::store("gone"))));
    assert!(r.failures[0].exchange.is_none());
    is(&next, "wait");
    assert_eq!(claim(c.step(Input::Next)), [1]);
}

#[test]
fn a_failed_completion_of_the_batch_in_flight_is_told_and_does_not_hold_up_the_claim() {
    let mut c = in_flight_then(rows(11..=13), Ok(rows(14..=14)));
    c.step(Input::Confirmed(vec![Ok(()), Ok(()), Err(Error::invalid("404"))]));
    let (r, next) = told(&mut c, Input::Completed(Err(Error::store("gone"))));
    assert_eq!(r.failures.len(), 2, "the row's and the database's");
    assert_eq!(send(next).len(), 1);
}

#[test]
fn stopping_settles_the_batch_in_flight_then_deletes_what_is_held_and_finishes() {
    let mut c = in_flight_then(rows(1..=3), Ok(rows(4..=6)));
    let (_, next) = told(&mut c, Input::Confirmed(ok(3)));
    is(&c.step(Input::Sent(send(next))), "again");
    assert_eq!((c.in_flight(), c.held()), (3, 3));
    is(&c.step(Input::Stop), "settle");
    assert_eq!(delete(told(&mut c, Input::Confirmed(ok(3))).1), [1, 2, 3, 4, 5, 6]);
    finished(c.step(Input::Deleted(Ok(6))));
    assert_eq!((c.in_flight(), c.held()), (0, 0));
}

#[test]
fn a_delete_failing_at_stop_is_reported_once_and_the_cycle_still_finishes() {
    let mut c = held_after_a_wake_up(rows(1..=2));
    assert_eq!(delete(c.step(Input::Stop)), [1, 2]);
    let (r, next) = told(&mut c, Input::Deleted(Err(Error::store("gone"))));
    assert!(r.failures[0].exchange.is_none(), "told; the rows go out again after their lease");
    finished(next);
    finished(c.step(Input::Next));
}

#[test]
fn stopping_with_nothing_in_flight_or_held_finishes_at_once() {
    let mut c = Cycle::started(3);
    finished(c.step(Input::Stop));
}

#[test]
fn an_abandoned_claim_keeps_its_ids_held_for_the_stop() {
    let mut c = held_after_a_wake_up(rows(1..=2));
    assert_eq!(claim(c.step(Input::Next)), [1, 2]);
    // The driver was interrupted (Thread#kill) before the claim came back.
    c.abandon();
    assert_eq!(delete(c.step(Input::Stop)), [1, 2]);
}

#[test]
fn an_answer_that_does_not_fit_is_a_driver_bug_said_once() {
    let mut c = Cycle::started(3);
    claim(c.step(Input::Next));
    let (r, next) = told(&mut c, Input::Woken(true));
    assert!(r.failures[0].error.to_string().contains("answered woken where the cycle wanted claimed"), "{:?}", r.failures[0]);
    is(&next, "wait");
    claim(c.step(Input::Next));

    let mut c = Cycle::once(3);
    is(&c.step(Input::Deleted(Ok(1))), "failed");
}
