//! acemq's Rust API against raw lapin on the same broker, in the same run.
//!
//! ```text
//! cargo run --release --example bench     # `rake bench` runs it before bench/run.rb
//! ```
//!
//! AMQP_URL overrides the broker (default amqp://guest:guest@127.0.0.1:5672);
//! BENCH_RUNS (default 5) runs per side and case, the median reported;
//! BENCH_SCALE (default 1.0) multiplies every message count; BENCH_CASES
//! (default all) names the cases to run, comma-separated; BENCH_SIDE=acemq,
//! pull or lapin runs only that side of the consume case (for a profiler), with
//! each run's client CPU per thread; BENCH_SIDES=blocking,lapin alternates
//! the sides named instead (`blocking`: the engine path the Ruby consumer
//! takes, from a plain thread, without Ruby); BENCH_PHASES=1 prints how long acemq's
//! consume took to open, to handle every message and to cancel. Every case sends
//! the same 1 KiB JSON object, persistent; queues are named per run, purged
//! before every timed run and deleted at the end.
//!
//! ```text
//! bench raw publish_each|publish_batch|consume QUEUE N
//! ```
//!
//! is one timed run of raw lapin alone, on a queue the caller declared (and,
//! for `consume`, preloaded with N messages), printing `{"rate": msg/s}`:
//! bench/*.rb alternate it with the Ruby side, so the Ruby figures have the
//! broker's limit for any client beside them, measured in the same run.

use acemq::{Ack, ConsumeOptions, Connection, JsonMessage, Next, Outcome, Payload, PublishOptions, Topology};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, ConnectionProperties};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

const PREFETCH: u16 = 100;
/// Each Rust case against raw lapin (issue 12).
const TARGET: f64 = 0.95;
/// Raw lapin acknowledges every this many deliveries with `multiple`, as the
/// figure in FACTS.md was measured.
const ACK_EVERY: u64 = 50;
/// A run that has not finished by then is a hang, not a slow result.
const RUN_LIMIT: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn count(n: f64) -> u64 {
    ((n * env_or("BENCH_SCALE", 1.0f64)).round() as u64).max(16)
}

/// The same 1 KiB order as bench/run.rb: the filler is sized from the rest.
fn payloads() -> Vec<Value> {
    let make = |i: usize, note: &str| {
        json!({
            "order_id": format!("A-{i:08}"),
            "customer": {"id": 4217, "name": "Ada Lovelace", "email": "ada@example.com"},
            "items": [{"sku": "BK-001", "qty": 2, "price": 1250}, {"sku": "PN-042", "qty": 1, "price": 399}],
            "currency": "EUR",
            "note": note,
        })
    };
    let base = serde_json::to_vec(&make(0, "")).unwrap().len();
    let filler = "x".repeat(1024 - base);
    let out: Vec<Value> = (0..64).map(|i| make(i, &filler)).collect();
    assert_eq!(serde_json::to_vec(&out[0]).unwrap().len(), 1024);
    out
}

/// This process's CPU time so far (user and system, every thread), in
/// seconds: what the client spends of the two cores the broker shares.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 12th and 13th of them, in clock ticks (100 a second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    ticks(&f)
}

/// utime + stime, in seconds, of a stat line's fields after the command.
fn ticks(f: &[&str]) -> f64 {
    let at = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (at(11) + at(12)) / 100.0
}

/// CPU seconds and voluntary context switches of this process's threads so
/// far, summed by thread name: where a case's client CPU goes.
fn threads_cpu() -> std::collections::BTreeMap<String, (f64, u64)> {
    let mut by = std::collections::BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let name = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map_or("?", |(n, _)| n).to_owned();
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let cpu = ticks(&f);
        let switches = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let e = by.entry(name).or_insert((0.0, 0));
        e.0 += cpu;
        e.1 += switches;
    }
    by
}

fn per_thread(before: &std::collections::BTreeMap<String, (f64, u64)>, n: u64) -> String {
    threads_cpu()
        .into_iter()
        .map(|(name, (cpu, cs))| {
            let (c0, s0) = before.get(&name).copied().unwrap_or((0.0, 0));
            format!("{name}={:.1}us/{:.2}cs", (cpu - c0) / n as f64 * 1e6, (cs - s0) as f64 / n as f64)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// The same wire message acemq sends (its properties and its three
/// `x-acemq-*` headers), built by hand: the baseline does the same work on
/// the broker, so the ratio measures the client. The baseline's publishes
/// are `mandatory`, as acemq's are, for the same reason: the broker routes a
/// mandatory publish at a measured 2-8% more cost (`raw_batch_as`).
fn lapin_props() -> BasicProperties {
    let id = acemq::new_id();
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(ShortString::from("x-acemq-id"), lapin::types::AMQPValue::LongString(id.clone().into()));
    headers.insert(ShortString::from("x-acemq-attempt"), lapin::types::AMQPValue::LongLongInt(1));
    headers.insert(ShortString::from("x-acemq-origin"), lapin::types::AMQPValue::LongString("bench@host".into()));
    BasicProperties::default()
        .with_content_type(ShortString::from("application/json"))
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(id))
        .with_app_id(ShortString::from("bench@host"))
        .with_timestamp(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs())
        .with_headers(headers)
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Raw lapin's consume: parse each body, ack every ACK_EVERY (`multiple`),
/// until n.
async fn raw_loop(ch: &Channel, consumer: &mut lapin::Consumer, n: u64) -> Result<(), BoxError> {
    let mut seen = 0u64;
    while let Some(d) = consumer.next().await {
        let d = d?;
        let v: Value = serde_json::from_slice(&d.data)?;
        std::hint::black_box(&v["order_id"]);
        seen += 1;
        if seen % ACK_EVERY == 0 || seen == n {
            ch.basic_ack(d.delivery_tag, BasicAckOptions { multiple: true }).await?;
        }
        if seen == n {
            break;
        }
    }
    Ok(())
}

struct Bench {
    mq: Connection,
    raw: lapin::Connection,
    admin: Channel,
    publisher: Channel,
    payloads: Vec<Value>,
    prefix: String,
    queues: Vec<String>,
    runs: usize,
    /// Name, acemq's rate, the baseline's rate, what the baseline is.
    rows: Vec<(String, f64, f64, String)>,
}

impl Bench {
    async fn queue(&mut self, name: &str) -> Result<String, BoxError> {
        let q = format!("{}-{name}", self.prefix);
        self.mq.apply(&Topology::new().queue(q.as_str())).await?;
        self.queues.push(q.clone());
        self.queues.push(acemq::dlq_name(&q));
        // The default ladder's rungs, which consuming declares.
        for delay in acemq::RetryPolicy::default().rungs() {
            self.queues.push(acemq::rung_name(&q, delay));
        }
        Ok(q)
    }

    async fn purge(&self, q: &str) -> Result<(), BoxError> {
        self.admin.queue_purge(ShortString::from(q), QueuePurgeOptions::default()).await?;
        Ok(())
    }

    fn row(&mut self, name: &str, ours: f64, base: f64) {
        self.row_against(name, ours, base, "raw lapin");
    }

    /// A row whose baseline is raw lapin run some particular way (`against`).
    fn row_against(&mut self, name: &str, ours: f64, base: f64, against: &str) {
        println!("  {name:<40} acemq {ours:>8.0}/s  {against} {base:>8.0}/s  {:>5.2}x", ours / base);
        self.rows.push((name.to_owned(), ours, base, against.to_owned()));
    }

    async fn raw_publish(&self, q: &str, i: usize) -> Result<lapin::PublisherConfirm, BoxError> {
        self.raw_publish_as(q, i, true).await
    }

    /// `mandatory`: as acemq publishes (the broker returns what no queue
    /// takes), or not.
    async fn raw_publish_as(&self, q: &str, i: usize, mandatory: bool) -> Result<lapin::PublisherConfirm, BoxError> {
        let body = serde_json::to_vec(&self.payloads[i % 64])?;
        Ok(self
            .publisher
            .basic_publish(ShortString::from(""), ShortString::from(q), BasicPublishOptions { mandatory, immediate: false }, &body, lapin_props())
            .await?)
    }

    async fn publish_each(&mut self) -> Result<(), BoxError> {
        let q = self.queue("each").await?;
        let n = count(2_000.0);
        let mut ours = Vec::new();
        let mut base = Vec::new();
        for _ in 0..self.runs {
            self.purge(&q).await?;
            let t = Instant::now();
            for i in 0..n as usize {
                self.mq.publish(&self.payloads[i % 64], &q, PublishOptions::default()).await?;
            }
            ours.push(n as f64 / t.elapsed().as_secs_f64());

            self.purge(&q).await?;
            let t = Instant::now();
            for i in 0..n as usize {
                self.raw_publish(&q, i).await?.await?;
            }
            base.push(n as f64 / t.elapsed().as_secs_f64());
        }
        self.row("1 publish, each confirm awaited", median(ours), median(base));
        Ok(())
    }

    /// Build all, then send all, then await every confirm: the held form,
    /// where nothing is sent until the batch is whole. Returns how long the
    /// building took, when the broker had nothing yet.
    async fn acemq_batch(&self, q: &str, n: u64) -> Result<Duration, BoxError> {
        let t = Instant::now();
        let mut bodies = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            bodies.push((serde_json::to_vec(&self.payloads[i % 64])?, self.mq.envelope_for(&PublishOptions::default())));
        }
        let built = t.elapsed();
        let messages: Vec<JsonMessage<'_>> =
            bodies.iter().map(|(body, envelope)| JsonMessage { body, exchange: "", routing_key: q, envelope }).collect();
        for c in self.mq.send_json_batch(&messages).await {
            c?.wait().await?;
        }
        Ok(built)
    }

    /// A publish stream: each message pushed as it is built, sent (in the
    /// stream's chunks) while the next is built; every confirm awaited at
    /// the end.
    async fn acemq_stream(&self, q: &str, n: u64) -> Result<(), BoxError> {
        let mut stream = self.mq.stream();
        for i in 0..n as usize {
            stream
                .push(acemq::OutgoingMessage {
                    body: serde_json::to_vec(&self.payloads[i % 64])?,
                    exchange: String::new(),
                    routing_key: q.to_owned(),
                    envelope: self.mq.envelope_for(&PublishOptions::default()),
                })
                .await?;
        }
        stream.finish().await?;
        Ok(())
    }

    /// Raw lapin: send all, then await every confirm.
    async fn raw_batch(&self, q: &str, n: u64) -> Result<(), BoxError> {
        self.raw_batch_as(q, n, true).await
    }

    async fn raw_batch_as(&self, q: &str, n: u64, mandatory: bool) -> Result<(), BoxError> {
        let mut confirms = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            confirms.push(self.raw_publish_as(q, i, mandatory).await?);
        }
        for c in confirms {
            c.await?;
        }
        Ok(())
    }

    async fn publish_batch(&mut self) -> Result<(), BoxError> {
        let q = self.queue("batch").await?;
        let n = count(10_000.0);
        let (mut ours, mut streamed, mut base) = (Vec::new(), Vec::new(), Vec::new());
        // Client CPU a message (every thread of this process), per side.
        let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); 3];
        // The share of the held batch's time spent building it, before the
        // first message is sent.
        let mut held = Vec::new();
        // Raw lapin without `mandatory`, which acemq sets so that the broker
        // returns what no queue takes: what that costs the broker.
        let mut plain = Vec::new();
        let per_msg = |cpu: f64| (cpu_seconds() - cpu) / n as f64 * 1e6;
        for _ in 0..self.runs {
            self.purge(&q).await?;
            let (t, cpu) = (Instant::now(), cpu_seconds());
            let built = self.acemq_batch(&q, n).await?;
            let took = t.elapsed();
            ours.push(n as f64 / took.as_secs_f64());
            cpus[0].push(per_msg(cpu));
            held.push(built.as_secs_f64() / took.as_secs_f64());

            self.purge(&q).await?;
            let (t, cpu) = (Instant::now(), cpu_seconds());
            self.acemq_stream(&q, n).await?;
            streamed.push(n as f64 / t.elapsed().as_secs_f64());
            cpus[1].push(per_msg(cpu));

            self.purge(&q).await?;
            let (t, cpu) = (Instant::now(), cpu_seconds());
            self.raw_batch(&q, n).await?;
            base.push(n as f64 / t.elapsed().as_secs_f64());
            cpus[2].push(per_msg(cpu));

            self.purge(&q).await?;
            let t = Instant::now();
            self.raw_batch_as(&q, n, false).await?;
            plain.push(n as f64 / t.elapsed().as_secs_f64());
        }
        let base = median(base);
        self.row("2 publish batch, confirms together", median(ours), base);
        self.row("2 the same, a publish stream (Connection::stream)", median(streamed), base);
        println!(
            "  {:<40} batch {:>5.1}, stream {:>5.1}, lapin {:>5.1} us/msg (client CPU, user + system)",
            "",
            median(cpus[0].clone()),
            median(cpus[1].clone()),
            median(cpus[2].clone())
        );
        println!("  {:<40} the held batch spent {:.1}% of its time building, before sending", "", median(held) * 100.0);
        let plain = median(plain);
        println!(
            "  {:<40} raw lapin without mandatory: {plain:.0}/s (mandatory costs the broker {:.0}%)",
            "",
            (1.0 - base / plain) * 100.0
        );
        Ok(())
    }

    async fn preload(&self, q: &str, n: u64) -> Result<(), BoxError> {
        self.purge(q).await?;
        self.acemq_batch(q, n).await?;
        Ok(())
    }

    async fn acemq_consume(&self, q: &str, n: u64) -> Result<f64, BoxError> {
        self.acemq_consume_retrying(q, n, None).await
    }

    /// Time until n messages are accepted and the consumer cancelled (which
    /// sends the last acks). With a ladder (`retry`), the handler asks for a
    /// retry on a first attempt and accepts the second: the retry case.
    async fn acemq_consume_retrying(&self, q: &str, n: u64, retry: Option<&acemq::RetryPolicy>) -> Result<f64, BoxError> {
        let seen = Arc::new(AtomicU64::new(0));
        let done = Arc::new(Notify::new());
        let (s, d) = (seen.clone(), done.clone());
        let retrying = retry.is_some();
        let options = ConsumeOptions { prefetch: PREFETCH, retry: retry.cloned().unwrap_or_default(), ..ConsumeOptions::default() };
        let t = Instant::now();
        let handle = self
            .mq
            .consume(q, options, move |m: acemq::Message| {
                let (s, d) = (s.clone(), d.clone());
                async move {
                    if retrying && m.envelope.attempt == 1 {
                        return Outcome::Ack(Ack::retry("once"));
                    }
                    std::hint::black_box(&m.payload["order_id"]);
                    if s.fetch_add(1, Ordering::Relaxed) + 1 == n {
                        d.notify_one();
                    }
                    Outcome::Ack(Ack::accept())
                }
            })
            .await?;
        let opened = t.elapsed();
        tokio::time::timeout(RUN_LIMIT, done.notified()).await.map_err(|_| "acemq consume timed out")?;
        let handled = t.elapsed();
        handle.cancel().await;
        if std::env::var("BENCH_PHASES").is_ok() {
            println!("  phases: open {:?}, handled {:?}, cancelled {:?}", opened, handled, t.elapsed());
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }

    /// The pull consumer on this task, the loop raw lapin's side runs:
    /// `Consumer::next`, read the payload, `Consumer::accept`.
    async fn acemq_pull_consume(&self, q: &str, n: u64) -> Result<f64, BoxError> {
        let t = Instant::now();
        let consumer = self.mq.consumer(q, ConsumeOptions { prefetch: PREFETCH, ..ConsumeOptions::default() }).await?;
        let work = async {
            for _ in 0..n {
                let d = consumer.next().await.ok_or("the consumer closed")?;
                std::hint::black_box(&d.message.payload["order_id"]);
                consumer.accept(d);
            }
            Ok::<(), BoxError>(())
        };
        tokio::time::timeout(RUN_LIMIT, work).await.map_err(|_| "acemq pull consume timed out")??;
        consumer.close().await;
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }

    /// What the Ruby consumer does, without Ruby: a thread outside the
    /// runtime takes each delivery as the extension does (buffered first,
    /// then waiting with `next_blocking_as`), the body checked but not
    /// built, then parses the body itself and accepts. The engine's share of
    /// the Ruby row: the rest of that row's gap is Ruby's.
    async fn acemq_blocking_consume(&self, q: &str, n: u64) -> Result<f64, BoxError> {
        let t = Instant::now();
        let consumer = Arc::new(self.mq.consumer(q, ConsumeOptions { prefetch: PREFETCH, ..ConsumeOptions::default() }).await?);
        let c = consumer.clone();
        let reader = std::thread::spawn(move || -> Result<(), String> {
            let mut seen = 0;
            while seen < n {
                let next = match c.try_next_as(Payload::Checked) {
                    Next::Empty => c.next_blocking_as(Duration::from_millis(250), Payload::Checked),
                    ready => ready,
                };
                match next {
                    Next::Delivery(d) => {
                        let v: Value = serde_json::from_slice(d.shared_body().as_ref()).map_err(|e| e.to_string())?;
                        std::hint::black_box(&v["order_id"]);
                        c.accept(*d);
                        seen += 1;
                    }
                    Next::Empty => {}
                    Next::Closed => return Err("the consumer closed".into()),
                }
            }
            Ok(())
        });
        let joined = tokio::task::spawn_blocking(move || reader.join().map_err(|_| "the reader panicked".to_string()));
        tokio::time::timeout(RUN_LIMIT, joined).await.map_err(|_| "acemq blocking consume timed out")????;
        consumer.close().await;
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }

    async fn raw_consume(&self, q: &str, n: u64) -> Result<f64, BoxError> {
        self.raw_consume_on(q, n, false).await
    }

    /// Raw lapin's consume loop, on this task or (`spawned`) on a task of
    /// the runtime, where `Connection::consume` runs its handlers: a wake-up
    /// from lapin's I/O thread then goes through tokio's scheduler (a worker
    /// unparked, and it unparks another to keep searching) instead of
    /// unparking this thread.
    async fn raw_consume_on(&self, q: &str, n: u64, spawned: bool) -> Result<f64, BoxError> {
        let t = Instant::now();
        let ch = self.raw.create_channel().await?;
        ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
        let mut consumer =
            ch.basic_consume(ShortString::from(q), ShortString::from(""), BasicConsumeOptions::default(), FieldTable::default()).await?;
        if std::env::var("BENCH_PHASES").is_ok() {
            println!("  phases: lapin open {:?}", t.elapsed());
        }
        let tag = consumer.tag();
        if spawned {
            let c = ch.clone();
            let task = tokio::spawn(async move { raw_loop(&c, &mut consumer, n).await.map_err(|e| e.to_string()) });
            tokio::time::timeout(RUN_LIMIT, task).await.map_err(|_| "lapin consume timed out")???;
        } else {
            tokio::time::timeout(RUN_LIMIT, raw_loop(&ch, &mut consumer, n)).await.map_err(|_| "lapin consume timed out")??;
        }
        ch.basic_cancel(tag, BasicCancelOptions::default()).await?;
        ch.close(200, ShortString::from("OK")).await?;
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }

    /// What retrying once costs any client: consume `q`; a first attempt is
    /// copied to the rung with acemq's failure headers and its attempt
    /// raised (persistent, mandatory; sent and its confirm awaited in a task
    /// of its own, as acemq's background settle does, so up to the prefetch
    /// are in flight) and acknowledged once the copy is
    /// confirmed; a second attempt, back from the rung's TTL, is parsed and
    /// acknowledged (also from a task). Each ack is single: the two kinds interleave, so
    /// `multiple` would acknowledge unconfirmed copies. Clock stops at n
    /// accepted.
    async fn raw_retry_once(&self, q: &str, rung: &str, n: u64) -> Result<f64, BoxError> {
        let t = Instant::now();
        let ch = self.raw.create_channel().await?;
        ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
        let copies = self.raw.create_channel().await?;
        copies.confirm_select(ConfirmSelectOptions::default()).await?;
        let mut consumer =
            ch.basic_consume(ShortString::from(q), ShortString::from(""), BasicConsumeOptions::default(), FieldTable::default()).await?;
        let mut accepted = 0u64;
        let work = async {
            while let Some(d) = consumer.next().await {
                let d = d?;
                let retried = d.properties.headers().as_ref().is_some_and(|h| h.inner().contains_key("x-bench-retried"));
                if retried {
                    let v: Value = serde_json::from_slice(&d.data)?;
                    std::hint::black_box(&v["order_id"]);
                    // Sent from a task too: awaiting each ack here (lapin's
                    // I/O thread writing it and waking this loop) held the
                    // loop to 0.6-0.9x of this.
                    let ch = ch.clone();
                    tokio::spawn(async move {
                        let _ = ch.basic_ack(d.delivery_tag, BasicAckOptions::default()).await;
                    });
                    accepted += 1;
                    if accepted == n {
                        break;
                    }
                    continue;
                }
                // The headers acemq's retry writes on the copy (consumer.rs,
                // failure_headers), so the broker stores the same message.
                let mut headers = d.properties.headers().clone().unwrap_or_default();
                let text = |s: &str| lapin::types::AMQPValue::LongString(s.into());
                headers.insert(ShortString::from("x-acemq-reason"), text("once"));
                headers.insert(ShortString::from("x-acemq-failed-at"), lapin::types::AMQPValue::LongLongInt(now_secs()));
                headers.insert(ShortString::from("x-acemq-queue"), text(q));
                headers.insert(ShortString::from("x-acemq-original-exchange"), text(""));
                headers.insert(ShortString::from("x-acemq-original-routing-key"), text(q));
                headers.insert(ShortString::from("x-acemq-attempt"), lapin::types::AMQPValue::LongLongInt(2));
                headers.insert(ShortString::from("x-bench-retried"), lapin::types::AMQPValue::Boolean(true));
                let props = d.properties.clone().with_headers(headers);
                // The copy, its confirm and the ack in a task of their own,
                // so the loop goes on to the next delivery at once (what
                // acemq's background settle does).
                let (ch, copies, rung) = (ch.clone(), copies.clone(), ShortString::from(rung));
                tokio::spawn(async move {
                    let options = BasicPublishOptions { mandatory: true, immediate: false };
                    let Ok(confirm) = copies.basic_publish(ShortString::from(""), rung, options, &d.data, props).await else { return };
                    if matches!(confirm.await, Ok(lapin::Confirmation::Ack(None))) {
                        let _ = ch.basic_ack(d.delivery_tag, BasicAckOptions::default()).await;
                    }
                });
            }
            Ok::<(), BoxError>(())
        };
        tokio::time::timeout(RUN_LIMIT, work).await.map_err(|_| "lapin retry_once timed out")??;
        ch.basic_cancel(consumer.tag(), BasicCancelOptions::default()).await?;
        ch.close(200, ShortString::from("OK")).await?;
        copies.close(200, ShortString::from("OK")).await?;
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }

    /// Retry every message once, then accept it: acemq's push consumer
    /// against raw lapin doing the same (`raw_retry_once`: the copy with
    /// acemq's headers to the same 50 ms rung, confirmed, then the ack; the
    /// copy accepted when it comes back; pipelined up to the prefetch),
    /// alternated run by run. The rung is short so the figure is the settle
    /// path's throughput, not the delay: at 5,000 messages the last copy's
    /// 50 ms is a few percent of a run.
    async fn retry_once(&mut self) -> Result<(), BoxError> {
        let q = self.queue("retry").await?;
        let policy = acemq::RetryPolicy::new(5, Duration::from_millis(50), Duration::from_secs(1));
        for delay in policy.rungs() {
            self.queues.push(acemq::rung_name(&q, delay));
        }
        let rung = acemq::rung_name(&q, policy.delay_after(1));
        let n = count(5_000.0);
        let only = std::env::var("BENCH_SIDE").unwrap_or_default();
        let (mut ours, mut base, mut ours_cpu, mut base_cpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..self.runs {
            // acemq's side declares the ladder, so it runs first the first time.
            for side in if i % 2 == 0 { ["acemq", "lapin"] } else { ["lapin", "acemq"] } {
                if !only.is_empty() && only != side && i > 0 {
                    continue;
                }
                // Every copy has come back by the end of a run: the rung is empty.
                self.preload(&q, n).await?;
                let cpu = cpu_seconds();
                let before = threads_cpu();
                if side == "acemq" {
                    ours.push(self.acemq_consume_retrying(&q, n, Some(&policy)).await?);
                    ours_cpu.push((cpu_seconds() - cpu) / n as f64 * 1e6);
                } else {
                    base.push(self.raw_retry_once(&q, &rung, n).await?);
                    base_cpu.push((cpu_seconds() - cpu) / n as f64 * 1e6);
                }
                if !only.is_empty() {
                    println!("  {side}: {}", per_thread(&before, n));
                }
            }
        }
        if !only.is_empty() {
            let (rates, cpus) = if only == "acemq" { (ours, ours_cpu) } else { (base, base_cpu) };
            println!("  retry once, {only} alone: {:.0}/s, {:.1} us/msg client CPU", median(rates), median(cpus));
            return Ok(());
        }
        self.row("4 retry once then accept (rung 50 ms)", median(ours.clone()), median(base.clone()));
        println!(
            "  {:<40} acemq {:>5.1}, lapin {:>5.1} us/msg (client CPU, user + system); runs: {}",
            "",
            median(ours_cpu),
            median(base_cpu),
            ours.iter().zip(&base).map(|(a, b)| format!("{:.2}x", a / b)).collect::<Vec<_>>().join(" ")
        );
        Ok(())
    }

    /// One timed consume of n preloaded messages, acemq's or raw lapin's:
    /// its rate and the client's CPU per message (and, with `threads`, each
    /// thread's, printed).
    async fn consume_once(&self, q: &str, n: u64, side: &str, threads: bool) -> Result<(f64, f64), BoxError> {
        self.preload(q, n).await?;
        let cpu = cpu_seconds();
        let before = threads_cpu();
        let rate = match side {
            "acemq" => self.acemq_consume(q, n).await?,
            "pull" => self.acemq_pull_consume(q, n).await?,
            "blocking" => self.acemq_blocking_consume(q, n).await?,
            "lapin_task" => self.raw_consume_on(q, n, true).await?,
            _ => self.raw_consume(q, n).await?,
        };
        let per = (cpu_seconds() - cpu) / n as f64 * 1e6;
        if threads {
            println!("  {side}: {}", per_thread(&before, n));
        }
        Ok((rate, per))
    }

    /// Case 3 three ways, alternated run by run: acemq's push consumer
    /// (`Connection::consume`, its handler on a task of the runtime), its
    /// pull consumer on this task (`Consumer::next`, the same loop as raw
    /// lapin's), and raw lapin.
    async fn consume(&mut self) -> Result<(), BoxError> {
        let q = self.queue("consume").await?;
        let n = count(10_000.0);
        // BENCH_SIDES=blocking,lapin alternates the Ruby consumer's engine
        // path with raw lapin instead (not part of the table).
        if let Ok(sides) = std::env::var("BENCH_SIDES") {
            let sides: Vec<&str> = sides.split(',').map(str::trim).collect();
            let mut rates: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
            let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
            for _ in 0..self.runs {
                for (i, side) in sides.iter().enumerate() {
                    let (rate, cpu) = self.consume_once(&q, n, side, false).await?;
                    rates[i].push(rate);
                    cpus[i].push(cpu);
                }
            }
            for (i, side) in sides.iter().enumerate() {
                println!("  consume, {side}: {:.0}/s, {:.1} us/msg client CPU (medians)", median(rates[i].clone()), median(cpus[i].clone()));
            }
            return Ok(());
        }
        // Each acemq side against raw lapin run the same way: `consume` runs
        // its handlers on a spawned task, so its baseline is raw lapin's loop
        // on a spawned task; the pull loop runs on this task, as raw lapin's
        // plain loop does.
        let sides = ["acemq", "pull", "lapin", "lapin_task"];
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
        let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
        // BENCH_SIDE=acemq, pull, blocking, lapin or lapin_task runs one side only (for a profiler).
        let only = std::env::var("BENCH_SIDE").unwrap_or_default();
        for _ in 0..self.runs {
            for (i, side) in sides.iter().enumerate() {
                if only.is_empty() || only == *side {
                    let (rate, cpu) = self.consume_once(&q, n, side, !only.is_empty()).await?;
                    rates[i].push(rate);
                    cpus[i].push(cpu);
                }
            }
        }
        if !only.is_empty() {
            let i = sides.iter().position(|s| *s == only).ok_or("BENCH_SIDE is acemq, pull, blocking, lapin or lapin_task")?;
            println!("  consume, {only} alone: {:.0}/s, {:.1} us/msg client CPU", median(rates[i].clone()), median(cpus[i].clone()));
            return Ok(());
        }
        let [push, pull, lapin, lapin_task] = [0, 1, 2, 3].map(|i| median(rates[i].clone()));
        let name = format!("3 consume + parse + ack (prefetch {PREFETCH})");
        self.row_against(&name, push, lapin_task, "raw lapin, a spawned task");
        self.row("3 the same, pull: Consumer::next on this task", pull, lapin);
        println!(
            "  {:<40} push {:>5.1}, pull {:>5.1}, lapin {:>5.1}, lapin in a task {:>5.1} us/msg (client CPU, user + system)",
            "",
            median(cpus[0].clone()),
            median(cpus[1].clone()),
            median(cpus[2].clone()),
            median(cpus[3].clone())
        );
        println!(
            "  {:<40} raw lapin's loop on a spawned task: {:.2}x of it on this task (tokio's wake-ups); acemq `consume` {:.2}x of raw lapin on this task",
            "",
            lapin_task / lapin,
            push / lapin
        );
        Ok(())
    }

    async fn cleanup(&self) {
        for q in &self.queues {
            let _ = self.admin.queue_delete(ShortString::from(q.as_str()), QueueDeleteOptions::default()).await;
        }
        self.mq.close().await;
        let _ = self.raw.close(200, ShortString::from("OK")).await;
    }

    fn table(&self) {
        println!();
        println!("| case | acemq msg/s | baseline | msg/s | ratio | target | result |");
        println!("|---|---:|---|---:|---:|---:|---|");
        for (name, ours, base, against) in &self.rows {
            let ratio = ours / base;
            let result = if ratio >= TARGET { "pass" } else { "MISS" };
            println!("| {name} | {ours:.0} | {against} | {base:.0} | {ratio:.2}x | >= {TARGET:.2}x | {result} |");
        }
        // The same rows for bench/table.rb (the targets table `rake bench` ends with).
        if let Ok(file) = std::env::var("ACEMQ_BENCH_ROWS") {
            use std::io::Write;
            let _ = std::fs::create_dir_all(std::path::Path::new(&file).parent().unwrap_or(std::path::Path::new(".")));
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&file) {
                for (name, ours, base, against) in &self.rows {
                    let ratio = ours / base;
                    let row = serde_json::json!({
                        "path": format!("Rust API, {name}, vs {against}"),
                        "result": format!("{:.1}k/s = {ratio:.2}x ({against} {:.1}k/s)", ours / 1000.0, base / 1000.0),
                        "target": format!(">= {TARGET:.2}x"),
                        "pass": ratio >= TARGET,
                    });
                    let _ = writeln!(f, "{row}");
                }
            }
        }
    }
}

/// What an emission point costs while nobody subscribes (the hot path's
/// case): the check is one atomic load and the event is never built.
fn emission_cost() {
    use acemq::events::{emit, enabled};
    const N: u32 = 20_000_000;
    assert!(!enabled(), "the bench subscribes to nothing");
    let t = Instant::now();
    for i in 0..N {
        emit(|| {
            std::hint::black_box(i);
            unreachable!("nobody listens")
        });
        std::hint::black_box(enabled());
    }
    let per = t.elapsed().as_secs_f64() / f64::from(N) * 1e9;
    println!("events::emit with nobody subscribed: {per:.2} ns per emission point ({N} in a loop)");
}

/// `bench raw CASE QUEUE N`: one run of raw lapin, its rate on stdout.
async fn raw(url: &str, args: &[String]) -> Result<(), BoxError> {
    let [case, q, n] = args else {
        return Err("usage: bench raw publish_each|publish_batch|consume|acemq_consume|retry_once QUEUE N".into());
    };
    let n: u64 = n.parse()?;
    let raw = lapin::Connection::connect(url, ConnectionProperties::default()).await?;
    let publisher = raw.create_channel().await?;
    publisher.confirm_select(ConfirmSelectOptions::default()).await?;
    let bench = Bench {
        mq: Connection::open(url).await?,
        admin: raw.create_channel().await?,
        raw,
        publisher,
        payloads: payloads(),
        prefix: String::new(),
        queues: Vec::new(),
        runs: 1,
        rows: Vec::new(),
    };
    let rate = match case.as_str() {
        "publish_each" => {
            let t = Instant::now();
            for i in 0..n as usize {
                bench.raw_publish(q, i).await?.await?;
            }
            n as f64 / t.elapsed().as_secs_f64()
        }
        "publish_batch" => {
            let t = Instant::now();
            bench.raw_batch(q, n).await?;
            n as f64 / t.elapsed().as_secs_f64()
        }
        "consume" => bench.raw_consume(q, n).await?,
        // acemq's side of case 3 alone, for a profiler.
        "acemq_consume" => bench.acemq_consume(q, n).await?,
        // The queue's first rung is `{q}.retry.50ms` (declared by the caller).
        "retry_once" => bench.raw_retry_once(q, &acemq::rung_name(q, Duration::from_millis(50)), n).await?,
        other => return Err(format!("bench raw: no case {other}").into()),
    };
    println!("{{\"rate\": {rate:.1}}}");
    bench.cleanup().await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("raw") {
        return raw(&url, &args[1..]).await;
    }
    let runs = env_or("BENCH_RUNS", 5usize).max(1);
    let started = Instant::now();
    let mq = Connection::open(&url).await?;
    let raw = lapin::Connection::connect(&url, ConnectionProperties::default()).await?;
    let admin = raw.create_channel().await?;
    let publisher = raw.create_channel().await?;
    publisher.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut bench = Bench {
        mq,
        raw,
        admin,
        publisher,
        payloads: payloads(),
        prefix: format!("acemq-bench-rs-{}-{}", std::process::id(), &acemq::new_id()[30..]),
        queues: Vec::new(),
        runs,
        rows: Vec::new(),
    };
    let endpoint = url.rsplit('@').next().unwrap_or("");
    println!("AceMQ Rust bench: {endpoint}, 1 KiB JSON, persistent, median of {runs} runs, lapin 4.12 (tokio, 2 workers)");
    // BENCH_CASES (default all): a comma-separated subset, for profiling one.
    let cases = std::env::var("BENCH_CASES").unwrap_or_else(|_| "publish_each,publish_batch,consume,retry_once".into());
    let wanted = |case: &str| cases.split(',').any(|c| c.trim() == case);
    let result = async {
        if wanted("publish_each") {
            bench.publish_each().await?;
        }
        if wanted("publish_batch") {
            bench.publish_batch().await?;
        }
        if wanted("consume") {
            bench.consume().await?;
        }
        if wanted("retry_once") {
            bench.retry_once().await?;
        }
        Ok::<(), BoxError>(())
    }
    .await;
    bench.cleanup().await;
    result?;
    bench.table();
    emission_cost();
    println!("({:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
