//! `memory://`: an in-process broker with RabbitMQ's semantics, as far as
//! AceMQ relies on them.
//!
//! Direct, topic and fanout exchanges and the default exchange; bindings;
//! durable queues with arguments compared on redeclaration (406 on a
//! difference, like RabbitMQ); queue-level TTL with a dead-letter exchange and
//! routing key, so the retry ladder runs unchanged; prefetch; redelivery of
//! unacked messages when a consumer goes away; mandatory publishes that fail
//! when nothing is bound. Its clock can be advanced, so a spec walks a message
//! up a ladder of 5-minute rungs in microseconds.
//!
//! It is a product feature for specs and demos without a broker, not a mock:
//! the same scenarios also run against RabbitMQ.

use super::queue::DeliveryQueue;
use crate::error::{Error, ErrorKind, Result};
use crate::headers::Headers;
use crate::topology::{BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec};
use crate::wire::{Props, RawDelivery};
use once_cell::sync::Lazy;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

static BROKERS: Lazy<Mutex<HashMap<String, Arc<MemoryBroker>>>> = Lazy::new(|| Mutex::new(HashMap::new()));

#[derive(Clone)]
struct Stored {
    exchange: String,
    routing_key: String,
    body: Vec<u8>,
    props: Props,
    redelivered: bool,
    enqueued_at: u64,
}

struct MemExchange {
    kind: ExchangeKind,
    bindings: Vec<(String, String)>,
}

struct MemQueue {
    arguments: Headers,
    ttl_ms: Option<u64>,
    dlx: Option<String>,
    dlrk: Option<String>,
    ready: VecDeque<Stored>,
    consumers: Vec<u64>,
    rr: usize,
    /// The consumer that has the queue to itself (basic.consume's
    /// `exclusive`), while it does.
    exclusive: Option<u64>,
}

struct MemConsumer {
    queue: String,
    prefetch: usize,
    unacked: HashMap<u64, Stored>,
    next_tag: u64,
    out: Arc<DeliveryQueue>,
    /// Paused ([`MemoryBroker::pause`]): nothing is dispatched to it.
    paused: bool,
}

#[derive(Default)]
struct State {
    exchanges: HashMap<String, MemExchange>,
    queues: HashMap<String, MemQueue>,
    consumers: HashMap<u64, MemConsumer>,
    next_consumer: u64,
    /// Delayed publishes (`crate::delay`), due on this broker's clock.
    delayed: Vec<(u64, Stored)>,
    /// Direct reply-to addresses (`crate::request`) and who takes their replies.
    reply_sinks: HashMap<String, ReplySink>,
}

/// Takes the replies sent to one direct reply-to address.
pub(crate) type ReplySink = Arc<dyn Fn(RawDelivery) + Send + Sync>;

/// One in-process broker, shared by every connection that opens the same
/// `memory://name` in this process.
pub struct MemoryBroker {
    name: String,
    state: Mutex<State>,
    started: Instant,
    offset_ms: AtomicU64,
    timer: Notify,
}

/// How many messages sit in a queue, ready and unacknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueDepth {
    /// Waiting for a consumer.
    pub ready: usize,
    /// Delivered and not yet settled.
    pub unacked: usize,
}

impl MemoryBroker {
    /// The broker called `name` in this process, created on first use.
    pub fn named(name: &str) -> Arc<MemoryBroker> {
        let mut brokers = BROKERS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = brokers.get(name) {
            return b.clone();
        }
        let broker = Arc::new(MemoryBroker {
            name: name.to_owned(),
            state: Mutex::new(State::default()),
            started: Instant::now(),
            offset_ms: AtomicU64::new(0),
            timer: Notify::new(),
        });
        spawn_timer(Arc::downgrade(&broker));
        brokers.insert(name.to_owned(), broker.clone());
        broker
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Milliseconds on this broker's clock: real time plus every `advance`.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + self.offset_ms.load(Ordering::SeqCst)
    }

    /// Move this broker's clock forward: TTLs that fall due expire now, so a
    /// message waiting in a rung queue comes back without waiting.
    pub fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        let mut st = self.lock();
        self.expire_all(&mut st);
        drop(st);
        self.timer.notify_one();
    }

    /// Ready and unacked counts of `queue`, or None when it does not exist.
    pub fn depth(&self, queue: &str) -> Option<QueueDepth> {
        let st = self.lock();
        let q = st.queues.get(queue)?;
        let unacked = st.consumers.values().filter(|c| c.queue == queue).map(|c| c.unacked.len()).sum();
        Some(QueueDepth { ready: q.ready.len(), unacked })
    }

    /// Ready messages and consumers of `queue`, as a passive declare on
    /// RabbitMQ answers; None when it does not exist.
    pub fn counts(&self, queue: &str) -> Option<super::QueueCounts> {
        let st = self.lock();
        let q = st.queues.get(queue)?;
        Some(super::QueueCounts { ready: q.ready.len() as u64, consumers: q.consumers.len() as u64 })
    }

    /// Forget every exchange, queue and message (consumers are closed).
    pub fn reset(&self) {
        let mut st = self.lock();
        for c in st.consumers.values() {
            c.out.close();
        }
        *st = State::default();
    }

    fn not_found(&self, what: &str, name: &str) -> Error {
        Error::new(
            ErrorKind::Broker { reply_code: 404 },
            format!("NOT_FOUND - no {what} '{name}' in memory://{}: declare it with a Topology first", self.name),
        )
    }

    pub(crate) fn declare_exchange(&self, spec: &ExchangeSpec) -> Result<()> {
        if spec.kind == ExchangeKind::Headers {
            return Err(Error::invalid("memory:// does not implement headers exchanges: use direct, topic or fanout"));
        }
        let mut st = self.lock();
        match st.exchanges.get(&spec.name) {
            Some(e) if e.kind != spec.kind => Err(Error::new(
                ErrorKind::Broker { reply_code: 406 },
                format!(
                    "PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{}': received '{}' but current is '{}'; declare it as it is, or delete it by hand (acemq never deletes an exchange)",
                    spec.name,
                    spec.kind.as_str(),
                    e.kind.as_str()
                ),
            )),
            Some(_) => Ok(()),
            None => {
                st.exchanges.insert(spec.name.clone(), MemExchange { kind: spec.kind, bindings: Vec::new() });
                Ok(())
            }
        }
    }

    pub(crate) fn declare_queue(&self, spec: &QueueSpec) -> Result<()> {
        // The arguments RabbitMQ would be sent, so a redeclaration as another
        // type is refused here as it is there.
        let arguments = spec.declared_arguments();
        let mut st = self.lock();
        if let Some(q) = st.queues.get(&spec.name) {
            return match differing_argument(&q.arguments, &arguments) {
                None => Ok(()),
                Some((arg, received, current)) => Err(Error::new(
                    ErrorKind::Broker { reply_code: 406 },
                    format!(
                        "PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{}': received {received} but current is {current}; declare it with the same arguments, or delete the queue by hand once it is drained (acemq never deletes a queue)",
                        spec.name
                    ),
                )),
            };
        }
        let ttl_ms = arguments.get("x-message-ttl").and_then(|v| v.as_u64());
        let dlx = arguments.get("x-dead-letter-exchange").and_then(|v| v.as_str()).map(str::to_owned);
        let dlrk = arguments.get("x-dead-letter-routing-key").and_then(|v| v.as_str()).map(str::to_owned);
        st.queues.insert(
            spec.name.clone(),
            MemQueue { arguments: arguments.clone(), ttl_ms, dlx, dlrk, ready: VecDeque::new(), consumers: Vec::new(), rr: 0, exclusive: None },
        );
        drop(st);
        if ttl_ms.is_some() {
            self.timer.notify_one();
        }
        Ok(())
    }

    /// Delete a queue (for tests that simulate an operator deleting a DLQ).
    pub fn delete_queue(&self, name: &str) -> bool {
        let mut st = self.lock();
        let removed = st.queues.remove(name).is_some();
        for e in st.exchanges.values_mut() {
            e.bindings.retain(|(q, _)| q != name);
        }
        removed
    }

    pub(crate) fn bind(&self, spec: &BindingSpec) -> Result<()> {
        let mut st = self.lock();
        if !st.queues.contains_key(&spec.queue) {
            return Err(self.not_found("queue", &spec.queue));
        }
        let Some(ex) = st.exchanges.get_mut(&spec.exchange) else {
            return Err(self.not_found("exchange", &spec.exchange));
        };
        let b = (spec.queue.clone(), spec.routing_key.clone());
        if !ex.bindings.contains(&b) {
            ex.bindings.push(b);
        }
        Ok(())
    }

    /// Milliseconds since the epoch on this broker's clock: the wall clock
    /// plus every `advance`. A delayed message is due against this.
    pub fn wall_ms(&self) -> u64 {
        crate::cascade::epoch_ms(std::time::SystemTime::now()) + self.offset_ms.load(Ordering::SeqCst)
    }

    /// How many delayed messages wait, by the level of the cascade they would
    /// be in on RabbitMQ (the highest set bit of the whole seconds left),
    /// level 0 first.
    pub fn delayed_by_level(&self) -> Vec<u64> {
        let st = self.lock();
        let now = self.now_ms();
        let mut out = vec![0u64; crate::cascade::LEVELS as usize];
        for (due, _) in &st.delayed {
            let secs = crate::cascade::remaining_secs(*due, now).max(1);
            let k = crate::cascade::level_of(secs).unwrap_or(0).min(crate::cascade::LEVELS - 1);
            out[k as usize] += 1;
        }
        out
    }

    /// Give the replies to `address` (an `amq.rabbitmq.reply-to.*` name) to
    /// `sink`, as RabbitMQ gives them to the channel that consumed it.
    pub(crate) fn reply_sink(&self, address: &str, sink: ReplySink) {
        self.lock().reply_sinks.insert(address.to_owned(), sink);
    }

    pub(crate) fn publish(&self, exchange: &str, routing_key: &str, body: &[u8], props: &Props) -> Result<()> {
        let mut st = self.lock();
        let now = self.now_ms();
        // A reply: straight to the requester, never queued; dropped when it
        // is gone, as RabbitMQ drops it.
        if exchange.is_empty() && routing_key.starts_with(crate::wire::REPLY_TO) {
            let sink = st.reply_sinks.get(routing_key).cloned();
            drop(st);
            if let Some(sink) = sink {
                sink(RawDelivery {
                    tag: 0,
                    exchange: String::new(),
                    routing_key: routing_key.to_owned(),
                    redelivered: false,
                    body: body.to_vec(),
                    props: props.clone(),
                });
            }
            return Ok(());
        }
        let targets = self.route(&st, exchange, routing_key)?;
        // Delayed: held until due on this clock (an `advance` brings it
        // forward), then routed as published. The route is checked now, as
        // the cascade's binding is on RabbitMQ.
        let wait = props
            .header(crate::cascade::DUE_HEADER)
            .and_then(|v| crate::cascade::due_value(&v))
            .map_or(0, |due| due.saturating_sub(self.wall_ms()));
        let stored = Stored {
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            body: body.to_vec(),
            props: props.clone(),
            redelivered: false,
            enqueued_at: now,
        };
        if wait > 0 && !targets.is_empty() {
            if wait > crate::cascade::MAX_DELAY.as_millis() as u64 + 1000 {
                return Err(Error::invalid(format!(
                    "a delay can be at most {} s: publish it later",
                    crate::cascade::MAX_DELAY.as_secs()
                )));
            }
            st.delayed.push((now + wait, stored));
            drop(st);
            self.timer.notify_one();
            return Ok(());
        }
        if targets.is_empty() {
            return Err(Error::new(
                ErrorKind::Unroutable,
                format!(
                    "NO_ROUTE - nothing is bound to exchange '{exchange}' with routing key '{routing_key}' in memory://{}: the message was not stored; declare and bind the queue first",
                    self.name
                ),
            ));
        }
        let mut ttl = false;
        for q in &targets {
            if let Some(queue) = st.queues.get_mut(q) {
                ttl |= queue.ttl_ms.is_some();
                queue.ready.push_back(stored.clone());
            }
        }
        for q in &targets {
            self.dispatch(&mut st, q);
        }
        drop(st);
        if ttl {
            self.timer.notify_one();
        }
        Ok(())
    }

    fn route(&self, st: &State, exchange: &str, routing_key: &str) -> Result<Vec<String>> {
        if exchange.is_empty() {
            return Ok(if st.queues.contains_key(routing_key) { vec![routing_key.to_owned()] } else { vec![] });
        }
        let ex = st.exchanges.get(exchange).ok_or_else(|| self.not_found("exchange", exchange))?;
        let mut out: Vec<String> = Vec::new();
        for (q, key) in &ex.bindings {
            let hit = match ex.kind {
                ExchangeKind::Fanout => true,
                ExchangeKind::Direct => key == routing_key,
                ExchangeKind::Topic => topic_matches(key, routing_key),
                ExchangeKind::Headers => false,
            };
            if hit && !out.contains(q) && st.queues.contains_key(q) {
                out.push(q.clone());
            }
        }
        Ok(out)
    }

    /// Deliver what `queue` has ready to its consumers, round robin, within
    /// each consumer's prefetch.
    fn dispatch(&self, st: &mut State, queue: &str) {
        let Some(q) = st.queues.get_mut(queue) else { return };
        if q.consumers.is_empty() || q.ready.is_empty() {
            return;
        }
        let consumer_ids = q.consumers.clone();
        let mut rr = q.rr;
        loop {
            let q = st.queues.get_mut(queue).expect("queue checked above");
            if q.ready.is_empty() {
                break;
            }
            let mut chosen = None;
            for i in 0..consumer_ids.len() {
                let id = consumer_ids[(rr + i) % consumer_ids.len()];
                if let Some(c) = st.consumers.get(&id) {
                    if c.unacked.len() < c.prefetch && !c.paused {
                        chosen = Some(id);
                        rr = (rr + i + 1) % consumer_ids.len();
                        break;
                    }
                }
            }
            let Some(id) = chosen else { break };
            let msg = st.queues.get_mut(queue).and_then(|q| q.ready.pop_front()).expect("ready checked above");
            let c = st.consumers.get_mut(&id).expect("consumer chosen above");
            c.next_tag += 1;
            let tag = c.next_tag;
            c.out.push(RawDelivery {
                tag,
                exchange: msg.exchange.clone(),
                routing_key: msg.routing_key.clone(),
                redelivered: msg.redelivered,
                body: msg.body.clone(),
                props: msg.props.clone(),
            });
            c.unacked.insert(tag, msg);
        }
        if let Some(q) = st.queues.get_mut(queue) {
            q.rr = rr;
        }
    }

    /// Expire every queue's due messages, dead-lettering them where the queue
    /// says to. Returns the next deadline on the broker clock, if any.
    fn expire_all(&self, st: &mut State) -> Option<u64> {
        let now = self.now_ms();
        let mut dead: Vec<(String, Option<String>, Stored)> = Vec::new();
        let mut next: Option<u64> = None;
        for q in st.queues.values_mut() {
            let Some(ttl) = q.ttl_ms else { continue };
            while let Some(head) = q.ready.front() {
                if head.enqueued_at + ttl <= now {
                    let m = q.ready.pop_front().expect("front checked");
                    if let Some(dlx) = &q.dlx {
                        dead.push((dlx.clone(), q.dlrk.clone(), m));
                    }
                } else {
                    let due = head.enqueued_at + ttl;
                    next = Some(next.map_or(due, |n: u64| n.min(due)));
                    break;
                }
            }
        }
        let mut touched: Vec<String> = Vec::new();
        // Delayed messages now due go where they were published to; one whose
        // route has gone since is dropped, as dead-lettering drops one.
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut st.delayed).into_iter().partition(|(d, _)| *d <= now);
        st.delayed = waiting;
        if let Some(d) = st.delayed.iter().map(|(d, _)| *d).min() {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
        // Each goes where it was published to (a delayed message now due) or
        // to its dead-letter exchange; one that matches nothing there is
        // dropped, as RabbitMQ drops it.
        let moves = due.into_iter().map(|(_, m)| (m.exchange.clone(), m.routing_key.clone(), m)).chain(dead.into_iter().map(
            |(dlx, dlrk, m)| {
                let rk = dlrk.unwrap_or_else(|| m.routing_key.clone());
                (dlx, rk, m)
            },
        ));
        for (exchange, routing_key, mut m) in moves {
            if let Ok(targets) = self.route(st, &exchange, &routing_key) {
                m.exchange = exchange;
                m.routing_key = routing_key;
                m.enqueued_at = now;
                for t in targets {
                    if let Some(q) = st.queues.get_mut(&t) {
                        if let Some(ttl) = q.ttl_ms {
                            next = Some(next.map_or(now + ttl, |n| n.min(now + ttl)));
                        }
                        q.ready.push_back(m.clone());
                        touched.push(t);
                    }
                }
            }
        }
        for t in touched {
            self.dispatch(st, &t);
        }
        next
    }

    pub(crate) fn consume(self: &Arc<Self>, queue: &str, prefetch: u16) -> Result<(u64, Arc<DeliveryQueue>)> {
        self.consume_with(queue, prefetch, false)
    }

    /// [`MemoryBroker::consume`]; `exclusive` as basic.consume's flag on
    /// RabbitMQ: refused (403) while the queue has any consumer, and while
    /// it has an exclusive one, every other consumer is refused.
    pub(crate) fn consume_with(self: &Arc<Self>, queue: &str, prefetch: u16, exclusive: bool) -> Result<(u64, Arc<DeliveryQueue>)> {
        let mut st = self.lock();
        let Some(q) = st.queues.get(queue) else {
            return Err(self.not_found("queue", queue));
        };
        if q.exclusive.is_some() || (exclusive && !q.consumers.is_empty()) {
            return Err(crate::error::Error::new(
                crate::error::ErrorKind::Broker { reply_code: 403 },
                format!("ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use (memory://)"),
            ));
        }
        st.next_consumer += 1;
        let id = st.next_consumer;
        let out = Arc::new(DeliveryQueue::default());
        st.consumers.insert(
            id,
            MemConsumer { queue: queue.to_owned(), prefetch: prefetch.max(1) as usize, unacked: HashMap::new(), next_tag: 0, out: out.clone(), paused: false },
        );
        let q = st.queues.get_mut(queue).expect("checked");
        q.consumers.push(id);
        if exclusive {
            q.exclusive = Some(id);
        }
        self.dispatch(&mut st, queue);
        Ok((id, out))
    }

    pub(crate) fn ack(&self, consumer: u64, tag: u64) {
        let mut st = self.lock();
        let Some(c) = st.consumers.get_mut(&consumer) else { return };
        c.unacked.remove(&tag);
        let q = c.queue.clone();
        self.dispatch(&mut st, &q);
    }

    pub(crate) fn requeue(&self, consumer: u64, tag: u64) {
        let mut st = self.lock();
        let Some(c) = st.consumers.get_mut(&consumer) else { return };
        let Some(m) = c.unacked.remove(&tag) else { return };
        let q = c.queue.clone();
        self.give_back(&mut st, &q, vec![m]);
    }

    /// Put `held` (in delivery order) back at the head of `queue`, marked
    /// redelivered, and deliver again.
    fn give_back(&self, st: &mut State, queue: &str, held: Vec<Stored>) {
        if let Some(q) = st.queues.get_mut(queue) {
            for mut m in held.into_iter().rev() {
                m.redelivered = true;
                q.ready.push_front(m);
            }
        }
        self.dispatch(st, queue);
    }

    /// Deliver nothing more to `consumer`, and give what it holds and has
    /// not handed to a handler back to the head of its queue, in order, as
    /// a pause on RabbitMQ does (basic.cancel, then a requeue of each).
    pub(crate) fn pause(&self, consumer: u64) {
        let mut st = self.lock();
        let Some(c) = st.consumers.get_mut(&consumer) else { return };
        c.paused = true;
        let held: Vec<Stored> = c.out.drain().into_iter().filter_map(|d| c.unacked.remove(&d.tag)).collect();
        let q = c.queue.clone();
        self.give_back(&mut st, &q, held);
    }

    /// Deliver to `consumer` again.
    pub(crate) fn resume(&self, consumer: u64) {
        let mut st = self.lock();
        let Some(c) = st.consumers.get_mut(&consumer) else { return };
        c.paused = false;
        let q = c.queue.clone();
        self.dispatch(&mut st, &q);
    }

    /// The consumer goes away: what it had not settled goes back to the head
    /// of its queue, marked redelivered, as RabbitMQ does when a channel closes.
    pub(crate) fn cancel(&self, consumer: u64) {
        let mut st = self.lock();
        let Some(c) = st.consumers.remove(&consumer) else { return };
        c.out.close();
        c.out.drain();
        let mut unacked: Vec<(u64, Stored)> = c.unacked.into_iter().collect();
        unacked.sort_by_key(|(t, _)| *t);
        if let Some(q) = st.queues.get_mut(&c.queue) {
            q.consumers.retain(|id| *id != consumer);
            if q.exclusive == Some(consumer) {
                q.exclusive = None;
            }
            for (_, mut m) in unacked.into_iter().rev() {
                m.redelivered = true;
                q.ready.push_front(m);
            }
        }
        self.dispatch(&mut st, &c.queue);
    }
}

fn spawn_timer(broker: Weak<MemoryBroker>) {
    crate::runtime::handle().spawn(async move {
        // Brokers live in the process registry for the life of the process,
        // so this holds the broker for as long as it exists anyway.
        let Some(b) = broker.upgrade() else { return };
        loop {
            let notified = b.timer.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let mut st = b.lock();
                b.expire_all(&mut st)
            };
            let now = b.now_ms();
            // Sleep to the next deadline, at most a second (the clock may be
            // advanced, or a TTL queue declared, without anything due yet).
            let wait = next.map_or(1000, |due| due.saturating_sub(now).min(1000)).max(1);
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
            }
        }
    });
}

fn differing_argument(current: &Headers, received: &Headers) -> Option<(String, String, String)> {
    let mut keys: Vec<&String> = current.keys().chain(received.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let c = current.get(k);
        let r = received.get(k);
        if c != r {
            let show = |v: Option<&serde_json::Value>| v.map_or("none".to_string(), |v| format!("'{v}'"));
            return Some((k.clone(), show(r), show(c)));
        }
    }
    None
}

/// AMQP topic matching: words separated by dots, `*` one word, `#` zero or more.
pub(crate) fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => go(&p[1..], k) || (!k.is_empty() && go(p, &k[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &k[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &k[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = key.split('.').collect();
    go(&p, &k)
}

#[cfg(test)]
mod tests {
    use super::topic_matches;

    #[test]
    fn topic_patterns() {
        assert!(topic_matches("order.*", "order.placed"));
        assert!(!topic_matches("order.*", "order.placed.v2"));
        assert!(topic_matches("order.#", "order.placed.v2"));
        assert!(topic_matches("#", "anything.at.all"));
        assert!(topic_matches("*.placed", "order.placed"));
        assert!(!topic_matches("order.placed", "order.paid"));
    }
}
