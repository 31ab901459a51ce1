//! The shared throttle's statements on each database (core/src/throttle.rs):
//! SQLite always, PostgreSQL when `DATABASE_URL` is set (with `--features
//! postgres`), MySQL or MariaDB when `MYSQL_URL` is (with `--features mysql`).
//! The same window, lease by lease: leases of 2 up to 24 of 25, then the
//! rest (1), then nothing until the window ends; the next window afresh; a
//! clock behind it gets nothing. Each run has a table of its own, dropped.

use acemq::sql::AsyncConnectionSource;
use acemq::throttle::{lease_size, AsyncSqlThrottleStore, Lease};
use acemq::Throttle;
use std::time::Duration;

async fn one_window<S: AsyncConnectionSource>(what: &str, source: S) {
    let table = format!("t_throttle_{}", std::process::id());
    let store = AsyncSqlThrottleStore::new(source).with_table(&table).unwrap();
    let t = Throttle::new(25, Duration::from_secs(1));
    let at = 1_000_000;
    let mut granted = Vec::new();
    loop {
        let l = store.lease_at("payments", t, lease_size(25), at + 10).await.unwrap();
        assert_eq!(l.until_ms, at + 1000, "{what}");
        if l.tokens == 0 {
            break;
        }
        granted.push(l.tokens);
    }
    assert_eq!(granted, [vec![2; 12], vec![1]].concat(), "{what}");
    assert_eq!(store.lease_at("payments", t, 2, at + 1000).await.unwrap(), Lease { tokens: 2, until_ms: at + 2000 }, "{what}");
    assert_eq!(store.lease_at("payments", t, 2, at + 999).await.unwrap(), Lease { tokens: 0, until_ms: at + 1000 }, "{what}");
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn drop_table<S: AsyncConnectionSource>(source: &S) {
    use acemq::sql::AsyncSqlConnection;
    let table = format!("t_throttle_{}", std::process::id());
    source.connection().await.unwrap().execute(&format!("DROP TABLE IF EXISTS {table}"), &[]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_is_leased_the_same_on_every_database() {
    let file = std::env::temp_dir().join(format!("acemq-throttle-{}.db", std::process::id()));
    let path = file.to_str().unwrap().to_owned();
    one_window("SQLite", acemq::sql::AsyncSqliteConnection::open(&path).await.unwrap()).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let pg = std::sync::Arc::new(acemq::sql::PgConnection::connect(&url).await.unwrap());
        drop_table(&pg).await;
        one_window("PostgreSQL", pg.clone()).await;
        drop_table(&pg).await;
    }
    #[cfg(feature = "mysql")]
    if let Ok(url) = std::env::var("MYSQL_URL") {
        let my = std::sync::Arc::new(acemq::sql::MysqlConnection::connect(&url).await.unwrap());
        drop_table(&my).await;
        one_window("MySQL", my.clone()).await;
        drop_table(&my).await;
    }
}
