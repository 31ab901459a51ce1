//! AceMQ: RabbitMQ messaging where at-least-once delivery is made harmless.
//!
//! Publish with confirms, consume with an [`Ack`], retry on a ladder of delay
//! queues, dead-letter with the reason attached, and keep work and the
//! message about it together with the idempotent consumer and the
//! transactional outbox. The same engine runs the `acemq` Ruby gem.
//!
//! ```no_run
//! use acemq::{Ack, ConsumeOptions, Connection, Outcome, PublishOptions, Topology};
//! use serde_json::json;
//!
//! # async fn run() -> acemq::Result<()> {
//! let mq = Connection::open("amqp://guest:guest@localhost:5672").await?;
//! mq.apply(&Topology::new().queue("payments")).await?;
//!
//! let handle = mq
//!     .consume("payments", ConsumeOptions::default(), |message| async move {
//!         println!("charging {}", message.payload["order_id"]);
//!         Outcome::Ack(Ack::accept())
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

#![warn(missing_docs)]

pub mod ack;
pub mod checks;
pub mod connection;
pub mod consumer;
pub mod envelope;
pub mod error;
pub mod events;
mod fault;
pub mod headers;
pub mod idempotency;
pub mod limits;
pub mod message;
pub mod metrics;
pub mod outbox;
pub mod replay;
pub mod retry;
pub mod runner;
pub mod runtime;
pub mod sql;
pub mod topology;
pub mod trace;
pub mod transport;
pub mod wire;

pub use ack::{Ack, Outcome, Settlement};
pub use connection::{Connection, ConnectionOptions, JsonMessage, PublishOptions, TlsOptions};
pub use consumer::{ConsumeOptions, Consumer, ConsumerHandle, ConsumerStats, Delivery, Next};
pub use envelope::Envelope;
pub use error::{Error, ErrorKind, Result};
pub use message::{DeliveryInfo, Message};
pub use replay::{DeadLetter, ReplayOptions, ReplayReport};
pub use retry::RetryPolicy;
pub use topology::{ExchangeKind, QueueType, Topology};
pub use trace::TraceContext;
pub use transport::memory::MemoryBroker;
pub use transport::{Confirm, QueueCounts};

/// The crate README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}

/// docs/rust.md's samples, compiled as doc tests: a sample on that page that
/// stops compiling fails `cargo test -p acemq`. Outside the package's
/// directory, so only for doc tests, never in a build of the crate.
#[cfg(doctest)]
#[doc = include_str!("../../docs/rust.md")]
mod rust_guide {}

/// docs/tracing.md's Rust sample, compiled the same way.
#[cfg(doctest)]
#[doc = include_str!("../../docs/tracing.md")]
mod tracing_guide {}
