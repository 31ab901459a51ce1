//! Declaring the delay cascade (`crate::delay`) and binding a destination to
//! its delivery exchange.

use super::{all, bind, declare_exchange, declare_queue, map_error, AmqpBackend};
use crate::cascade::{cascade, Destination, DELIVER_EXCHANGE};
use crate::error::Result;
use crate::topology::BindingSpec;
use lapin::options::{ExchangeBindOptions, QueueBindOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::Channel;

async fn exchange_bind(ch: &Channel, source: &str, destination: &str, key: &str) -> Result<()> {
    ch.exchange_bind(
        ShortString::from(destination),
        ShortString::from(source),
        ShortString::from(key),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| map_error(&e, &format!("binding exchange '{destination}' to '{source}'")))
}

impl AmqpBackend {
    /// Declare every level of the cascade: idempotent, one round trip per
    /// group (exchanges, queues, bindings).
    pub(crate) async fn declare_cascade(&self) -> Result<()> {
        let c = cascade();
        let names: Vec<String> = c.exchanges.iter().map(|e| e.name.clone()).collect();
        self.with_declare_channel(|ch| async move {
            all(c.exchanges.iter().map(|e| declare_exchange(&ch, e))).await?;
            all(c.queues.iter().map(|q| declare_queue(&ch, q))).await?;
            let queue_bindings: Vec<BindingSpec> = c
                .queue_bindings
                .iter()
                .map(|(q, e, k)| BindingSpec { queue: q.clone(), exchange: e.clone(), routing_key: k.clone() })
                .collect();
            all(queue_bindings.iter().map(|b| bind(&ch, b))).await?;
            all(c.exchange_bindings.iter().map(|(s, d, k)| exchange_bind(&ch, s, d, k))).await
        })
        .await?;
        self.declared(names);
        Ok(())
    }

    /// Bind `destination` to the delivery exchange. A queue or exchange that
    /// does not exist is NOT_FOUND here, when the message is published,
    /// rather than a message waiting for years to go nowhere.
    pub(crate) async fn bind_delay_destination(&self, destination: &Destination) -> Result<()> {
        let key = destination.binding_key();
        self.with_declare_channel(|ch| async move {
            match destination {
                Destination::Queue(q) => ch
                    .queue_bind(
                        ShortString::from(q.as_str()),
                        ShortString::from(DELIVER_EXCHANGE),
                        ShortString::from(key.as_str()),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| map_error(&e, &format!("delaying a message to queue '{q}'"))),
                Destination::Exchange(x) => exchange_bind(&ch, DELIVER_EXCHANGE, x, &key).await,
            }
        })
        .await
    }
}
