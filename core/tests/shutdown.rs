//! Shutdown on SIGTERM, with a real process: core/examples/shutdown.rs
//! consumes from RabbitMQ (AMQP_URL; skipped without it), is sent SIGTERM
//! while its handler runs, and must finish the handler, acknowledge its
//! message and exit 0 — or, with a handler slower than the shutdown
//! deadline, exit 1 with the message back on the queue.
//!
//! `cargo test -p acemq` builds the example first (examples are built with
//! the tests); `cargo test --test shutdown` alone does not, so build it with
//! `cargo build -p acemq --examples`.

use acemq::{ConsumeOptions, Connection, PublishOptions, Topology};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn example(name: &str) -> std::path::PathBuf {
    // target/debug/deps/shutdown-… → target/debug/examples/NAME
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is not built: run `cargo build -p acemq --examples` (cargo test -p acemq does)", path.display());
    path
}

struct Service {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Service {
    fn start(url: &str, queue: &str, handler_ms: u64, shutdown_ms: u64) -> Service {
        let mut child = Command::new(example("shutdown"))
            .args([queue, &handler_ms.to_string(), &shutdown_ms.to_string()])
            .env("AMQP_URL", url)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Service { child, lines, seen: Vec::new() }
    }

    fn wait_for(&mut self, prefix: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.seen.iter().any(|l| l.starts_with(prefix)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("the service never printed {prefix:?}; it printed {:?}", self.seen),
            }
        }
    }

    fn terminate(&mut self) -> (i32, Duration) {
        let sent = Instant::now();
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = sent + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.seen.extend(self.lines.try_iter());
                return (status.code().expect("exited, not killed by a signal"), sent.elapsed());
            }
            assert!(Instant::now() < deadline, "still running 20 s after SIGTERM; printed {:?}", self.seen);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// The next message on `queue` within `wait`, settled as accepted.
async fn take(mq: &Connection, queue: &str, wait: Duration) -> Option<acemq::Message> {
    let c = mq.consumer(queue, ConsumeOptions::default()).await.unwrap();
    let d = tokio::time::timeout(wait, c.next()).await.ok().flatten();
    let m = d.map(|d| {
        let m = d.message.clone();
        c.accept(d);
        m
    });
    c.close().await;
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_running_handler_finish_and_acks_it() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    let queue = unique("shutdown-ok");
    let mq = Connection::open(&url).await.unwrap();
    mq.apply(&Topology::new().queue(&queue)).await.unwrap();

    let mut service = Service::start(&url, &queue, 1500, 5000);
    service.wait_for("ready");
    let env = mq.publish(&json!({"order_id": "A-1"}), &queue, PublishOptions::default()).await.unwrap();
    service.wait_for("handling");
    let (code, took) = service.terminate();

    assert_eq!(code, 0, "printed {:?}", service.seen);
    assert!(service.seen.contains(&format!("handled {}", env.id)), "{:?}", service.seen);
    assert!(service.seen.contains(&"stopped: 0 abandoned".to_owned()), "{:?}", service.seen);
    assert!(took < Duration::from_secs(5), "waited for the handler, not the deadline: {took:?}");
    assert!(take(&mq, &queue, Duration::from_millis(1500)).await.is_none(), "the message was acknowledged");
    eprintln!("clean shutdown: exited {took:?} after SIGTERM (handler 1.5 s, deadline 5 s)");
    mq.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_slower_than_the_deadline_is_abandoned_and_its_message_requeued() {
    let Ok(url) = std::env::var("AMQP_URL") else { return };
    let queue = unique("shutdown-late");
    let mq = Connection::open(&url).await.unwrap();
    mq.apply(&Topology::new().queue(&queue)).await.unwrap();

    let mut service = Service::start(&url, &queue, 30_000, 500);
    service.wait_for("ready");
    let env = mq.publish(&json!({"order_id": "A-2"}), &queue, PublishOptions::default()).await.unwrap();
    service.wait_for("handling");
    let (code, took) = service.terminate();

    assert_eq!(code, 1, "printed {:?}", service.seen);
    assert!(!service.seen.iter().any(|l| l.starts_with("handled")), "{:?}", service.seen);
    assert!(service.seen.contains(&"stopped: 1 abandoned".to_owned()), "{:?}", service.seen);
    assert!(took < Duration::from_secs(5), "the deadline bounds the shutdown: {took:?}");
    let back = take(&mq, &queue, Duration::from_secs(5)).await.expect("the abandoned message is back on the queue");
    assert_eq!(back.envelope.id, env.id);
    assert!(back.delivery.redelivered, "delivered again, marked redelivered");
    eprintln!("abandoning shutdown: exited {took:?} after SIGTERM (deadline 0.5 s)");
    mq.close().await;
}
