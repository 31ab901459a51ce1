//! A read-side AMQP frame filter between the broker's socket and lapin.
//!
//! Everything in a content header was written by whoever published the
//! message, and RabbitMQ passes most of it on as it arrived. lapin's parser
//! (amq-protocol) then fails on three things another client can publish:
//!
//! - a header table nested a thousand levels deep: it recurses once per
//!   level on lapin's I/O thread, which overflows its stack and kills the
//!   process (SIGSEGV);
//! - a short string that is not UTF-8 (`message_id`, `type`, a header name,
//!   basic.deliver's routing key): the frame fails to parse and lapin closes
//!   the whole connection, so the message is never delivered and comes back
//!   on every reconnect;
//! - a field type letter it does not know: the same. (RabbitMQ 3.10 refuses
//!   those at publish; other brokers and paths may not.)
//!
//! No lapin setting reaches any of that, so the bytes are fixed before lapin
//! sees them. Method and content-header frames are buffered whole, checked
//! by a walker that never recurses, repaired in the fewest bytes that make
//! them readable, and passed on; body and heartbeat frames stream through
//! untouched and, on the common path, uncopied (they are read straight into
//! lapin's buffer). A repaired message is marked with the
//! [`MALFORMED_HEADER`] header saying what was repaired, so the consumer
//! dead-letters it with that reason instead of handling it as if it had
//! arrived that way.
//!
//! Repairs keep every byte that can be kept:
//! - a table or array nested deeper than [`MAX_HEADER_DEPTH`] becomes a long
//!   string (`S`) holding its raw bytes: the same length prefix, so only the
//!   type letter changes;
//! - an unknown type letter, or a length that runs past its container: the
//!   smallest enclosing table or array becomes such a long string (at the top
//!   of the headers, the rest of the table goes into [`MALFORMED_RAW_HEADER`]);
//! - a byte that is not valid UTF-8 in a short string or a table key becomes
//!   `?`, one for one, so no length changes; the marker quotes the original
//!   bytes.
//!
//! Anything the filter does not understand as AMQP 0-9-1 framing (a frame
//! type it does not know, a bad frame-end byte, the broker's protocol header
//! refusing our version) switches it off for the rest of the connection:
//! everything passes as it came and lapin reports the problem as it would
//! have without the filter.

use super::tls::{Socket, TlsDial};
use crate::limits::MAX_HEADER_DEPTH;
use crate::wire::{MALFORMED_HEADER, MALFORMED_RAW_HEADER};
use async_rs::traits::Reactor;
use async_rs::util::RuntimeParts;
use async_rs::{Runtime, Tokio};
use futures_lite::{AsyncRead, AsyncWrite, Stream};
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

mod frames;
mod notes;
mod properties;
mod stream;
mod table;
#[cfg(test)]
mod tests;

use frames::*;
use notes::*;
use properties::*;
pub(crate) use stream::Filtered;
use table::*;

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
/// Type, channel and size.
const FRAME_PREFIX: usize = 7;
/// The prefix and the end byte.
const FRAME_OVERHEAD: usize = FRAME_PREFIX + 1;
/// AMQP's smallest frame_max; lapin never negotiates below it.
const FRAME_MIN_SIZE: u32 = 4096;
/// The largest method or content-header frame buffered for checking when
/// the negotiated frame_max is smaller (or not known yet): RabbitMQ's own
/// default frame_max, which bounds what a publisher can have sent it. A
/// larger frame passes unchecked; lapin refuses it as too large.
const HOLD_AT_LEAST: usize = 128 * 1024;
/// The longest marker text. A marker is for a person reading the DLQ and
/// must leave room in the frame for the headers it describes.
const MAX_MARKER: usize = 2048;
/// The most an incomplete frame's buffer grows by in one read.
const READ_AHEAD: usize = 64 * 1024;
/// Bit 13 of the basic property flags: a header table follows.
const HEADERS_FLAG: u16 = 1 << 13;

/// The runtime lapin connects through: tokio's executor, and a reactor
/// whose TCP streams are [`Filtered`]. `client_frame_max` is the URL's
/// `frame_max` (0 when it has none), which lapin negotiates with the
/// broker's and the filter needs to know to keep a repaired frame within it.
/// With `tls`, each stream is TLS over TCP and the filter reads the
/// plaintext (see tls.rs: lapin's own TLS would sit above the filter).
/// `server` receives the broker's `version` server property from
/// connection.start: lapin reads that table and keeps none of it, and what
/// RabbitMQ does with delivery limits, dead-letter headers and consumer
/// timeouts differs by version (docs/production.md).
pub(crate) fn runtime(client_frame_max: u32, tls: Option<TlsDial>, server: ServerVersion) -> Runtime<RuntimeParts<Tokio, FilterReactor>> {
    Runtime::new(RuntimeParts::new(Tokio::current(), FilterReactor { tokio: Tokio::current(), client_frame_max, tls, server }))
}

/// Where the filter puts the broker's `version` server property.
pub(crate) type ServerVersion = std::sync::Arc<std::sync::Mutex<Option<String>>>;

/// Tokio's reactor, with every TCP stream it connects wrapped in [`Filtered`]
/// (after the TLS handshake, for `amqps://`).
#[derive(Clone)]
pub(crate) struct FilterReactor {
    tokio: Tokio,
    client_frame_max: u32,
    tls: Option<TlsDial>,
    server: ServerVersion,
}

impl std::fmt::Debug for FilterReactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilterReactor").field("client_frame_max", &self.client_frame_max).field("tls", &self.tls.is_some()).finish()
    }
}

impl Reactor for FilterReactor {
    type TcpStream = Filtered<Socket<<Tokio as Reactor>::TcpStream>>;
    type Sleep = <Tokio as Reactor>::Sleep;

    // async-rs names the bound `AsSysFd`, from a private module; these are
    // its supertraits, which its blanket impl turns back into it.
    fn register<H: io::Read + io::Write + std::os::fd::AsFd + std::os::fd::AsRawFd + Send + 'static>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        self.tokio.register(socket)
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.tokio.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.tokio.interval(dur)
    }

    fn tcp_connect_addr(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let connect = self.tokio.tcp_connect_addr(addr);
        let client_frame_max = self.client_frame_max;
        let tls = self.tls.clone();
        let server = self.server.clone();
        async move {
            let tcp = connect.await?;
            let stream = match tls {
                None => Socket::Plain(tcp),
                Some(tls) => tls.handshake(tcp).await?,
            };
            let mut filtered = Filtered::new(stream, client_frame_max);
            filtered.frames.server = Some(server);
            Ok(filtered)
        }
    }
}
