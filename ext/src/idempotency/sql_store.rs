//! AceMQ::AMQP::Patterns::SQLIdempotencyStore: core's SQL store, over a
//! SQLite file the library opens itself (`path:`, rusqlite, GVL released) or
//! over the application's own Ruby connection (`connection:`, through
//! `SQL.connect`'s adapter, GVL held). lib/acemq/amqp/patterns/
//! sql_idempotency_store.rb adds the keywords.

use super::{required_key, seconds};
use crate::gvl;
use crate::errors::IntoRuby;
use crate::sql::{self, RbSource};
use acemq::idempotency::{IdempotencyStore, SqlIdempotencyOptions, SqlIdempotencyStore};
use acemq::sql::{Dialect, SqliteConnection};
use magnus::{function, method, prelude::*, typed_data::DataTypeFunctions, Error, RModule, Ruby, Value};

pub(crate) enum Inner {
    /// A SQLite file opened by the library: no Ruby is called, so the GVL is
    /// released around every statement.
    File(SqlIdempotencyStore<SqliteConnection>),
    /// The application's connection, called with the GVL held.
    Ruby(SqlIdempotencyStore<RbSource>),
}

#[derive(magnus::TypedData)]
#[magnus(class = "AceMQ::AMQP::Patterns::SQLIdempotencyStore", free_immediately, size, mark)]
pub struct RbSqlStore {
    pub(crate) inner: Inner,
    adapter: sql::MarkedAdapter,
}

impl DataTypeFunctions for RbSqlStore {
    fn mark(&self, marker: &magnus::gc::Marker) {
        self.adapter.mark(marker);
    }
}

/// `nil` for what the caller left out: core has the defaults (and the
/// rules that refuse what cannot work).
fn options(
    ruby: &Ruby,
    table: Option<String>,
    retention: Option<f64>,
    claim_timeout: Option<f64>,
    worker: Option<String>,
) -> Result<SqlIdempotencyOptions, Error> {
    let retention = retention.map(|r| seconds(ruby, "retention", r)).transpose()?;
    let claim_timeout = claim_timeout.map(|c| seconds(ruby, "claim_timeout", c)).transpose()?;
    Ok(SqlIdempotencyOptions::with(table, retention, claim_timeout, worker))
}

impl RbSqlStore {
    fn new_file(
        ruby: &Ruby,
        path: String,
        table: Option<String>,
        retention: Option<f64>,
        claim_timeout: Option<f64>,
        worker: Option<String>,
    ) -> Result<Self, Error> {
        let o = options(ruby, table, retention, claim_timeout, worker)?;
        let conn = gvl::without_gvl(ruby, || SqliteConnection::open(&path), || {})?;
        let store = conn.and_then(|c| SqlIdempotencyStore::new(c, o));
        Ok(Self { inner: Inner::File(sql::finish(ruby, store)?), adapter: sql::MarkedAdapter::default() })
    }

    fn new_ruby(
        ruby: &Ruby,
        adapter: Value,
        table: Option<String>,
        retention: Option<f64>,
        claim_timeout: Option<f64>,
        worker: Option<String>,
    ) -> Result<Self, Error> {
        let o = options(ruby, table, retention, claim_timeout, worker)?;
        sql::begin();
        let source = RbSource::new(ruby, adapter)?;
        let store = SqlIdempotencyStore::new(source, o);
        Ok(Self { inner: Inner::Ruby(sql::finish(ruby, store)?), adapter: sql::MarkedAdapter::new(adapter) })
    }

    /// Run `f` on the store: without the GVL for a file, with it (and with
    /// Ruby interrupts raised untouched) for a Ruby connection.
    pub(crate) fn run<R>(&self, ruby: &Ruby, f: impl FnOnce(&dyn IdempotencyStore) -> R) -> Result<R, Error> {
        match &self.inner {
            Inner::File(store) => sql::on_file(ruby, || Ok(f(store))),
            Inner::Ruby(store) => sql::on_ruby(ruby, || Ok(f(store))),
        }
    }

    fn with<R>(
        &self,
        ruby: &Ruby,
        file: impl FnOnce(&SqlIdempotencyStore<SqliteConnection>) -> acemq::Result<R>,
        rb: impl FnOnce(&SqlIdempotencyStore<RbSource>) -> acemq::Result<R>,
    ) -> Result<R, Error> {
        match &self.inner {
            Inner::File(store) => sql::on_file(ruby, || file(store)),
            Inner::Ruby(store) => sql::on_ruby(ruby, || rb(store)),
        }
    }

    fn create_schema(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        rb_self.with(ruby, |s| s.create_schema(), |s| s.create_schema())
    }

    fn purge_expired(ruby: &Ruby, rb_self: &Self) -> Result<u64, Error> {
        rb_self.with(ruby, |s| s.purge_expired(), |s| s.purge_expired())
    }

    fn first_time(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<bool, Error> {
        let key = required_key(ruby, key)?;
        let r = rb_self.run(ruby, |s| s.first_time(&key))?;
        sql::finish(ruby, r)
    }

    fn confirm(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<(), Error> {
        let key = required_key(ruby, key)?;
        let r = rb_self.run(ruby, |s| s.confirm(&key))?;
        sql::finish(ruby, r)
    }

    fn forget(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<(), Error> {
        let key = required_key(ruby, key)?;
        let r = rb_self.run(ruby, |s| s.forget(&key))?;
        sql::finish(ruby, r)
    }

    fn confirmed(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<bool, Error> {
        let key = required_key(ruby, key)?;
        let r = rb_self.run(ruby, |s| s.confirmed(&key))?;
        sql::finish(ruby, r)
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
            Inner::File(s) => s.options().table.clone(),
            Inner::Ruby(s) => s.options().table.clone(),
        }
    }

    /// Seconds a claim lives before another worker may take it over.
    fn claim_timeout(&self) -> f64 {
        match &self.inner {
            Inner::File(s) => s.options().claim_timeout.as_secs_f64(),
            Inner::Ruby(s) => s.options().claim_timeout.as_secs_f64(),
        }
    }

    fn worker(&self) -> String {
        match &self.inner {
            Inner::File(s) => s.worker(),
            Inner::Ruby(s) => s.worker(),
        }
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("SQLIdempotencyStore", ruby.class_object())?;
    class.define_singleton_method("_new_file", function!(RbSqlStore::new_file, 5))?;
    class.define_singleton_method("_new_ruby", function!(RbSqlStore::new_ruby, 5))?;
    class.define_method("create_schema", method!(RbSqlStore::create_schema, 0))?;
    class.define_method("purge_expired", method!(RbSqlStore::purge_expired, 0))?;
    class.define_method("first_time?", method!(RbSqlStore::first_time, 1))?;
    class.define_method("confirm", method!(RbSqlStore::confirm, 1))?;
    class.define_method("forget", method!(RbSqlStore::forget, 1))?;
    class.define_method("confirmed?", method!(RbSqlStore::confirmed, 1))?;
    class.define_private_method("_schema_sql", method!(RbSqlStore::schema_sql, 1))?;
    class.define_method("table", method!(RbSqlStore::table, 0))?;
    class.define_method("worker", method!(RbSqlStore::worker, 0))?;
    class.define_method("claim_timeout", method!(RbSqlStore::claim_timeout, 0))?;
    Ok(())
}
