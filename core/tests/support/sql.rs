//! Either database behind one type (SQLite always; PostgreSQL and MySQL with
//! their features), for the tests of the SQL stores.
#![allow(dead_code)] // each test crate uses its own part of it

use acemq::sql::{AsyncConnectionSource, AsyncSqlConnection, AsyncSqliteConnection, Dialect, Row, SqlValue};
use std::future::Future;

/// Either database behind one type, so each scenario is written once: what
/// a service with its own pool or driver writes to plug it into the stores.
#[allow(clippy::large_enum_variant)] // one per test
pub enum Source {
    Sqlite(AsyncSqliteConnection),
    #[cfg(feature = "postgres")]
    Pg(acemq::sql::PgConnection),
    #[cfg(feature = "mysql")]
    My(acemq::sql::MysqlConnection),
}

pub enum Session<'a> {
    Sqlite(acemq::sql::AsyncSqliteSession<'a>),
    #[cfg(feature = "postgres")]
    Pg(acemq::sql::PgSession<'a>),
    #[cfg(feature = "mysql")]
    My(acemq::sql::MysqlSession<'a>),
}

impl AsyncConnectionSource for Source {
    type Connection<'a> = Session<'a>;

    async fn connection(&self) -> acemq::Result<Session<'_>> {
        Ok(match self {
            Source::Sqlite(s) => Session::Sqlite(s.connection().await?),
            #[cfg(feature = "postgres")]
            Source::Pg(s) => Session::Pg(s.connection().await?),
            #[cfg(feature = "mysql")]
            Source::My(s) => Session::My(s.connection().await?),
        })
    }

    fn listen(&self, channel: &str, notified: acemq::sql::Notified, stop: tokio::sync::watch::Receiver<bool>) -> bool {
        match self {
            Source::Sqlite(s) => s.listen(channel, notified, stop),
            #[cfg(feature = "postgres")]
            Source::Pg(s) => s.listen(channel, notified, stop),
            #[cfg(feature = "mysql")]
            Source::My(s) => s.listen(channel, notified, stop),
        }
    }
}

impl AsyncSqlConnection for Session<'_> {
    fn dialect(&self) -> Dialect {
        match self {
            Session::Sqlite(s) => s.dialect(),
            #[cfg(feature = "postgres")]
            Session::Pg(s) => s.dialect(),
            #[cfg(feature = "mysql")]
            Session::My(s) => s.dialect(),
        }
    }

    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = acemq::Result<u64>> + Send + 'a {
        async move {
            match self {
                Session::Sqlite(s) => s.execute(sql, params).await,
                #[cfg(feature = "postgres")]
                Session::Pg(s) => s.execute(sql, params).await,
                #[cfg(feature = "mysql")]
                Session::My(s) => s.execute(sql, params).await,
            }
        }
    }

    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = acemq::Result<Vec<Row>>> + Send + 'a {
        async move {
            match self {
                Session::Sqlite(s) => s.query(sql, params).await,
                #[cfg(feature = "postgres")]
                Session::Pg(s) => s.query(sql, params).await,
                #[cfg(feature = "mysql")]
                Session::My(s) => s.query(sql, params).await,
            }
        }
    }
}
