//! What a shared throttle's lease costs (docs/flow.md): the lease's round
//! trip (one UPDATE when granted) against the same connection's `SELECT 1`,
//! measured in the same run, alternated, medians.
//!
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p acemq --features postgres --example throttle_lease
//! (MYSQL_URL=mysql://root@127.0.0.1:3306/test with --features mysql too.)

#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn measure<S: acemq::sql::AsyncConnectionSource>(what: &str, source: std::sync::Arc<S>) {
    use acemq::sql::AsyncSqlConnection;
    use acemq::throttle::AsyncSqlThrottleStore;
    use std::time::{Duration, Instant};
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(2000);
    let store = AsyncSqlThrottleStore::new(source.clone());
    // A limit no run reaches: every lease is granted by the one UPDATE.
    let throttle = acemq::Throttle::new(u32::MAX, Duration::from_secs(3600));
    let name = format!("bench-{}", acemq::new_id());
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    store.lease_at(&name, throttle, 100, now()).await.unwrap();
    let (mut lease, mut select) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        let t = Instant::now();
        let granted = store.lease_at(&name, throttle, 100, now()).await.unwrap();
        lease.push(t.elapsed());
        assert_eq!(granted.tokens, 100);
        let t = Instant::now();
        source.connection().await.unwrap().query("SELECT 1", &[]).await.unwrap();
        select.push(t.elapsed());
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (l, s) = (median(&mut lease), median(&mut select));
    println!(
        "{what}: lease (one UPDATE) median {:.0} µs, SELECT 1 median {:.0} µs: {:.2}x ({runs} each, alternated)",
        l.as_secs_f64() * 1e6,
        s.as_secs_f64() * 1e6,
        l.as_secs_f64() / s.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        measure("PostgreSQL", std::sync::Arc::new(acemq::sql::PgConnection::connect(&url).await.unwrap())).await;
    }
    #[cfg(feature = "mysql")]
    if let Ok(url) = std::env::var("MYSQL_URL") {
        measure("MySQL", std::sync::Arc::new(acemq::sql::MysqlConnection::connect(&url).await.unwrap())).await;
    }
    #[cfg(not(any(feature = "postgres", feature = "mysql")))]
    eprintln!("build with --features postgres (and/or mysql) and set DATABASE_URL (MYSQL_URL)");
}
