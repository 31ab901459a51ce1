//! The exchanges known to exist, so that a publish to a missing one fails
//! on a throwaway channel instead of closing the publishing channel.

use super::{map_error, AmqpBackend};
use crate::error::Result;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::ExchangeKind;

impl AmqpBackend {
    pub(super) fn known(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.known_exchanges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remember exchanges that a topology declared.
    pub(crate) fn declared(&self, exchanges: impl IntoIterator<Item = String>) {
        self.known().extend(exchanges);
    }

    /// Make sure `exchange` exists before anything is published to it: the
    /// default exchange always does; a known one is not asked about again.
    /// The default exchange always exists and takes a publish; others once
    /// declared or checked, or published to with success, through this
    /// connection. `amq.*` exist too, but a user may not be allowed to write
    /// to them, so they are learnt like any other.
    pub(super) fn is_known(&self, exchange: &str) -> bool {
        exchange.is_empty() || self.known().contains(exchange)
    }

    pub(super) async fn check_exchange(&self, exchange: &str) -> Result<()> {
        if self.is_known(exchange) {
            return Ok(());
        }
        let ch = self.open_channel(false).await?;
        let checked = ch
            .exchange_declare(
                ShortString::from(exchange),
                ExchangeKind::Direct,
                ExchangeDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| map_error(&e, &format!("publishing to exchange '{exchange}'")));
        if ch.status().connected() {
            let _ = ch.close(200, ShortString::from("OK")).await;
        }
        checked?;
        self.known().insert(exchange.to_owned());
        Ok(())
    }
}
