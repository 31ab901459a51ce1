//! The Ruby side of the SQL seam: a connection adapter built by
//! `AceMQ::AMQP::SQL.connect` (lib/acemq/amqp/sql.rb) behind core's
//! `SqlConnection`, so core's stores run their SQL through whatever driver
//! the application already uses.
//!
//! The adapter answers three methods — `dialect`, `execute(sql, params)`
//! (rows changed) and `query(sql, params)` (rows as arrays, in SELECT order)
//! — and is called with the GVL held, on the calling Ruby thread: a Ruby
//! driver can only be used there. A per-call adapter (`connection: -> { … }`)
//! also answers `checkout`, called once per store operation for the
//! connection to use for that operation.
//!
//! A Ruby exception raised by the adapter becomes a core store error, so the
//! store's own rules (a failing claim is a retry) apply. One that is not a
//! StandardError (`Thread#kill`, `Interrupt`, `throw`) is kept here and
//! raised again, untouched, when the native call returns: see [`finish`].

use acemq::sql::{ConnectionSource, Dialect, Row, SqlConnection, SqlValue, SqliteConnection};
use acemq::ErrorKind;
use magnus::value::{Opaque, ReprValue};
use magnus::{prelude::*, Error, IntoValue, RArray, RModule, RString, Ruby, Value};
use std::cell::RefCell;

thread_local! {
    // A Ruby error that must reach Ruby as it was (not a StandardError).
    // While one is pending no further Ruby code is called, so nothing can
    // collect the exception before `finish` raises it.
    static PENDING: RefCell<Option<Error>> = const { RefCell::new(None) };
}

fn pending() -> bool {
    PENDING.with(|p| p.borrow().is_some())
}

/// A Ruby error raised by a callback (an adapter method, a store object's
/// `first_time?`) as a core store error. A StandardError becomes the store
/// error with its class and message; anything else is kept to be raised
/// again untouched by [`finish`].
pub(crate) fn from_ruby(ruby: &Ruby, e: Error, doing: &str) -> acemq::Error {
    if e.is_kind_of(ruby.exception_standard_error()) {
        let class = e
            .value()
            .map(|v| unsafe { v.classname() }.into_owned())
            .unwrap_or_else(|| "StandardError".to_string());
        let message = e
            .value()
            .and_then(|v| v.funcall::<_, _, String>("message", ()).ok())
            .unwrap_or_else(|| e.to_string());
        acemq::Error::new(ErrorKind::Store, format!("{doing} raised {class}: {message}"))
    } else {
        PENDING.with(|p| *p.borrow_mut() = Some(e));
        acemq::Error::new(ErrorKind::Store, format!("{doing} was interrupted"))
    }
}

/// Call a Ruby method for a core callback, unless an interrupt is already
/// pending (then Ruby is not called again until it has been raised).
pub(crate) fn call<T, A>(ruby: &Ruby, recv: Value, method: &str, args: A, doing: &str) -> acemq::Result<T>
where
    T: magnus::TryConvert,
    A: magnus::ArgList,
{
    if pending() {
        return Err(acemq::Error::new(ErrorKind::Store, format!("{doing} was not attempted: interrupted")));
    }
    recv.funcall(method, args).map_err(|e| from_ruby(ruby, e, doing))
}

/// The end of every native call that may have called Ruby: raise a pending
/// interrupt untouched, else map a core error onto its Ruby class.
pub(crate) fn finish<T>(ruby: &Ruby, r: acemq::Result<T>) -> Result<T, Error> {
    if let Some(e) = PENDING.with(|p| p.borrow_mut().take()) {
        return Err(e);
    }
    r.map_err(|e| crate::errors::to_ruby(ruby, e))
}

/// Clear anything left over from an earlier call on this thread (a call
/// that panicked between stashing and finishing).
pub(crate) fn begin() {
    PENDING.with(|p| *p.borrow_mut() = None);
}

/// A store call over a SQLite file the library opened: without the GVL.
pub(crate) fn on_file<R>(ruby: &Ruby, f: impl FnOnce() -> acemq::Result<R>) -> Result<R, Error> {
    let r = crate::gvl::without_gvl(ruby, f, || {})?;
    finish(ruby, r)
}

/// A store call over the application's Ruby connection: with the GVL held
/// (a Ruby driver can be used nowhere else), a Ruby interrupt raised
/// untouched at the end.
pub(crate) fn on_ruby<R>(ruby: &Ruby, f: impl FnOnce() -> acemq::Result<R>) -> Result<R, Error> {
    begin();
    let r = f();
    finish(ruby, r)
}

/// Where a SQL store's statements run: a SQLite file the library opened
/// (rusqlite; no Ruby is called, so the GVL can be released around each
/// call) or the application's own connection through its Ruby adapter.
pub(crate) enum StoreSource {
    File(SqliteConnection),
    Ruby(RbSource),
}

impl ConnectionSource for StoreSource {
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> acemq::Result<()>) -> acemq::Result<()> {
        match self {
            StoreSource::File(c) => c.with_connection(f),
            StoreSource::Ruby(s) => s.with_connection(f),
        }
    }
}

/// One of core's SQL stores (the idempotency keys, the outbox) as a Ruby
/// object's contents, over a [`StoreSource`]: built from `path:` or
/// `connection:`, and every call made the way its source needs — without
/// the GVL for a file, with it (Ruby interrupts raised untouched) for a
/// Ruby connection, on the calling thread.
pub(crate) struct SqlStore<S> {
    store: S,
    /// The Ruby adapter, marked for as long as the store lives; none for a file.
    adapter: MarkedAdapter,
}

impl<S> SqlStore<S> {
    /// Build the store from `path:` or from `connection:`'s adapter (what
    /// `SQL.connect` returned): exactly one, as the Ruby side checks.
    pub(crate) fn open(
        ruby: &Ruby,
        path: Option<String>,
        adapter: Option<Value>,
        build: impl FnOnce(StoreSource) -> acemq::Result<S>,
    ) -> Result<Self, Error> {
        match (path, adapter) {
            (Some(path), None) => Self::open_file(ruby, &path, build),
            (None, Some(adapter)) => Self::over_ruby(ruby, adapter, build),
            _ => Err(Error::new(ruby.exception_arg_error(), "a SQL store takes path: or connection:, exactly one")),
        }
    }

    /// Open the SQLite file at `path` (without the GVL: opening may wait on
    /// a lock) and build the store on it.
    fn open_file(
        ruby: &Ruby,
        path: &str,
        build: impl FnOnce(StoreSource) -> acemq::Result<S>,
    ) -> Result<Self, Error> {
        let open = || SqliteConnection::open(path).and_then(|c| build(StoreSource::File(c)));
        let store = crate::gvl::without_gvl(ruby, open, || {})?;
        Ok(SqlStore { store: finish(ruby, store)?, adapter: MarkedAdapter::default() })
    }

    /// Build the store over `adapter`.
    fn over_ruby(ruby: &Ruby, adapter: Value, build: impl FnOnce(StoreSource) -> acemq::Result<S>) -> Result<Self, Error> {
        begin();
        let source = RbSource::new(ruby, adapter)?;
        let store = build(StoreSource::Ruby(source));
        Ok(SqlStore { store: finish(ruby, store)?, adapter: MarkedAdapter::new(adapter) })
    }

    /// The store, for what calls no SQL (its table, its worker id).
    pub(crate) fn get(&self) -> &S {
        &self.store
    }

    /// Whether the store is over a file the library opened.
    pub(crate) fn on_file(&self) -> bool {
        self.adapter.0.is_none()
    }

    pub(crate) fn mark(&self, marker: &magnus::gc::Marker) {
        self.adapter.mark(marker);
    }

    /// Run `f` on the store, a core error raised as its Ruby class.
    pub(crate) fn call<R>(&self, ruby: &Ruby, f: impl FnOnce(&S) -> acemq::Result<R>) -> Result<R, Error> {
        if self.on_file() {
            on_file(ruby, || f(&self.store))
        } else {
            on_ruby(ruby, || f(&self.store))
        }
    }

    /// Run `f` on the store with its result kept as core's, for a caller
    /// that reads it (the guard, the relay's cycle): only a Ruby interrupt
    /// (or a panic) is the outer error.
    pub(crate) fn kept<R>(&self, ruby: &Ruby, f: impl FnOnce(&S) -> R) -> Result<R, Error> {
        if self.on_file() {
            crate::gvl::without_gvl(ruby, || f(&self.store), || {})
        } else {
            on_ruby(ruby, || Ok(f(&self.store)))
        }
    }
}

/// The Ruby adapter a store calls, kept alive by the GC for as long as the
/// store: a store's `mark` marks it.
#[derive(Default, Clone, Copy)]
pub(crate) struct MarkedAdapter(Option<Opaque<Value>>);

impl MarkedAdapter {
    pub(crate) fn new(v: Value) -> Self {
        MarkedAdapter(Some(v.into()))
    }

    pub(crate) fn mark(&self, marker: &magnus::gc::Marker) {
        if let Some(a) = self.0 {
            marker.mark(a);
        }
    }
}

fn ruby_handle() -> acemq::Result<Ruby> {
    Ruby::get().map_err(|_| {
        acemq::Error::new(ErrorKind::Store, "a Ruby SQL connection was used off a Ruby thread (this is a bug in acemq)")
    })
}

fn params_to_ruby(ruby: &Ruby, params: &[SqlValue]) -> RArray {
    let arr = ruby.ary_new_capa(params.len());
    for p in params {
        let v: Value = match p {
            SqlValue::Null => ruby.qnil().as_value(),
            SqlValue::Int(i) => i.into_value_with(ruby),
            SqlValue::Real(f) => f.into_value_with(ruby),
            // str_new makes a UTF-8 string: bound as TEXT, never as a BLOB.
            SqlValue::Text(s) => ruby.str_new(s).as_value(),
        };
        let _ = arr.push(v);
    }
    arr
}

fn value_from_ruby(ruby: &Ruby, v: Value) -> acemq::Result<SqlValue> {
    if v.is_nil() {
        return Ok(SqlValue::Null);
    }
    if let Some(s) = RString::from_value(v) {
        let bytes = unsafe { s.as_slice() };
        return Ok(SqlValue::Text(String::from_utf8_lossy(bytes).into_owned()));
    }
    if v.is_kind_of(ruby.class_integer()) {
        return i64::try_convert(v)
            .map(SqlValue::Int)
            .map_err(|e| acemq::Error::new(ErrorKind::Store, format!("an integer column is out of range: {e}")));
    }
    if v.is_kind_of(ruby.class_float()) {
        return f64::try_convert(v).map(SqlValue::Real).map_err(|e| acemq::Error::new(ErrorKind::Store, e.to_string()));
    }
    if v.is_kind_of(ruby.class_true_class()) {
        return Ok(SqlValue::Int(1));
    }
    if v.is_kind_of(ruby.class_false_class()) {
        return Ok(SqlValue::Int(0));
    }
    let text: String = call(ruby, v, "to_s", (), "converting a column value")?;
    Ok(SqlValue::Text(text))
}

/// One Ruby adapter as a core connection, for the length of one store call.
struct RbSqlConnection {
    adapter: Value,
    dialect: Dialect,
}

impl SqlConnection for RbSqlConnection {
    fn dialect(&self) -> Dialect {
        self.dialect
    }

    fn execute(&self, sql: &str, params: &[SqlValue]) -> acemq::Result<u64> {
        let ruby = ruby_handle()?;
        let n: i64 = call(&ruby, self.adapter, "execute", (sql, params_to_ruby(&ruby, params)), "the SQL connection's execute")?;
        Ok(n.max(0) as u64)
    }

    fn query(&self, sql: &str, params: &[SqlValue]) -> acemq::Result<Vec<Row>> {
        let ruby = ruby_handle()?;
        let rows: RArray = call(&ruby, self.adapter, "query", (sql, params_to_ruby(&ruby, params)), "the SQL connection's query")?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows.into_iter() {
            let row = RArray::from_value(row).ok_or_else(|| {
                acemq::Error::new(ErrorKind::Store, "the SQL connection's query returned a row that is not an Array (a bug in the adapter)")
            })?;
            let mut cols = Vec::with_capacity(row.len());
            for v in row.into_iter() {
                cols.push(value_from_ruby(&ruby, v)?);
            }
            out.push(cols);
        }
        Ok(out)
    }
}

/// A store's connection source over a Ruby adapter: either one adapter used
/// for every call, or a per-call adapter asked to `checkout` one each time.
pub(crate) struct RbSource {
    adapter: Opaque<Value>,
    per_call: bool,
    dialect: Option<Dialect>,
}

impl RbSource {
    /// Over `adapter` (what `SQL.connect` returned). The dialect of a fixed
    /// adapter is read once, here.
    pub(crate) fn new(ruby: &Ruby, adapter: Value) -> Result<Self, Error> {
        let per_call = adapter.respond_to("checkout", false)?;
        let dialect = if per_call {
            None
        } else {
            let name: String = adapter.funcall("dialect", ())?;
            Some(Dialect::parse(&name).map_err(|e| crate::errors::to_ruby(ruby, e))?)
        };
        Ok(RbSource { adapter: adapter.into(), per_call, dialect })
    }
}

impl ConnectionSource for RbSource {
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> acemq::Result<()>) -> acemq::Result<()> {
        let ruby = ruby_handle()?;
        let adapter = ruby.get_inner(self.adapter);
        let conn = if self.per_call {
            let conn: Value = call(&ruby, adapter, "checkout", (), "the connection: callable")?;
            let name: String = call(&ruby, conn, "dialect", (), "the SQL connection's dialect")?;
            RbSqlConnection { adapter: conn, dialect: Dialect::parse(&name)? }
        } else {
            RbSqlConnection { adapter, dialect: self.dialect.unwrap_or(Dialect::Sqlite) }
        };
        // `conn.adapter` lives on this stack frame for the whole call, which
        // is where Ruby's conservative GC looks for it.
        let r = f(&conn);
        std::hint::black_box(&conn.adapter);
        r
    }
}

pub fn init(_ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    // How long a delivery waits round the ladder while the database is
    // away: core's, the same wait the idempotent guard gives a store that fails.
    let sql = amqp.define_module("SQL")?;
    sql.const_set("OUTAGE_WAIT", acemq::idempotency::STORE_OUTAGE_WAIT.as_secs_f64())?;
    Ok(())
}
