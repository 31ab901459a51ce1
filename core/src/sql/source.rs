//! Where the SQL store gets a connection: one it owns, or one per call.

use crate::error::{Error, Result};
use crate::sql::SqlConnection;

/// Lends the SQL store a connection for the length of one call.
///
/// Either a connection the store owns (every [`SqlConnection`] is a source
/// of itself), or something that yields one per call — a pool, or on the
/// Ruby side `connection: -> { Thread.current[:db] }` — so each call uses the
/// caller's connection and, with it, the caller's transaction.
///
/// Object safe and without a `Send` bound: a source over Ruby objects must be
/// called on a Ruby thread, and the store inherits `Send`/`Sync` from its
/// source rather than demanding them.
pub trait ConnectionSource {
    /// Call `f` once with a connection and return what it returns.
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> Result<()>) -> Result<()>;
}

impl<C: SqlConnection> ConnectionSource for C {
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> Result<()>) -> Result<()> {
        f(self)
    }
}

impl ConnectionSource for Box<dyn SqlConnection> {
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> Result<()>) -> Result<()> {
        f(self.as_ref())
    }
}

impl ConnectionSource for Box<dyn ConnectionSource> {
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> Result<()>) -> Result<()> {
        self.as_ref().with_connection(f)
    }
}

/// A source that calls a function for a connection on every store call
/// (a pool checkout, a thread-local connection).
pub struct PerCall<F>(pub F);

impl<F, C> ConnectionSource for PerCall<F>
where
    F: Fn() -> Result<C>,
    C: SqlConnection,
{
    fn with_connection(&self, f: &mut dyn FnMut(&dyn SqlConnection) -> Result<()>) -> Result<()> {
        let conn = (self.0)()?;
        f(&conn)
    }
}

/// Run `f` once on the connection `source` lends and return what it
/// returns: the one way a blocking store gets its result out of
/// [`ConnectionSource::with_connection`]. `doing` names the call in the
/// error of a source that never lends one.
pub(crate) fn lend<R>(source: &(impl ConnectionSource + ?Sized), doing: &str, f: impl FnOnce(&dyn SqlConnection) -> Result<R>) -> Result<R> {
    let mut f = Some(f);
    let mut out = None;
    source.with_connection(&mut |c| {
        let f = f.take().ok_or_else(|| Error::store("connection source called the store twice"))?;
        out = Some(f(c)?);
        Ok(())
    })?;
    out.ok_or_else(|| Error::store(format!("cannot {doing}: the connection source never lent a connection")))
}
