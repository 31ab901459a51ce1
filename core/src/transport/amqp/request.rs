//! Requests over RabbitMQ's direct reply-to: a channel of the connection's
//! own that consumes `amq.rabbitmq.reply-to` (no ack, as RabbitMQ requires)
//! and sends the requests, since a reply reaches only the channel the
//! request was published on, and only if that channel consumed the
//! pseudo-queue before publishing.

use super::{from_basic_properties, map_error, AmqpBackend, AmqpConfirm};
use crate::error::Result;
use crate::wire::{Props, RawDelivery};
use futures_lite::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::Channel;

impl AmqpBackend {
    /// Open a channel with confirms that consumes direct replies, each
    /// handed to `on_reply` (on lapin's side: it must not block). The
    /// consumer ends with the channel.
    pub(crate) async fn reply_channel(&self, on_reply: impl Fn(RawDelivery) + Send + Sync + 'static) -> Result<Channel> {
        let ch = self.open_channel(true).await?;
        let mut consumer = ch
            .basic_consume(
                ShortString::from(crate::wire::REPLY_TO),
                ShortString::from(""),
                BasicConsumeOptions { no_ack: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| map_error(&e, "consuming direct replies (amq.rabbitmq.reply-to)"))?;
        crate::runtime::handle().spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                on_reply(RawDelivery {
                    tag: d.delivery_tag,
                    exchange: d.exchange.to_string(),
                    routing_key: d.routing_key.to_string(),
                    redelivered: d.redelivered,
                    props: from_basic_properties(d.properties),
                    body: d.data,
                });
            }
        });
        Ok(ch)
    }

    /// Publish a request on its reply channel.
    pub(crate) async fn send_request(&self, ch: &Channel, exchange: &str, routing_key: &str, body: &[u8], props: &Props) -> Result<AmqpConfirm> {
        self.unblocked().await?;
        self.check_exchange(exchange).await?;
        self.send_on(ch.clone(), exchange, routing_key, body, props).await
    }
}
