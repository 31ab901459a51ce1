//! AceMQ::AMQP::Connection: the native half. lib/acemq/amqp/connection.rb
//! adds the keywords, defaults and the consume loop.

use crate::consumer::RbConsumer;
use crate::convert::seconds;
use crate::dead_letter::{RbDeadLetterPage, RbReplayReport};
use crate::errors::IntoRuby;
use crate::outgoing::RbOutgoing;
use crate::gvl;
use crate::keywords::Keywords;
use acemq::{BindingSpec, ExchangeSpec, QueueSpec};
use acemq::{
    ConnectionOptions, ConsumeOptions, ExchangeKind, RetryPolicy, TlsOptions, Topology,
};
use magnus::{function, method, prelude::*, Error, RArray, RHash, RModule, Ruby, Value};
use std::time::Duration;

#[magnus::wrap(class = "AceMQ::AMQP::Connection", free_immediately, size)]
pub struct RbConnection {
    pub(crate) inner: acemq::Connection,
}

/// `options[:name]`, None when absent or nil.
pub(crate) fn opt<T: magnus::TryConvert>(options: &RHash, name: &str) -> Result<Option<T>, Error> {
    let ruby = Ruby::get_with(*options);
    options.lookup::<_, Option<T>>(ruby.to_symbol(name))
}

/// Which dead letters `_replay` and `_browse` read, by name: reason:
/// (contained in the reason), type:, error_class: (exactly) and ids: (any of
/// them); absent or nil reads them all.
fn dead_letter_filter(kw: &Keywords) -> Result<acemq::ReplayOptions, Error> {
    Ok(acemq::ReplayOptions {
        reason: kw.get("reason")?,
        kind: kw.get("type")?,
        error_class: kw.get("error_class")?,
        ids: kw.get_or("ids", Vec::new())?,
        ..Default::default()
    })
}

/// The `tls:` Hash as Connection.open checked it: Symbol keys, String
/// paths, a boolean `verify` (absent means true).
fn tls_options(ruby: &Ruby, hash: RHash) -> Result<TlsOptions, Error> {
    let path = |name: &str| -> Result<Option<std::path::PathBuf>, Error> {
        Ok(hash.lookup::<_, Option<String>>(ruby.to_symbol(name))?.map(Into::into))
    };
    Ok(TlsOptions {
        ca_file: path("ca_file")?,
        cert_file: path("cert_file")?,
        key_file: path("key_file")?,
        verify: hash.lookup::<_, Option<bool>>(ruby.to_symbol("verify"))?.unwrap_or(true),
        server_name: hash.lookup(ruby.to_symbol("server_name"))?,
    })
}

impl RbConnection {
    /// `options` is read by name: origin:, connect_timeout:,
    /// confirm_timeout:, heartbeat: (seconds) and tls: (a Hash, see
    /// `tls_options`). What is absent or nil takes core's default.
    fn open(ruby: &Ruby, urls: Vec<String>, options: RHash) -> Result<Self, Error> {
        let defaults = ConnectionOptions::default();
        let secs = |name: &str| -> Result<Option<Duration>, Error> {
            opt::<f64>(&options, name)?.map(|s| seconds(ruby, name, s)).transpose()
        };
        let options = ConnectionOptions {
            origin: opt(&options, "origin")?,
            connect_timeout: secs("connect_timeout")?.unwrap_or(defaults.connect_timeout),
            confirm_timeout: secs("confirm_timeout")?.unwrap_or(defaults.confirm_timeout),
            heartbeat: secs("heartbeat")?,
            tls: opt::<RHash>(&options, "tls")?.map(|h| tls_options(ruby, h)).transpose()?,
        };
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let conn = gvl::block_on(ruby, acemq::Connection::open_any(&urls, options))?.rb(ruby)?;
        Ok(RbConnection { inner: conn })
    }

    /// Send one message built by `Outgoing._build` and wait for its confirm.
    fn publish(ruby: &Ruby, rb_self: &Self, out: &RbOutgoing) -> Result<(), Error> {
        let (conn, out) = (&rb_self.inner, &out.inner);
        gvl::block_on(ruby, async {
            conn.send_json(&out.body, &out.exchange, &out.routing_key, &out.envelope).await?.wait().await
        })?
        .rb(ruby)
    }

    /// The engine's side of a `Connection#batch`, held or streamed.
    fn batch(&self, stream: bool) -> crate::stream::RbBatch {
        crate::stream::RbBatch::new(&self.inner, stream)
    }

    /// `Connection#apply`: a Topology's rows (ExchangeSpec, QueueSpec and
    /// BindingSpec structs) read by name and declared by core.
    fn apply(ruby: &Ruby, rb_self: &Self, topology: Value) -> Result<(), Error> {
        let rows = |list: &str| -> Result<RArray, Error> { topology.funcall(list, ()) };
        let mut t = Topology::new();
        for row in rows("exchanges")? {
            let kind: String = row.funcall("type", ())?;
            let kind = ExchangeKind::parse(&kind).rb(ruby)?;
            t.exchanges.push(ExchangeSpec { name: row.funcall("name", ())?, kind });
        }
        for row in rows("queues")? {
            let name: String = row.funcall("name", ())?;
            let args: Option<RHash> = row.funcall("arguments", ())?;
            let kind: Option<String> = row.funcall("type", ())?;
            let what = format!("arguments of queue {name:?}");
            let mut spec = QueueSpec::new(name);
            if let Some(kind) = kind {
                spec = spec.with_type(acemq::QueueType::parse(&kind).rb(ruby)?);
            }
            if let Some(args) = args {
                spec.arguments = crate::table::from_ruby(ruby, args, &what)?;
            }
            t.queues.push(spec);
        }
        for row in rows("bindings")? {
            t.bindings.push(BindingSpec {
                queue: row.funcall("queue", ())?,
                exchange: row.funcall("exchange", ())?,
                routing_key: row.funcall("routing_key", ())?,
            });
        }
        let conn = &rb_self.inner;
        gvl::block_on(ruby, conn.apply(&t))?.rb(ruby)
    }

    /// A pull consumer. `options` holds what the caller named, by name
    /// (prefetch, concurrency, max_attempts, initial_delay, max_delay,
    /// queue_type, timeout, consumer_timeout, claim_timeout, name,
    /// circuit_breaker, throttle; seconds as floats); what is missing or nil
    /// is core's default.
    fn consumer(ruby: &Ruby, rb_self: &Self, queue: String, options: RHash) -> Result<RbConsumer, Error> {
        let concurrency: usize = opt(&options, "concurrency")?.unwrap_or(1);
        let batch: usize = opt(&options, "batch")?.unwrap_or(1);
        let mut o = ConsumeOptions::with_batches(concurrency, batch);
        o.queue_type = opt::<String>(&options, "queue_type")?.map(|t| acemq::QueueType::parse(&t)).transpose().rb(ruby)?;
        if let Some(p) = opt(&options, "prefetch")? {
            o.prefetch = p;
        }
        o.name = opt(&options, "name")?;
        o.retry = retry_policy(ruby, opt(&options, "max_attempts")?, opt(&options, "initial_delay")?, opt(&options, "max_delay")?)?;
        if let Some(t) = opt::<f64>(&options, "consumer_timeout")? {
            o.broker_consumer_timeout = seconds(ruby, "consumer_timeout", t)?;
        }
        if let Some(t) = opt::<f64>(&options, "claim_timeout")? {
            o = o.guarded_by(seconds(ruby, "claim_timeout", t)?);
        }
        if let Some(t) = opt::<f64>(&options, "timeout")? {
            o.timeout = seconds(ruby, "timeout", t)?;
        }
        // The breaker (ext/src/breaker.rs) and [limit, per]; core checks them.
        if let Some(spec) = opt::<crate::breaker::Spec>(&options, "circuit_breaker")? {
            o.circuit_breaker = Some(crate::breaker::circuit_breaker(ruby, spec)?);
        }
        o.keep_order = opt(&options, "keep_order")?.unwrap_or(false);
        if let Some((limit, per)) = opt::<(u32, f64)>(&options, "throttle")? {
            o.throttle = Some(acemq::Throttle::new(limit, seconds(ruby, "throttle per", per)?));
        }
        // The SQL adapter of a throttle shared across processes.
        if let Some(adapter) = opt::<magnus::Value>(&options, "throttle_store")? {
            o.throttle_store = Some(crate::throttle::store(ruby, adapter)?);
        }
        let conn = &rb_self.inner;
        let consumer = gvl::block_on(ruby, conn.consumer(&queue, o))?.rb(ruby)?;
        Ok(RbConsumer::new(consumer))
    }

    /// Replay (or, with `discard: true`, remove) the dead letters matching
    /// the filter: what was done, as a ReplayReport. Keywords: limit,
    /// discard, and the filter's (`dead_letter_filter`).
    fn replay(ruby: &Ruby, rb_self: &Self, queue: String, options: RHash) -> Result<RbReplayReport, Error> {
        const KNOWN: &[&str] = &["limit", "discard", "reason", "type", "error_class", "ids"];
        let kw = Keywords::read(ruby, options, "Connection#_replay", KNOWN)?;
        let options = acemq::ReplayOptions { limit: kw.get("limit")?, ..dead_letter_filter(&kw)? };
        let conn = &rb_self.inner;
        let report = if kw.get_or("discard", false)? {
            gvl::block_on(ruby, conn.discard_dead_letters(&queue, options))?.rb(ruby)?
        } else {
            gvl::block_on(ruby, conn.replay_dead_letters(&queue, options))?.rb(ruby)?
        };
        Ok(RbReplayReport(report))
    }

    /// One page of dead letters, left in place, oldest first: [a
    /// DeadLetterPage, what the DLQ held when the read began (nil when it
    /// does not exist), whether it gave up at `within` seconds, the most it
    /// held unacknowledged at once]. Keywords: skip and limit (0 when
    /// absent), within, and the filter's (`dead_letter_filter`).
    fn browse(
        ruby: &Ruby,
        rb_self: &Self,
        queue: String,
        options: RHash,
    ) -> Result<(RbDeadLetterPage, Option<u64>, bool, usize), Error> {
        const KNOWN: &[&str] = &["skip", "limit", "within", "reason", "type", "error_class", "ids"];
        let kw = Keywords::read(ruby, options, "Connection#_browse", KNOWN)?;
        let (skip, limit) = (kw.get_or("skip", 0)?, kw.get_or("limit", 0)?);
        let within = kw.get::<f64>("within")?.map(|w| seconds(ruby, "within", w)).transpose()?;
        let filter = acemq::ReplayOptions { within, ..dead_letter_filter(&kw)? };
        let conn = &rb_self.inner;
        let page = gvl::block_on(ruby, conn.browse_dead_letters(&queue, &filter, skip, limit))?.rb(ruby)?;
        let (total, gave_up, most_held) = (page.total, page.gave_up, page.most_held);
        Ok((RbDeadLetterPage(page), total, gave_up, most_held))
    }

    fn close(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let conn = &rb_self.inner;
        gvl::block_on(ruby, conn.close())
    }

    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn is_blocked(&self) -> bool {
        self.inner.is_blocked()
    }

    fn origin(&self) -> String {
        self.inner.origin().to_owned()
    }

    /// The broker's version from connection.start ("4.3.6"); nil on memory://.
    fn server_version(&self) -> Option<String> {
        self.inner.server_version()
    }

    /// Connection#resources' fields: the channels held and the runtime's tasks.
    fn resources(ruby: &Ruby, rb_self: &Self) -> Result<magnus::RHash, Error> {
        let r = rb_self.inner.resources();
        let h = ruby.hash_new();
        h.aset(ruby.to_symbol("channels"), r.channels)?;
        h.aset(ruby.to_symbol("tasks"), r.tasks)?;
        Ok(h)
    }

    fn is_memory(&self) -> bool {
        self.inner.memory_broker().is_some()
    }

    fn advance_clock(ruby: &Ruby, rb_self: &Self, secs: f64) -> Result<(), Error> {
        let by = seconds(ruby, "advance_clock", secs)?;
        match rb_self.inner.memory_broker() {
            Some(b) => {
                b.advance(by);
                Ok(())
            }
            None => Err(Error::new(
                ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
                "advance_clock works on memory:// connections only: RabbitMQ's clock is its own",
            )),
        }
    }

    fn queue_depth(&self, queue: String) -> Option<(usize, usize)> {
        self.inner.memory_broker().and_then(|b| b.depth(&queue)).map(|d| (d.ready, d.unacked))
    }

    /// [ready, consumers] or nil for each queue, in order, on one channel.
    fn queue_counts_many(ruby: &Ruby, rb_self: &Self, queues: Vec<String>) -> Result<Vec<Option<(u64, u64)>>, Error> {
        let counts = gvl::block_on(ruby, rb_self.inner.queue_counts_many(&queues))?.rb(ruby)?;
        Ok(counts.into_iter().map(|c| c.map(|c| (c.ready, c.consumers))).collect())
    }

    fn queue_counts(ruby: &Ruby, rb_self: &Self, queue: String) -> Result<Option<(u64, u64)>, Error> {
        let counts = gvl::block_on(ruby, rb_self.inner.queue_counts(&queue))?.rb(ruby)?;
        Ok(counts.map(|c| (c.ready, c.consumers)))
    }

    fn reset_memory(&self) -> bool {
        match self.inner.memory_broker() {
            Some(b) => {
                b.reset();
                true
            }
            None => false,
        }
    }

    fn delete_memory_queue(&self, queue: String) -> bool {
        self.inner.memory_broker().map(|b| b.delete_queue(&queue)).unwrap_or(false)
    }
}

/// The retry ladder from what Ruby gave, nil being core's default.
fn retry_policy(
    ruby: &Ruby,
    max_attempts: Option<u32>,
    initial_delay: Option<f64>,
    max_delay: Option<f64>,
) -> Result<RetryPolicy, Error> {
    let RetryPolicy { max_attempts: default_attempts, initial_delay: default_initial, max_delay: default_max } =
        RetryPolicy::default();
    Ok(RetryPolicy::new(
        max_attempts.unwrap_or(default_attempts),
        initial_delay.map(|s| seconds(ruby, "initial_delay", s)).transpose()?.unwrap_or(default_initial),
        max_delay.map(|s| seconds(ruby, "max_delay", s)).transpose()?.unwrap_or(default_max),
    ))
}

/// Core's check of a retry ladder, for a declaration (a consumer class's
/// `retries`) to fail where it is written rather than when it subscribes.
fn check_retries(ruby: &Ruby, max_attempts: Option<u32>, initial_delay: Option<f64>, max_delay: Option<f64>) -> Result<(), Error> {
    retry_policy(ruby, max_attempts, initial_delay, max_delay)?.validate().rb(ruby)
}

/// `Connection#teardown`: core's [`acemq::Connection::teardown`] for these
/// queues and ladders (RetryPolicy structs, read by name; a nil setting is
/// core's default); the names deleted.
fn teardown(ruby: &Ruby, rb_self: &RbConnection, queues: Vec<String>, ladders: RArray, force: bool) -> Result<Vec<String>, Error> {
    let mut topology = Topology::new();
    for name in queues {
        topology = topology.queue(name);
    }
    let retry = ladders
        .into_iter()
        .map(|p| {
            retry_policy(ruby, p.funcall("max_attempts", ())?, p.funcall("initial_delay", ())?, p.funcall("max_delay", ())?)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = acemq::TeardownOptions { retry, force };
    Ok(gvl::block_on(ruby, rb_self.inner.teardown(&topology, &options))?.rb(ruby)?.deleted)
}

fn rung_queues(ruby: &Ruby, queue: String, max_attempts: Option<u32>, initial_delay: Option<f64>, max_delay: Option<f64>) -> Result<Vec<String>, Error> {
    Ok(retry_policy(ruby, max_attempts, initial_delay, max_delay)?.rung_queues(&queue))
}

/// `consume`'s and the Rails DSL's check of concurrency, prefetch (nil: the
/// default) and batch: core's rules. A negative count is refused as 0 is.
fn check_sizes(ruby: &Ruby, concurrency: i64, prefetch: Option<i64>, batch: i64) -> Result<(), Error> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    ConsumeOptions::check_sizes(count(concurrency), prefetch.map(count), count(batch)).rb(ruby)
}

/// Seconds as core's rules read them. What cannot be a Duration (negative,
/// NaN, infinite, past 2**64) is refused here, with the number as given:
/// core's message would show it as the 0 it became.
fn rule_seconds(ruby: &Ruby, what: &str, s: f64) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        Error::new(
            ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
            format!("{what} must be a number of seconds above zero (got {s})"),
        )
    })
}

/// A count for a 32-bit rule: a negative one, or one past u32, cannot be
/// represented, and is refused with the number as given.
fn rule_count(ruby: &Ruby, what: &str, n: i64) -> Result<u32, Error> {
    u32::try_from(n).map_err(|_| {
        Error::new(
            ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
            format!("{what} must be a whole number from 1 to {} (got {n})", u32::MAX),
        )
    })
}

/// `BreakerOptions`' check, so `consume`'s and the Rails DSL's: core's rules
/// for a circuit breaker (`CircuitBreaker::validate`), as it is given.
fn check_breaker(ruby: &Ruby, failures: i64, within: f64, pause: f64, probe: Option<f64>) -> Result<(), Error> {
    let failures = rule_count(ruby, "circuit_breaker: failures", failures)?;
    let mut breaker = acemq::CircuitBreaker::new(
        failures,
        rule_seconds(ruby, "circuit_breaker: within", within)?,
        rule_seconds(ruby, "circuit_breaker: pause", pause)?,
    );
    if let Some(p) = probe {
        breaker = breaker.probe(rule_seconds(ruby, "circuit_breaker: probe", p)?);
    }
    breaker.validate().rb(ruby)
}

/// `consume(throttle:)`'s and the Rails DSL's check: core's rules for a
/// throttle (`Throttle::validate`).
fn check_throttle(ruby: &Ruby, limit: i64, per: f64) -> Result<(), Error> {
    acemq::Throttle::new(rule_count(ruby, "throttle: limit", limit)?, rule_seconds(ruby, "throttle: per", per)?).validate().rb(ruby)
}

/// `Topology#exchange(type:)`'s check: core's name for the kind, or its
/// ConfigurationError.
fn exchange_type(ruby: &Ruby, kind: String) -> Result<&'static str, Error> {
    Ok(ExchangeKind::parse(&kind).rb(ruby)?.as_str())
}

/// `Topology#queue(type:)`'s check (and the Rails DSL's): core's name for
/// the type, or its ConfigurationError.
fn queue_type(ruby: &Ruby, kind: String) -> Result<&'static str, Error> {
    Ok(acemq::QueueType::parse(&kind).rb(ruby)?.as_str())
}

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    amqp.define_module_function("_check_retries", magnus::function!(check_retries, 3))?;
    amqp.define_module_function("_check_sizes", magnus::function!(check_sizes, 3))?;
    amqp.define_module_function("_check_breaker", magnus::function!(check_breaker, 4))?;
    amqp.define_module_function("_check_throttle", magnus::function!(check_throttle, 2))?;
    // Core's consumer defaults, for `consume` and the Rails DSL to read
    // rather than repeat.
    let defaults = ruby.hash_new();
    let consume = ConsumeOptions::default();
    defaults.aset(ruby.to_symbol("concurrency"), consume.concurrency)?;
    defaults.freeze();
    amqp.const_set("CONSUME_DEFAULTS", defaults)?;
    amqp.define_module_function("_exchange_type", magnus::function!(exchange_type, 1))?;
    amqp.define_module_function("_queue_type", magnus::function!(queue_type, 1))?;
    amqp.const_set("EXCHANGE_TYPES", ruby.ary_from_iter(ExchangeKind::ALL.iter().map(|k| k.as_str())))?;
    amqp.const_set("QUEUE_TYPES", ruby.ary_from_iter(acemq::QueueType::ALL.iter().map(|t| t.as_str())))?;
    amqp.define_module_function("_rung_queues", magnus::function!(rung_queues, 4))?;
    let class = amqp.define_class("Connection", ruby.class_object())?;
    class.define_singleton_method("_open", function!(RbConnection::open, 2))?;
    class.define_private_method("_publish", method!(RbConnection::publish, 1))?;
    class.define_private_method("_batch", method!(RbConnection::batch, 1))?;
    class.define_private_method("_apply", method!(RbConnection::apply, 1))?;
    class.define_private_method("_teardown", method!(teardown, 3))?;
    class.define_private_method("_consumer", method!(RbConnection::consumer, 2))?;
    class.define_private_method("_advance_clock", method!(RbConnection::advance_clock, 1))?;
    class.define_private_method("_queue_depth", method!(RbConnection::queue_depth, 1))?;
    class.define_private_method("_queue_counts", method!(RbConnection::queue_counts, 1))?;
    class.define_private_method("_queue_counts_many", method!(RbConnection::queue_counts_many, 1))?;
    class.define_private_method("_reset_memory", method!(RbConnection::reset_memory, 0))?;
    class.define_private_method("_delete_memory_queue", method!(RbConnection::delete_memory_queue, 1))?;
    class.define_private_method("_replay", method!(RbConnection::replay, 2))?;
    class.define_private_method("_browse", method!(RbConnection::browse, 2))?;
    class.define_method("close", method!(RbConnection::close, 0))?;
    class.define_method("closed?", method!(RbConnection::is_closed, 0))?;
    class.define_method("blocked?", method!(RbConnection::is_blocked, 0))?;
    class.define_method("origin", method!(RbConnection::origin, 0))?;
    class.define_method("memory?", method!(RbConnection::is_memory, 0))?;
    class.define_method("server_version", method!(RbConnection::server_version, 0))?;
    class.define_private_method("_resources", method!(RbConnection::resources, 0))?;
    crate::dead_letter::init(ruby, class)?;
    Ok(())
}
