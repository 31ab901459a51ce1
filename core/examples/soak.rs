//! The soak (issue 47): every error path of the public API, `SOAK_ROUNDS`
//! times each, on ONE [`Connection`], and then the proof that nothing wore
//! out: the same connection still declares, publishes and consumes, and what
//! the process holds (the connection's channel ids, the tasks alive on both
//! tokio runtimes, file descriptors, threads, resident memory) is back where
//! it was.
//!
//! Why: a connection used to break for good after about 2,047 failed
//! operations (lapin kept the ids of channels the broker had closed; see
//! vendor/lapin/PATCHES.md). Each failure the broker answers by closing a
//! channel is a chance to leak an id, a task, a socket or a thread; a
//! unit test sees one of them, a soak sees the two-thousandth.
//!
//! `cargo build --release -p acemq --example soak`, then
//! `target/release/examples/soak`. `rake soak` (drill/soak.rb) runs it
//! against a private RabbitMQ node with:
//!
//! - `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672`); `memory://...`
//!   runs on the in-process broker and skips, saying why, the paths it has
//!   no meaning for (permissions, message size, `x-overflow`);
//! - `SOAK_ROUNDS` (default 500): operations per path;
//! - `SOAK_DENIED_EXCHANGE` (default `soak.denied`): an exchange the URL's
//!   user may not write to. The soak declares it first (harmless if it
//!   exists or the user may not); a publish there that is not refused
//!   skips the path ("the user may write to it");
//! - `SOAK_PATHS`: a comma-separated list of path names to run (all when
//!   unset), to reproduce one finding alone;
//! - `SOAK_MAX_MESSAGE`: the size in bytes past which the broker refuses a
//!   message (RabbitMQ's `max_message_size`). Unset, the oversized path is
//!   skipped: the crate bounds names, properties and frames
//!   (`acemq::limits`), never a body.
//!
//! The paths (names for `SOAK_PATHS`): `missing_queue_check`
//! (`queue_counts` answers `Ok(None)`), `missing_exchange_check` (a bind to
//! a missing exchange: the public API has no passive exchange check of its
//! own), `publish_missing_exchange`, `publish_unroutable`,
//! `publish_nacked_overflow` (`x-max-length: 1`, `x-overflow:
//! reject-publish`), `publish_oversized`, `publish_denied`,
//! `redeclare_other_arguments`, `consumer_queue_deleted`,
//! `consumer_missing_queue`, `handler_failures` (retry, reject, an error on
//! every attempt, a panic, a fatal error, an accept; every message counted
//! at the end), `handler_deadline` (a handler past `ConsumeOptions::timeout`),
//! `request_no_responder`, `request_unroutable`, `dead_letters_missing_dlq`
//! (peek, replay and discard of a DLQ that does not exist) and
//! `connection_open_close` (`SOAK_ROUNDS` more connections opened and closed).
//!
//! Every path starts with the connection's lifelong channels open (the
//! publishing channel, the reply channel), interleaves good traffic (a
//! publish and its delivery on a long-lived consumer, every [`GOOD_EVERY`]
//! operations), then runs a round trip on a fresh queue (apply, publish,
//! consume, accept, teardown), then waits up to [`SETTLE_LIMIT`] for the
//! resources to come back. Channels must come back exactly; tasks, fds and
//! threads within a few; RSS within [`RSS_PATH_MB`]. A connection event
//! (lost, replaced) or a lost subscription of the long-lived consumer
//! during a path fails it: a failed operation must cost neither.
//!
//! Output: a baseline line; one line per path, `soak: NAME: PASS|FAIL|SKIP
//! ...` with its operations by kind and the resources before and after,
//! followed by indented detail lines (`soak:   NAME: ...`: a sample of each
//! error, notes, and every `PROBLEM`); a `whole_run` line against the
//! baseline, counted as a path; `soak: K skipped` when some were; and last,
//! exactly `soak: N passed, M failed`. The exit status is 1 when any path
//! failed.

use acemq::{
    Ack, ConsumeOptions, Connection, ConnectionOptions, Consumer, Error, ErrorKind, ExchangeKind, Failure, Message, PublishOptions,
    QueueSpec, ReplayOptions, RequestOptions, RetryPolicy, TeardownOptions, Topology,
};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Good traffic (a publish and its delivery) after this many operations.
const GOOD_EVERY: u64 = 50;
/// One operation that takes longer than this is a hang: the path stops.
const OP_LIMIT: Duration = Duration::from_secs(45);
/// How long resources may take to come back after a path. A nacked publish
/// retires its channel after the confirm timeout (30 s by default), so this
/// is longer than that.
const SETTLE_LIMIT: Duration = Duration::from_secs(45);
/// Tasks, fds and threads may end a path this many above where they began
/// (a runtime's idle blocking thread, a timer).
const TASK_SLACK: usize = 3;
const FD_SLACK: usize = 2;
const THREAD_SLACK: usize = 3;
/// Resident memory a path may add, and the whole run.
const RSS_PATH_MB: u64 = 64;
const RSS_RUN_MB: u64 = 160;
/// The handler paths' ladder: 1 s, then 2 s, then the DLQ.
const LADDER_ATTEMPTS: u32 = 3;
/// A panic the handler path raises on purpose: not printed.
const DELIBERATE: &str = "soak: deliberate panic";

/// Connection and subscription events since the last look: a failed
/// operation must never cost the connection, nor the long-lived consumer
/// its subscription.
static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn watch_events(good_queue: String) {
    acemq::events::subscribe(move |event: &acemq::events::Event| {
        let p = event.payload();
        let line = match event.name() {
            "connection" => format!("connection {}: {}", p["state"].as_str().unwrap_or("?"), p["reason"].as_str().unwrap_or("")),
            "subscription" if p["queue"] == json!(good_queue) => {
                format!("the long-lived consumer's subscription {}: {}", p["state"].as_str().unwrap_or("?"), p["reason"].as_str().unwrap_or(""))
            }
            _ => return,
        };
        EVENTS.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    });
}

fn take_events() -> Vec<String> {
    std::mem::take(&mut *EVENTS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// What the process holds at one moment.
#[derive(Debug, Clone, Copy)]
struct Snap {
    /// Channel ids held on the soak's connection.
    channels: usize,
    /// Tasks alive on the soak's own runtime (`Connection::resources`).
    tasks: usize,
    /// Tasks alive on the crate's process runtime (`acemq::runtime`), where
    /// subscriptions' supervisors and retired channels' closes run.
    engine_tasks: usize,
    fds: usize,
    threads: usize,
    rss_kb: u64,
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

/// The process's file descriptors by what they are (`socket`, `pipe`,
/// `anon_inode:[eventpoll]`, a path), counted: what a leak is made of.
fn fd_kinds() -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
        let target = std::fs::read_link(entry.path()).map(|t| t.to_string_lossy().into_owned()).unwrap_or_else(|_| "?".into());
        let kind = match target.split_once(":[") {
            Some((k, _)) if k == "socket" || k == "pipe" => k.to_owned(),
            _ => target,
        };
        *out.entry(kind).or_default() += 1;
    }
    out
}

/// The process's threads by name, counted.
fn thread_names() -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let name = std::fs::read_to_string(entry.path().join("comm")).map(|n| n.trim().to_owned()).unwrap_or_else(|_| "?".into());
        *out.entry(name).or_default() += 1;
    }
    out
}

/// What `after` has more of than `before`: `socket +4, pipe +1`.
fn more_of(before: &BTreeMap<String, usize>, after: &BTreeMap<String, usize>) -> String {
    after
        .iter()
        .filter_map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or(0);
            (*a > b).then(|| format!("{k} +{}", a - b))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn snap(mq: &Connection) -> Snap {
    let r = mq.resources();
    Snap {
        channels: r.channels,
        tasks: r.tasks,
        engine_tasks: acemq::runtime::handle().metrics().num_alive_tasks(),
        fds: count_dir("/proc/self/fd"),
        threads: count_dir("/proc/self/task"),
        rss_kb: rss_kb(),
    }
}

/// What `after` holds beyond `before`, as problems (empty: back where it was).
fn grown(before: &Snap, after: &Snap, rss_mb: u64) -> Vec<String> {
    let mut out = Vec::new();
    if after.channels != before.channels {
        out.push(format!("channels {} -> {}: not back to the baseline", before.channels, after.channels));
    }
    for (what, b, a, slack) in [
        ("tasks", before.tasks, after.tasks, TASK_SLACK),
        ("engine tasks", before.engine_tasks, after.engine_tasks, TASK_SLACK),
        ("fds", before.fds, after.fds, FD_SLACK),
        ("threads", before.threads, after.threads, THREAD_SLACK),
    ] {
        if a > b + slack {
            out.push(format!("{what} {b} -> {a}: more than {slack} above the baseline"));
        }
    }
    if after.rss_kb > before.rss_kb + rss_mb * 1024 {
        out.push(format!("rss {} -> {} kB: grew more than {rss_mb} MB", before.rss_kb, after.rss_kb));
    }
    out
}

/// Wait (at most [`SETTLE_LIMIT`]) until what the process holds is back to
/// `before`: the snapshot then, how long it took, and what was still out
/// when the wait began (what the wait was for).
async fn settle(mq: &Connection, before: &Snap, rss_mb: u64) -> (Snap, Duration, Vec<String>) {
    let start = Instant::now();
    let first = grown(before, &snap(mq), rss_mb);
    loop {
        let now = snap(mq);
        if grown(before, &now, rss_mb).is_empty() || start.elapsed() >= SETTLE_LIMIT {
            return (now, start.elapsed(), first);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A snapshot once nothing is moving: two in a row 200 ms apart that agree
/// on everything but RSS (at most 10 s). A channel whose close-ok is still
/// on its way is not part of a baseline.
async fn quiet(mq: &Connection) -> Snap {
    let mut last = snap(mq);
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = snap(mq);
        let same = (now.channels, now.tasks, now.engine_tasks, now.fds, now.threads)
            == (last.channels, last.tasks, last.engine_tasks, last.fds, last.threads);
        last = now;
        if same {
            break;
        }
    }
    last
}

/// An error as the soak counts it: by kind, the broker's reply code named.
fn kind_name(e: &Error) -> String {
    match e.kind() {
        ErrorKind::Broker { reply_code: 404 } => "not_found".into(),
        ErrorKind::Broker { reply_code: 406 } => "precondition_failed".into(),
        ErrorKind::Broker { reply_code: 403 } => "access_refused".into(),
        ErrorKind::Broker { reply_code } => format!("broker_{reply_code}"),
        ErrorKind::Unroutable => "unroutable".into(),
        ErrorKind::Nacked => "nacked".into(),
        ErrorKind::Timeout => "timeout".into(),
        ErrorKind::Closed => "closed".into(),
        ErrorKind::InvalidArgument => "invalid_argument".into(),
        ErrorKind::ConnectionFailed => "connection_failed".into(),
        ErrorKind::AuthenticationFailed => "authentication_failed".into(),
        ErrorKind::Blocked => "blocked".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// An operation's result as (kind, sample text): `ok` names an `Ok`.
fn outcome<T>(r: acemq::Result<T>, ok: impl FnOnce(&T) -> &'static str) -> (String, String) {
    match r {
        Ok(v) => (ok(&v).to_owned(), String::new()),
        Err(e) => (kind_name(&e), e.to_string()),
    }
}

/// `url` without its password.
fn redacted(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split(':').next().unwrap_or("");
                format!("{scheme}://{user}:***@{host}")
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// Everything a path needs: the one connection, the long-lived consumer the
/// good traffic goes through, the settings.
struct Ctx {
    mq: Connection,
    url: String,
    options: ConnectionOptions,
    memory: bool,
    rounds: usize,
    run: String,
    denied: String,
    max_message: Option<usize>,
    good_queue: String,
    /// Requests that open the reply channel go here; they expire at once.
    warm_queue: String,
    good: Consumer,
    good_seq: AtomicU64,
    round_trips: AtomicU64,
}

impl Ctx {
    fn name(&self, what: &str) -> String {
        format!("soak.{what}.{}", self.run)
    }

    /// One good publish and its delivery on the long-lived consumer.
    async fn good_traffic(&self) -> Result<(), String> {
        let n = self.good_seq.fetch_add(1, Ordering::Relaxed);
        self.mq
            .publish(&json!({ "good": n }), &self.good_queue, PublishOptions::default())
            .await
            .map_err(|e| format!("good publish {n}: {} ({})", kind_name(&e), e))?;
        let d = tokio::time::timeout(Duration::from_secs(10), self.good.next())
            .await
            .map_err(|_| format!("good message {n}: no delivery within 10 s"))?
            .ok_or_else(|| format!("good message {n}: the long-lived consumer has closed"))?;
        let got = d.message.payload["good"].as_u64();
        self.good.accept(d);
        if got != Some(n) {
            return Err(format!("good message {n}: the long-lived consumer got {got:?}"));
        }
        Ok(())
    }

    /// Open again what the connection keeps for its whole life and opens on
    /// first use (the publishing channel, the reply channel), in case a path
    /// lost them (a connection replaced), so that each path's baseline has
    /// them: one good message and one request to a queue whose messages
    /// expire at once.
    async fn warm(&self) -> Result<(), String> {
        self.good_traffic().await?;
        let options = RequestOptions { timeout: Duration::from_millis(50), ..Default::default() };
        match self.mq.request(&json!({ "warm": true }), &self.warm_queue, options).await {
            Err(e) if e.kind() == &ErrorKind::Timeout => Ok(()),
            Err(e) => Err(format!("warm-up request: {} ({e})", kind_name(&e))),
            Ok(_) => Ok(()),
        }
    }

    /// The connection still declares a fresh queue, publishes to it,
    /// consumes the message back, accepts it, and the queue is left empty
    /// (a teardown without force refuses a queue holding a message).
    async fn round_trip(&self) -> Result<Duration, String> {
        let start = Instant::now();
        let n = self.round_trips.fetch_add(1, Ordering::Relaxed);
        let q = self.name(&format!("roundtrip.{n}"));
        let topology = Topology::new().queue(&q);
        let once = RetryPolicy::new(1, Duration::ZERO, Duration::ZERO);
        self.mq.apply(&topology).await.map_err(|e| format!("round trip: declare: {} ({e})", kind_name(&e)))?;
        self.mq
            .publish(&json!({ "round_trip": n }), &q, PublishOptions::default())
            .await
            .map_err(|e| format!("round trip: publish: {} ({e})", kind_name(&e)))?;
        let c = self
            .mq
            .consumer(&q, ConsumeOptions { retry: once.clone(), ..ConsumeOptions::default() })
            .await
            .map_err(|e| format!("round trip: consume: {} ({e})", kind_name(&e)))?;
        let got = tokio::time::timeout(Duration::from_secs(10), c.next()).await;
        let result = match got {
            Ok(Some(d)) if d.message.payload["round_trip"] == json!(n) => {
                c.accept(d);
                Ok(())
            }
            Ok(Some(d)) => Err(format!("round trip: got {} instead of {n}", d.message.payload)),
            Ok(None) => Err("round trip: the consumer closed".to_owned()),
            Err(_) => Err("round trip: no delivery within 10 s".to_owned()),
        };
        c.close().await;
        result?;
        self.mq
            .teardown(&topology, &TeardownOptions { retry: vec![once], force: false })
            .await
            .map_err(|e| format!("round trip: teardown (the queue should be empty): {} ({e})", kind_name(&e)))?;
        Ok(start.elapsed())
    }
}

/// What one path saw.
#[derive(Default)]
struct Tally {
    ops: u64,
    kinds: BTreeMap<String, u64>,
    samples: BTreeMap<String, String>,
    good: u64,
    problems: Vec<String>,
    peak_channels: usize,
    notes: Vec<String>,
}

impl Tally {
    fn problem(&mut self, p: impl Into<String>) {
        let p = p.into();
        if self.problems.len() < 10 {
            self.problems.push(p);
        } else if self.problems.len() == 10 {
            self.problems.push("(more problems not shown)".into());
        }
    }

    fn count(&mut self, kind: &str, n: u64) {
        *self.kinds.entry(kind.to_owned()).or_default() += n;
    }

    /// One operation's result, against what the path expects; good
    /// traffic every [`GOOD_EVERY`] operations.
    async fn note(&mut self, cx: &Ctx, (kind, sample): (String, String), expected: &[&str]) {
        self.ops += 1;
        self.count(&kind, 1);
        if !sample.is_empty() {
            self.samples.entry(kind.clone()).or_insert(sample.clone());
        }
        if !expected.contains(&kind.as_str()) {
            self.problem(format!("op {}: {kind} where {} was expected: {sample}", self.ops, expected.join(" or ")));
        }
        self.peak_channels = self.peak_channels.max(cx.mq.resources().channels);
        if self.ops % GOOD_EVERY == 0 {
            self.good(cx).await;
        }
    }

    async fn good(&mut self, cx: &Ctx) {
        match tokio::time::timeout(OP_LIMIT, cx.good_traffic()).await {
            Ok(Ok(())) => self.good += 1,
            Ok(Err(e)) => self.problem(e),
            Err(_) => self.problem(format!("good traffic hung for {OP_LIMIT:?}")),
        }
    }
}

/// Run `count` operations made by `make`, `width` at a time, each on a task
/// of its own and bounded by [`OP_LIMIT`], noting each result. False when
/// one hung (the path stops there).
async fn rounds<F, Fut>(cx: &Ctx, t: &mut Tally, count: usize, width: usize, expected: &[&str], mut make: F) -> bool
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = (String, String)> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut next = 0;
    while next < count || !set.is_empty() {
        while next < count && set.len() < width.max(1) {
            let op = make(next);
            let i = next;
            set.spawn(async move { (i, tokio::time::timeout(OP_LIMIT, op).await) });
            next += 1;
        }
        match set.join_next().await {
            Some(Ok((_, Ok(result)))) => t.note(cx, result, expected).await,
            Some(Ok((i, Err(_)))) => {
                t.count("hang", 1);
                t.problem(format!("op {i} hung: no answer within {OP_LIMIT:?}; the path stops"));
                set.abort_all();
                return false;
            }
            Some(Err(e)) => {
                t.count("panic", 1);
                t.problem(format!("an operation's task failed: {e}"));
            }
            None => break,
        }
    }
    true
}

#[derive(Debug, Clone, Copy)]
enum Path {
    MissingQueue,
    MissingExchange,
    PublishMissingExchange,
    Unroutable,
    Nacked,
    Oversized,
    Denied,
    Redeclare,
    ConsumerQueueDeleted,
    ConsumerMissingQueue,
    HandlerFailures,
    HandlerDeadline,
    RequestTimeout,
    RequestUnroutable,
    DeadLettersMissing,
    OpenClose,
}

const PATHS: [Path; 16] = [
    Path::MissingQueue,
    Path::MissingExchange,
    Path::PublishMissingExchange,
    Path::Unroutable,
    Path::Nacked,
    Path::Oversized,
    Path::Denied,
    Path::Redeclare,
    Path::ConsumerQueueDeleted,
    Path::ConsumerMissingQueue,
    Path::HandlerFailures,
    Path::HandlerDeadline,
    Path::RequestTimeout,
    Path::RequestUnroutable,
    Path::DeadLettersMissing,
    Path::OpenClose,
];

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::MissingQueue => "missing_queue_check",
            Path::MissingExchange => "missing_exchange_check",
            Path::PublishMissingExchange => "publish_missing_exchange",
            Path::Unroutable => "publish_unroutable",
            Path::Nacked => "publish_nacked_overflow",
            Path::Oversized => "publish_oversized",
            Path::Denied => "publish_denied",
            Path::Redeclare => "redeclare_other_arguments",
            Path::ConsumerQueueDeleted => "consumer_queue_deleted",
            Path::ConsumerMissingQueue => "consumer_missing_queue",
            Path::HandlerFailures => "handler_failures",
            Path::HandlerDeadline => "handler_deadline",
            Path::RequestTimeout => "request_no_responder",
            Path::RequestUnroutable => "request_unroutable",
            Path::DeadLettersMissing => "dead_letters_missing_dlq",
            Path::OpenClose => "connection_open_close",
        }
    }
}

/// Why a path did not run.
type Skip = String;

/// Run one path's operations into `t`.
async fn run_path(cx: &Ctx, path: Path, t: &mut Tally) -> Result<(), Skip> {
    let n = cx.rounds;
    match path {
        // A passive declare of a queue that does not exist: Ok(None), and
        // the broker closes the channel it asked on.
        Path::MissingQueue => {
            let (mq, q) = (cx.mq.clone(), cx.name("missing-queue"));
            rounds(cx, t, n, 1, &["none"], |_| {
                let (mq, q) = (mq.clone(), q.clone());
                async move { outcome(mq.queue_counts(&q).await, |c| if c.is_none() { "none" } else { "some" }) }
            })
            .await;
        }
        // The public API has no passive check of an exchange by itself (a
        // publish makes one internally: the next path); binding a queue to
        // a missing exchange is the declaration the broker refuses with 404.
        Path::MissingExchange => {
            let (mq, ex, q) = (cx.mq.clone(), cx.name("missing-exchange"), cx.good_queue.clone());
            t.notes.push("a bind to a missing exchange: no public passive exchange check (publish checks one internally)".into());
            rounds(cx, t, n, 1, &["not_found"], |_| {
                let (mq, ex, q) = (mq.clone(), ex.clone(), q.clone());
                async move { outcome(mq.apply(&Topology::new().bind(&q, &ex, "soak")).await, |_| "ok") }
            })
            .await;
        }
        Path::PublishMissingExchange => {
            let (mq, ex) = (cx.mq.clone(), cx.name("missing-exchange"));
            rounds(cx, t, n, 1, &["not_found"], |i| {
                let (mq, ex) = (mq.clone(), ex.clone());
                async move {
                    let opts = PublishOptions { exchange: ex, ..Default::default() };
                    outcome(mq.publish(&json!({ "n": i }), "soak", opts).await, |_| "ok")
                }
            })
            .await;
        }
        // Publishes are mandatory: one nothing is bound to take comes back.
        Path::Unroutable => {
            let (mq, q) = (cx.mq.clone(), cx.name("nobody"));
            rounds(cx, t, n, 1, &["unroutable"], |i| {
                let (mq, q) = (mq.clone(), q.clone());
                async move { outcome(mq.publish(&json!({ "n": i }), &q, PublishOptions::default()).await, |_| "ok") }
            })
            .await;
        }
        Path::Nacked => {
            if cx.memory {
                return Err("memory:// does not implement x-max-length / x-overflow: reject-publish".into());
            }
            let q = cx.name("overflow");
            let mut spec = QueueSpec::new(&q);
            spec.dead_letter_queue = false;
            spec.arguments.insert("x-max-length".into(), json!(1));
            spec.arguments.insert("x-overflow".into(), json!("reject-publish"));
            let topology = Topology::new().queue_spec(spec);
            cx.mq.apply(&topology).await.map_err(|e| format!("declaring {q}: {e}"))?;
            if let Err(e) = cx.mq.publish(&json!({ "fill": 1 }), &q, PublishOptions::default()).await {
                t.problem(format!("filling {q} (x-max-length 1): {} ({e})", kind_name(&e)));
            }
            let mq = cx.mq.clone();
            let q2 = q.clone();
            rounds(cx, t, n, 1, &["nacked"], |i| {
                let (mq, q) = (mq.clone(), q2.clone());
                async move { outcome(mq.publish(&json!({ "n": i }), &q, PublishOptions::default()).await, |_| "ok") }
            })
            .await;
            match cx.mq.queue_counts(&q).await {
                Ok(Some(c)) if c.ready == 1 => {}
                other => t.problem(format!("{q} should hold its 1 message: {other:?}")),
            }
            let _ = cx.mq.teardown(&topology, &TeardownOptions { retry: vec![], force: true }).await;
        }
        Path::Oversized => {
            if cx.memory {
                return Err("memory:// has no message size limit".into());
            }
            let Some(max) = cx.max_message else {
                return Err("SOAK_MAX_MESSAGE is not set, and the crate has no body limit of its own (acemq::limits bounds names, properties and frames)".into());
            };
            let q = cx.name("oversized");
            let topology = Topology::new().queue(&q);
            cx.mq.apply(&topology).await.map_err(|e| format!("declaring {q}: {e}"))?;
            // One body, shared: max + 1 KiB of JSON.
            let pad = Arc::new(json!({ "pad": "x".repeat(max + 1024) }));
            let (mq, q2) = (cx.mq.clone(), q.clone());
            rounds(cx, t, n, 1, &["precondition_failed"], |_| {
                let (mq, q, pad) = (mq.clone(), q2.clone(), pad.clone());
                async move { outcome(mq.publish(&*pad, &q, PublishOptions::default()).await, |_| "ok") }
            })
            .await;
            match cx.mq.queue_counts(&q).await {
                Ok(Some(c)) if c.ready == 0 => {}
                other => t.problem(format!("{q} should be empty: {other:?}")),
            }
            let _ = cx.mq.teardown(&topology, &TeardownOptions { retry: vec![], force: true }).await;
        }
        Path::Denied => {
            if cx.memory {
                return Err("memory:// has no users or permissions".into());
            }
            // Declared first, so that the path needs only the permission
            // to be set up; refused (no configure permission) or there
            // already, it is what the broker has.
            let declared = cx.mq.apply(&Topology::new().exchange(&cx.denied, ExchangeKind::Direct)).await;
            let opts = PublishOptions { exchange: cx.denied.clone(), ..Default::default() };
            let first = outcome(cx.mq.publish(&json!({ "n": 0 }), "soak", opts.clone()).await, |_| "ok");
            match first.0.as_str() {
                "ok" | "unroutable" => {
                    return Err(format!(
                        "publishing to exchange '{}' was not refused ({}): the user may write to it",
                        cx.denied, first.0
                    ))
                }
                "not_found" => {
                    return Err(format!(
                        "exchange '{}' does not exist and could not be declared ({}): create it for a user that may not write to it",
                        cx.denied,
                        declared.err().map_or("declared".to_owned(), |e| e.to_string())
                    ))
                }
                _ => {}
            }
            t.note(cx, first, &["access_refused"]).await;
            let mq = cx.mq.clone();
            rounds(cx, t, n.saturating_sub(1), 1, &["access_refused"], |i| {
                let (mq, opts) = (mq.clone(), opts.clone());
                async move { outcome(mq.publish(&json!({ "n": i + 1 }), "soak", opts).await, |_| "ok") }
            })
            .await;
        }
        Path::Redeclare => {
            let q = cx.name("redeclare");
            let topology = Topology::new().queue(&q);
            cx.mq.apply(&topology).await.map_err(|e| format!("declaring {q}: {e}"))?;
            let mut other = QueueSpec::new(&q);
            other.arguments.insert("x-max-length".into(), json!(10));
            let conflicting = Topology::new().queue_spec(other);
            let mq = cx.mq.clone();
            rounds(cx, t, n, 1, &["precondition_failed"], |_| {
                let (mq, conflicting) = (mq.clone(), conflicting.clone());
                async move { outcome(mq.apply(&conflicting).await, |_| "ok") }
            })
            .await;
            let _ = cx.mq.teardown(&topology, &TeardownOptions { retry: vec![], force: true }).await;
        }
        // The broker cancels a consumer whose queue is deleted under it;
        // the subscription sees it, tries again (404), and is closed.
        Path::ConsumerQueueDeleted => {
            if cx.memory {
                return Err("memory:// does not cancel the consumers of a deleted queue (MemoryBroker::delete_queue leaves them subscribed)".into());
            }
            let (mq, base) = (cx.mq.clone(), cx.name("cancelled"));
            rounds(cx, t, n, 4, &["cancelled"], |i| {
                let (mq, q) = (mq.clone(), format!("{base}.{i}"));
                async move { consumer_of_deleted_queue(&mq, &q).await }
            })
            .await;
        }
        Path::ConsumerMissingQueue => {
            let q = cx.name("consumer-missing");
            let mq = cx.mq.clone();
            let q2 = q.clone();
            rounds(cx, t, n, 1, &["not_found"], |_| {
                let (mq, q) = (mq.clone(), q2.clone());
                async move {
                    match mq.consumer(&q, ConsumeOptions::default()).await {
                        Ok(c) => {
                            c.close().await;
                            ("subscribed".to_owned(), String::new())
                        }
                        Err(e) => (kind_name(&e), e.to_string()),
                    }
                }
            })
            .await;
            // Opening the consumer declared the missing queue's ladder and
            // DLQ: say so, and take them down.
            let left = cx
                .mq
                .queue_counts(&acemq::dlq_name(&q))
                .await
                .ok()
                .flatten()
                .is_some();
            if left {
                t.notes.push(format!("opening a consumer on the missing queue declared {} and its rungs", acemq::dlq_name(&q)));
            }
            let _ = cx.mq.teardown(&Topology::new().queue(&q), &TeardownOptions { retry: vec![], force: true }).await;
        }
        Path::HandlerFailures => handler_failures(cx, t).await?,
        Path::HandlerDeadline => handler_deadline(cx, t).await?,
        Path::RequestTimeout => {
            let q = cx.name("no-responder");
            let topology = Topology::new().queue(&q);
            cx.mq.apply(&topology).await.map_err(|e| format!("declaring {q}: {e}"))?;
            let late = cx.mq.late_replies();
            let (mq, q2) = (cx.mq.clone(), q.clone());
            rounds(cx, t, n, 10, &["timeout"], |i| {
                let (mq, q) = (mq.clone(), q2.clone());
                async move {
                    let options = RequestOptions { timeout: Duration::from_millis(100), ..Default::default() };
                    outcome(mq.request(&json!({ "n": i }), &q, options).await, |_| "replied")
                }
            })
            .await;
            if cx.mq.late_replies() != late {
                t.problem(format!("late replies {} -> {} with no responder", late, cx.mq.late_replies()));
            }
            // Every request was stored (confirmed) in the queue nobody reads.
            match cx.mq.queue_counts(&q).await {
                Ok(Some(c)) if c.ready == n as u64 => {}
                other => t.problem(format!("{q} should hold the {n} requests: {other:?}")),
            }
            let _ = cx.mq.teardown(&topology, &TeardownOptions { retry: vec![], force: true }).await;
        }
        Path::RequestUnroutable => {
            let (mq, q) = (cx.mq.clone(), cx.name("no-such-service"));
            rounds(cx, t, n, 1, &["unroutable"], |i| {
                let (mq, q) = (mq.clone(), q.clone());
                async move {
                    let options = RequestOptions { timeout: Duration::from_secs(5), ..Default::default() };
                    outcome(mq.request(&json!({ "n": i }), &q, options).await, |_| "replied")
                }
            })
            .await;
        }
        // Browse (peek), replay and discard of a DLQ that does not exist.
        Path::DeadLettersMissing => {
            let (mq, q) = (cx.mq.clone(), cx.name("no-dlq"));
            rounds(cx, t, 3 * n, 1, &["not_found"], |i| {
                let (mq, q) = (mq.clone(), q.clone());
                async move {
                    match i % 3 {
                        0 => outcome(mq.peek_dead_letters(&q, 10).await, |_| "ok"),
                        1 => outcome(mq.replay_dead_letters(&q, ReplayOptions::default()).await, |_| "ok"),
                        _ => outcome(mq.discard_dead_letters(&q, ReplayOptions::default()).await, |_| "ok"),
                    }
                }
            })
            .await;
        }
        Path::OpenClose => {
            let (url, options, q) = (cx.url.clone(), cx.options.clone(), cx.good_queue.clone());
            rounds(cx, t, n, 1, &["ok"], |_| {
                let (url, options, q) = (url.clone(), options.clone(), q.clone());
                async move {
                    let mq = match Connection::open_with(&url, options).await {
                        Ok(mq) => mq,
                        Err(e) => return (kind_name(&e), e.to_string()),
                    };
                    let counted = outcome(mq.queue_counts(&q).await, |c| if c.is_some() { "ok" } else { "missing" });
                    mq.close().await;
                    counted
                }
            })
            .await;
        }
    }
    Ok(())
}

/// Declare `q`, consume it, delete it under the consumer (teardown with
/// force), wait for the subscription to see the broker's cancel, close.
async fn consumer_of_deleted_queue(mq: &Connection, q: &str) -> (String, String) {
    let once = RetryPolicy::new(1, Duration::ZERO, Duration::ZERO);
    let topology = Topology::new().queue(q);
    if let Err(e) = mq.apply(&topology).await {
        return (format!("declare_{}", kind_name(&e)), e.to_string());
    }
    let c = match mq.consumer(q, ConsumeOptions { retry: once.clone(), ..ConsumeOptions::default() }).await {
        Ok(c) => c,
        Err(e) => return (format!("consume_{}", kind_name(&e)), e.to_string()),
    };
    let deleted = mq.teardown(&topology, &TeardownOptions { retry: vec![once], force: true }).await;
    let result = match deleted {
        Err(e) => (format!("teardown_{}", kind_name(&e)), e.to_string()),
        Ok(_) => {
            // What a consumer's worker does meanwhile: wait for the next
            // delivery. The subscription learns of the broker's cancel from
            // its stream, which only a reader polls.
            let seen = async {
                loop {
                    if c.down_for().is_some() || c.failure().is_some() {
                        break ("cancelled".to_owned(), c.failure().map(|e| e.to_string()).unwrap_or_default());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            tokio::select! {
                r = seen => r,
                d = c.next() => match d {
                    Some(d) => ("delivered".to_owned(), format!("a delivery from a deleted queue: {}", d.message.payload)),
                    None => ("ended".to_owned(), "the consumer ended".to_owned()),
                },
                _ = tokio::time::sleep(Duration::from_secs(10)) => {
                    ("not_cancelled".to_owned(), "the subscription did not see its queue deleted within 10 s".to_owned())
                }
            }
        }
    };
    c.close().await;
    result
}

/// What a handler path's handler returned, by kind.
#[derive(Default)]
struct Returns {
    kinds: Mutex<BTreeMap<&'static str, u64>>,
    accepted: Mutex<HashSet<u64>>,
    accepts: AtomicU64,
}

impl Returns {
    fn saw(&self, kind: &'static str) {
        *self.kinds.lock().unwrap_or_else(|p| p.into_inner()).entry(kind).or_default() += 1;
    }

    fn accept(&self, n: u64) -> Ack {
        self.saw("accept");
        self.accepts.fetch_add(1, Ordering::Relaxed);
        self.accepted.lock().unwrap_or_else(|p| p.into_inner()).insert(n);
        Ack::accept()
    }

    fn distinct(&self) -> u64 {
        self.accepted.lock().unwrap_or_else(|p| p.into_inner()).len() as u64
    }
}

/// An error of the soak's own, for a handler to return.
#[derive(Debug)]
struct SoakError(&'static str);

impl std::fmt::Display for SoakError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for SoakError {}

/// Publish `n` messages `{"n": i}` to `q`, with good traffic between.
async fn publish_numbered(cx: &Ctx, t: &mut Tally, q: &str) -> Result<(), Skip> {
    for i in 0..cx.rounds as u64 {
        if let Err(e) = cx.mq.publish(&json!({ "n": i }), q, PublishOptions::default()).await {
            t.problem(format!("publishing message {i} to {q}: {} ({e})", kind_name(&e)));
            return Ok(());
        }
        if (i + 1) % GOOD_EVERY == 0 {
            t.good(cx).await;
        }
    }
    Ok(())
}

/// Where every one of `published` messages is now: accepted, in the DLQ, on
/// the ladder or still in the queue; problems for the rest.
async fn account(cx: &Ctx, t: &mut Tally, q: &str, policy: &RetryPolicy, accepted: u64, expect_accepted: u64, expect_dlq: u64) {
    let mut names = vec![q.to_owned(), acemq::dlq_name(q)];
    names.extend(policy.rung_queues(q));
    let counts = match cx.mq.queue_counts_many(&names).await {
        Ok(c) => c,
        Err(e) => {
            t.problem(format!("counting {q} and its ladder: {} ({e})", kind_name(&e)));
            return;
        }
    };
    let ready = |i: usize| counts.get(i).copied().flatten().map_or(0, |c| c.ready);
    let (queued, dlq) = (ready(0), ready(1));
    let ladder: u64 = (2..names.len()).map(ready).sum();
    let published = cx.rounds as u64;
    let lost = published as i64 - (accepted + dlq + ladder + queued) as i64;
    t.notes.push(format!(
        "{published} published: {accepted} accepted, {dlq} in the DLQ, {ladder} on the ladder, {queued} in the queue: {lost} lost"
    ));
    if lost != 0 {
        t.problem(format!("{lost} messages unaccounted for (negative: counted twice)"));
    }
    if accepted != expect_accepted || dlq != expect_dlq || ladder != 0 || queued != 0 {
        t.problem(format!(
            "expected {expect_accepted} accepted and {expect_dlq} dead-lettered, nothing left: got {accepted} accepted, {dlq} in the DLQ, {ladder} on the ladder, {queued} queued"
        ));
    }
}

/// Wait (bounded) until `done` says the handlers have settled everything.
async fn until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Handlers that fail every way a handler can: a retry then an accept, a
/// reject, an error on every attempt (exhausted to the DLQ), a panic then
/// an accept, a fatal error, a plain accept. Every message is counted at
/// the end.
async fn handler_failures(cx: &Ctx, t: &mut Tally) -> Result<(), Skip> {
    let q = cx.name("handlers");
    let topology = Topology::new().queue(&q);
    let policy = RetryPolicy::new(LADDER_ATTEMPTS, Duration::from_secs(1), Duration::from_secs(2));
    cx.mq.apply(&topology).await.map_err(|e| format!("declaring {q}: {e}"))?;
    let returns = Arc::new(Returns::default());
    let r = returns.clone();
    let options = ConsumeOptions { retry: policy.clone(), ..ConsumeOptions::with_concurrency(8) };
    let handle = cx
        .mq
        .consume(&q, options, move |m: Message| {
            let r = r.clone();
            async move {
                let n = m.payload["n"].as_u64().unwrap_or(u64::MAX);
                let first = m.envelope.attempt <= 1;
                match n % 6 {
                    0 if first => {
                        r.saw("retry");
                        Ok(Ack::retry("soak: retry once"))
                    }
                    1 => {
                        r.saw("reject");
                        Ok(Ack::reject("soak: rejected"))
                    }
                    2 => {
                        r.saw("error");
                        Err(Failure::from(SoakError("soak: fails every attempt")))
                    }
                    3 if first => {
                        r.saw("panic");
                        panic!("{DELIBERATE}");
                    }
                    4 => {
                        r.saw("fatal");
                        Err(Failure::fatal(SoakError("soak: fatal")))
                    }
                    _ => Ok(r.accept(n)),
                }
            }
        })
        .await
        .map_err(|e| format!("consuming {q}: {e}"))?;
    publish_numbered(cx, t, &q).await?;
    let n = cx.rounds as u64;
    let class = |k: u64| (0..n).filter(|i| i % 6 == k).count() as u64;
    let expect_dlq = class(1) + class(2) + class(4);
    let expect_accepted = n - expect_dlq;
    let c = handle.consumer();
    // The ladder is 1 s then 2 s; every message is settled well within a minute.
    let settled = until(Duration::from_secs(60) + Duration::from_millis(20 * n), || {
        let s = c.stats();
        s.accepted + s.dead_lettered >= n
    })
    .await;
    if !settled {
        t.problem(format!("not every message settled within the wait: {:?}", c.stats()));
    }
    // Acknowledgements go out within 10 ms; the DLQ's copies are confirmed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = c.stats();
    let errors = c.take_errors();
    if !errors.is_empty() {
        t.problem(format!("{} background settlement errors, the first: {}", errors.len(), errors[0]));
    }
    handle.cancel().await;
    for (k, v) in returns.kinds.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        t.count(k, *v);
    }
    t.ops = n;
    let distinct = returns.distinct();
    let dupes = returns.accepts.load(Ordering::Relaxed) - distinct;
    t.notes.push(format!(
        "stats: {} accepted, {} retried, {} dead-lettered; {dupes} accepted twice",
        stats.accepted, stats.retried, stats.dead_lettered
    ));
    if dupes != 0 {
        t.problem(format!("{dupes} messages handled and accepted twice"));
    }
    account(cx, t, &q, &policy, distinct, expect_accepted, expect_dlq).await;
    let _ = cx.mq.teardown(&topology, &TeardownOptions { retry: vec![policy], force: true }).await;
    Ok(())
}

/// A handler that overruns its deadline on the first attempt: the deadline
/// settles it as a retry, its late accept is discarded (abandoned), the
/// second attempt accepts.
async fn handler_deadline(cx: &Ctx, t: &mut Tally) -> Result<(), Skip> {
    let q = cx.name("deadline");
    let topology = Topology::new().queue(&q);
    let policy = RetryPolicy::new(LADDER_ATTEMPTS, Duration::from_secs(1), Duration::from_secs(1));
    cx.mq.apply(&topology).await.map_err(|e| format!("declaring {q}: {e}"))?;
    let returns = Arc::new(Returns::default());
    let r = returns.clone();
    let options = ConsumeOptions { retry: policy.clone(), timeout: Duration::from_millis(200), ..ConsumeOptions::with_concurrency(16) };
    let handle = cx
        .mq
        .consume(&q, options, move |m: Message| {
            let r = r.clone();
            async move {
                let n = m.payload["n"].as_u64().unwrap_or(u64::MAX);
                if m.envelope.attempt <= 1 {
                    r.saw("overrun");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    r.saw("late_accept");
                    return Ack::accept();
                }
                r.accept(n)
            }
        })
        .await
        .map_err(|e| format!("consuming {q}: {e}"))?;
    publish_numbered(cx, t, &q).await?;
    let n = cx.rounds as u64;
    let c = handle.consumer();
    let settled = until(Duration::from_secs(60) + Duration::from_millis(20 * n), || {
        let s = c.stats();
        s.accepted >= n && s.abandoned >= n
    })
    .await;
    if !settled {
        t.problem(format!("not every message settled within the wait: {:?}", c.stats()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = c.stats();
    let errors = c.take_errors();
    if !errors.is_empty() {
        t.problem(format!("{} background settlement errors, the first: {}", errors.len(), errors[0]));
    }
    handle.cancel().await;
    for (k, v) in returns.kinds.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        t.count(k, *v);
    }
    t.ops = n;
    t.notes.push(format!(
        "stats: {} accepted, {} timed out, {} abandoned, {} retried, {} dead-lettered",
        stats.accepted, stats.timed_out, stats.abandoned, stats.retried, stats.dead_lettered
    ));
    if stats.timed_out != n || stats.abandoned != n {
        t.problem(format!("expected {n} timed out and {n} abandoned: {stats:?}"));
    }
    let distinct = returns.distinct();
    let dupes = returns.accepts.load(Ordering::Relaxed) - distinct;
    if dupes != 0 {
        t.problem(format!("{dupes} messages accepted twice"));
    }
    account(cx, t, &q, &policy, distinct, n, 0).await;
    let _ = cx.mq.teardown(&topology, &TeardownOptions { retry: vec![policy], force: true }).await;
    Ok(())
}

fn mb(kb: u64) -> String {
    format!("{:.1}", kb as f64 / 1024.0)
}

fn resources_line(b: &Snap, a: &Snap, peak: usize) -> String {
    format!(
        "channels {}->{} (peak {peak}), tasks {}->{}, engine tasks {}->{}, fds {}->{}, threads {}->{}, rss {}->{} MB",
        b.channels,
        a.channels,
        b.tasks,
        a.tasks,
        b.engine_tasks,
        a.engine_tasks,
        b.fds,
        a.fds,
        b.threads,
        a.threads,
        mb(b.rss_kb),
        mb(a.rss_kb)
    )
}

/// A path's budget: generous, so only a hang reaches it (each operation
/// has its own [`OP_LIMIT`]).
fn path_limit(rounds: usize) -> Duration {
    Duration::from_secs(180) + Duration::from_millis(400 * rounds as u64)
}

enum Verdict {
    Passed,
    Failed,
    Skipped,
}

async fn soak_path(cx: &Ctx, path: Path) -> Verdict {
    let name = path.name();
    if let Err(e) = cx.warm().await {
        println!("soak:   {name}: warming up before the path: {e}");
    }
    let before = quiet(&cx.mq).await;
    let (fds_before, threads_before) = (fd_kinds(), thread_names());
    let start = Instant::now();
    let mut t = Tally { peak_channels: before.channels, ..Tally::default() };
    let ran = tokio::time::timeout(path_limit(cx.rounds), run_path(cx, path, &mut t)).await;
    let elapsed = start.elapsed();
    match ran {
        Ok(Err(skip)) => {
            println!("soak: {name}: SKIP {skip}");
            return Verdict::Skipped;
        }
        Ok(Ok(())) => {}
        Err(_) => t.problem(format!("the path did not finish within {:?}: hung", path_limit(cx.rounds))),
    }
    let round_trip = tokio::time::timeout(OP_LIMIT, cx.round_trip()).await.unwrap_or_else(|_| Err("round trip: hung".into()));
    let (after, settled_in, waited_for) = settle(&cx.mq, &before, RSS_PATH_MB).await;
    let events = take_events();
    if !events.is_empty() {
        t.problem(format!("{} connection or subscription events during the path", events.len()));
        for e in events.iter().take(5) {
            t.problem(format!("event: {e}"));
        }
    }
    let mut leaks = grown(&before, &after, RSS_PATH_MB);
    if after.fds > before.fds {
        leaks.push(format!("fds new since the path began: {}", more_of(&fds_before, &fd_kinds())));
    }
    if after.threads > before.threads {
        leaks.push(format!("threads new since the path began: {}", more_of(&threads_before, &thread_names())));
    }
    let kinds = t.kinds.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
    let rt = match &round_trip {
        Ok(d) => format!("round trip ok in {} ms", d.as_millis()),
        Err(_) => "round trip FAILED".to_owned(),
    };
    let failed = !t.problems.is_empty() || round_trip.is_err() || !grown(&before, &after, RSS_PATH_MB).is_empty();
    println!(
        "soak: {name}: {} {} ops ({kinds}), {} good, {}, settled in {:.1} s, {rt}, {:.1} s",
        if failed { "FAIL" } else { "PASS" },
        t.ops,
        t.good,
        resources_line(&before, &after, t.peak_channels),
        settled_in.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    for note in &t.notes {
        println!("soak:   {name}: {note}");
    }
    if t.peak_channels > before.channels + 100 {
        println!(
            "soak:   {name}: NOTE {} channels held at the peak, {} above the baseline (RabbitMQ allows 2,047 on a connection)",
            t.peak_channels,
            t.peak_channels - before.channels
        );
    }
    if settled_in >= Duration::from_secs(1) {
        println!("soak:   {name}: the settle wait was for: {}", waited_for.join("; "));
    }
    for (kind, sample) in &t.samples {
        println!("soak:   {name}: {kind}: {sample}");
    }
    for p in t.problems.iter().chain(&leaks) {
        println!("soak:   {name}: PROBLEM {p}");
    }
    if let Err(e) = round_trip {
        println!("soak:   {name}: PROBLEM {e}");
    }
    if failed {
        Verdict::Failed
    } else {
        Verdict::Passed
    }
}

/// The panic the handler path raises on purpose is not printed; any other
/// goes to the default hook.
fn quiet_deliberate_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        if text.is_some_and(|t| t.starts_with(DELIBERATE)) {
            return;
        }
        default(info);
    }));
}

/// Open the connection and what every path shares, warmed up: the
/// publishing channel, the long-lived consumer and the reply channel are
/// opened once, for the life of the connection, before the baseline.
async fn setup(url: &str) -> Result<Ctx, String> {
    let memory = url.starts_with("memory://");
    let options = ConnectionOptions { origin: Some("acemq-soak".into()), ..ConnectionOptions::default() };
    let mq = Connection::open_with(url, options.clone()).await.map_err(|e| format!("opening {}: {e}", redacted(url)))?;
    let run = uuid::Uuid::now_v7().simple().to_string()[20..].to_owned();
    let good_queue = format!("soak.good.{run}");
    let warm_queue = format!("soak.warm.{run}");
    mq.apply(&Topology::new().queue(&good_queue)).await.map_err(|e| format!("declaring {good_queue}: {e}"))?;
    let once = RetryPolicy::new(1, Duration::ZERO, Duration::ZERO);
    let good = mq
        .consumer(&good_queue, ConsumeOptions { retry: once, ..ConsumeOptions::default() })
        .await
        .map_err(|e| format!("consuming {good_queue}: {e}"))?;
    let cx = Ctx {
        mq,
        url: url.to_owned(),
        options,
        memory,
        rounds: env_or("SOAK_ROUNDS", 500usize).max(1),
        run,
        denied: std::env::var("SOAK_DENIED_EXCHANGE").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "soak.denied".into()),
        max_message: std::env::var("SOAK_MAX_MESSAGE").ok().and_then(|v| v.trim().parse().ok()),
        warm_queue,
        good_queue,
        good,
        good_seq: AtomicU64::new(0),
        round_trips: AtomicU64::new(0),
    };
    let mut warm = QueueSpec::new(&cx.warm_queue);
    warm.dead_letter_queue = false;
    warm.arguments.insert("x-message-ttl".into(), json!(0));
    cx.mq.apply(&Topology::new().queue_spec(warm)).await.map_err(|e| format!("declaring {}: {e}", cx.warm_queue))?;
    cx.warm().await?;
    cx.round_trip().await?;
    // The first connection closed makes what stays for the life of the
    // process: async-compat's fallback tokio runtime (a thread named
    // `async-compat/to…`, an epoll, an eventfd, a dup of tokio's signal
    // socket), built when lapin drops the socket on its own I/O thread.
    // Made once here, before the baseline, so that the open/close path
    // measures what each connection leaves.
    let other = Connection::open_with(url, cx.options.clone()).await.map_err(|e| format!("opening a second connection: {e}"))?;
    other.close().await;
    drop(other);
    Ok(cx)
}

#[tokio::main]
async fn main() {
    quiet_deliberate_panics();
    let url = std::env::var("AMQP_URL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672".into());
    // The crate's process runtime runs subscriptions' supervisors: built
    // now, so that its threads are in the baseline.
    let _ = acemq::runtime::handle();
    let started = Instant::now();
    let cx = match setup(&url).await {
        Ok(cx) => cx,
        Err(e) => {
            println!("soak: cannot start: {e}");
            println!("soak: 0 passed, 1 failed");
            std::process::exit(1);
        }
    };
    println!(
        "soak: {} ({}), {} rounds a path, denied exchange '{}', max message {}",
        redacted(&url),
        cx.mq.server_version().map_or("in-process broker".to_owned(), |v| format!("RabbitMQ {v}")),
        cx.rounds,
        cx.denied,
        cx.max_message.map_or("unset".to_owned(), |m| format!("{m} bytes"))
    );
    watch_events(cx.good_queue.clone());
    let baseline = quiet(&cx.mq).await;
    println!("soak: baseline {}", resources_line(&baseline, &baseline, baseline.channels).replace("->", " "));
    let chosen: Option<Vec<String>> =
        std::env::var("SOAK_PATHS").ok().filter(|s| !s.trim().is_empty()).map(|s| s.split(',').map(|p| p.trim().to_owned()).collect());
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for path in PATHS {
        if chosen.as_ref().is_some_and(|c| !c.iter().any(|p| p == path.name())) {
            continue;
        }
        match soak_path(&cx, path).await {
            Verdict::Passed => passed += 1,
            Verdict::Failed => failed += 1,
            Verdict::Skipped => skipped += 1,
        }
    }
    // The whole run against the baseline taken before the first path.
    let (end, settled_in, _) = settle(&cx.mq, &baseline, RSS_RUN_MB).await;
    let leaks = grown(&baseline, &end, RSS_RUN_MB);
    println!(
        "soak: whole_run: {} {}, settled in {:.1} s, {:.1} s",
        if leaks.is_empty() { "PASS" } else { "FAIL" },
        resources_line(&baseline, &end, end.channels),
        settled_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for p in &leaks {
        println!("soak:   whole_run: PROBLEM {p}");
    }
    if leaks.is_empty() {
        passed += 1;
    } else {
        failed += 1;
    }
    cx.good.close().await;
    let _ = cx.mq.teardown(&Topology::new().queue(&cx.good_queue), &TeardownOptions { retry: vec![], force: true }).await;
    let _ = cx.mq.teardown(&Topology::new().queue(&cx.warm_queue), &TeardownOptions { retry: vec![], force: true }).await;
    cx.mq.close().await;
    if skipped > 0 {
        println!("soak: {skipped} skipped");
    }
    println!("soak: {passed} passed, {failed} failed");
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
