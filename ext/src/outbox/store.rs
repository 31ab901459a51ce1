//! AceMQ::AMQP::Patterns::SQLOutboxStore: core's SQL outbox, over a SQLite
//! file the library opens itself (`path:`, rusqlite, GVL released) or over
//! the application's own Ruby connection (`connection:`, through
//! `SQL.connect`'s adapter, GVL held), with the SQL steps the relay's
//! driver (outbox/cycle.rs) runs.
//! lib/acemq/amqp/patterns/sql_outbox_store.rb adds the keywords.

use super::backlog::RbBacklog;
use super::record::RbOutboxRecord;
use super::stuck_record::RbStuckRecord;
use crate::errors::IntoRuby;
use crate::keywords::Keywords;
use crate::sql::{self, RbSource, StoreSource};
use acemq::sql::ConnectionSource;
use acemq::outbox::{Completion, LocalWake, OutboxRecord, OutboxStoreOptions, SqlOutboxStore};
use acemq::sql::Dialect;
use magnus::{function, method, prelude::*, typed_data::DataTypeFunctions, Error, RArray, RHash, RModule, Ruby, Value};

#[derive(magnus::TypedData)]
#[magnus(class = "AceMQ::AMQP::Patterns::SQLOutboxStore", free_immediately, size, mark)]
pub struct RbOutboxStore(sql::SqlStore<SqlOutboxStore<StoreSource>>);

impl DataTypeFunctions for RbOutboxStore {
    fn mark(&self, marker: &magnus::gc::Marker) {
        self.0.mark(marker);
    }
}

/// Core's options from the keywords by name; absent or nil is core's
/// default.
fn options(ruby: &Ruby, kw: &Keywords) -> Result<OutboxStoreOptions, Error> {
    let mut o = OutboxStoreOptions { worker_id: kw.get("worker")?, ..Default::default() };
    if let Some(t) = kw.get("table")? {
        o.table = t;
    }
    if let Some(s) = kw.get("lease")? {
        o.lease = crate::convert::seconds(ruby, "lease", s)?;
    }
    if let Some(s) = kw.get("backoff")? {
        o.base_backoff = crate::convert::seconds(ruby, "backoff", s)?;
    }
    if let Some(s) = kw.get("max_backoff")? {
        o.max_backoff = crate::convert::seconds(ruby, "max_backoff", s)?;
    }
    Ok(o)
}

impl RbOutboxStore {
    /// By name: on the SQLite file at `path`, or over `adapter`
    /// (`connection:`), with table, worker, lease, backoff and max_backoff.
    fn new(ruby: &Ruby, keywords: RHash) -> Result<Self, Error> {
        const KNOWN: &[&str] = &["path", "adapter", "table", "worker", "lease", "backoff", "max_backoff"];
        let kw = Keywords::read(ruby, keywords, "SQLOutboxStore._new", KNOWN)?;
        let o = options(ruby, &kw)?;
        sql::SqlStore::open(ruby, kw.get("path")?, kw.get("adapter")?, |source| SqlOutboxStore::new(source, o)).map(Self)
    }

    fn create_schema(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        rb_self.0.call(ruby, |s| s.create_schema())
    }

    /// Insert `record` with `adapter`, the caller's connection (what
    /// `SQL.connect` made of it), on this thread with the GVL held: nothing
    /// is begun, committed or closed, so the row belongs to whatever
    /// transaction that connection is in.
    fn add(ruby: &Ruby, rb_self: &Self, record: &RbOutboxRecord, adapter: Value) -> Result<i64, Error> {
        sql::begin();
        let source = RbSource::new(ruby, adapter)?;
        let mut id = 0;
        let r = source.with_connection(&mut |conn| {
            id = rb_self.0.get().add(&record.inner, conn)?;
            Ok(())
        });
        std::hint::black_box(adapter);
        sql::finish(ruby, r.map(|()| id))
    }

    fn backlog(ruby: &Ruby, rb_self: &Self) -> Result<RbBacklog, Error> {
        rb_self.0.call(ruby, |s| s.backlog()).map(RbBacklog)
    }

    fn stuck(ruby: &Ruby, rb_self: &Self, limit: usize) -> Result<RArray, Error> {
        let rows = rb_self.0.call(ruby, |s| s.stuck(limit))?;
        let array = ruby.ary_new_capa(rows.len());
        for row in rows {
            array.push(RbStuckRecord(row))?;
        }
        Ok(array)
    }

    /// The relay cycle's claim (deleting `done` in its commit): core's
    /// result, or the Ruby interrupt (Thread#kill, Ctrl-C) that stopped it,
    /// to be raised untouched.
    pub(crate) fn relay_claim(&self, ruby: &Ruby, done: &[i64], batch_size: usize) -> Result<acemq::Result<Vec<OutboxRecord>>, Error> {
        self.0.kept(ruby, |s| s.delete_then_claim(done, batch_size))
    }

    /// The relay cycle's completion: the confirmed deleted, the failed backed off.
    pub(crate) fn relay_complete(&self, ruby: &Ruby, completions: &[Completion]) -> Result<acemq::Result<usize>, Error> {
        self.0.kept(ruby, |s| s.complete(completions))
    }

    /// The relay cycle's delete of confirmed rows.
    pub(crate) fn relay_delete(&self, ruby: &Ruby, ids: &[i64]) -> Result<acemq::Result<usize>, Error> {
        self.0.kept(ruby, |s| s.delete_confirmed(ids))
    }

    /// The backlog for the relay's event: None when it cannot be read.
    pub(crate) fn relay_backlog(&self, ruby: &Ruby) -> Result<Option<(u64, Option<std::time::Duration>)>, Error> {
        let b = self.0.kept(ruby, |s| s.backlog())?;
        Ok(b.ok().map(|b| (b.count, b.oldest_age)))
    }

    pub(crate) fn wake(&self) -> &LocalWake {
        self.0.get().local_wake()
    }

    /// Whether a relay on this store can wait on the process-local wake-up.
    /// Only a `path:` store: its claim waits for the adder's commit on
    /// SQLite's write lock without the GVL. A claim through the sqlite3 gem
    /// waits holding the GVL, so the adding thread could never commit
    /// (a stall until the busy timeout); such a relay waits out its interval.
    pub(crate) fn wakes_on_add(&self) -> bool {
        self.0.on_file()
    }

    /// The PostgreSQL channel every add notifies at commit.
    fn channel(&self) -> String {
        self.0.get().channel()
    }

    fn schema_sql(ruby: &Ruby, rb_self: &Self, dialect: String) -> Result<Vec<String>, Error> {
        let d = Dialect::parse(&dialect).rb(ruby)?;
        Ok(rb_self.0.get().schema_sql(d))
    }

    fn table(&self) -> String {
        self.0.get().table().to_owned()
    }

    fn worker(&self) -> String {
        self.0.get().worker_id().to_owned()
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("SQLOutboxStore", ruby.class_object())?;
    class.define_singleton_method("_new", function!(RbOutboxStore::new, 1))?;
    class.define_method("create_schema", method!(RbOutboxStore::create_schema, 0))?;
    class.define_private_method("_add", method!(RbOutboxStore::add, 2))?;
    class.define_private_method("_backlog", method!(RbOutboxStore::backlog, 0))?;
    class.define_private_method("_stuck", method!(RbOutboxStore::stuck, 1))?;
    class.define_private_method("_channel", method!(RbOutboxStore::channel, 0))?;
    class.define_private_method("_schema_sql", method!(RbOutboxStore::schema_sql, 1))?;
    class.define_method("table", method!(RbOutboxStore::table, 0))?;
    class.define_method("worker", method!(RbOutboxStore::worker, 0))?;
    super::backlog::init(ruby, class)?;
    super::stuck_record::init(ruby, class)?;
    Ok(())
}
