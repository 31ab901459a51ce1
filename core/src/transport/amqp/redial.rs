//! Dialling: each address in turn, through the frame filter (and TLS for
//! `amqps://`), and again, lazily, when the connection was lost.

use super::{map_error, AmqpBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::tls::Tls;
use lapin::ConnectionProperties;
use std::sync::Arc;
use std::time::Duration;

pub(super) fn endpoint_of(url: &str) -> String {
    // Never echo the password back in an error message. The last @ ends the
    // user and password: one inside an unencoded password must not leave
    // its tail in the host part.
    match url.rsplit_once('@') {
        Some((_, rest)) => rest.to_owned(),
        None => url.trim_start_matches("amqps://").trim_start_matches("amqp://").to_owned(),
    }
}

impl AmqpBackend {
    /// Where the current connection goes, for messages.
    pub(super) fn endpoint(&self) -> &str {
        &self.endpoints[self.at.load(std::sync::atomic::Ordering::Acquire).min(self.endpoints.len() - 1)]
    }

    pub(super) fn current(&self) -> Arc<lapin::Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The connection, dialled again if the broker went away (a restart, a
    /// network cut, a forced close). lapin does not recover on its own; this
    /// is the recovery, done lazily by whoever needs the connection next, so
    /// a publish during an outage fails after `connect_timeout` rather than
    /// hanging, and the first one after it works.
    pub(super) async fn connection(&self) -> Result<Arc<lapin::Connection>> {
        let c = self.current();
        if c.status().connected() {
            return Ok(c);
        }
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::closed(format!("the connection to {} is closed: open a new one", self.endpoint())));
        }
        let _one_at_a_time = self.redial.lock().await;
        let c = self.current();
        if c.status().connected() {
            return Ok(c);
        }
        // The next address first: the one that was lost is the likeliest to
        // be down (a node stopped, failed over), and the others are the
        // same cluster.
        crate::events::connection("lost", self.endpoint(), None);
        let start = (self.at.load(std::sync::atomic::Ordering::Acquire) + 1) % self.urls.len();
        let (at, dialed) = dial_any(&self.urls, &self.endpoints, &self.origin, start, self.connect_timeout, self.tls.as_ref()).await?;
        self.at.store(at, std::sync::atomic::Ordering::Release);
        // Another node of a cluster being upgraded may run another version.
        *self.server_version.lock().unwrap_or_else(|p| p.into_inner()) = dialed.version;
        let fresh = Arc::new(dialed.conn);
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        // What was known of the old broker may not hold for this one.
        self.known().clear();
        crate::events::connection("recovered", self.endpoint(), None);
        Ok(fresh)
    }
}

/// How long after replacing a connection for lost channel bookkeeping the
/// next replacement may come. A process that really holds `channel_max`
/// channels (2,047 consumers on one connection) gets the same refusal from a
/// fresh connection once its consumers are back; replacing it again at once
/// would only churn them.
const REPLACE_COOLDOWN: Duration = Duration::from_secs(30);

/// Whether lapin refused to open a channel because its own record of the
/// connection's channels went wrong, not because the broker said anything:
/// ChannelsLimitReached, or a channel.open refused with a channel-level
/// (soft) error, which RabbitMQ never answers channel.open with, so it is a
/// closed channel's error left behind.
fn bookkeeping_lost(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::ChannelsLimitReached => true,
        lapin::ErrorKind::ProtocolError(amqp) => matches!(amqp.kind(), lapin::protocol::AMQPErrorKind::Soft(_)),
        _ => false,
    }
}

impl AmqpBackend {
    /// A new channel on the current connection (dialled again if it was
    /// lost). If lapin cannot open one for a reason of its own bookkeeping
    /// (see [`bookkeeping_lost`]), the connection is replaced and the channel
    /// opened on the new one, rather than every later call failing the same
    /// way: issue 47, where 2,047 failed operations used up a connection for
    /// good. Consumers on the old connection subscribe again on the new one,
    /// as after any lost connection.
    pub(super) async fn create_channel(&self) -> Result<lapin::Channel> {
        let conn = self.connection().await?;
        let refused = match crate::fault::refuse_channel_open() {
            Some(e) => e,
            None => match conn.create_channel().await {
                Ok(ch) => return Ok(ch),
                Err(e) => e,
            },
        };
        if !bookkeeping_lost(&refused) || !conn.status().connected() {
            return Err(map_error(&refused, "opening a channel"));
        }
        let held = conn.channels_in_use();
        {
            let mut last = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < REPLACE_COOLDOWN) {
                return Err(Error::new(
                    ErrorKind::Closed,
                    format!(
                        "opening a channel: {held} channel ids in use on the connection to {}, and it was replaced less than {}s ago: \
                         does this process hold that many channels (consumers, requests)? RabbitMQ allows 2,047 on one connection",
                        self.endpoint(),
                        REPLACE_COOLDOWN.as_secs()
                    ),
                ));
            }
            *last = Some(std::time::Instant::now());
        }
        crate::events::connection(
            "replaced",
            self.endpoint(),
            Some(format!("the client could not open a channel ({}) with {held} channel ids in use", map_error(&refused, "opening a channel"))),
        );
        if Arc::ptr_eq(&conn, &self.current()) {
            let _ = tokio::time::timeout(self.connect_timeout, conn.close(200, "replacing a connection whose channel bookkeeping was lost".into())).await;
        }
        let conn = self.connection().await?;
        conn.create_channel().await.map_err(|e| map_error(&e, "opening a channel"))
    }
}

/// Dial each address in turn from `start`, each within `connect_timeout`,
/// and return the first that answers with its index. A refused login is
/// reported as that (the same user is refused everywhere); otherwise what
/// each address said.
pub(super) async fn dial_any(
    urls: &[String],
    endpoints: &[String],
    origin: &str,
    start: usize,
    connect_timeout: Duration,
    tls: Option<&Tls>,
) -> Result<(usize, Dialed)> {
    let mut failures = Vec::new();
    // Every address failed in TLS: the same certificate problem everywhere
    // (one cluster, one CA), which is what to report, not "unreachable".
    let mut all_tls = true;
    for i in 0..urls.len() {
        let at = (start + i) % urls.len();
        match dial(&urls[at], origin, &endpoints[at], connect_timeout, tls).await {
            Ok(c) => return Ok((at, c)),
            Err(e) if urls.len() == 1 || matches!(e.kind(), ErrorKind::AuthenticationFailed) => return Err(e),
            Err(e) => {
                all_tls &= e.is_tls();
                failures.push(e.to_string());
            }
        }
    }
    Err(Error::new(
        if all_tls { ErrorKind::Tls } else { ErrorKind::ConnectionFailed },
        format!("could not connect to any of {} addresses: {}", urls.len(), failures.join("; ")),
    ))
}

/// A connection and the broker's version as its connection.start said.
pub(super) struct Dialed {
    pub(super) conn: lapin::Connection,
    pub(super) version: Option<String>,
}

pub(super) async fn dial(url: &str, origin: &str, endpoint: &str, connect_timeout: Duration, tls: Option<&Tls>) -> Result<Dialed> {
    let properties = ConnectionProperties::default().with_connection_name(origin.into());
    let mut uri = url
        .parse::<lapin::uri::AMQPUri>()
        .map_err(|e| Error::new(ErrorKind::InvalidUrl, format!("cannot parse {endpoint:?} as an AMQP URL ({e})")))?;
    // amqps:// is TLS done by the reactor, under the frame filter (tls.rs);
    // lapin is handed the same address as amqp:// (the port stays what the
    // URL said, or 5671) so that it does not try TLS itself.
    let secure = matches!(uri.scheme, lapin::uri::AMQPScheme::AMQPS);
    let tls_dial = match (secure, tls) {
        (true, Some(tls)) => {
            uri.scheme = lapin::uri::AMQPScheme::AMQP;
            Some(tls.dial(&uri.authority.host)?)
        }
        (true, None) => unreachable!("Backend::open reads the TLS settings for an amqps:// URL"),
        (false, _) => None,
    };
    // lapin sizes its two ring buffers (read and write) at 32 frames of the
    // frame_max it knows when it starts: with none in the URL that is AMQP's
    // 4 KiB minimum, and once the broker's 128 KiB is negotiated it grows
    // both to 4 MiB with `Vec::resize`, which writes every byte: 8 MiB
    // resident per connection before a message is sent (bench/memory.rb
    // measures it). Proposing RabbitMQ's default up front allocates the
    // same buffers once, zeroed by the allocator, so their pages become
    // resident only as traffic reaches them. Message size is not capped by
    // this (bodies span as many frames as they need); the properties budget
    // (`limits::MAX_PROPERTIES`) was this frame size already.
    if uri.query.frame_max.is_none() {
        uri.query.frame_max = Some(crate::limits::FRAME_MAX);
    }
    // Through the frame filter: what another client published must not be
    // able to crash lapin's parser or make it close the connection (see
    // frame_filter/). It keeps repaired frames within the frame_max lapin
    // negotiates, which the URL can lower.
    let frame_max = uri.query.frame_max.unwrap_or(0);
    let server = crate::transport::frame_filter::ServerVersion::default();
    let connect = lapin::Connection::connect_uri_with_runtime(
        uri,
        properties,
        crate::transport::frame_filter::runtime(frame_max, tls_dial.clone(), server.clone()),
    );
    let outcome = tokio::time::timeout(connect_timeout, connect).await;
    // A TLS failure reaches lapin as an I/O error ("invalid data"): the
    // reason rustls gave is what the caller needs.
    if let (Some(tls), Some(d)) = (tls, &tls_dial) {
        if !matches!(outcome, Ok(Ok(_))) {
            if let Some(failure) = d.failure() {
                return Err(tls.explain(&failure, endpoint, &d.name()));
            }
            // Ended by the broker, not by our timeout.
            if matches!(outcome, Ok(Err(_))) {
                if let Some(refused) = tls.refused_client_certificate(d, endpoint) {
                    return Err(refused);
                }
            }
        }
    }
    match outcome {
        Err(_) => Err(Error::new(
            ErrorKind::ConnectionFailed,
            format!(
                "could not connect to {endpoint} within {connect_timeout:?}: is RabbitMQ running and reachable? (connect_timeout: sets the limit)"
            ),
        )),
        Ok(Err(e)) => Err(connect_error(&e, endpoint)),
        Ok(Ok(conn)) => Ok(Dialed { conn, version: server.lock().unwrap_or_else(|e| e.into_inner()).take() }),
    }
}

pub(super) fn connect_error(e: &lapin::Error, endpoint: &str) -> Error {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
        if amqp.get_id() == 403 {
            return Error::new(
                ErrorKind::AuthenticationFailed,
                format!("{endpoint} refused the login ({}): check the user and password in the URL", amqp.get_message()),
            );
        }
        if amqp.get_id() == 530 || amqp.get_id() == 402 {
            return Error::new(
                ErrorKind::Broker { reply_code: amqp.get_id() },
                format!("{endpoint} refused the connection ({}): check the vhost in the URL", amqp.get_message()),
            );
        }
    }
    let mut err = map_error(e, &format!("could not connect to {endpoint}"));
    if !matches!(err.kind(), ErrorKind::Broker { .. }) {
        err = Error::new(ErrorKind::ConnectionFailed, format!("{err}: is RabbitMQ running and reachable?"));
    }
    err
}
