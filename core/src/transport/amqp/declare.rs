//! Declaring exchanges, queues and bindings, on a channel of their own.

use super::fields::to_field_table;
use super::{map_error, AmqpBackend};
use crate::error::{Error, Result};
use crate::topology::{BindingSpec, ExchangeKind as Kind, ExchangeSpec, QueueSpec};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, ExchangeKind};

impl AmqpBackend {
    /// Declarations run on a channel of their own: a 406 or 404 closes the
    /// channel it happens on, and it must not be the publishing one.
    pub(crate) async fn with_declare_channel<F, Fut>(&self, f: F) -> Result<()>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let ch = self.open_channel(false).await?;
        let result = f(ch.clone()).await;
        if ch.status().connected() {
            let _ = ch.close(200, ShortString::from("OK")).await;
        }
        result
    }
}

/// Run `futures` together (sent at once, answered in order, see
/// [`in_order`](super::in_order::in_order)) and return the first error in
/// their order, or `Ok` when all succeeded.
pub(crate) async fn all<F>(futures: impl IntoIterator<Item = F>) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    super::in_order::in_order(futures).await.into_iter().collect()
}

pub(crate) async fn declare_exchange(ch: &Channel, spec: &ExchangeSpec) -> Result<()> {
    let kind = match spec.kind {
        Kind::Direct => ExchangeKind::Direct,
        Kind::Topic => ExchangeKind::Topic,
        Kind::Fanout => ExchangeKind::Fanout,
        Kind::Headers => ExchangeKind::Headers,
    };
    ch.exchange_declare(
        ShortString::from(spec.name.as_str()),
        kind,
        ExchangeDeclareOptions { durable: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .map_err(|e| precondition_hint(map_error(&e, &format!("declaring exchange '{}'", spec.name))))
}

pub(crate) async fn declare_queue(ch: &Channel, spec: &QueueSpec) -> Result<()> {
    ch.queue_declare(
        ShortString::from(spec.name.as_str()),
        QueueDeclareOptions { durable: true, ..Default::default() },
        to_field_table(&spec.declared_arguments()),
    )
    .await
    .map(|_| ())
    .map_err(|e| precondition_hint(map_error(&e, &format!("declaring queue '{}'", spec.name))))
}

pub(crate) async fn bind(ch: &Channel, spec: &BindingSpec) -> Result<()> {
    ch.queue_bind(
        ShortString::from(spec.queue.as_str()),
        ShortString::from(spec.exchange.as_str()),
        ShortString::from(spec.routing_key.as_str()),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| map_error(&e, &format!("binding queue '{}' to exchange '{}'", spec.queue, spec.exchange)))
}

pub(super) fn precondition_hint(e: Error) -> Error {
    if e.is_precondition_failed() {
        Error::new(
            e.kind().clone(),
            format!(
                "{}: it exists with other arguments; declare it with the same arguments, or delete it by hand once it is drained (acemq never deletes a queue or exchange)",
                e.message()
            ),
        )
    } else {
        e
    }
}
