//! AceMQ::AMQP::SQLDeadLetterStore: core's dead-letter store
//! (acemq::dead_letters) over a SQLite file the library opens (`path:`,
//! GVL released) or the application's own connection (`connection:`,
//! through `SQL.connect`'s adapter, GVL held); and
//! AceMQ::AMQP::SQLDeadLetterStore::Feed, an exclusive subscription to one
//! DLQ that the Ruby ingester thread drains into the store.
//! lib/acemq/amqp/sql_dead_letter_store.rb adds the keywords.

use crate::connection::RbConnection;
use crate::errors::IntoRuby;
use crate::gvl;
use crate::sql::{self, StoreSource};
use acemq::dead_letters::{
    AuditEntry, Counts, DeadLetterFeed, DeadLetterStoreOptions, Filter, Replay, ReplayRoute, Retention, Selection,
    SqlDeadLetterStore, StoreReplayOptions, StoredDeadLetter,
};
use acemq::sql::Dialect;
use magnus::{function, method, prelude::*, typed_data::DataTypeFunctions, Error, RArray, RHash, RModule, Ruby, Value};

#[derive(magnus::TypedData)]
#[magnus(class = "AceMQ::AMQP::SQLDeadLetterStore", free_immediately, size, mark)]
pub struct RbDeadLetterStore(sql::SqlStore<SqlDeadLetterStore<StoreSource>>);

impl DataTypeFunctions for RbDeadLetterStore {
    fn mark(&self, marker: &magnus::gc::Marker) {
        self.0.mark(marker);
    }
}

/// An exclusive subscription to one DLQ (see core's `DeadLetterFeed`).
#[magnus::wrap(class = "AceMQ::AMQP::SQLDeadLetterStore::Feed", free_immediately, size)]
pub struct RbFeed(DeadLetterFeed);

impl RbFeed {
    /// Send the last acks and close (what is not acknowledged goes back).
    fn close(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        gvl::block_on(ruby, rb_self.0.close())
    }
}

/// The filter as Ruby passes it: [queue, reason, error_class, type, id,
/// since, before], each nil or a value.
type FilterArgs = (Option<String>, Option<String>, Option<String>, Option<String>, Option<String>, Option<i64>, Option<i64>);

fn filter((queue, reason, error_class, kind, message_id, since, before): FilterArgs) -> Filter {
    Filter { queue, reason, error_class, kind, message_id, since, before }
}

fn letter_to_ruby(ruby: &Ruby, row: &StoredDeadLetter) -> Result<RHash, Error> {
    let l = &row.letter;
    let h = ruby.hash_new();
    let sym = |k: &str| ruby.to_symbol(k);
    h.aset(sym("id"), row.id)?;
    h.aset(sym("ingested_at"), row.ingested_at)?;
    h.aset(sym("queue"), l.queue.as_str())?;
    h.aset(sym("message_id"), l.message_id.as_str())?;
    h.aset(sym("content_hash"), l.content_hash.as_str())?;
    // Binary: the bytes as they arrived, whatever they are.
    h.aset(sym("body"), ruby.str_from_slice(&l.body))?;
    h.aset(sym("headers"), crate::json::map_to_ruby(ruby, &l.headers)?)?;
    h.aset(sym("properties"), crate::json::map_to_ruby(ruby, &l.properties)?)?;
    h.aset(sym("type"), l.kind.clone())?;
    h.aset(sym("reason"), l.reason.clone())?;
    h.aset(sym("error_class"), l.error_class.clone())?;
    h.aset(sym("attempt"), l.attempt)?;
    h.aset(sym("exchange"), l.exchange.clone())?;
    h.aset(sym("routing_key"), l.routing_key.clone())?;
    h.aset(sym("failed_at"), l.failed_at)?;
    let history = match &l.history {
        Some(v) => crate::json::to_ruby(ruby, v)?,
        None => ruby.qnil().as_value(),
    };
    h.aset(sym("history"), history)?;
    h.aset(sym("backtrace"), l.backtrace.clone())?;
    Ok(h)
}

fn counts_to_ruby(ruby: &Ruby, c: &Counts) -> Result<RHash, Error> {
    let h = ruby.hash_new();
    h.aset(ruby.to_symbol("total"), c.total)?;
    let q = ruby.hash_new();
    for (k, n) in &c.by_queue {
        q.aset(k.as_str(), *n)?;
    }
    h.aset(ruby.to_symbol("by_queue"), q)?;
    for (name, groups) in [("by_reason", &c.by_reason), ("by_error_class", &c.by_error_class)] {
        let g = ruby.hash_new();
        for (k, n) in groups {
            g.aset(k.clone(), *n)?;
        }
        h.aset(ruby.to_symbol(name), g)?;
    }
    Ok(h)
}

fn audit_to_ruby(ruby: &Ruby, a: &AuditEntry) -> Result<RHash, Error> {
    let h = ruby.hash_new();
    let sym = |k: &str| ruby.to_symbol(k);
    h.aset(sym("id"), a.id)?;
    h.aset(sym("at"), a.at)?;
    h.aset(sym("actor"), a.actor.as_str())?;
    h.aset(sym("action"), a.action.as_str())?;
    h.aset(sym("queue"), a.queue.clone())?;
    h.aset(sym("detail"), crate::json::to_ruby(ruby, &a.detail)?)?;
    h.aset(sym("count"), a.count)?;
    Ok(h)
}

impl RbDeadLetterStore {
    fn new(ruby: &Ruby, path: Option<String>, adapter: Option<Value>, table: Option<String>, audit: Option<String>) -> Result<Self, Error> {
        let mut o = DeadLetterStoreOptions::default();
        if let Some(t) = table {
            o.table = t;
        }
        if let Some(a) = audit {
            o.audit_table = a;
        }
        sql::SqlStore::open(ruby, path, adapter, |source| SqlDeadLetterStore::new(source, o)).map(Self)
    }

    fn create_schema(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        rb_self.0.call(ruby, |s| s.create_schema())
    }

    fn schema_sql(ruby: &Ruby, rb_self: &Self, dialect: String) -> Result<Vec<String>, Error> {
        let d = Dialect::parse(&dialect).rb(ruby)?;
        Ok(rb_self.0.get().schema_sql(d))
    }

    fn table(&self) -> String {
        self.0.get().table().to_owned()
    }

    fn audit_table(&self) -> String {
        self.0.get().audit_table().to_owned()
    }

    /// [letters (Array of Hash), next cursor or nil].
    fn list(ruby: &Ruby, rb_self: &Self, f: FilterArgs, after: Option<i64>, limit: usize) -> Result<(RArray, Option<i64>), Error> {
        let f = filter(f);
        let page = rb_self.0.call(ruby, |s| s.list(&f, after, limit))?;
        let out = ruby.ary_new_capa(page.letters.len());
        for l in &page.letters {
            out.push(letter_to_ruby(ruby, l)?)?;
        }
        Ok((out, page.next))
    }

    fn find(ruby: &Ruby, rb_self: &Self, id: i64) -> Result<Option<RHash>, Error> {
        let found = rb_self.0.call(ruby, |s| s.find(id))?;
        found.map(|l| letter_to_ruby(ruby, &l)).transpose()
    }

    fn counts(ruby: &Ruby, rb_self: &Self, f: FilterArgs, top: usize) -> Result<RHash, Error> {
        let f = filter(f);
        let c = rb_self.0.call(ruby, |s| s.counts(&f, top))?;
        counts_to_ruby(ruby, &c)
    }

    fn discard(ruby: &Ruby, rb_self: &Self, ids: Vec<i64>, actor: String) -> Result<u64, Error> {
        rb_self.0.call(ruby, |s| s.discard(&ids, &actor))
    }

    /// `all`: an empty filter means every row (`all: true`); a filter
    /// that sets something is that filter, whatever `all` says.
    fn check_replay_rate(ruby: &Ruby, rate: f64) -> Result<f64, Error> {
        StoreReplayOptions::check_rate(rate).rb(ruby)?;
        Ok(rate)
    }

    fn purge(ruby: &Ruby, rb_self: &Self, f: FilterArgs, all: bool, actor: String) -> Result<u64, Error> {
        let f = filter(f);
        rb_self.0.call(ruby, |s| if all && f.is_empty() { s.purge_all(&actor) } else { s.purge(&f, &actor) })
    }

    fn prune(ruby: &Ruby, rb_self: &Self, queue: Option<String>, max_age: Option<f64>, max_count: Option<u64>, actor: String) -> Result<u64, Error> {
        let max_age = max_age.map(|a| crate::convert::seconds(ruby, "max_age", a)).transpose()?;
        let r = Retention { max_age, max_count };
        rb_self.0.call(ruby, |s| s.prune(queue.as_deref(), &r, &actor))
    }

    fn audit(ruby: &Ruby, rb_self: &Self, limit: usize) -> Result<RArray, Error> {
        let rows = rb_self.0.call(ruby, |s| s.audit(limit))?;
        let out = ruby.ary_new_capa(rows.len());
        for a in &rows {
            out.push(audit_to_ruby(ruby, a)?)?;
        }
        Ok(out)
    }

    /// Replay `ids` (when given) or what the filter matches now: the same
    /// steps as core's `AsyncSqlDeadLetterStore::replay`, with each store
    /// call made the way this store's source needs (on this thread) and
    /// each send without the GVL. A report Hash.
    fn replay(
        ruby: &Ruby,
        rb_self: &Self,
        mq: &RbConnection,
        ids: Option<Vec<i64>>,
        f: FilterArgs,
        (rate, original_route, lease): (Option<f64>, bool, Option<f64>),
        actor: String,
    ) -> Result<RHash, Error> {
        let store = &rb_self.0;
        let selection = match ids {
            Some(ids) => Selection::Ids(ids),
            None => Selection::Filter(filter(f)),
        };
        let mut options = StoreReplayOptions {
            actor: actor.clone(),
            route: if original_route { ReplayRoute::Original } else { ReplayRoute::Queue },
            ..Default::default()
        };
        if let Some(r) = rate {
            options.rate = r;
        }
        if let Some(l) = lease {
            options.lease = crate::convert::seconds(ruby, "lease", l)?;
        }
        selection.check_for_replay().rb(ruby)?;
        let snapshot = store.call(ruby, |s| s.snapshot(&selection))?;
        let mut run = Replay::new(snapshot, options).rb(ruby)?;
        let mut failure = None;
        while let Some(chunk) = run.next_chunk() {
            let (id, until) = (run.id().to_owned(), run.lease_until());
            let rows = store.call(ruby, |s| s.claim(&id, &chunk, until))?;
            run.skipped(chunk.len() - rows.len());
            let sent = gvl::block_on(ruby, run.send(&mq.inner, &rows))?;
            let deleted = store.call(ruby, |s| s.delete_sent(&id, &sent.confirmed))?;
            run.replayed(deleted as usize);
            if !sent.unsent.is_empty() {
                store.call(ruby, |s| s.release(&id, &sent.unsent))?;
            }
            if let Some(e) = sent.error {
                failure = Some(e);
                break;
            }
        }
        let detail = run.detail(&selection);
        let replayed = run.report().replayed as u64;
        store.call(ruby, |s| s.record(&actor, "replay", run.queue(&selection), detail, replayed))?;
        if let Some(e) = failure {
            return Err(crate::errors::to_ruby(ruby, e));
        }
        let r = run.report();
        let h = ruby.hash_new();
        h.aset(ruby.to_symbol("id"), r.id.as_str())?;
        h.aset(ruby.to_symbol("selected"), r.selected)?;
        h.aset(ruby.to_symbol("replayed"), r.replayed)?;
        h.aset(ruby.to_symbol("skipped"), r.skipped)?;
        Ok(h)
    }

    /// Subscribe to `{queue}.dlq` exclusively (AccessRefused while another
    /// ingester has it).
    fn open_feed(ruby: &Ruby, mq: &RbConnection, queue: String, prefetch: u16) -> Result<RbFeed, Error> {
        let feed = gvl::block_on(ruby, DeadLetterFeed::open(&mq.inner, &queue, prefetch))?.rb(ruby)?;
        Ok(RbFeed(feed))
    }

    /// One batch off `feed` into the store, committed, then acknowledged:
    /// how many deliveries (0 when none came within `wait` seconds). A
    /// failed insert raises and acknowledges nothing.
    fn ingest_batch(ruby: &Ruby, rb_self: &Self, feed: &RbFeed, max: usize, linger: f64, wait: f64) -> Result<usize, Error> {
        let linger = crate::convert::seconds(ruby, "linger", linger)?;
        let wait = crate::convert::seconds(ruby, "wait", wait)?;
        let batch = gvl::block_on(ruby, feed.0.next_batch(max, linger, wait))?.rb(ruby)?;
        if batch.is_empty() {
            return Ok(0);
        }
        rb_self.0.call(ruby, |s| s.insert(&batch.letters))?;
        feed.0.ack(&batch);
        Ok(batch.len())
    }
}

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class = amqp.define_class("SQLDeadLetterStore", ruby.class_object())?;
    class.define_singleton_method("_new", function!(RbDeadLetterStore::new, 4))?;
    class.define_singleton_method("_open_feed", function!(RbDeadLetterStore::open_feed, 3))?;
    class.define_method("create_schema", method!(RbDeadLetterStore::create_schema, 0))?;
    class.define_private_method("_schema_sql", method!(RbDeadLetterStore::schema_sql, 1))?;
    class.define_method("table", method!(RbDeadLetterStore::table, 0))?;
    class.define_method("audit_table", method!(RbDeadLetterStore::audit_table, 0))?;
    class.define_private_method("_list", method!(RbDeadLetterStore::list, 3))?;
    class.define_private_method("_find", method!(RbDeadLetterStore::find, 1))?;
    class.define_private_method("_counts", method!(RbDeadLetterStore::counts, 2))?;
    class.define_private_method("_discard", method!(RbDeadLetterStore::discard, 2))?;
    class.define_private_method("_purge", method!(RbDeadLetterStore::purge, 3))?;
    class.define_private_method("_prune", method!(RbDeadLetterStore::prune, 4))?;
    class.define_private_method("_audit", method!(RbDeadLetterStore::audit, 1))?;
    class.define_private_method("_replay", method!(RbDeadLetterStore::replay, 5))?;
    // Messages a second a replay sends when no rate: is given (core's).
    class.const_set("DEFAULT_REPLAY_RATE", StoreReplayOptions::default().rate)?;
    // Raises ConfigurationError for a rate a replay cannot keep (core's
    // rule), for a setting checked before any replay: the dashboard's.
    class.define_singleton_method("check_replay_rate", function!(RbDeadLetterStore::check_replay_rate, 1))?;
    class.define_private_method("_ingest_batch", method!(RbDeadLetterStore::ingest_batch, 4))?;
    let feed = class.define_class("Feed", ruby.class_object())?;
    feed.define_method("close", method!(RbFeed::close, 0))?;
    Ok(())
}
