//! AceMQ: RabbitMQ messaging where at-least-once delivery is made harmless.
//!
//! Publish with confirms, consume with an [`Ack`], retry on a ladder of delay
//! queues, dead-letter with the reason attached, and keep work and the
//! message about it together with the idempotent consumer and the
//! transactional outbox. The same engine runs the `acemq` Ruby gem.
//!
//! ```no_run
//! use acemq::{Ack, ConsumeOptions, Connection, Message, PublishOptions, Topology};
//! use serde_json::json;
//!
//! # async fn run() -> acemq::Result<()> {
//! let mq = Connection::open("amqp://guest:guest@localhost:5672").await?;
//! mq.apply(&Topology::new().queue("payments")).await?;
//!
//! let handle = mq
//!     .consume("payments", ConsumeOptions::default(), |message: Message| async move {
//!         println!("charging {}", message.payload["order_id"]);
//!         Ack::accept()
//!     })
//!     .await?;
//!
//! mq.publish(&json!({"order_id": "A-1", "amount": 4200}), "payments", PublishOptions::default()).await?;
//! handle.cancel().await;
//! mq.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! `memory://` opens an in-process broker with the same semantics, for tests
//! and demos without RabbitMQ.
//!
//! # Layers
//!
//! The crate's top-level modules are layers, top first. A module uses only
//! modules of its own row or of rows below it, and no modules use each other,
//! however indirectly (`tests/layers.rs` reads `src/` and fails otherwise).
//! A module that needs something from above takes it as a trait or a plain
//! value: events read an [`events::OutboxOutcome`], not the outbox's
//! completion; the connection keeps, as plain state, what the delay cascade
//! and request/reply need per connection (what is declared, the reply
//! channel), and the modules above it act on that state. A public item that
//! lives below the module a reader looks for it in is re-exported there
//! (`runner::Drained`, `delay::DUE_HEADER`), or at the crate root.
//!
//! | Layer | Modules | Why here |
//! |---|---|---|
//! | tools | `fuzzing` | Entry points for `fuzz/`: they reach into the engine; nothing reaches them. |
//! | process | `runner` | A service's supervisor, health server and drain: it runs consumers, so it sits on top. |
//! | patterns | `delay`, `dead_letters`, `idempotency`, `outbox`, `replay`, `teardown` | Each is a use of a connection or a handler; nothing below calls them. |
//! | consume and publish | `consumer`, `stream` | Deliveries, settling, the retry ladder; a publish stream with confirms. |
//! | answered and obeyed | `request`, `throttle` | A consumer sends a failed request's error reply and takes a shared throttle's leases, so both sit under it. |
//! | connection | `connection` | Publish with confirms, topology, per-connection state. |
//! | transport | `transport` | `amqp://` and `memory://` behind one backend, which declares the delay cascade and reads the reply-to. |
//! | format | `wire`, `message`, `decode`, `trace`, `limits`, `handler`, `topology`, `cascade` | Plain values and pure functions: the envelope on the wire, what a delivery becomes, the bounds on what is written, queue and delay names. No I/O. |
//! | interface | `events`, `metrics`, `sql` | What every layer emits into (events, metrics built on them) and the seam stores run on (a trait): they name nothing above them. |
//! | base | `error`, `backtrace`, `ack`, `envelope`, `headers`, `retry`, `partition`, `checks`, `broker`, `civil`, `fault`, `json_read`, `runtime` | Types and helpers every layer shares. |

#![warn(missing_docs)]

// One concept per module; the public API is re-exported below, and the
// namespaces a service navigates (the patterns, SQL, events, the runner) are
// public modules of their own. What is not re-exported is the engine's.
mod ack;
mod backtrace;
mod broker;
mod cascade;
mod checks;
mod civil;
mod connection;
mod consumer;
pub mod dead_letters;
pub mod delay;
mod decode;
mod envelope;
mod error;
mod fault;
mod handler;
mod headers;
mod message;
mod replay;
mod request;
mod retry;
mod stream;
mod teardown;
mod topology;
mod transport;
mod wire;

pub mod events;
pub mod idempotency;
pub mod json_read;
pub mod limits;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod outbox;
pub mod partition;
pub mod runner;
pub mod runtime;
pub mod sql;
pub mod throttle;
pub mod trace;

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

pub use ack::{Ack, Guarded, Outcome, Settlement, Verdict};
pub use backtrace::Backtrace;
pub use broker::BrokerVersion;
pub use connection::{Connection, ConnectionOptions, JsonMessage, PublishOptions, Resources};
pub use consumer::{
    Body, ConsumeOptions, Consumer, ConsumerHandle, ConsumerStats, Delivery, Fetch, Next, Settler, Unread, DEFAULT_BROKER_CONSUMER_TIMEOUT, DEFAULT_TIMEOUT,
    TIMEOUT_CLASS,
};
pub use consumer::{BreakerState, CircuitBreaker, Failed, Throttle, DEFAULT_BREAKER_PROBE};
pub use envelope::{new_id, Envelope};
pub use error::{Error, ErrorKind, RemoteFailure, Result};
pub use handler::{Failure, Handler};
pub use headers::Headers;
pub use message::{DeliveryInfo, Message};
pub use request::{RequestOptions, DEADLINE_HEADER, DEFAULT_REQUEST_TIMEOUT, ERROR_HEADER, ERROR_TYPE, RETRY_SAFE_HEADER};
pub use replay::{DeadLetter, DeadLetterPage, ReplayOptions, ReplayReport, REFRESHED_BY_HEADER, REFRESH_AT, REPLAYED_BY_HEADER};
pub use retry::{dlq_name, rung_name, RetryPolicy};
pub use stream::{OutgoingMessage, PublishStream, STREAM_CHUNK, STREAM_WINDOW};
pub use teardown::{TeardownOptions, TeardownReport};
pub use topology::{BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, QueueType, Topology, DEFAULT_DELIVERY_LIMIT, DLQ_DELIVERY_LIMIT};
pub use trace::TraceContext;
pub use decode::Payload;
pub use wire::{
    decoded_body, Props, BACKTRACE_HEADER, MAX_DECOMPRESSED, ORIGINAL_EXPIRATION_HEADER, ORIGINAL_USER_ID_HEADER, REPLY_TO,
};
pub use transport::memory::MemoryBroker;
pub use transport::{Confirm, QueueCounts, TlsOptions};

/// The crate README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}

/// docs/rust.md's samples, compiled as doc tests: a sample on that page that
/// stops compiling fails `cargo test -p acemq --features postgres` (the
/// page's PostgreSQL samples need the feature; `rake cargo_test` turns it
/// on). Outside the package's directory, so only for doc tests, never in a
/// build of the crate.
#[cfg(all(doctest, feature = "postgres", feature = "sqlite"))]
#[doc = include_str!("../../docs/rust.md")]
mod rust_guide {}

/// The repository README's Rust sample, compiled the same way.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod repository_readme {}

/// docs/tracing.md's Rust sample, compiled the same way.
#[cfg(doctest)]
#[doc = include_str!("../../docs/tracing.md")]
mod tracing_guide {}
