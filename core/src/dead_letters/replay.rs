//! Replay from the store: a snapshot of row ids taken when it is asked,
//! each row leased, sent to work with a confirm at a set pace, and deleted
//! once confirmed. It never reads the DLQ, so it cannot meet what it sent:
//! a copy that fails again is dead-lettered, ingested as a new row (its
//! headers differ: [`REPLAYED_BY_HEADER`](crate::REPLAYED_BY_HEADER)) and
//! waits for the next replay.
//!
//! The steps are here once; the async store runs them in
//! [`AsyncSqlDeadLetterStore::replay`](super::AsyncSqlDeadLetterStore::replay),
//! and the Ruby extension runs the same steps with its store calls on a
//! Ruby thread.

use super::letter::{props_from, BACKTRACE_HEADER};
use super::{NewDeadLetter, ReplayRoute, StoreReplayOptions, StoredDeadLetter};
use crate::connection::Connection;
use crate::envelope::ATTEMPT_HEADER;
use crate::error::{Error, Result};
use crate::wire::{ERROR_CLASS_HEADER, FAILED_AT_HEADER, HISTORY_HEADER, QUEUE_HEADER, REASON_HEADER};
use serde_json::{Map, Value};
use std::time::{Duration, Instant};

/// Failures kept in `x-acemq-history`, newest last (as a queue replay keeps).
const MAX_HISTORY: usize = 10;

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreReplayReport {
    /// The replay's id: on every copy it sent, as `x-acemq-replayed-by`,
    /// and in its audit row.
    pub id: String,
    /// Rows in the snapshot.
    pub selected: usize,
    /// Sent, confirmed and deleted.
    pub replayed: usize,
    /// In the snapshot but gone by their turn (discarded meanwhile) or held
    /// by another replay: not sent by this one.
    pub skipped: usize,
}

/// What one [`Replay::send`] did with its rows.
#[derive(Debug, Default)]
pub struct Sent {
    /// Confirmed by the broker: to delete.
    pub confirmed: Vec<i64>,
    /// Not sent (after a failure): to give back.
    pub unsent: Vec<i64>,
    /// What stopped it.
    pub error: Option<Error>,
}

/// One replay in progress: its snapshot and its pace.
#[derive(Debug)]
pub struct Replay {
    report: StoreReplayReport,
    ids: Vec<i64>,
    next: usize,
    options: StoreReplayOptions,
    interval: Duration,
    started: Option<Instant>,
    sent: u64,
    /// The queues of the rows it was given (see [`Replay::queue`]).
    queues: std::collections::BTreeSet<String>,
}

impl Replay {
    /// A replay of `ids` (the snapshot), paced and routed by `options`.
    pub fn new(ids: Vec<i64>, options: StoreReplayOptions) -> Result<Replay> {
        StoreReplayOptions::check_rate(options.rate)?;
        if options.actor.trim().is_empty() {
            return Err(Error::invalid("replay needs an actor: who asked, for the audit table (a user name, \"console\", ...)"));
        }
        let interval = Duration::from_secs_f64(1.0 / options.rate);
        let report = StoreReplayReport { id: crate::envelope::new_id(), selected: ids.len(), ..Default::default() };
        Ok(Replay { report, ids, next: 0, options, interval, started: None, sent: 0, queues: Default::default() })
    }

    /// The replay's id.
    pub fn id(&self) -> &str {
        &self.report.id
    }

    /// The options it runs with.
    pub fn options(&self) -> &StoreReplayOptions {
        &self.options
    }

    /// The next ids to lease and send: about a second's worth (10 to 100).
    pub fn next_chunk(&mut self) -> Option<Vec<i64>> {
        if self.next >= self.ids.len() {
            return None;
        }
        let n = (self.options.rate.ceil() as usize).clamp(10, 100);
        let end = (self.next + n).min(self.ids.len());
        let chunk = self.ids[self.next..end].to_vec();
        self.next = end;
        Some(chunk)
    }

    /// Until when a lease taken now holds, seconds since the epoch.
    pub fn lease_until(&self) -> i64 {
        super::rules::now_secs().saturating_add(i64::try_from(self.options.lease.as_secs()).unwrap_or(i64::MAX))
    }

    /// `n` ids of a chunk were not leased (gone, or held by another replay).
    pub fn skipped(&mut self, n: usize) {
        self.report.skipped += n;
    }

    /// `n` rows were deleted after their confirm.
    pub fn replayed(&mut self, n: usize) {
        self.report.replayed += n;
    }

    /// What it has done so far.
    pub fn report(&self) -> &StoreReplayReport {
        &self.report
    }

    /// The queue the audit row names: the filter's, else the one queue of
    /// every row it sent (ids picked on one DLQ's page), else none.
    pub fn queue<'a>(&'a self, selection: &'a super::Selection) -> Option<&'a str> {
        selection.queue().or_else(|| match self.queues.len() {
            1 => self.queues.first().map(String::as_str),
            _ => None,
        })
    }

    /// The audit row's detail.
    pub fn detail(&self, selection: &super::Selection) -> Value {
        let mut d = selection.summary();
        if let Value::Object(m) = &mut d {
            m.insert("replay".into(), Value::from(self.report.id.clone()));
            m.insert("rate".into(), Value::from(self.options.rate));
            m.insert("selected".into(), Value::from(self.report.selected));
            m.insert("skipped".into(), Value::from(self.report.skipped));
        }
        d
    }

    /// Send `rows` (leased to this replay), each confirmed before the next,
    /// at the replay's pace. Stops at the first failure: the rows not sent
    /// are in [`Sent::unsent`], to give back.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, but never lossy: a dropped send leaves its rows
    /// leased (another replay takes them when the lease ends), and the one
    /// in flight may have been published and still be in the store.
    pub async fn send(&mut self, mq: &Connection, rows: &[StoredDeadLetter]) -> Sent {
        let mut out = Sent::default();
        self.queues.extend(rows.iter().map(|r| r.letter.queue.clone()));
        let started = *self.started.get_or_insert_with(Instant::now);
        for (i, row) in rows.iter().enumerate() {
            let due = started + self.interval.saturating_mul(u32::try_from(self.sent).unwrap_or(u32::MAX));
            tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
            match self.send_one(mq, row).await {
                Ok(()) => {
                    self.sent += 1;
                    out.confirmed.push(row.id);
                }
                Err(e) => {
                    out.unsent = rows[i..].iter().map(|r| r.id).collect();
                    out.error = Some(Error::new(
                        e.kind().clone(),
                        format!(
                            "replay {} stopped at dead letter {} of queue '{}': {}; the rows not sent are still in the store",
                            self.report.id,
                            row.id,
                            row.letter.queue,
                            e.message()
                        ),
                    ));
                    break;
                }
            }
        }
        out
    }

    async fn send_one(&self, mq: &Connection, row: &StoredDeadLetter) -> Result<()> {
        let letter = &row.letter;
        let (exchange, key) = match (self.options.route, &letter.exchange, &letter.routing_key) {
            (ReplayRoute::Original, Some(x), Some(k)) => (x.as_str(), k.as_str()),
            _ => ("", letter.queue.as_str()),
        };
        let props = copy_of(letter, &self.report.id);
        mq.backend().send(exchange, key, &letter.body, &props).await?.wait().await
    }
}

/// The properties of `row`'s copy: every property it had, its headers but
/// for this failure, which moves into `x-acemq-history` (oldest first, the
/// newest [`MAX_HISTORY`]), attempt 1 again, and the replay's marks.
fn copy_of(row: &NewDeadLetter, run: &str) -> crate::wire::Props {
    let mut h = row.headers.clone();
    let mut entry = Map::new();
    for (key, name) in [(REASON_HEADER, "reason"), (ERROR_CLASS_HEADER, "error_class"), (FAILED_AT_HEADER, "failed_at"), (QUEUE_HEADER, "queue")] {
        if let Some(v) = h.remove(key) {
            entry.insert(name.into(), v);
        }
    }
    entry.insert("attempts".into(), Value::from(row.attempt));
    let mut history = match h.remove(HISTORY_HEADER) {
        Some(Value::Array(a)) => a,
        // A history of another shape (a hostile publisher's) is kept as
        // the first entry, not dropped.
        Some(other) => vec![other],
        None => Vec::new(),
    };
    history.push(Value::Object(entry));
    if history.len() > MAX_HISTORY {
        history.drain(..history.len() - MAX_HISTORY);
    }
    h.insert(HISTORY_HEADER.into(), Value::Array(history));
    // The backtrace was this failure's; a new failure brings its own.
    h.remove(BACKTRACE_HEADER);
    h.insert(ATTEMPT_HEADER.into(), Value::from(1));
    h.insert(crate::replay::REPLAYED_AT_HEADER.into(), Value::from(crate::envelope::now_secs()));
    h.insert(crate::replay::REPLAYED_BY_HEADER.into(), Value::from(run));
    let mut props = props_from(&row.properties).with_headers(h);
    crate::limits::copy_props(&mut props);
    props
}
