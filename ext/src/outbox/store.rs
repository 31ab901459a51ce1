//! AceMQ::AMQP::Patterns::SQLOutboxStore: core's SQL outbox, over a SQLite
//! file the library opens itself (`path:`, rusqlite, GVL released) or over
//! the application's own Ruby connection (`connection:`, through
//! `SQL.connect`'s adapter, GVL held), and the relay's sweep.
//! lib/acemq/amqp/patterns/sql_outbox_store.rb adds the keywords.

use super::in_flight::RbInFlight;
use super::record::RbOutboxRecord;
use crate::connection::RbConnection;
use crate::gvl;
use crate::errors::IntoRuby;
use crate::sql::{self, RbSource};
use acemq::sql::ConnectionSource;
use acemq::outbox::{InFlight, LocalWake, OutboxPublisher, OutboxRecord, OutboxStoreOptions, RelayOptions, Settled, SqlOutboxStore, Swept};
use acemq::sql::{Dialect, SqliteConnection};
use magnus::{
    function, method, prelude::*, typed_data::DataTypeFunctions, Error, Exception, ExceptionClass, RArray, RModule, Ruby,
    Value,
};

enum Inner {
    /// A SQLite file opened by the library: no Ruby is called, so the GVL is
    /// released around every statement.
    File(SqlOutboxStore<SqliteConnection>),
    /// The application's connection, called with the GVL held on the
    /// calling Ruby thread (the only thread a Ruby driver may be used on).
    Ruby(SqlOutboxStore<RbSource>),
}

#[derive(magnus::TypedData)]
#[magnus(class = "AceMQ::AMQP::Patterns::SQLOutboxStore", free_immediately, size, mark)]
pub struct RbOutboxStore {
    inner: Inner,
    adapter: sql::Kept,
}

impl DataTypeFunctions for RbOutboxStore {
    fn mark(&self, marker: &magnus::gc::Marker) {
        self.adapter.mark(marker);
    }
}

/// Core's options from the keywords; nil (a keyword left out) is core's default.
fn options(
    ruby: &Ruby,
    table: Option<String>,
    worker: Option<String>,
    lease: Option<f64>,
    backoff: Option<f64>,
    max_backoff: Option<f64>,
) -> Result<OutboxStoreOptions, Error> {
    let mut o = OutboxStoreOptions { worker_id: worker, ..Default::default() };
    if let Some(t) = table {
        o.table = t;
    }
    if let Some(s) = lease {
        o.lease = crate::connection::seconds(ruby, "lease", s)?;
    }
    if let Some(s) = backoff {
        o.base_backoff = crate::connection::seconds(ruby, "backoff", s)?;
    }
    if let Some(s) = max_backoff {
        o.max_backoff = crate::connection::seconds(ruby, "max_backoff", s)?;
    }
    Ok(o)
}

/// The Ruby relay's interval and batch size: nil is core's default, and
/// core's RelayOptions::validate refuses what cannot work.
fn relay_options(ruby: &Ruby, interval: Option<f64>, batch_size: Option<i64>) -> Result<(f64, usize), Error> {
    let mut o = RelayOptions::default();
    if let Some(s) = interval {
        o.interval = crate::connection::seconds(ruby, "interval", s)?;
    }
    if let Some(n) = batch_size {
        // A negative count is as unworkable as zero: let core say so.
        o.batch_size = usize::try_from(n).unwrap_or(0);
    }
    o.validate().rb(ruby)?;
    Ok((o.interval.as_secs_f64(), o.batch_size))
}

/// Call a store method on whichever store this is, with the GVL released
/// for a file and held (Ruby interrupts raised untouched) for a Ruby
/// connection. A macro because the two stores are two types.
macro_rules! on_store {
    ($ruby:expr, $self:expr, |$s:ident| $body:expr) => {
        match &$self.inner {
            Inner::File($s) => sql::on_file($ruby, || $body),
            Inner::Ruby($s) => sql::on_ruby($ruby, || $body),
        }
    };
}

impl RbOutboxStore {
    fn new_file(
        ruby: &Ruby,
        path: String,
        table: Option<String>,
        worker: Option<String>,
        lease: Option<f64>,
        backoff: Option<f64>,
        max_backoff: Option<f64>,
    ) -> Result<Self, Error> {
        let o = options(ruby, table, worker, lease, backoff, max_backoff)?;
        let store = gvl::without_gvl(ruby, || SqliteConnection::open(&path).and_then(|c| SqlOutboxStore::new(c, o)), || {})?;
        Ok(Self { inner: Inner::File(sql::finish(ruby, store)?), adapter: sql::Kept::default() })
    }

    fn new_ruby(
        ruby: &Ruby,
        adapter: Value,
        table: Option<String>,
        worker: Option<String>,
        lease: Option<f64>,
        backoff: Option<f64>,
        max_backoff: Option<f64>,
    ) -> Result<Self, Error> {
        let o = options(ruby, table, worker, lease, backoff, max_backoff)?;
        sql::begin();
        let source = RbSource::new(ruby, adapter)?;
        let store = SqlOutboxStore::new(source, o);
        Ok(Self { inner: Inner::Ruby(sql::finish(ruby, store)?), adapter: sql::Kept::new(adapter) })
    }

    fn create_schema(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        on_store!(ruby, rb_self, |s| s.create_schema())
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
            id = match &rb_self.inner {
                Inner::File(s) => s.add(&record.inner, conn)?,
                Inner::Ruby(s) => s.add(&record.inner, conn)?,
            };
            Ok(())
        });
        std::hint::black_box(adapter);
        sql::finish(ruby, r.map(|()| id))
    }

    /// (count, seconds the oldest has waited or nil, rows that have failed).
    fn backlog(ruby: &Ruby, rb_self: &Self) -> Result<(u64, Option<f64>, u64), Error> {
        let b = on_store!(ruby, rb_self, |s| s.backlog())?;
        Ok((b.count, b.oldest_age.map(|d| d.as_secs_f64()), b.stuck))
    }

    #[allow(clippy::type_complexity)]
    fn stuck(
        ruby: &Ruby,
        rb_self: &Self,
        limit: usize,
    ) -> Result<Vec<(i64, String, String, String, u32, Option<String>, i64, i64)>, Error> {
        let rows = on_store!(ruby, rb_self, |s| s.stuck(limit))?;
        Ok(rows
            .into_iter()
            .map(|r| (r.id, r.exchange, r.routing_key, r.message_id, r.attempts, r.last_error, r.next_attempt_at, r.created_at))
            .collect())
    }

    /// One sweep: claim up to `batch_size` due rows (SQL on this thread),
    /// deleting `done` in the same commit (confirmed rows whose delete the
    /// last sweep held back), publish them through `mq` and await the
    /// confirms together (without the GVL), settle the results (core's
    /// `settle`, the Rust relay's own bookkeeping) and complete: delete the
    /// confirmed, back off the failed. With `hold` (the started relay), a
    /// sweep in which nothing failed deletes nothing yet and returns the
    /// confirmed ids instead, for `_finish` to hold back or delete; and a
    /// full batch is left in flight (core's `InFlight::worth_it`): returned
    /// unsettled, for the next `_sweep` to settle after its claim, which so
    /// runs while the broker confirms. `previous` is that batch, or nil.
    ///
    /// Returns [claimed, confirmed, failed, again, held ids,
    /// [[exception, exchange, routing_key], …], in flight or nil], the
    /// counts being those of the batch settled last and `again` core's rule
    /// for sweeping again at once; a database error is raised (and `done`
    /// is then not deleted either: those rows, and a batch in flight, are
    /// published again after their lease).
    #[allow(clippy::type_complexity)]
    fn sweep(
        ruby: &Ruby,
        rb_self: &Self,
        mq: &RbConnection,
        batch_size: usize,
        done: Vec<i64>,
        hold: bool,
        previous: Option<&RbInFlight>,
    ) -> Result<(usize, usize, usize, bool, Vec<i64>, RArray, Option<RbInFlight>), Error> {
        let failures = ruby.ary_new();
        // The claim runs while the batch in flight is confirmed.
        let records: Vec<OutboxRecord> = on_store!(ruby, rb_self, |s| s.delete_then_claim(&done, batch_size))?;
        let (mut held, prior) = match previous.and_then(RbInFlight::take) {
            Some(batch) => {
                let settled = gvl::block_on(ruby, batch.settle())?;
                let ids = Self::settled(ruby, rb_self, &settled, &failures)?;
                Self::emit(ruby, rb_self, &settled);
                (ids, settled.swept)
            }
            None => (Vec::new(), Swept::default()),
        };
        if records.is_empty() {
            // The previous batch's rows are deleted by the next claim, now.
            let again = !held.is_empty();
            return Ok((prior.claimed, prior.confirmed, prior.failed, again, held, failures, None));
        }
        // Interrupted here (Thread#kill, Ctrl-C): the rows stay leased and
        // are published again once the lease runs out. Never deleted unconfirmed.
        let confirms = gvl::block_on(ruby, mq.inner.send_batch(&records))?;
        let batch = InFlight::new(records, confirms);
        if hold && InFlight::worth_it(batch.len(), batch_size, &prior) {
            return Ok((prior.claimed, prior.confirmed, prior.failed, true, held, failures, Some(RbInFlight::new(batch))));
        }
        let settled = gvl::block_on(ruby, batch.settle())?;
        let swept = settled.swept;
        held.extend(Self::settled(ruby, rb_self, &settled, &failures)?);
        if !(hold && swept.failed == 0) {
            // Not held: the previous batch's rows go now too.
            on_store!(ruby, rb_self, |s| s.delete_confirmed(&held))?;
            held.clear();
        }
        Self::emit(ruby, rb_self, &settled);
        Ok((swept.claimed, swept.confirmed, swept.failed, swept.again(batch_size), held, failures, None))
    }

    /// A settled batch: its failures added to `failures`, and its confirmed
    /// ids back when nothing failed (for a later claim or `_finish` to
    /// delete); otherwise completed now, after the confirms, never before
    /// (the failed backed off, the confirmed deleted: a crash in between
    /// publishes these again, where deleting first would lose them) and no
    /// ids back. The caller emits its event once what it deletes is gone.
    fn settled(ruby: &Ruby, rb_self: &Self, settled: &Settled, failures: &RArray) -> Result<Vec<i64>, Error> {
        let ids = if settled.swept.failed == 0 {
            settled.completions.iter().map(|c| c.id).collect()
        } else {
            on_store!(ruby, rb_self, |s| s.complete(&settled.completions))?;
            Vec::new()
        };
        for (e, exchange, routing_key) in &settled.failures {
            failures.push((exception(ruby, e.clone()), exchange.as_str(), routing_key.as_str()))?;
        }
        Ok(ids)
    }

    /// The `outbox.acemq` event of a settled batch, with the backlog as it
    /// is now.
    fn emit(ruby: &Ruby, rb_self: &Self, settled: &Settled) {
        if acemq::events::enabled() {
            let backlog = on_store!(ruby, rb_self, |s| s.backlog()).ok().map(|b| (b.count, b.oldest_age));
            let failed = acemq::events::outbox_failures(&settled.completions);
            acemq::events::outbox_swept(settled.swept.claimed, settled.swept.confirmed, failed, backlog);
        }
    }

    /// A stopping relay's batch in flight, settled and completed, with
    /// `held` (ids held back for a claim that is not coming) deleted in the
    /// same statement when nothing failed. Returns [[exception, exchange,
    /// routing_key], …].
    fn settle_in_flight(ruby: &Ruby, rb_self: &Self, batch: &RbInFlight, held: Vec<i64>) -> Result<RArray, Error> {
        let failures = ruby.ary_new();
        let mut held = held;
        let settled = match batch.take() {
            Some(batch) => Some(gvl::block_on(ruby, batch.settle())?),
            None => None,
        };
        if let Some(settled) = &settled {
            held.extend(Self::settled(ruby, rb_self, settled, &failures)?);
        }
        on_store!(ruby, rb_self, |s| s.delete_confirmed(&held))?;
        if let Some(settled) = &settled {
            Self::emit(ruby, rb_self, settled);
        }
        Ok(failures)
    }

    /// What to do with the ids a held sweep returned: core's
    /// `Swept::defer_delete` decides. Held back (returned, for the next
    /// sweep's claim to delete) when that claim comes at once; deleted now
    /// otherwise (an empty array back).
    fn finish(
        ruby: &Ruby,
        rb_self: &Self,
        held: Vec<i64>,
        counts: (usize, usize, usize),
        batch_size: usize,
        woken: bool,
    ) -> Result<Vec<i64>, Error> {
        let swept = acemq::outbox::Swept { claimed: counts.0, confirmed: counts.1, failed: counts.2 };
        if held.is_empty() || swept.defer_delete(batch_size, woken) {
            return Ok(held);
        }
        on_store!(ruby, rb_self, |s| s.delete_confirmed(&held))?;
        Ok(Vec::new())
    }

    /// Delete held-back ids now (a relay stopping).
    fn delete_held(ruby: &Ruby, rb_self: &Self, held: Vec<i64>) -> Result<usize, Error> {
        on_store!(ruby, rb_self, |s| s.delete_confirmed(&held))
    }

    fn wake(&self) -> &LocalWake {
        match &self.inner {
            Inner::File(s) => s.local_wake(),
            Inner::Ruby(s) => s.local_wake(),
        }
    }

    /// Whether a relay on this store can wait on the process-local wake-up.
    /// Only a `path:` store: its claim waits for the adder's commit on
    /// SQLite's write lock without the GVL. A claim through the sqlite3 gem
    /// waits holding the GVL, so the adding thread could never commit
    /// (a stall until the busy timeout); such a relay waits out its interval.
    fn wakes_on_add(&self) -> bool {
        matches!(self.inner, Inner::File(_))
    }

    /// The wake-up counter now (read before a sweep).
    fn wake_seen(&self) -> u64 {
        self.wake().seen()
    }

    /// Wait without the GVL until an add in this process moves the counter
    /// past `seen`, or `timeout` seconds; whether an add did. Interruptible
    /// (Thread#kill, close's `_wake`) between slices.
    fn wait_for_add(ruby: &Ruby, rb_self: &Self, seen: u64, timeout: f64) -> Result<bool, Error> {
        let timeout = crate::connection::seconds(ruby, "interval", timeout)?;
        let wake = rb_self.wake().clone();
        gvl::block_on(ruby, async move { wake.wait_past(seen, timeout).await })
    }

    /// The PostgreSQL channel every add notifies at commit.
    fn channel(&self) -> String {
        match &self.inner {
            Inner::File(s) => s.channel(),
            Inner::Ruby(s) => s.channel(),
        }
    }

    fn schema_sql(ruby: &Ruby, rb_self: &Self, dialect: String) -> Result<Vec<String>, Error> {
        let d = Dialect::parse(&dialect).rb(ruby)?;
        Ok(match &rb_self.inner {
            Inner::File(s) => s.schema_sql(d),
            Inner::Ruby(s) => s.schema_sql(d),
        })
    }

    fn table(&self) -> String {
        match &self.inner {
            Inner::File(s) => s.table().to_owned(),
            Inner::Ruby(s) => s.table().to_owned(),
        }
    }

    fn worker(&self) -> String {
        match &self.inner {
            Inner::File(s) => s.worker_id().to_owned(),
            Inner::Ruby(s) => s.worker_id().to_owned(),
        }
    }
}

/// The Ruby exception object for a core error, as `raise` would have made
/// it (errors::to_ruby gives a class and a message for most kinds).
fn exception(ruby: &Ruby, e: acemq::Error) -> Value {
    let message = e.to_string();
    let error = crate::errors::to_ruby(ruby, e);
    match error.value() {
        Some(v) if Exception::from_value(v).is_some() => v,
        Some(v) => ExceptionClass::from_value(v)
            .and_then(|c| c.new_instance((message.as_str(),)).ok())
            .map(|x| x.as_value())
            .unwrap_or_else(|| ruby.qnil().as_value()),
        None => ruby.qnil().as_value(),
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("SQLOutboxStore", ruby.class_object())?;
    class.define_singleton_method("_new_file", function!(RbOutboxStore::new_file, 6))?;
    class.define_singleton_method("_new_ruby", function!(RbOutboxStore::new_ruby, 6))?;
    class.define_method("create_schema", method!(RbOutboxStore::create_schema, 0))?;
    class.define_private_method("_add", method!(RbOutboxStore::add, 2))?;
    class.define_private_method("_backlog", method!(RbOutboxStore::backlog, 0))?;
    class.define_private_method("_stuck", method!(RbOutboxStore::stuck, 1))?;
    class.define_private_method("_sweep", method!(RbOutboxStore::sweep, 5))?;
    class.define_private_method("_settle_in_flight", method!(RbOutboxStore::settle_in_flight, 2))?;
    class.define_private_method("_finish", method!(RbOutboxStore::finish, 4))?;
    class.define_private_method("_delete_held", method!(RbOutboxStore::delete_held, 1))?;
    class.define_private_method("_wakes_on_add?", method!(RbOutboxStore::wakes_on_add, 0))?;
    class.define_private_method("_wake_seen", method!(RbOutboxStore::wake_seen, 0))?;
    class.define_private_method("_wait_for_add", method!(RbOutboxStore::wait_for_add, 2))?;
    class.define_private_method("_channel", method!(RbOutboxStore::channel, 0))?;
    let relay = patterns.define_class("OutboxRelay", ruby.class_object())?;
    relay.define_singleton_method("_options", function!(relay_options, 2))?;
    super::in_flight::init(ruby, relay)?;
    class.define_private_method("_schema_sql", method!(RbOutboxStore::schema_sql, 1))?;
    class.define_method("table", method!(RbOutboxStore::table, 0))?;
    class.define_method("worker", method!(RbOutboxStore::worker, 0))?;
    Ok(())
}
