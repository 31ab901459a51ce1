//! AceMQ::AMQP::Patterns::SQLIdempotencyStore: core's SQL store, over a
//! SQLite file the library opens itself (`path:`, rusqlite, GVL released) or
//! over the application's own Ruby connection (`connection:`, through
//! `SQL.connect`'s adapter, GVL held). lib/acemq/amqp/patterns/
//! sql_idempotency_store.rb adds the keywords.

use super::{required_key, seconds};
use crate::errors::IntoRuby;
use crate::keywords::Keywords;
use crate::sql::{self, StoreSource};
use acemq::idempotency::{IdempotencyStore, SqlIdempotencyOptions, SqlIdempotencyStore, TimeColumns};
use acemq::sql::Dialect;
use magnus::{function, method, prelude::*, typed_data::DataTypeFunctions, Error, RHash, RModule, Ruby, Value};

#[derive(magnus::TypedData)]
#[magnus(class = "AceMQ::AMQP::Patterns::SQLIdempotencyStore", free_immediately, size, mark)]
pub struct RbSqlStore(sql::SqlStore<SqlIdempotencyStore<StoreSource>>);

impl DataTypeFunctions for RbSqlStore {
    fn mark(&self, marker: &magnus::gc::Marker) {
        self.0.mark(marker);
    }
}

/// Absent or nil for what the caller left out: core has the defaults (and
/// the rules that refuse what cannot work).
fn options(ruby: &Ruby, kw: &Keywords) -> Result<SqlIdempotencyOptions, Error> {
    let retention = kw.get::<f64>("retention")?.map(|r| seconds(ruby, "retention", r)).transpose()?;
    let claim_timeout = kw.get::<f64>("claim_timeout")?.map(|c| seconds(ruby, "claim_timeout", c)).transpose()?;
    Ok(SqlIdempotencyOptions::with(kw.get("table")?, retention, claim_timeout, kw.get("worker")?))
}

/// `times:`, the kind of the table's time columns; None (absent) is core's.
fn time_columns(ruby: &Ruby, times: Option<String>) -> Result<Option<TimeColumns>, Error> {
    match times.as_deref() {
        None => Ok(None),
        Some("epoch_ms") => Ok(Some(TimeColumns::EpochMillis)),
        Some("datetime") => Ok(Some(TimeColumns::DatetimeUtc)),
        Some(other) => Err(Error::new(
            ruby.get_inner(&crate::errors::CONFIGURATION_ERROR),
            format!(
                "times: {other:?} is not a kind of time column: give :epoch_ms (integers, the table \
                 create_schema makes) or :datetime (UTC datetimes, the guide's ActiveRecord migration)"
            ),
        )),
    }
}

impl RbSqlStore {
    /// By name: on the SQLite file at `path`, or over `adapter`
    /// (`connection:`), on a table whose times are `times` ("epoch_ms" or
    /// "datetime").
    fn new(ruby: &Ruby, keywords: RHash) -> Result<Self, Error> {
        const KNOWN: &[&str] = &["path", "adapter", "table", "retention", "claim_timeout", "worker", "times"];
        let kw = Keywords::read(ruby, keywords, "SQLIdempotencyStore._new", KNOWN)?;
        let times = time_columns(ruby, kw.get("times")?)?;
        let o = options(ruby, &kw)?;
        sql::SqlStore::open(ruby, kw.get("path")?, kw.get("adapter")?, |source| {
            SqlIdempotencyStore::new(source, o).map(|s| match times {
                Some(t) => s.with_time_columns(t),
                None => s,
            })
        })
        .map(Self)
    }

    /// Run `f` on the store as core sees it, for the guard: its result is
    /// core's, only a Ruby interrupt is the outer error.
    pub(crate) fn run<R>(&self, ruby: &Ruby, f: impl FnOnce(&dyn IdempotencyStore) -> R) -> Result<R, Error> {
        self.0.kept(ruby, |s| f(s))
    }

    fn create_schema(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        rb_self.0.call(ruby, |s| s.create_schema())
    }

    fn purge_expired(ruby: &Ruby, rb_self: &Self) -> Result<u64, Error> {
        rb_self.0.call(ruby, |s| s.purge_expired())
    }

    fn first_time(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<bool, Error> {
        let key = required_key(ruby, key)?;
        rb_self.0.call(ruby, |s| s.first_time(&key))
    }

    fn confirm(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<(), Error> {
        let key = required_key(ruby, key)?;
        rb_self.0.call(ruby, |s| s.confirm(&key))
    }

    fn forget(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<(), Error> {
        let key = required_key(ruby, key)?;
        rb_self.0.call(ruby, |s| s.forget(&key))
    }

    fn confirmed(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<bool, Error> {
        let key = required_key(ruby, key)?;
        rb_self.0.call(ruby, |s| s.confirmed(&key))
    }

    fn schema_sql(ruby: &Ruby, rb_self: &Self, dialect: String) -> Result<Vec<String>, Error> {
        let d = Dialect::parse(&dialect).rb(ruby)?;
        Ok(rb_self.0.get().schema_sql(d))
    }

    fn table(&self) -> String {
        self.0.get().options().table.clone()
    }

    /// Seconds a claim lives before another worker may take it over.
    fn claim_timeout(&self) -> f64 {
        self.0.get().options().claim_timeout.as_secs_f64()
    }

    fn worker(&self) -> String {
        self.0.get().worker()
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("SQLIdempotencyStore", ruby.class_object())?;
    // Core's defaults, for the Ruby stores on other tables
    // (Rails::ActiveRecordIdempotencyStore) to use rather than repeat.
    class.const_set("DEFAULT_TABLE", acemq::idempotency::DEFAULT_TABLE)?;
    class.const_set("DEFAULT_RETENTION", acemq::idempotency::DEFAULT_RETENTION.as_secs_f64())?;
    class.const_set("DEFAULT_CLAIM_TIMEOUT", acemq::idempotency::DEFAULT_CLAIM_TIMEOUT.as_secs_f64())?;
    class.define_singleton_method("_new", function!(RbSqlStore::new, 1))?;
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
