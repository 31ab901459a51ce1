//! A Rust service that stops on SIGTERM the way the Rails runner does:
//! stop taking deliveries, let running handlers finish within the shutdown
//! deadline, close, and exit 0 (1 if handlers had to be abandoned).
//!
//! `cargo run -p acemq --example shutdown -- QUEUE [HANDLER_MS] [SHUTDOWN_MS]`
//! with AMQP_URL set (memory:// otherwise). core/tests/shutdown.rs runs it
//! against RabbitMQ and sends it SIGTERM mid-handler; docs/rust.md quotes
//! `serve`.

use acemq::runner::{RunnerOptions, StopSignals, Supervisor};
use acemq::{Ack, ConsumeOptions, Connection, Message, Topology};
use std::sync::Arc;
use std::time::Duration;

/// Consume `queue` until SIGTERM or SIGINT, then drain and close; the exit code.
async fn serve(url: &str, queue: &str, handler_time: Duration, shutdown_timeout: Duration) -> acemq::Result<i32> {
    // Listening starts here, before the first delivery: a SIGTERM that
    // arrived before it would kill the process mid-handler.
    let mut signals = StopSignals::listen()?;
    let supervisor = Arc::new(Supervisor::new(RunnerOptions { shutdown_timeout, ..RunnerOptions::default() }));

    let mq = Connection::open(url).await?;
    mq.apply(&Topology::new().queue(queue)).await?;
    let options = ConsumeOptions { concurrency: 2, ..ConsumeOptions::default() };
    supervisor.register_consumer("PaymentsConsumer", queue, &options);
    let payments = mq
        .consume(queue, options, move |message: Message| async move {
            println!("handling {}", message.envelope.id);
            tokio::time::sleep(handler_time).await; // the work
            println!("handled {}", message.envelope.id);
            Ack::accept()
        })
        .await?;
    supervisor.running();
    println!("ready");

    let signal = signals.recv().await;
    println!("stopping on {}", signal.as_str());
    let drained = acemq::runner::drain(&supervisor, vec![payments]).await;
    mq.close().await;
    println!("stopped: {} abandoned", drained.abandoned);
    Ok(supervisor.exit_code(&drained))
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let queue = args.next().unwrap_or_else(|| "payments".into());
    let ms = |a: Option<String>, default: u64| Duration::from_millis(a.and_then(|s| s.parse().ok()).unwrap_or(default));
    let handler_time = ms(args.next(), 1000);
    let shutdown_timeout = ms(args.next(), 25_000);
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "memory://shutdown".into());
    let code = match serve(&url, &queue, handler_time, shutdown_timeout).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shutdown example: {e}");
            2
        }
    };
    std::process::exit(code);
}
