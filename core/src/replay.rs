//! Moving dead letters back to work: `{queue}.dlq` to `{queue}`.

use crate::connection::Connection;
use crate::envelope::ATTEMPT_HEADER;
use crate::error::{Error, Result};
use crate::retry::dlq_name;
use crate::wire::{
    envelope_of, RawDelivery, ERROR_CLASS_HEADER, FAILED_AT_HEADER, HISTORY_HEADER, QUEUE_HEADER, REASON_HEADER,
};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Which dead letters to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// At most this many; all when None.
    pub limit: Option<usize>,
    /// Only those whose reason contains this text.
    pub reason: Option<String>,
    /// Only those of this message type.
    pub kind: Option<String>,
    /// Only those whose error class is this one (`x-acemq-error-class`).
    pub error_class: Option<String>,
    /// Only those whose message id is one of these; any when empty.
    pub ids: Vec<String>,
    /// A browse gives up after this long and says how far it read
    /// ([`DeadLetterPage::gave_up`]); None reads as far as the page needs.
    /// A replay or a discard does not use it (it is bounded by the count).
    pub within: Option<Duration>,
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
    /// The exchange it was first published to: AceMQ's
    /// `x-acemq-original-exchange`, else the broker's newest `x-death`.
    pub exchange: Option<String>,
    /// Its routing key there, found the same way.
    pub routing_key: Option<String>,
    /// Every header as it sits in the DLQ (`x-acemq-history` among them).
    pub headers: crate::headers::Headers,
}

/// One page of a DLQ as [`Connection::browse_dead_letters`] reads it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeadLetterPage {
    /// The matching dead letters after the skipped ones, oldest first.
    pub letters: Vec<DeadLetter>,
    /// How many messages the read took off the DLQ and gave back: what the
    /// page cost (a deep page or a rare filter reads everything before it).
    pub scanned: usize,
    /// Whether another match follows this page.
    pub more: bool,
    /// Read near a delivery limit and so put back at the DLQ's tail as
    /// fresh copies ([`REFRESH_AT`]): the DLQ's order changed by this many.
    pub moved: usize,
    /// The read stopped before the DLQ's end (deeper than [`BROWSE_WHOLE`]):
    /// RabbitMQ puts the messages given back behind the rest of a quorum
    /// queue (measured on 3.10.8, 4.0.5 and 4.3.6), so such a DLQ has
    /// rotated by `scanned`.
    pub partial: bool,
    /// What the DLQ held (ready) when the read started: the read takes no
    /// more than that many, and a page says "read N of total".
    pub total: Option<u64>,
    /// The read stopped at [`ReplayOptions::within`], before the page was
    /// full or the DLQ's end.
    pub gave_up: bool,
    /// The most messages the read held unacknowledged at once: never more
    /// than [`HOLD`].
    pub most_held: usize,
}

/// The most a read holds unacknowledged: its prefetch. A read deeper than
/// this puts each further message back at the DLQ's tail as a fresh copy
/// (confirmed, then the original acknowledged, counted in
/// [`DeadLetterPage::moved`]) instead of holding a whole DLQ of 100,000
/// (55,000 held unacknowledged were seen, and basic.get slowed from about
/// 1,000 to 100 a second). A DLQ of [`BROWSE_WHOLE`] or fewer is read whole
/// and held whole: the same bound.
pub const HOLD: usize = BROWSE_WHOLE as usize;

/// Copies a read puts back at the tail with their confirms awaited
/// together; a bounded read holds at most [`HOLD`] counting these.
const REFRESH_BATCH: usize = 200;

/// How long a reader waits for another reader of the same DLQ to finish
/// ([`reading_lock_name`]) before it says so.
pub const READ_LOCK_WAIT: Duration = Duration::from_secs(2);

/// The queue whose exclusive consumer is the right to read `dlq`:
/// `{dlq}.reader`. One reader at a time per DLQ, across threads,
/// processes and hosts: two readers each take and give back, so together
/// they reorder the DLQ and each misses what the other holds (an id filter
/// for a letter that exists said "None match" 7 times in 10). The lock is
/// an exclusive basic.consume on this queue, on the reading channel: the
/// broker refuses a second (403), and lets it go when the channel closes,
/// whether the read ends, the process dies or the connection drops, so
/// there is no lock to clean up. The queue is durable with `x-expires` (10
/// minutes unused): RabbitMQ 4.3 refuses transient queues that are not
/// exclusive, and an exclusive queue would belong to one connection, which
/// a second reader on the same connection would not be kept out of.
pub fn reading_lock_name(dlq: &str) -> String {
    format!("{dlq}.reader")
}

/// The lock queue's `x-expires`: it goes away 10 minutes after its last reader.
const READ_LOCK_EXPIRES_MS: i64 = 600_000;

/// The right to read one DLQ, held until dropped (memory://) or until the
/// reading channel closes (RabbitMQ).
enum ReadLock {
    /// The exclusive consumer: cancelled when dropped, and gone with its
    /// channel in any case.
    Broker(#[allow(dead_code)] lapin::Consumer),
    Memory(String),
}

/// memory:// readers in this process, by broker and DLQ.
static MEMORY_READERS: std::sync::Mutex<Option<HashSet<String>>> = std::sync::Mutex::new(None);

impl Drop for ReadLock {
    fn drop(&mut self) {
        if let ReadLock::Memory(key) = self {
            if let Ok(mut set) = MEMORY_READERS.lock() {
                set.get_or_insert_with(HashSet::new).remove(key);
            }
        }
    }
}

fn busy(dlq: &str) -> Error {
    Error::new(
        crate::error::ErrorKind::Broker { reply_code: 405 },
        format!(
            "another reader is reading {dlq} (it holds the exclusive consumer of {}); try again when it finishes: \
             one reader at a time keeps the DLQ's order and every letter visible",
            reading_lock_name(dlq)
        ),
    )
}

/// A reader of `dlq` holding the right to read it (waiting up to
/// [`READ_LOCK_WAIT`] for another reader to finish; a 405 error saying so
/// after that), and what the DLQ held (ready) once that right was taken:
/// no other reader holds any of it then. memory:// counts before its
/// reader opens (the reader takes every message at once).
async fn open_reading(
    backend: &crate::transport::Backend,
    dlq: &str,
) -> Result<(crate::transport::Reader, ReadLock, Option<u64>)> {
    if let crate::transport::Backend::Memory(broker) = backend {
        let lock = lock_memory(format!("{:p}/{dlq}", std::sync::Arc::as_ptr(broker)), dlq).await?;
        let total = backend.queue_counts(dlq).await?.map(|c| c.ready);
        return Ok((backend.reader(dlq).await?, lock, total));
    }
    let reader = backend.reader(dlq).await?;
    let counted = async {
        let lock = lock_reading(&reader, dlq).await?;
        Ok::<_, Error>((lock, backend.queue_counts(dlq).await?.map(|c| c.ready)))
    };
    match counted.await {
        Ok((lock, total)) => Ok((reader, lock, total)),
        Err(e) => {
            reader.close().await;
            Err(e)
        }
    }
}

async fn lock_memory(key: String, dlq: &str) -> Result<ReadLock> {
    let deadline = Instant::now() + READ_LOCK_WAIT;
    loop {
        {
            let mut set = MEMORY_READERS.lock().map_err(|_| Error::invalid("the reader lock was poisoned"))?;
            if set.get_or_insert_with(HashSet::new).insert(key.clone()) {
                return Ok(ReadLock::Memory(key));
            }
        }
        if Instant::now() >= deadline {
            return Err(busy(dlq));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Take the right to read `dlq` on RabbitMQ: the exclusive consumer of
/// [`reading_lock_name`] on the reader's channel.
async fn lock_reading(reader: &crate::transport::Reader, dlq: &str) -> Result<ReadLock> {
    use crate::transport::Reader;
    let deadline = Instant::now() + READ_LOCK_WAIT;
    match reader {
        Reader::Memory { .. } => Err(Error::invalid("a memory:// reader is locked before it opens")),
        Reader::Amqp { channel, .. } => {
            use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
            use lapin::types::{AMQPValue, FieldTable, ShortString};
            let name = reading_lock_name(dlq);
            crate::limits::queue(&name)?;
            let mut args = FieldTable::default();
            args.insert(ShortString::from("x-expires"), AMQPValue::LongLongInt(READ_LOCK_EXPIRES_MS));
            let broker = |e: lapin::Error, what: &str| match e.kind() {
                lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 403 => busy(dlq),
                lapin::ErrorKind::ProtocolError(amqp) => Error::new(
                    crate::error::ErrorKind::Broker { reply_code: amqp.get_id() },
                    format!("{} ({what} {name})", amqp.get_message()),
                ),
                other => Error::new(crate::error::ErrorKind::Closed, format!("{what} {name}: {other:?}")),
            };
            // The declare answers with the consumer count: wait while
            // another reader holds it, without a refused consume (each
            // closes a channel).
            loop {
                let declare = channel.queue_declare(
                    ShortString::from(name.as_str()),
                    QueueDeclareOptions { durable: true, ..Default::default() },
                    args.clone(),
                );
                let q = tokio::time::timeout(Duration::from_secs(5), declare)
                    .await
                    .map_err(|_| Error::new(crate::error::ErrorKind::Timeout, format!("declaring {name}: no answer in 5 s")))?
                    .map_err(|e| broker(e, "declaring"))?;
                if q.consumer_count() == 0 {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(busy(dlq));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let consume = channel.basic_consume(
                ShortString::from(name.as_str()),
                ShortString::from(format!("acemq-reader-{}", crate::envelope::new_id())),
                BasicConsumeOptions { exclusive: true, ..Default::default() },
                FieldTable::default(),
            );
            let consumer = tokio::time::timeout(Duration::from_secs(5), consume)
                .await
                .map_err(|_| Error::new(crate::error::ErrorKind::Timeout, format!("consuming {name}: no answer in 5 s")))?
                .map_err(|e| broker(e, "consuming"))?;
            Ok(ReadLock::Broker(consumer))
        }
    }
}

/// A DLQ this deep or less is read to its end on every page: every message
/// is taken and given back in one turn, so the DLQ keeps its order where
/// the broker puts returned messages at the tail (a quorum queue on
/// RabbitMQ 3.10.8, 4.0.5 and 4.3.6, measured: read 4 of 7 and give them
/// back, and they come after the other 3) as well as where it puts them
/// back in place (a classic queue). A deeper one is read
/// only as far as the page needs (`partial`): reading a whole DLQ of
/// 100,000 one `basic.get` at a time takes tens of seconds.
pub const BROWSE_WHOLE: u64 = 1_000;

/// Failures kept in `x-acemq-history`, newest last.
const MAX_HISTORY: usize = 10;

/// Header recording when a message was last replayed.
pub const REPLAYED_AT_HEADER: &str = "x-acemq-replayed-at";

/// Header on a replayed copy: the id of the replay that sent it. A copy
/// that fails again comes back to the DLQ with it (a dead letter keeps
/// every header), and that replay never takes it again, whatever else it
/// reads: each dead letter is replayed once by one replay. The next replay
/// stamps its own.
pub const REPLAYED_BY_HEADER: &str = "x-acemq-replayed-by";

/// The reason a dead letter shows: AceMQ's, else the broker's own. The
/// dead-letter store's reason column is this too.
pub(crate) fn reason_of(h: &crate::headers::Headers) -> Option<String> {
    h.get(REASON_HEADER).and_then(Value::as_str).map(str::to_owned).or_else(|| broker_reason(h))
}

/// Every id asked for has been found: nothing further can match (a DLQ
/// holds each message id once; a duplicate from a crash mid-replay is the
/// same message).
fn all_found(options: &ReplayOptions, matched: usize) -> bool {
    !options.ids.is_empty() && matched >= options.ids.len()
}

fn matches(raw: &RawDelivery, options: &ReplayOptions) -> bool {
    let h = raw.props.headers();
    let reason_ok = options.reason.as_deref().is_none_or(|want| reason_of(h).is_some_and(|r| r.contains(want)));
    let kind_ok = options.kind.as_deref().is_none_or(|want| raw.props.kind.as_deref() == Some(want));
    let class_ok = options
        .error_class
        .as_deref()
        .is_none_or(|want| h.get(ERROR_CLASS_HEADER).and_then(Value::as_str) == Some(want));
    let id_ok = options.ids.is_empty() || options.ids.contains(&envelope_of(&raw.props).id);
    reason_ok && kind_ok && class_ok && id_ok
}

/// Where the dead letter was first published: AceMQ's headers, else the
/// broker's newest `x-death` entry. The dead-letter store's exchange and
/// routing key columns are this too.
pub(crate) fn original_route(h: &crate::headers::Headers) -> (Option<String>, Option<String>) {
    let text = |k: &str| h.get(k).and_then(Value::as_str).map(str::to_owned);
    let death = h.get("x-death").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_object);
    let exchange = text(crate::wire::ORIGINAL_EXCHANGE_HEADER)
        .or_else(|| death.and_then(|d| d.get("exchange")?.as_str().map(str::to_owned)));
    let key = text(crate::wire::ORIGINAL_ROUTING_KEY_HEADER).or_else(|| {
        death.and_then(|d| d.get("routing-keys")?.as_array()?.first()?.as_str().map(str::to_owned))
    });
    (exchange, key)
}

fn dead_letter(raw: &RawDelivery) -> DeadLetter {
    let envelope = envelope_of(&raw.props);
    let h = raw.props.headers();
    let (exchange, routing_key) = original_route(h);
    DeadLetter {
        id: envelope.id,
        kind: envelope.kind,
        attempt: envelope.attempt,
        reason: reason_of(h),
        error_class: h.get(ERROR_CLASS_HEADER).and_then(Value::as_str).map(str::to_owned),
        failed_at: h.get(FAILED_AT_HEADER).and_then(Value::as_u64),
        body: raw.body.clone(),
        exchange,
        routing_key,
        headers: h.clone(),
    }
}

/// What a take does with each match.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Take {
    /// Republish it to its queue, then remove it from the DLQ.
    Replay,
    /// Remove it from the DLQ.
    Discard,
}

/// The copy that goes back to work: attempt 1 again, and this failure moved
/// into `x-acemq-history` (oldest first) so the next failure's reason is its
/// own and the earlier ones are still there to read.
fn revived(mut raw: RawDelivery, run: &str) -> RawDelivery {
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
    for counter in BROKER_COUNTERS.into_iter().chain([REFRESHED_BY_HEADER]) {
        h.remove(counter);
    }
    h.insert(ATTEMPT_HEADER.into(), Value::from(1));
    h.insert(REPLAYED_AT_HEADER.into(), Value::from(crate::envelope::now_secs()));
    h.insert(REPLAYED_BY_HEADER.into(), Value::from(run));
    raw
}

/// Whether `raw` is a copy that the replay `run` sent and that failed again.
fn replayed_by(raw: &RawDelivery, run: &str) -> bool {
    raw.props.header(REPLAYED_BY_HEADER).is_some_and(|v| v.as_str() == Some(run))
}

/// The broker's own delivery counters: a copy is a new message to the
/// broker, which ignores these on a publish (measured: a copy published with
/// `x-delivery-count: 100` is counted from 0 on 3.10.8, 4.0.5 and 4.3.6),
/// but 4.x shows the stale number on its first delivery, where it would read
/// as returns that never happened.
const BROKER_COUNTERS: [&str; 2] = ["x-delivery-count", "x-acquired-count"];

/// A dead letter read with a broker delivery count (`x-delivery-count`) this
/// high is put back as a fresh copy (published to the DLQ's tail, confirmed,
/// then the original acknowledged) instead of being given back. Looking at a
/// quorum DLQ gives each message back once, which counts toward its limit on
/// RabbitMQ 3.10 and 4.0, and past the limit the broker drops it: a DLQ has
/// nowhere to dead-letter to. A DLQ declared before AceMQ set
/// [`crate::topology::DLQ_DELIVERY_LIMIT`] has RabbitMQ 4.x's default of 20;
/// on 4.3 a message the broker dead-lettered for its delivery limit arrives
/// in the DLQ with its count already past it (measured: main queue limit 3,
/// DLQ limit 5: count 4 on arrival, gone at the second return, even by a
/// nack that does not count). Half the default leaves every peek, status
/// and filtered replay room to give a message back. A DLQ limit below it is
/// not supported (docs/production.md).
pub const REFRESH_AT: u64 = 10;

/// Why the broker dead-lettered a message itself (a quorum queue's delivery
/// limit, a TTL, a length limit): the newest `x-death` entry, else 4.x's
/// `x-last-death-*` (or `x-first-death-*`) headers, which a message can
/// carry without an `x-death` its publisher dropped.
fn broker_reason(h: &crate::headers::Headers) -> Option<String> {
    let from_x_death = || {
        let death = h.get("x-death")?.as_array()?.first()?.as_object()?;
        let reason = death.get("reason")?.as_str()?;
        let queue = death.get("queue").and_then(Value::as_str).unwrap_or("?");
        let count = death.get("count").and_then(Value::as_u64).unwrap_or(1);
        Some(format!("dead-lettered by the broker: {reason} on {queue} (x-death count {count})"))
    };
    let from_pair = |which: &str| {
        let reason = h.get(&format!("x-{which}-death-reason"))?.as_str()?;
        let queue = h.get(&format!("x-{which}-death-queue")).and_then(Value::as_str).unwrap_or("?");
        Some(format!("dead-lettered by the broker: {reason} on {queue}"))
    };
    from_x_death().or_else(|| from_pair("last")).or_else(|| from_pair("first"))
}

/// The broker's count of returns of `raw` so far: `x-delivery-count`, set on
/// a quorum queue's redeliveries (and, on 4.x, carried from the queue that
/// dead-lettered it).
fn delivery_count(raw: &RawDelivery) -> u64 {
    raw.props.header("x-delivery-count").and_then(|v| v.as_u64()).unwrap_or(0)
}

/// Header on a copy put back at the DLQ's tail by a read: that read's own
/// id, so that reaching it tells the read it has been round the queue.
/// Messages behind it arrived during the read and wait for the next one.
pub const REFRESHED_BY_HEADER: &str = "x-acemq-refreshed-by";

/// What to do with a dead letter being read that is not leaving the DLQ.
struct Keeper<'a> {
    backend: &'a crate::transport::Backend,
    reader: &'a crate::transport::Reader,
    dlq: String,
    /// This read's id, on the copies it puts back.
    read: String,
    /// The newest delivery tag held unacknowledged, to give back.
    held: Option<u64>,
    /// Copies put back at the tail (see [`DeadLetterPage::moved`]).
    moved: usize,
    /// Held now, and the most held at once (see [`HOLD`]).
    holding: usize,
    most_held: usize,
    /// Hold no more than [`HOLD`] (a read deeper than [`BROWSE_WHOLE`]).
    bounded: bool,
    /// Copies sent and not yet confirmed, with their originals' tags.
    pending: Vec<(u64, crate::transport::Confirm)>,
}

impl<'a> Keeper<'a> {
    fn new(backend: &'a crate::transport::Backend, reader: &'a crate::transport::Reader, dlq: String) -> Self {
        Keeper {
            backend,
            reader,
            dlq,
            read: crate::envelope::new_id(),
            held: None,
            moved: 0,
            holding: 0,
            most_held: 0,
            bounded: false,
            pending: Vec::new(),
        }
    }

    /// Whether `raw` is a copy this read put back: the read has been round
    /// the queue, and it and what follows stay where they are.
    fn round(&mut self, raw: &RawDelivery) -> bool {
        let mine = raw.props.header(REFRESHED_BY_HEADER).is_some_and(|v| v.as_str() == Some(self.read.as_str()));
        if mine {
            self.hold(raw);
        }
        mine
    }

    fn hold(&mut self, raw: &RawDelivery) {
        self.held = Some(raw.tag);
        self.holding += 1;
        self.most_held = self.most_held.max(self.holding);
    }

    /// Keep `raw` in the DLQ: held, to be given back in place, or, when its
    /// count is near a limit ([`REFRESH_AT`]), put back at the tail as a
    /// fresh copy (confirmed before the original is acknowledged: a crash in
    /// between leaves two, never none). A copy keeps the broker's reason in
    /// `x-acemq-reason`, so it reads the same if a broker drops a client's
    /// `x-death`.
    async fn keep(&mut self, raw: &RawDelivery) -> Result<()> {
        self.keep_or_refresh(raw, false).await
    }

    /// As [`Keeper::keep`]; with `refresh`, put it back at the tail as a
    /// fresh copy whatever its count.
    async fn keep_or_refresh(&mut self, raw: &RawDelivery, refresh: bool) -> Result<()> {
        // Past HOLD held, a bounded read puts each one back at the tail as a
        // fresh copy instead of holding it: giving back what it holds does
        // not let it read on, because RabbitMQ 3.10.8 delivers a quorum
        // queue's returns (basic.nack, requeue) first, as a classic queue
        // puts them back in place (measured: the 1,001st basic.get after
        // giving back 1,000 was the first of them again).
        let full = self.bounded && self.holding + REFRESH_BATCH >= HOLD;
        if !refresh && !full && delivery_count(raw) < REFRESH_AT {
            self.hold(raw);
            return Ok(());
        }
        let mut props = raw.props.clone();
        let h = props.headers_mut();
        for counter in BROKER_COUNTERS {
            h.remove(counter);
        }
        if !h.contains_key(REASON_HEADER) {
            if let Some(reason) = broker_reason(h) {
                h.insert(REASON_HEADER.into(), Value::from(reason));
            }
        }
        h.insert(REFRESHED_BY_HEADER.into(), Value::from(self.read.clone()));
        crate::limits::copy_props(&mut props);
        // Confirms awaited together, REFRESH_BATCH at a time (one each
        // held a bounded read to about 300 a second): each original is
        // acknowledged only once its copy is confirmed.
        let confirm = self.backend.send("", &self.dlq, &raw.body, &props).await?;
        self.pending.push((raw.tag, confirm));
        self.moved += 1;
        self.most_held = self.most_held.max(self.holding + self.pending.len());
        // Only a bounded read batches them: a whole read (the refreshes
        // near REFRESH_AT) waits for each, as before, which the order of a
        // DLQ read round and round depends on (a replay just after a read
        // read 367 of 300 when these were batched there too).
        if !self.bounded || self.pending.len() >= REFRESH_BATCH {
            self.flush().await?;
        }
        Ok(())
    }

    /// Wait for the copies sent, then acknowledge their originals.
    async fn flush(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let mut tags = Vec::with_capacity(pending.len());
        let mut failed = None;
        for (tag, confirm) in pending {
            match confirm.wait().await {
                Ok(()) => tags.push(tag),
                // Its original stays (given back when the read ends): two
                // copies, never none.
                Err(e) => failed = Some(e),
            }
        }
        for tag in tags {
            self.reader.ack(tag).await?;
        }
        failed.map_or(Ok(()), Err)
    }

    /// Acknowledge what was copied, then give back what is held (see
    /// [`crate::transport::Reader::give_back`]): in that order, because
    /// the give-back takes every unacknowledged delivery up to the last
    /// held, and an original already copied must not go back too.
    async fn finish(mut self) {
        let _ = self.flush().await;
        let held = self.held.filter(|_| self.holding > 0).map(|tag| (tag, self.holding));
        self.reader.finish(held).await;
    }
}

impl Connection {
    /// Look at up to `limit` dead letters in `{queue}.dlq`, oldest first,
    /// without taking them: [`Connection::browse_dead_letters`] with no
    /// filter, from the head. What an operator runs before deciding to
    /// replay.
    pub async fn peek_dead_letters(&self, queue: &str, limit: usize) -> Result<Vec<DeadLetter>> {
        Ok(self.browse_dead_letters(queue, &ReplayOptions::default(), 0, limit).await?.letters)
    }

    /// One page of `{queue}.dlq`: the dead letters matching `filter` (its
    /// `limit` is not used), after the first `skip` matches, at most
    /// `limit`, oldest first, without taking them. Each message read is
    /// held unacknowledged and given back when the read ends (behind the
    /// rest, on a quorum queue: see [`BROWSE_WHOLE`]); one whose broker delivery count is near a limit is put back at
    /// the tail as a fresh copy instead ([`REFRESH_AT`], counted in
    /// [`DeadLetterPage::moved`]), so looking never makes a quorum DLQ drop
    /// one, however often. The read goes on to the end of the DLQ (or its
    /// own first copy) when the DLQ holds [`BROWSE_WHOLE`] or fewer; a
    /// deeper one it stops at the match after the page (which sets `more`
    /// and `partial`): a deep page or a rare match costs reading all before
    /// it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is lost. What a dropped future had read stays
    /// unacknowledged, and the broker puts it back, in place, when the
    /// reading channel or the connection closes; a copy being refreshed is
    /// in the DLQ once or twice.
    pub async fn browse_dead_letters(
        &self,
        queue: &str,
        filter: &ReplayOptions,
        skip: usize,
        limit: usize,
    ) -> Result<DeadLetterPage> {
        if queue.is_empty() {
            return Err(Error::invalid("peek needs the queue whose dead letters to show"));
        }
        crate::limits::queue(queue)?;
        if limit == 0 {
            return Err(Error::invalid("peek limit must be at least 1: it is how many dead letters to show"));
        }
        let backend = self.backend();
        let dlq = dlq_name(queue);
        // Counted once the lock is held: no other reader holds any of it.
        let (reader, lock, total) = open_reading(backend, &dlq).await?;
        let whole = total.is_some_and(|t| t <= BROWSE_WHOLE);
        let started = Instant::now();
        let mut keeper = Keeper::new(backend, &reader, dlq);
        keeper.bounded = !whole;
        let mut page = DeadLetterPage { total, ..Default::default() };
        let mut matched = 0;
        // A whole read keeps the DLQ's order only if it moves all or none:
        // each message read as often as the others, the head decides for
        // all (a copy read once more at the end of a turn is one ahead).
        let mut refresh_all = false;
        let mut round = false;
        let result: Result<()> = async {
            loop {
                // A deep filter that finds nothing would otherwise read on
                // for minutes: it stops, and the page says how far it read.
                if filter.within.is_some_and(|w| started.elapsed() >= w) && !round {
                    page.gave_up = true;
                    page.partial = true;
                    break;
                }
                // A deeper read goes round once at most: what it gave back
                // is behind the rest.
                if !whole && total.is_some_and(|t| page.scanned as u64 >= t) {
                    break;
                }
                let Some(raw) = reader.next().await? else { break };
                // After its own first copy a whole read takes the rest too,
                // held, so that all go back in one turn.
                if round {
                    keeper.hold(&raw);
                } else if keeper.round(&raw) {
                    round = true;
                }
                if round {
                    if whole {
                        continue;
                    }
                    break;
                }
                if whole && page.scanned == 0 && delivery_count(&raw) >= REFRESH_AT {
                    refresh_all = true;
                }
                page.scanned += 1;
                if matches(&raw, filter) {
                    matched += 1;
                    if page.letters.len() == limit {
                        page.more = true;
                    } else if matched > skip {
                        page.letters.push(dead_letter(&raw));
                    }
                }
                keeper.keep_or_refresh(&raw, refresh_all).await?;
                if (page.more || all_found(filter, matched)) && !whole {
                    page.partial = true;
                    break;
                }
            }
            Ok(())
        }
        .await;
        page.moved = keeper.moved;
        page.most_held = keeper.most_held;
        keeper.finish().await;
        drop(lock);
        result.map(|()| page)
    }

    /// Move dead letters from `{queue}.dlq` back to `{queue}`.
    ///
    /// Each copy goes straight to the queue through the default exchange,
    /// not through the exchange it was first published to: re-routing would
    /// deliver it again to every other queue bound there, which handled it
    /// the first time. A message leaves the DLQ only once its copy is
    /// confirmed; a crash in between leaves it in both (a duplicate, never a
    /// loss). Messages that do not match stay in the DLQ, in order, except
    /// one whose broker delivery count is near a limit, which is put back
    /// at the tail as a fresh copy ([`REFRESH_AT`]).
    ///
    /// A replay reads what the DLQ holds when it starts (a passive
    /// declare's count), no more: dead letters that arrive while it runs,
    /// among them its own copies whose handler still fails, wait for the
    /// next replay. Each copy carries the replay's id
    /// ([`REPLAYED_BY_HEADER`]), and a replay never takes a copy it sent, so
    /// each dead letter is replayed once by one replay.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, but never lossy: a dropped future may have replayed
    /// some (each removed from the DLQ only after its copy was confirmed),
    /// and the one in flight may be in both queues. Running it again goes on
    /// with what is left.
    pub async fn replay_dead_letters(&self, queue: &str, options: ReplayOptions) -> Result<ReplayReport> {
        self.take_dead_letters(queue, options, Take::Replay).await
    }

    /// Remove dead letters from `{queue}.dlq` for good: those matching
    /// `options` (all when it is the default), read as a replay reads them,
    /// each acknowledged instead of republished. `replayed` in the report
    /// counts those removed. The rest stay, in order, as in a replay, and
    /// dead letters that arrive meanwhile are not read.
    pub async fn discard_dead_letters(&self, queue: &str, options: ReplayOptions) -> Result<ReplayReport> {
        self.take_dead_letters(queue, options, Take::Discard).await
    }

    async fn take_dead_letters(&self, queue: &str, options: ReplayOptions, take: Take) -> Result<ReplayReport> {
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
        let dlq = dlq_name(queue);
        // One reader at a time (see [`reading_lock_name`]), taken before
        // the count so no other reader holds any of what it counts.
        // What the DLQ holds now bounds the read: a dead letter that arrives
        // while it runs is not read. A replayed copy whose handler still
        // fails is such a one, and a replay that read on to the DLQ's end
        // replayed it again, and again (300 dead letters: 20,315 replays in
        // 55 s). The DLQ is read from its head, so the first `held` read are
        // the ones it held. (A DLQ that does not exist has no count: the
        // reader says why.)
        let (reader, lock, held) = open_reading(backend, &dlq).await?;
        // As a browse: a DLQ of BROWSE_WHOLE or fewer is read to its end
        // as it stood, so what stays goes back in one turn and keeps its
        // order; a deeper one is left once every id asked for is found.
        let whole = held.is_some_and(|h| h <= BROWSE_WHOLE);
        let budget = held.unwrap_or(u64::MAX);
        let run = crate::envelope::new_id();
        let mut keeper = Keeper::new(backend, &reader, dlq);
        keeper.bounded = !whole;
        let mut report = ReplayReport::default();
        let mut read = 0u64;
        let result: Result<()> = async {
            while options.limit.is_none_or(|l| report.replayed < l) {
                let Some(raw) = reader.next().await? else { break };
                read += 1;
                if keeper.round(&raw) {
                    break;
                }
                // Past the count, only what another reader held when it was
                // taken and has given back since (redelivered): the count
                // is of ready messages, and RabbitMQ counts a quorum
                // queue's returns a moment after a reader closes (measured
                // on 3.10.8: 3 to 129 of 300 just after a page was read).
                // A new dead letter, this replay's own copies among them,
                // is not redelivered: the read ends there, and it stays.
                if read > budget && !raw.redelivered {
                    keeper.keep(&raw).await?;
                    break;
                }
                // A copy this replay sent, back already (another reader's
                // returns can put one inside the budget): it stays.
                if take == Take::Replay && replayed_by(&raw, &run) {
                    keeper.keep(&raw).await?;
                    continue;
                }
                if !matches(&raw, &options) {
                    report.skipped += 1;
                    keeper.keep(&raw).await?;
                    continue;
                }
                let tag = raw.tag;
                if take == Take::Discard {
                    reader.ack(tag).await?;
                    report.replayed += 1;
                    if !whole && all_found(&options, report.replayed) {
                        break;
                    }
                    continue;
                }
                let mut copy = revived(raw, &run);
                crate::limits::copy_props(&mut copy.props);
                backend.send("", queue, &copy.body, &copy.props).await?.wait().await?;
                reader.ack(tag).await?;
                report.replayed += 1;
                if !whole && all_found(&options, report.replayed) {
                    break;
                }
            }
            Ok(())
        }
        .await;
        keeper.finish().await;
        drop(lock);
        result.map(|()| report)
    }
}
