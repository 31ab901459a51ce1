//! Moving dead letters back to work: `{queue}.dlq` to `{queue}`.

use crate::connection::Connection;
use crate::envelope::ATTEMPT_HEADER;
use crate::error::{Error, Result};
use crate::retry::dlq_name;
use crate::wire::{
    envelope_of, RawDelivery, ERROR_CLASS_HEADER, FAILED_AT_HEADER, HISTORY_HEADER, QUEUE_HEADER, REASON_HEADER,
};
use serde_json::{Map, Value};

/// Which dead letters to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// At most this many; all when None.
    pub limit: Option<usize>,
    /// Only those whose reason contains this text.
    pub reason: Option<String>,
    /// Only those of this message type.
    pub kind: Option<String>,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Republished to the queue and removed from the DLQ.
    pub replayed: usize,
    /// Left in the DLQ because they did not match.
    pub skipped: usize,
}

/// One dead letter as [`Connection::peek_dead_letters`] shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// The message id, unchanged since it was first published.
    pub id: String,
    /// The message type.
    pub kind: Option<String>,
    /// Attempts made before it was dead-lettered.
    pub attempt: u32,
    /// Why (`x-acemq-reason`).
    pub reason: Option<String>,
    /// The error class, when an exception put it there (`x-acemq-error-class`).
    pub error_class: Option<String>,
    /// When, in seconds since the epoch (`x-acemq-failed-at`).
    pub failed_at: Option<u64>,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

/// Failures kept in `x-acemq-history`, newest last.
const MAX_HISTORY: usize = 10;

/// Header recording when a message was last replayed.
pub const REPLAYED_AT_HEADER: &str = "x-acemq-replayed-at";

fn matches(raw: &RawDelivery, options: &ReplayOptions) -> bool {
    let reason_ok = options.reason.as_deref().is_none_or(|want| {
        raw.props.header(REASON_HEADER).is_some_and(|r| r.as_str().is_some_and(|r| r.contains(want)))
    });
    let kind_ok = options.kind.as_deref().is_none_or(|want| raw.props.kind.as_deref() == Some(want));
    reason_ok && kind_ok
}

/// The copy that goes back to work: attempt 1 again, and this failure moved
/// into `x-acemq-history` (oldest first) so the next failure's reason is its
/// own and the earlier ones are still there to read.
fn revived(mut raw: RawDelivery) -> RawDelivery {
    let attempts = envelope_of(&raw.props).attempt;
    let h = raw.props.headers_mut();
    let mut entry = Map::new();
    for (key, name) in [(REASON_HEADER, "reason"), (ERROR_CLASS_HEADER, "error_class"), (FAILED_AT_HEADER, "failed_at"), (QUEUE_HEADER, "queue")] {
        if let Some(v) = h.remove(key) {
            entry.insert(name.into(), v);
        }
    }
    entry.insert("attempts".into(), Value::from(attempts));
    let mut history = match h.remove(HISTORY_HEADER) {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    history.push(Value::Object(entry));
    // The newest failures are the ones worth reading; a message replayed
    // over and over must not grow its headers past a frame.
    if history.len() > MAX_HISTORY {
        history.drain(..history.len() - MAX_HISTORY);
    }
    h.insert(HISTORY_HEADER.into(), Value::Array(history));
    h.insert(ATTEMPT_HEADER.into(), Value::from(1));
    h.insert(REPLAYED_AT_HEADER.into(), Value::from(crate::envelope::now_secs()));
    raw
}

/// Why the broker dead-lettered a message itself (a quorum queue's delivery
/// limit, a TTL, a length limit), from the newest `x-death` entry.
fn broker_reason(h: &crate::headers::Headers) -> Option<String> {
    let death = h.get("x-death")?.as_array()?.first()?.as_object()?;
    let reason = death.get("reason")?.as_str()?;
    let queue = death.get("queue").and_then(Value::as_str).unwrap_or("?");
    let count = death.get("count").and_then(Value::as_u64).unwrap_or(1);
    Some(format!("dead-lettered by the broker: {reason} on {queue} (x-death count {count})"))
}

impl Connection {
    /// Look at up to `limit` dead letters in `{queue}.dlq`, oldest first,
    /// without taking them: each is read unacknowledged and every one goes
    /// back, in its place, when the reading channel closes. What an operator
    /// runs before deciding to replay.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is taken. What a dropped future had read stays
    /// unacknowledged, and the broker puts it back, in place, when the
    /// reading channel or the connection closes.
    pub async fn peek_dead_letters(&self, queue: &str, limit: usize) -> Result<Vec<DeadLetter>> {
        if queue.is_empty() {
            return Err(Error::invalid("peek needs the queue whose dead letters to show"));
        }
        crate::limits::queue(queue)?;
        if limit == 0 {
            return Err(Error::invalid("peek limit must be at least 1: it is how many dead letters to show"));
        }
        let reader = self.backend().reader(&dlq_name(queue)).await?;
        let mut seen = Vec::new();
        let result: Result<()> = async {
            while seen.len() < limit {
                let Some(raw) = reader.next().await? else { break };
                let envelope = envelope_of(&raw.props);
                let h = raw.props.headers();
                let text = |k: &str| h.get(k).and_then(Value::as_str).map(str::to_owned);
                seen.push(DeadLetter {
                    id: envelope.id,
                    kind: envelope.kind,
                    attempt: envelope.attempt,
                    reason: text(REASON_HEADER).or_else(|| broker_reason(h)),
                    error_class: text(ERROR_CLASS_HEADER),
                    failed_at: h.get(FAILED_AT_HEADER).and_then(Value::as_u64),
                    body: raw.body.clone(),
                });
            }
            Ok(())
        }
        .await;
        reader.close().await;
        result.map(|()| seen)
    }

    /// Move dead letters from `{queue}.dlq` back to `{queue}`.
    ///
    /// Each copy goes straight to the queue through the default exchange,
    /// not through the exchange it was first published to: re-routing would
    /// deliver it again to every other queue bound there, which handled it
    /// the first time. A message leaves the DLQ only once its copy is
    /// confirmed; a crash in between leaves it in both (a duplicate, never a
    /// loss). Messages that do not match stay where they are, in order.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, but never lossy: a dropped future may have replayed
    /// some (each removed from the DLQ only after its copy was confirmed),
    /// and the one in flight may be in both queues. Running it again goes on
    /// with what is left.
    pub async fn replay_dead_letters(&self, queue: &str, options: ReplayOptions) -> Result<ReplayReport> {
        if queue.is_empty() {
            return Err(Error::invalid("replay needs the queue whose dead letters to replay"));
        }
        crate::limits::queue(queue)?;
        // Some(0) would replay nothing and report success: a caller who
        // computed a limit of 0 meant something else.
        if options.limit == Some(0) {
            return Err(Error::invalid("replay limit must be at least 1, or none (None / limit: nil) to replay them all"));
        }
        let backend = self.backend();
        let reader = backend.reader(&dlq_name(queue)).await?;
        let mut report = ReplayReport::default();
        let result: Result<()> = async {
            while options.limit.is_none_or(|l| report.replayed < l) {
                let Some(raw) = reader.next().await? else { break };
                if !matches(&raw, &options) {
                    report.skipped += 1;
                    continue;
                }
                let tag = raw.tag;
                let mut copy = revived(raw);
                crate::limits::fit_copy(&mut copy.props);
                backend.send("", queue, &copy.body, &copy.props).await?.wait().await?;
                reader.ack(tag).await?;
                report.replayed += 1;
            }
            Ok(())
        }
        .await;
        reader.close().await;
        result.map(|()| report)
    }
}
