use super::*;
use std::sync::Arc;

fn options() -> RunnerOptions {
    RunnerOptions {
        restart: RestartPolicy {
            max_restarts: 2,
            window: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(150),
        },
        recovery_bound: Duration::from_secs(10),
        ..RunnerOptions::default()
    }
}

fn ended() -> Observation {
    Observation { ended: Some("server cancel".into()), ..Observation::default() }
}

#[test]
fn ready_only_when_running_with_every_consumer_up() {
    let s = Supervisor::new(options());
    let i = s.register("PaymentsConsumer", "shop.payments", 2, 32);
    assert!(!s.ready(), "booting is not ready");
    s.running();
    assert!(s.ready() && s.live());
    assert!(matches!(s.observe(i, ended()), Verdict::Restart { .. }));
    assert!(!s.ready(), "a consumer being restarted is not ready");
    assert!(s.live(), "a restart is not a reason to kill the process");
    s.restarted(i);
    assert!(s.ready());
    s.quiet();
    assert!(!s.ready() && s.live(), "quiet: alive, taking nothing");
    s.running();
    assert!(s.ready());
}

#[test]
fn restarts_back_off_then_give_up_within_the_window() {
    let s = Supervisor::new(options());
    let i = s.register("C", "q", 1, 32);
    s.running();
    let Verdict::Restart { after: first, reason } = s.observe(i, ended()) else { panic!("restart") };
    assert_eq!(first, Duration::from_millis(100));
    assert!(reason.contains("C on q") && reason.contains("server cancel"), "{reason}");
    let Verdict::Restart { after: second, .. } = s.observe(i, ended()) else { panic!("restart") };
    assert_eq!(second, Duration::from_millis(150), "doubled, capped at max_backoff");
    let Verdict::GiveUp { reason } = s.observe(i, ended()) else { panic!("give up") };
    assert!(reason.contains("giving up"), "{reason}");
    assert_eq!(s.state(), RunnerState::Failed);
    assert!(!s.live(), "a runner that gave up is not live");
    assert!(s.status_json().contains("\"state\":\"failed\""));
}

#[test]
fn dead_workers_and_a_long_outage_are_failures_a_short_one_is_not() {
    let s = Supervisor::new(options());
    let i = s.register("C", "q", 3, 32);
    s.running();
    let short = Observation { down_for: Some(Duration::from_secs(2)), ..Observation::default() };
    assert_eq!(s.observe(i, short), Verdict::Healthy);
    assert!(!s.ready(), "not ready while without a channel");
    assert_eq!(s.observe(i, Observation::default()), Verdict::Healthy);
    assert!(s.ready(), "ready again once subscribed");
    let long = Observation { down_for: Some(Duration::from_secs(11)), last_error: Some("404".into()), ..Observation::default() };
    let Verdict::Restart { reason, .. } = s.observe(i, long) else { panic!("restart") };
    assert!(reason.contains("could not subscribe for 11s") && reason.contains("404"), "{reason}");
    let dead = Observation { dead_workers: 1, ..Observation::default() };
    let Verdict::Restart { reason, .. } = s.observe(i, dead) else { panic!("restart") };
    assert!(reason.contains("1 of 3 handler threads died"), "{reason}");
}

#[test]
fn nothing_is_decided_while_quiet_or_stopping() {
    let s = Supervisor::new(options());
    let i = s.register("C", "q", 1, 32);
    s.running();
    s.quiet();
    assert_eq!(s.observe(i, ended()), Verdict::Healthy);
    let deadline = s.stopping();
    assert_eq!(s.stopping(), deadline, "the deadline counts from the first stop");
    assert!(deadline > Instant::now() + Duration::from_secs(24));
    assert_eq!(s.observe(i, ended()), Verdict::Healthy);
    s.stopped();
    assert_eq!(s.state(), RunnerState::Stopped);
}

#[test]
fn a_silent_loop_is_not_live() {
    let s = Supervisor::new(RunnerOptions { heartbeat: Duration::from_millis(10), ..RunnerOptions::default() });
    s.running();
    assert!(s.live());
    std::thread::sleep(Duration::from_millis(60));
    assert!(!s.live(), "three missed beats");
    s.beat();
    assert!(s.live());
}

#[test]
fn the_health_endpoint_answers_probes() {
    crate::runtime::block_on(async {
        let s = Arc::new(Supervisor::new(options()));
        s.register("C", "q", 1, 32);
        let server = serve_health("127.0.0.1:0".parse().unwrap(), s.clone()).await.unwrap();
        let get = |path: &'static str| {
            let addr = server.local_addr();
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
                c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
                let mut out = String::new();
                c.read_to_string(&mut out).await.unwrap();
                out
            }
        };
        assert!(get("/ready").await.starts_with("HTTP/1.1 503"), "booting");
        s.running();
        assert!(get("/ready").await.starts_with("HTTP/1.1 200"));
        assert!(get("/live").await.starts_with("HTTP/1.1 200"));
        let status = get("/status").await;
        assert!(status.contains("\"name\":\"C\"") && status.contains("\"state\":\"running\""), "{status}");
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        server.close();
    });
}

#[test]
fn ingesters_are_in_the_status_and_a_standby_leaves_the_runner_ready() {
    let s = Supervisor::new(options());
    s.register("C", "q", 1, 32);
    s.running();
    s.ingester("q.dlq", IngesterState::Starting, 0, None);
    s.ingester("q.dlq", IngesterState::Standby, 0, Some("ACCESS_REFUSED"));
    s.ingester("r.dlq", IngesterState::Ingesting, 7, None);
    let status: serde_json::Value = serde_json::from_str(&s.status_json()).unwrap();
    assert_eq!(
        status["dead_letters"],
        serde_json::json!([
            {"dlq": "q.dlq", "state": "standby", "received": 0, "last_error": "ACCESS_REFUSED"},
            {"dlq": "r.dlq", "state": "ingesting", "received": 7, "last_error": null},
        ])
    );
    assert!(s.ready(), "a standby ingester is what every runner but one is");
    assert_eq!(IngesterState::parse("standby"), Some(IngesterState::Standby));
    assert_eq!(IngesterState::parse("asleep"), None);
}

#[test]
fn control_requests_are_authorized_by_token_or_loopback() {
    let head = |auth: &str| format!("POST /consumers/C/pause HTTP/1.1\r\nHost: h\r\n{auth}\r\n\r\n");
    assert_eq!(authorize_control(None, &head(""), true), Ok(()));
    assert!(authorize_control(None, &head(""), false).unwrap_err().contains("127.0.0.1 only"));
    assert_eq!(authorize_control(Some("s3cret"), &head("Authorization: Bearer s3cret"), false), Ok(()));
    assert_eq!(authorize_control(Some("s3cret"), &head("authorization: bearer  s3cret "), false), Ok(()), "any case, spaces");
    assert_eq!(authorize_control(Some("s3cret\n"), &head("Authorization: Bearer s3cret"), false), Ok(()), "a secret file's line break");
    for bad in ["Authorization: Bearer s3cre", "Authorization: Basic s3cret", "Authorization: Bearers3cret", "X: Bearer s3cret", "Authorization: Bé"] {
        assert!(authorize_control(Some("s3cret"), &head(bad), true).unwrap_err().contains("control token"), "{bad}");
    }
    assert_eq!(authorize_control(Some(" "), &head(""), true), Ok(()), "a blank token is none");
}
