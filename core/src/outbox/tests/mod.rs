//! Outbox tests: real SQLite files in temp dirs, a fake publisher that can
//! fail chosen exchanges, and a recording connection for the PostgreSQL SQL.

mod cycle;
mod postgres;
mod relay;
mod store;
mod support;
