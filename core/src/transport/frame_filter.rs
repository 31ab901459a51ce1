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

/// A stream whose reads are filtered frame by frame (see the module docs);
/// writes pass straight through.
pub(crate) struct Filtered<S> {
    inner: S,
    frames: Frames,
    /// Read and not yet passed on: the start of a method or content-header
    /// frame that is not complete yet (and what came after it in that read).
    input: Vec<u8>,
    /// Ready to be passed on, in order, before anything else: frames that
    /// were rewritten, or that were completed in `input`.
    output: Vec<u8>,
    output_pos: usize,
    eof: bool,
}

impl<S> Filtered<S> {
    pub(crate) fn new(inner: S, client_frame_max: u32) -> Self {
        Filtered {
            inner,
            frames: Frames::new(client_frame_max),
            input: Vec::new(),
            output: Vec::new(),
            output_pos: 0,
            eof: false,
        }
    }

    /// The stream it reads, for the fuzz targets' checks.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn inner(&self) -> &S {
        &self.inner
    }

    /// Filter `buf[..n]`, just read, where it lies. Returns how many bytes at
    /// its front are ready; what follows them went to `input` or `output`.
    fn filter_in_place(&mut self, buf: &mut [u8]) -> usize {
        let mut pos = 0;
        while pos < buf.len() {
            match self.frames.step(&mut buf[pos..]) {
                Step::Pass(n) => pos += n,
                Step::NeedMore => {
                    self.input.extend_from_slice(&buf[pos..]);
                    return pos;
                }
                Step::Replace { skip, consumed, with } => {
                    let at = pos + skip;
                    self.output = with;
                    self.output_pos = 0;
                    self.input.extend_from_slice(&buf[at + consumed..]);
                    self.filter_input();
                    return at;
                }
            }
        }
        pos
    }

    /// Move every complete frame at the front of `input` to `output`.
    fn filter_input(&mut self) {
        let mut pos = 0;
        while pos < self.input.len() {
            match self.frames.step(&mut self.input[pos..]) {
                Step::Pass(n) => {
                    self.output.extend_from_slice(&self.input[pos..pos + n]);
                    pos += n;
                }
                Step::Replace { skip, consumed, with } => {
                    self.output.extend_from_slice(&self.input[pos..pos + skip]);
                    self.output.extend_from_slice(&with);
                    pos += skip + consumed;
                }
                Step::NeedMore => break,
            }
        }
        self.input.drain(..pos);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Filtered<S> {
    // lapin treats a read of 0 as the broker closing the connection, and
    // polls again only when woken: so 0 is returned only at the real end of
    // the stream, and Pending only when the inner stream returned Pending
    // (which is what registered the waker).
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            if this.output_pos < this.output.len() {
                let n = buf.len().min(this.output.len() - this.output_pos);
                buf[..n].copy_from_slice(&this.output[this.output_pos..this.output_pos + n]);
                this.output_pos += n;
                if this.output_pos == this.output.len() {
                    this.output.clear();
                    this.output_pos = 0;
                }
                return Poll::Ready(Ok(n));
            }
            if this.eof {
                return Poll::Ready(Ok(0));
            }
            if !this.input.is_empty() {
                // A frame is incomplete: read exactly what it lacks into our
                // own buffer, so the next read goes straight to lapin again.
                // At most READ_AHEAD at a time: the size is the broker's
                // claim, up to the frame_max it proposed (4 GiB), and a
                // buffer that large was zeroed before a byte of it came.
                let want = this.frames.missing(&this.input).clamp(1, READ_AHEAD);
                let old = this.input.len();
                this.input.resize(old + want, 0);
                match Pin::new(&mut this.inner).poll_read(cx, &mut this.input[old..]) {
                    Poll::Pending => {
                        this.input.truncate(old);
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => {
                        this.input.truncate(old);
                        return Poll::Ready(Err(e));
                    }
                    Poll::Ready(Ok(0)) => {
                        // The broker went away mid-frame: pass on what there
                        // is, as it is, then the end.
                        this.input.truncate(old);
                        this.output = std::mem::take(&mut this.input);
                        this.output_pos = 0;
                        this.eof = true;
                    }
                    Poll::Ready(Ok(n)) => {
                        this.input.truncate(old + n);
                        this.filter_input();
                    }
                }
                continue;
            }
            match Pin::new(&mut this.inner).poll_read(cx, buf) {
                Poll::Ready(Ok(0)) => {
                    this.eof = true;
                    return Poll::Ready(Ok(0));
                }
                Poll::Ready(Ok(n)) => {
                    let ready = this.filter_in_place(&mut buf[..n]);
                    if ready > 0 {
                        return Poll::Ready(Ok(ready));
                    }
                }
                other => return other,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Filtered<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// What [`Frames::step`] found at the front of the bytes it was given.
#[derive(Debug, PartialEq)]
enum Step {
    /// The first n bytes are ready (checked, and repaired where they lie).
    Pass(usize),
    /// The first `skip` bytes are ready; the `consumed` after them are a
    /// frame to be replaced by `with`.
    Replace { skip: usize, consumed: usize, with: Vec<u8> },
    /// The bytes start with a frame that is not complete.
    NeedMore,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// At the start of a frame.
    Boundary,
    /// Inside a frame that passes as it is: this many bytes of it are left,
    /// its end byte included.
    Through(usize),
    /// Not AMQP framing as we know it: everything passes.
    Off,
}

/// The frame state machine, without any I/O.
struct Frames {
    mode: Mode,
    /// From connection.tune; None before it.
    server_frame_max: Option<u32>,
    client_frame_max: u32,
    /// Channels whose next content header is to be marked: a basic.deliver,
    /// basic.get-ok or basic.return on them had its strings repaired.
    marks: Vec<(u16, Notes)>,
    /// The walker's stack, kept between frames so that a clean message
    /// costs no allocation.
    levels: Vec<Level>,
    /// Given the broker's version from connection.start, when set.
    server: Option<ServerVersion>,
}

impl Frames {
    fn new(client_frame_max: u32) -> Self {
        Frames { mode: Mode::Boundary, server_frame_max: None, client_frame_max, marks: Vec::new(), levels: Vec::new(), server: None }
    }

    /// The frame_max lapin enforces on what it reads, negotiated as lapin
    /// does: the smaller of ours and the broker's where both are set, at
    /// least AMQP's minimum. None before connection.tune.
    fn negotiated(&self) -> Option<usize> {
        let server = self.server_frame_max?;
        let max = match (server, self.client_frame_max) {
            (0, 0) => u32::MAX,
            (0, c) => c,
            (s, 0) => s,
            (s, c) => s.min(c),
        };
        Some(max.max(FRAME_MIN_SIZE) as usize)
    }

    fn hold_limit(&self) -> usize {
        let server = self.server_frame_max.unwrap_or(0) as usize;
        self.negotiated().unwrap_or(0).max(server).max(HOLD_AT_LEAST)
    }

    /// How many more bytes the incomplete frame at the front of `input` needs.
    fn missing(&self, input: &[u8]) -> usize {
        if input.len() < FRAME_PREFIX {
            return FRAME_PREFIX - input.len();
        }
        (be32(&input[3..7]) as usize + FRAME_OVERHEAD).saturating_sub(input.len())
    }

    /// Look at the bytes at the front of `data` (which continue the stream
    /// where the last call left off), repair what can be repaired in place,
    /// and say what is ready. `data` is never empty.
    fn step(&mut self, data: &mut [u8]) -> Step {
        let mut pos = 0;
        loop {
            match self.mode {
                Mode::Off => return Step::Pass(data.len()),
                Mode::Through(remaining) => {
                    let available = data.len() - pos;
                    if available < remaining {
                        self.mode = Mode::Through(remaining - available);
                        return Step::Pass(data.len());
                    }
                    pos += remaining;
                    if data[pos - 1] != FRAME_END {
                        self.mode = Mode::Off;
                        return Step::Pass(data.len());
                    }
                    self.mode = Mode::Boundary;
                }
                Mode::Boundary => {
                    let rest = &data[pos..];
                    if rest.is_empty() {
                        return Step::Pass(pos);
                    }
                    let kind = rest[0];
                    if !matches!(kind, FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT) {
                        // Also the broker's "AMQP" + version refusing ours.
                        self.mode = Mode::Off;
                        return Step::Pass(data.len());
                    }
                    if rest.len() < FRAME_PREFIX {
                        return if pos > 0 { Step::Pass(pos) } else { Step::NeedMore };
                    }
                    let channel = be16(&rest[1..3]);
                    let size = be32(&rest[3..7]) as usize;
                    let total = size + FRAME_OVERHEAD;
                    if kind == FRAME_BODY || kind == FRAME_HEARTBEAT || total > self.hold_limit() {
                        pos += FRAME_PREFIX;
                        self.mode = Mode::Through(size + 1);
                        continue;
                    }
                    if rest.len() < total {
                        return if pos > 0 { Step::Pass(pos) } else { Step::NeedMore };
                    }
                    if rest[total - 1] != FRAME_END {
                        self.mode = Mode::Off;
                        return Step::Pass(data.len());
                    }
                    let payload = &mut data[pos + FRAME_PREFIX..pos + total - 1];
                    if kind == FRAME_METHOD {
                        self.method(channel, payload);
                    } else if let Some(repaired) = self.content_header(channel, payload) {
                        let mut with = Vec::with_capacity(repaired.len() + FRAME_OVERHEAD);
                        with.push(FRAME_HEADER);
                        with.extend_from_slice(&channel.to_be_bytes());
                        with.extend_from_slice(&(repaired.len() as u32).to_be_bytes());
                        with.extend_from_slice(&repaired);
                        with.push(FRAME_END);
                        return Step::Replace { skip: pos, consumed: total, with };
                    }
                    pos += total;
                }
            }
        }
    }

    /// Check a method frame's short strings and tables, repairing them
    /// where they lie (no length changes). Learns frame_max from
    /// connection.tune.
    fn method(&mut self, channel: u16, p: &mut [u8]) {
        if p.len() < 4 {
            return;
        }
        let (class, method) = (be16(&p[0..2]), be16(&p[2..4]));
        if (class, method) == (10, 30) {
            if p.len() >= 10 {
                self.server_frame_max = Some(be32(&p[6..10]));
            }
            return;
        }
        let Some((name, fields)) = server_method(class, method) else { return };
        let mut edits = Vec::new();
        let mut notes = Notes::default();
        let mut pos = 4;
        for field in fields {
            match *field {
                Field::Fixed(n) => pos += n,
                Field::Short(what) => {
                    let Some(&len) = p.get(pos) else { return };
                    let end = pos + 1 + len as usize;
                    if end > p.len() {
                        return;
                    }
                    if repair_utf8(p, pos + 1, end, &mut edits) {
                        notes.push(format!("{name} {what}: not UTF-8, was {}", quoted(&p[pos + 1..end])));
                    }
                    pos = end;
                }
                Field::Table(what) => {
                    if pos + 4 > p.len() {
                        return;
                    }
                    let end = pos + 4 + be32(&p[pos..pos + 4]) as usize;
                    if end > p.len() {
                        return;
                    }
                    // A table that cannot be read at its top level is left
                    // as it is: nothing of the same length would make it
                    // readable, and only the broker writes these.
                    let _ = walk_table(p, pos + 4, end, what, &mut self.levels, &mut edits, &mut notes);
                    pos = end;
                }
            }
        }
        for (at, byte) in edits {
            p[at] = byte;
        }
        if (class, method) == (10, 10) {
            // version-major, version-minor, then the server properties.
            if let (Some(slot), Some(len)) = (&self.server, p.get(6..10).map(be32)) {
                let table = p.get(10..10 + len as usize).unwrap_or_default();
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = server_version(table);
            }
        }
        if matches!((class, method), (60, 50) | (60, 60) | (60, 71)) && !notes.is_empty() {
            match self.marks.iter_mut().find(|(c, _)| *c == channel) {
                Some((_, pending)) => pending.extend(notes),
                None => self.marks.push((channel, notes)),
            }
        }
    }

    /// Check a content header; None when it passes as it is, else the
    /// repaired payload with the marker in its headers.
    fn content_header(&mut self, channel: u16, p: &[u8]) -> Option<Vec<u8>> {
        let mut notes = match self.marks.iter().position(|(c, _)| *c == channel) {
            Some(i) => self.marks.swap_remove(i).1,
            None => Notes::default(),
        };
        // Class, weight and body size are the broker's own; only the
        // properties after them come from the publisher.
        if p.len() < 14 {
            return None;
        }
        let flags = be16(&p[12..14]);
        let mut pos = 14;
        if flags & 1 != 0 {
            // Continuation: more flag words follow. Basic has 14 properties
            // and lapin reads one word, so the rest only misalign it.
            loop {
                if pos + 2 > p.len() {
                    return Some(self.rebuild(p, 14, notes, "the property flags run past the end of the frame"));
                }
                let more = be16(&p[pos..pos + 2]) & 1 != 0;
                pos += 2;
                if !more {
                    break;
                }
            }
            notes.push(format!("{} bytes of continued property flags dropped (basic has 14 properties)", pos - 14));
        }
        let props_start = pos;
        let mut edits = Vec::new();
        let mut headers_slot = pos;
        let mut headers: Option<(usize, usize, Option<usize>)> = None;
        for (bit, (what, kind)) in (2..16).rev().zip(PROPERTIES) {
            if bit == 13 {
                headers_slot = pos;
            }
            if flags & (1 << bit) == 0 {
                continue;
            }
            let need = match kind {
                Prop::Short => 1 + *p.get(pos).unwrap_or(&0) as usize,
                Prop::Octet => 1,
                Prop::Timestamp => 8,
                Prop::Table => 4 + p.get(pos..pos + 4).map_or(0, be32) as usize,
            };
            if pos + need > p.len() || (kind == Prop::Short && pos >= p.len()) {
                let why = format!("{what} runs past the end of the frame");
                return Some(self.rebuild(p, props_start, notes, &why));
            }
            match kind {
                Prop::Short => {
                    if repair_utf8(p, pos + 1, pos + need, &mut edits) {
                        notes.push(format!("{what}: not UTF-8, was {}", quoted(&p[pos + 1..pos + need])));
                    }
                }
                Prop::Table => {
                    let (start, end) = (pos + 4, pos + need);
                    let broken = walk_table(p, start, end, "header", &mut self.levels, &mut edits, &mut notes).err();
                    headers = Some((start, end, broken));
                }
                Prop::Octet | Prop::Timestamp => {}
            }
            pos += need;
        }
        if pos < p.len() {
            notes.push(format!("{} bytes after the properties dropped", p.len() - pos));
        }
        if notes.is_empty() {
            return None;
        }
        let mut fixed = p[..pos].to_vec();
        for (at, byte) in edits {
            fixed[at] = byte;
        }
        let mut table = match headers {
            Some((start, end, None)) => fixed[start..end].to_vec(),
            Some((start, end, Some(broken_at))) => {
                let mut t = fixed[start..broken_at].to_vec();
                push_long_entry(&mut t, MALFORMED_RAW_HEADER, &p[broken_at..end]);
                t
            }
            None => Vec::new(),
        };
        let after = match headers {
            Some((_, end, _)) => end,
            None => headers_slot,
        };
        // Everything but the table's entries and the marker.
        let base = FRAME_OVERHEAD + 14 + (headers_slot - props_start) + 4 + (pos - after);
        let budget = self.negotiated().unwrap_or(usize::MAX);
        let mut marker = notes.text(MAX_MARKER);
        if base + table.len() + entry_size(&marker) > budget {
            notes.push(format!("the other headers dropped to keep the frame within frame_max ({budget} bytes)"));
            marker = notes.text(MAX_MARKER);
            table.clear();
        }
        let room = budget.saturating_sub(base + table.len() + entry_size(""));
        if marker.len() > room {
            marker = crate::limits::bounded(&marker, room);
        }
        push_long_entry(&mut table, MALFORMED_HEADER, marker.as_bytes());

        let mut out = Vec::with_capacity(base + table.len());
        out.extend_from_slice(&fixed[..12]);
        out.extend_from_slice(&((flags & !1) | HEADERS_FLAG).to_be_bytes());
        out.extend_from_slice(&fixed[props_start..headers_slot]);
        out.extend_from_slice(&(table.len() as u32).to_be_bytes());
        out.extend_from_slice(&table);
        out.extend_from_slice(&fixed[after..pos]);
        Some(out)
    }

    /// Properties that cannot be walked at all: keep the class, weight and
    /// body size (the body frames must still match), and replace the
    /// properties by a header table with the marker and, if it fits, their
    /// raw bytes.
    fn rebuild(&self, p: &[u8], props_start: usize, mut notes: Notes, why: &str) -> Vec<u8> {
        notes.push(format!("properties unreadable ({why}); all of them replaced by {MALFORMED_RAW_HEADER}, their raw bytes"));
        let marker = notes.text(MAX_MARKER);
        let raw = &p[props_start..];
        let budget = self.negotiated().unwrap_or(usize::MAX);
        let mut table = Vec::new();
        if FRAME_OVERHEAD + 18 + entry_size(&marker) + 5 + MALFORMED_RAW_HEADER.len() + 1 + raw.len() <= budget {
            push_long_entry(&mut table, MALFORMED_RAW_HEADER, raw);
        }
        let room = budget.saturating_sub(FRAME_OVERHEAD + 18 + table.len() + entry_size(""));
        push_long_entry(&mut table, MALFORMED_HEADER, crate::limits::bounded(&marker, room).as_bytes());
        let mut out = Vec::with_capacity(18 + table.len());
        out.extend_from_slice(&p[..12]);
        out.extend_from_slice(&HEADERS_FLAG.to_be_bytes());
        out.extend_from_slice(&(table.len() as u32).to_be_bytes());
        out.extend_from_slice(&table);
        out
    }
}

/// The basic properties in flag order (bit 15 down to bit 2).
#[derive(Clone, Copy, PartialEq)]
enum Prop {
    Short,
    Table,
    Octet,
    Timestamp,
}

const PROPERTIES: [(&str, Prop); 14] = [
    ("content_type", Prop::Short),
    ("content_encoding", Prop::Short),
    ("headers", Prop::Table),
    ("delivery_mode", Prop::Octet),
    ("priority", Prop::Octet),
    ("correlation_id", Prop::Short),
    ("reply_to", Prop::Short),
    ("expiration", Prop::Short),
    ("message_id", Prop::Short),
    ("timestamp", Prop::Timestamp),
    ("type", Prop::Short),
    ("user_id", Prop::Short),
    ("app_id", Prop::Short),
    ("cluster_id", Prop::Short),
];

/// A method argument, as far as the filter needs to know it.
#[derive(Clone, Copy)]
enum Field {
    /// Octets, shorts, longs, bits: skipped.
    Fixed(usize),
    Short(&'static str),
    Table(&'static str),
}

/// The methods a broker sends that carry short strings or tables, and where.
/// Bits sharing an octet are one `Fixed(1)`; what follows the last string or
/// table is not listed.
fn server_method(class: u16, method: u16) -> Option<(&'static str, &'static [Field])> {
    use Field::*;
    Some(match (class, method) {
        (10, 10) => ("connection.start", &[Fixed(2), Table("server property")]),
        (10, 41) => ("connection.open-ok", &[Short("reserved")]),
        (10, 50) => ("connection.close", &[Fixed(2), Short("reply text")]),
        (10, 60) => ("connection.blocked", &[Short("reason")]),
        (20, 40) => ("channel.close", &[Fixed(2), Short("reply text")]),
        (50, 11) => ("queue.declare-ok", &[Short("queue")]),
        (60, 21) => ("basic.consume-ok", &[Short("consumer tag")]),
        (60, 30) => ("basic.cancel", &[Short("consumer tag")]),
        (60, 31) => ("basic.cancel-ok", &[Short("consumer tag")]),
        (60, 50) => ("basic.return", &[Fixed(2), Short("reply text"), Short("exchange"), Short("routing key")]),
        (60, 60) => ("basic.deliver", &[Short("consumer tag"), Fixed(9), Short("exchange"), Short("routing key")]),
        (60, 71) => ("basic.get-ok", &[Fixed(9), Short("exchange"), Short("routing key")]),
        (60, 72) => ("basic.get-empty", &[Short("reserved")]),
        _ => return None,
    })
}

/// What was repaired, in words, bounded: past [`MAX_MARKER`] bytes the rest
/// are only counted.
#[derive(Default, Debug)]
struct Notes {
    list: Vec<String>,
    bytes: usize,
    more: usize,
}

impl Notes {
    fn push(&mut self, note: String) {
        if self.bytes + note.len() > MAX_MARKER {
            self.more += 1;
        } else {
            self.bytes += note.len() + 2;
            self.list.push(note);
        }
    }

    fn extend(&mut self, other: Notes) {
        for n in other.list {
            self.push(n);
        }
        self.more += other.more;
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty() && self.more == 0
    }

    fn mark(&self) -> (usize, usize, usize) {
        (self.list.len(), self.bytes, self.more)
    }

    fn reset(&mut self, (len, bytes, more): (usize, usize, usize)) {
        self.list.truncate(len);
        self.bytes = bytes;
        self.more = more;
    }

    fn text(&self, max: usize) -> String {
        let mut t = self.list.join("; ");
        if self.more > 0 {
            t.push_str(&format!("; and {} more", self.more));
        }
        crate::limits::bounded(&t, max)
    }
}

/// One table or array being walked.
struct Level {
    table: bool,
    pos: usize,
    end: usize,
    /// Where its type letter is (unused for the top table).
    tag_at: usize,
    depth: usize,
    /// Its key in its parent table, or its index in its parent array.
    label: Label,
    /// Elements seen, for arrays' labels.
    index: usize,
    edits_mark: usize,
    notes_mark: (usize, usize, usize),
}

#[derive(Clone, Copy)]
enum Label {
    Root,
    Key(usize, usize),
    Index(usize),
}

/// Walk the field table `src[start..end]` without recursing, recording in
/// `edits` the bytes to change to make it readable by amq-protocol (see the
/// module docs) and in `notes` why. Err(at) when the top table itself
/// cannot be read from the entry at `at` on; what precedes it is sound.
fn walk_table(
    src: &[u8],
    start: usize,
    end: usize,
    what: &str,
    stack: &mut Vec<Level>,
    edits: &mut Vec<(usize, u8)>,
    notes: &mut Notes,
) -> Result<(), usize> {
    stack.clear();
    stack.push(Level {
        table: true,
        pos: start,
        end,
        tag_at: 0,
        depth: 1,
        label: Label::Root,
        index: 0,
        edits_mark: 0,
        notes_mark: notes.mark(),
    });
    'walk: while let Some(level) = stack.last_mut() {
        if level.pos == level.end {
            stack.pop();
            continue;
        }
        let entry_at = level.pos;
        let mut pos = level.pos;
        let label;
        let failure: String;
        'entry: {
            if level.table {
                let len = src[pos] as usize;
                if pos + 1 + len > level.end {
                    failure = "a name runs past the end of its table".into();
                    label = Label::Key(pos + 1, 0);
                    break 'entry;
                }
                label = Label::Key(pos + 1, len);
                if repair_utf8(src, pos + 1, pos + 1 + len, edits) {
                    let name = path(src, stack, label, what);
                    notes.push(format!("{what} name {name}: not UTF-8"));
                }
                pos += 1 + len;
            } else {
                label = Label::Index(level.index);
                level.index += 1;
            }
            let level = stack.last_mut().expect("the level being walked");
            if pos >= level.end {
                failure = "a name has no value".into();
                break 'entry;
            }
            let tag = src[pos];
            pos += 1;
            let Some(size) = value_size(tag, &src[pos..level.end]) else {
                failure = format!("unknown field type {}", quoted(&[tag]));
                break 'entry;
            };
            if size > level.end - pos {
                failure = "a value runs past the end of its table".into();
                break 'entry;
            }
            level.pos = pos + size;
            if tag == b'A' || tag == b'F' {
                let depth = level.depth + 1;
                if depth > MAX_HEADER_DEPTH {
                    edits.push((pos - 1, b'S'));
                    let at = path(src, stack, label, what);
                    notes.push(format!(
                        "{what} {at}: nested deeper than {MAX_HEADER_DEPTH} levels, kept as a long string of its raw bytes"
                    ));
                } else {
                    stack.push(Level {
                        table: tag == b'F',
                        pos: pos + 4,
                        end: pos + size,
                        tag_at: pos - 1,
                        depth,
                        label,
                        index: 0,
                        edits_mark: edits.len(),
                        notes_mark: notes.mark(),
                    });
                }
            }
            continue 'walk;
        }
        // This table or array cannot be read: the smallest one holding the
        // problem becomes a long string of its raw bytes, undoing whatever
        // was repaired inside it (the raw bytes are the point).
        let entry = path(src, stack, label, what);
        let level = stack.pop().expect("the level being walked");
        if stack.is_empty() {
            notes.push(format!(
                "{what} {entry}: {failure}; the {what}s from byte {} of the table on kept as {MALFORMED_RAW_HEADER}, a long string of their raw bytes",
                entry_at - start
            ));
            return Err(entry_at);
        }
        edits.truncate(level.edits_mark);
        notes.reset(level.notes_mark);
        edits.push((level.tag_at, b'S'));
        let container = path(src, stack, level.label, what);
        let kind = if level.table { "table" } else { "array" };
        notes.push(format!("{what} {entry}: {failure}; the {kind} {container} kept as a long string of its raw bytes"));
    }
    Ok(())
}

/// A readable name for the entry `last` under the levels in `stack`:
/// `"a.b[2].c"`, each key quoted as it arrived.
fn path(src: &[u8], stack: &[Level], last: Label, what: &str) -> String {
    let mut out = Vec::new();
    for label in stack.iter().map(|l| l.label).chain(std::iter::once(last)) {
        match label {
            Label::Root => {}
            Label::Key(at, len) => {
                if !out.is_empty() {
                    out.push(b'.');
                }
                out.extend_from_slice(&src[at..at + len]);
            }
            Label::Index(i) => out.extend_from_slice(format!("[{i}]").as_bytes()),
        }
    }
    if out.is_empty() {
        return format!("(the {what} table)");
    }
    quoted(&out)
}

/// Record in `edits` a `?` for every byte of `src[start..end]` that is not
/// part of valid UTF-8. True if there was one.
fn repair_utf8(src: &[u8], start: usize, end: usize, edits: &mut Vec<(usize, u8)>) -> bool {
    let s = &src[start..end];
    let mut i = 0;
    let mut bad = false;
    while let Err(e) = std::str::from_utf8(&s[i..]) {
        let from = i + e.valid_up_to();
        let len = e.error_len().unwrap_or(s.len() - from);
        edits.extend((from..from + len).map(|j| (start + j, b'?')));
        bad = true;
        i = from + len;
    }
    bad
}

/// Bytes as a quoted, escaped, exact string: `"id-\xff"`.
fn quoted(bytes: &[u8]) -> String {
    format!("\"{}\"", bytes.escape_ascii())
}

fn entry_size(text: &str) -> usize {
    1 + MALFORMED_HEADER.len().max(MALFORMED_RAW_HEADER.len()) + 5 + text.len()
}

fn push_long_entry(table: &mut Vec<u8>, key: &str, value: &[u8]) {
    table.push(key.len() as u8);
    table.extend_from_slice(key.as_bytes());
    table.push(b'S');
    table.extend_from_slice(&(value.len() as u32).to_be_bytes());
    table.extend_from_slice(value);
}

/// The `version` entry (a long string) of connection.start's server
/// properties, read without recursing: nested tables are skipped by their
/// length. None when the table has no such entry or cannot be read.
fn server_version(table: &[u8]) -> Option<String> {
    let mut pos = 0;
    while pos < table.len() {
        let klen = *table.get(pos)? as usize;
        let key = table.get(pos + 1..pos + 1 + klen)?;
        pos += 1 + klen;
        let tag = *table.get(pos)?;
        pos += 1;
        let size = value_size(tag, &table[pos.min(table.len())..])?;
        let value = table.get(pos..pos.checked_add(size)?)?;
        if key == b"version" && tag == b'S' {
            return Some(String::from_utf8_lossy(&value[4..]).into_owned());
        }
        pos += size;
    }
    None
}

/// The encoded size of a field value of type `tag` whose bytes start
/// `rest`: None for a type AMQP has not got, usize::MAX for a
/// length-prefixed value (string, byte array, array, table) whose length
/// itself is cut off, which no table can hold.
fn value_size(tag: u8, rest: &[u8]) -> Option<usize> {
    Some(match tag {
        b't' | b'b' | b'B' => 1,
        b's' | b'U' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'D' => 5,
        b'L' | b'l' | b'd' | b'T' => 8,
        b'V' => 0,
        b'S' | b'x' | b'A' | b'F' => rest.get(..4).map_or(usize::MAX, |n| 4 + be32(n) as usize),
        _ => return None,
    })
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::frame::{parse_frame, AMQPFrame};
    use amq_protocol::protocol::{basic, AMQPClass};
    use lapin::types::{AMQPValue, FieldTable};

    // ---- building frames by hand, hostile ones included ----

    fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![kind];
        f.extend_from_slice(&channel.to_be_bytes());
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f.push(FRAME_END);
        f
    }

    fn short(s: &[u8]) -> Vec<u8> {
        let mut v = vec![s.len() as u8];
        v.extend_from_slice(s);
        v
    }

    fn long(s: &[u8]) -> Vec<u8> {
        let mut v = (s.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(s);
        v
    }

    /// A table's bytes (length prefix included) from entries of a key, a
    /// type letter and the value's bytes.
    fn table(entries: &[(&[u8], u8, Vec<u8>)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (k, t, v) in entries {
            body.extend(short(k));
            body.push(*t);
            body.extend_from_slice(v);
        }
        long(&body)
    }

    fn method(channel: u16, class: u16, method: u16, args: &[u8]) -> Vec<u8> {
        let mut p = class.to_be_bytes().to_vec();
        p.extend_from_slice(&method.to_be_bytes());
        p.extend_from_slice(args);
        frame(FRAME_METHOD, channel, &p)
    }

    fn deliver(channel: u16, exchange: &[u8], routing_key: &[u8]) -> Vec<u8> {
        let mut a = short(b"ctag");
        a.extend_from_slice(&7u64.to_be_bytes());
        a.push(0);
        a.extend(short(exchange));
        a.extend(short(routing_key));
        method(channel, 60, 60, &a)
    }

    fn tune(frame_max: u32) -> Vec<u8> {
        tune_with(frame_max, 60)
    }

    fn tune_with(frame_max: u32, heartbeat: u16) -> Vec<u8> {
        let mut a = 2047u16.to_be_bytes().to_vec();
        a.extend_from_slice(&frame_max.to_be_bytes());
        a.extend_from_slice(&heartbeat.to_be_bytes());
        method(0, 10, 30, &a)
    }

    /// A content header with the given properties, each (flag bit, bytes),
    /// highest bit first.
    fn header(channel: u16, body_size: u64, props: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut p = 60u16.to_be_bytes().to_vec();
        p.extend_from_slice(&0u16.to_be_bytes());
        p.extend_from_slice(&body_size.to_be_bytes());
        let flags = props.iter().fold(0u16, |f, (bit, _)| f | (1 << bit));
        p.extend_from_slice(&flags.to_be_bytes());
        for (_, bytes) in props {
            p.extend_from_slice(bytes);
        }
        frame(FRAME_HEADER, channel, &p)
    }

    const CONTENT_TYPE: u8 = 15;
    const HEADERS: u8 = 13;
    const DELIVERY_MODE: u8 = 12;
    const MESSAGE_ID: u8 = 7;
    const TIMESTAMP: u8 = 6;
    const TYPE: u8 = 5;

    fn body(channel: u16, bytes: &[u8]) -> Vec<u8> {
        frame(FRAME_BODY, channel, bytes)
    }

    fn heartbeat() -> Vec<u8> {
        frame(FRAME_HEARTBEAT, 0, &[])
    }

    /// What a consumer reads of one clean AceMQ message, with the kind of
    /// headers RabbitMQ adds (x-death: an array of tables).
    fn clean_message(channel: u16, payload: &[u8]) -> Vec<u8> {
        let death = table(&[(b"count", b'l', 3i64.to_be_bytes().to_vec()), (b"queue", b'S', long(b"payments"))]);
        let mut deaths = vec![b'F'];
        deaths.extend(death);
        let headers = table(&[
            (b"x-acemq-id", b'S', long(b"0190a1b2-c3d4")),
            (b"x-acemq-attempt", b'l', 1i64.to_be_bytes().to_vec()),
            (b"x-death", b'A', long(&deaths)),
            (b"nested", b'F', table(&[(b"k", b'S', long("vé".as_bytes()))])),
            (b"flag", b't', vec![1]),
        ]);
        let mut m = deliver(channel, b"orders", b"order.placed");
        m.extend(header(
            channel,
            payload.len() as u64,
            &[
                (CONTENT_TYPE, short(b"application/json")),
                (HEADERS, headers),
                (DELIVERY_MODE, vec![2]),
                (MESSAGE_ID, short(b"0190a1b2-c3d4")),
                (TIMESTAMP, 1_700_000_000u64.to_be_bytes().to_vec()),
                (TYPE, short(b"order.placed.v1")),
            ],
        ));
        m.extend(body(channel, payload));
        m
    }

    /// A table holding `levels` tables, each in the next: {"a": {"a": ... {"v": 1}}}.
    fn deep_tables(levels: usize) -> Vec<u8> {
        let mut inner = table(&[(b"v", b'I', 1i32.to_be_bytes().to_vec())]);
        for _ in 0..levels {
            inner = table(&[(b"a", b'F', inner)]);
        }
        inner
    }

    /// An array holding `levels` arrays, each in the next.
    fn deep_arrays(levels: usize) -> Vec<u8> {
        let mut inner = long(b"V");
        for _ in 0..levels {
            let mut element = vec![b'A'];
            element.extend(inner);
            inner = long(&element);
        }
        table(&[(b"arr", b'A', inner)])
    }

    // ---- reading through the filter ----

    /// The broker's side: hands out `data` `chunk` bytes at a time, and
    /// answers Pending before every read when `pending` is set.
    struct Script {
        data: Vec<u8>,
        pos: usize,
        chunk: usize,
        pending: bool,
        owed: bool,
        last_was_pending: bool,
    }

    impl AsyncRead for Script {
        fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
            if self.pending && !self.owed {
                self.owed = true;
                self.last_was_pending = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.owed = false;
            self.last_was_pending = false;
            let n = self.chunk.min(buf.len()).min(self.data.len() - self.pos);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Poll::Ready(Ok(n))
        }
    }

    /// Everything lapin would read through the filter, `chunk` bytes per
    /// read from the broker into buffers of `buf_len`. Checks the contract
    /// lapin relies on as it goes: Pending only after the broker's side
    /// said Pending, and 0 only once everything has been read.
    fn read_through(data: &[u8], chunk: usize, buf_len: usize, pending: bool) -> (Vec<u8>, Filtered<Script>) {
        let script = Script { data: data.to_vec(), pos: 0, chunk, pending, owed: false, last_was_pending: false };
        let mut filtered = Filtered::new(script, 0);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut buf = vec![0u8; buf_len];
        let mut out = Vec::new();
        loop {
            match Pin::new(&mut filtered).poll_read(&mut cx, &mut buf) {
                Poll::Ready(Ok(0)) => break,
                Poll::Ready(Ok(n)) => out.extend_from_slice(&buf[..n]),
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => assert!(filtered.inner.last_was_pending, "Pending without the inner stream's"),
            }
        }
        assert_eq!(filtered.inner.pos, data.len(), "0 returned before the end of the stream");
        (out, filtered)
    }

    /// The frames lapin's parser makes of the bytes: every one must parse.
    fn parsed(mut bytes: &[u8]) -> Vec<AMQPFrame> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            let (rest, f) = parse_frame(bytes).unwrap_or_else(|e| panic!("lapin's parser refused the filtered bytes: {e:?}"));
            frames.push(f);
            bytes = rest;
        }
        frames
    }

    fn filtered(data: &[u8]) -> Vec<AMQPFrame> {
        parsed(&read_through(data, usize::MAX, 1 << 16, false).0)
    }

    fn headers_of(frames: &[AMQPFrame]) -> Vec<basic::AMQPProperties> {
        frames
            .iter()
            .filter_map(|f| match f {
                AMQPFrame::Header(_, h) => Some(h.properties.clone()),
                _ => None,
            })
            .collect()
    }

    fn marker(props: &basic::AMQPProperties) -> Option<String> {
        let h = props.headers().as_ref()?;
        match h.inner().get(MALFORMED_HEADER)? {
            AMQPValue::LongString(s) => Some(String::from_utf8(s.as_bytes().to_vec()).expect("the marker is UTF-8")),
            other => panic!("marker is {other:?}"),
        }
    }

    const SIZES: [usize; 6] = [1, 2, 5, 13, 4096, usize::MAX];

    #[test]
    fn clean_frames_pass_byte_identical_however_the_reads_fall() {
        let mut data = b"".to_vec();
        data.extend(tune(131_072));
        for i in 0..5 {
            data.extend(clean_message(1 + i % 2, format!("{{\"n\":{i}}}").as_bytes()));
            data.extend(heartbeat());
        }
        for chunk in SIZES {
            for buf_len in [1, 3, 8, 100, 65_536] {
                for pending in [false, true] {
                    let (out, _) = read_through(&data, chunk, buf_len, pending);
                    assert!(out == data, "chunk {chunk}, buffer {buf_len}, pending {pending}: bytes changed");
                }
            }
        }
        assert_eq!(headers_of(&parsed(&data)).len(), 5);
    }

    #[test]
    fn body_frames_stream_through_unchanged_without_being_buffered() {
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut data = clean_message(1, b"{}");
        for part in big.chunks(131_064) {
            data.extend(body(1, part));
            data.extend(heartbeat());
        }
        let (out, f) = read_through(&data, 16_384, 65_536, false);
        assert!(out == data);
        // Nothing of the body was held: it went where lapin reads.
        assert!(f.input.capacity() < 4096 && f.output.capacity() < 4096, "{} {}", f.input.capacity(), f.output.capacity());
    }

    #[test]
    fn several_frames_in_one_read_and_one_frame_over_many_reads() {
        let mut data = Vec::new();
        for i in 0..50 {
            data.extend(clean_message(1, format!("[{i}]").as_bytes()));
        }
        data.extend(deliver(1, b"", b"rk-\xff"));
        data.extend(header(1, 2, &[(MESSAGE_ID, short(b"id-\xfe"))]));
        data.extend(body(1, b"{}"));
        data.extend(clean_message(1, b"[50]"));
        for chunk in SIZES {
            for buf_len in [1, 7, 4096] {
                let (out, _) = read_through(&data, chunk, buf_len, chunk == 5);
                let frames = parsed(&out);
                let props = headers_of(&frames);
                assert_eq!(props.len(), 52, "chunk {chunk} buffer {buf_len}");
                assert!(marker(&props[50]).is_some());
                assert!(props.iter().enumerate().all(|(i, p)| (i == 50) == marker(p).is_some()));
            }
        }
    }

    #[test]
    fn tables_nested_ten_thousand_deep_are_cut_at_the_depth_bound() {
        let mut data = clean_message(1, b"{}");
        data.extend(deliver(1, b"", b"q"));
        data.extend(header(1, 2, &[(HEADERS, deep_tables(10_000)), (MESSAGE_ID, short(b"deep-1"))]));
        data.extend(body(1, b"{}"));
        data.extend(clean_message(1, b"{}"));
        let frames = parsed(&read_through(&data, 1000, 4096, false).0);
        let props = headers_of(&frames);
        assert_eq!(props.len(), 3);
        let hostile = &props[1];
        assert_eq!(hostile.message_id().as_ref().map(|s| s.as_str()), Some("deep-1"));
        let m = marker(hostile).expect("marked");
        assert!(m.contains("nested deeper than 32 levels"), "{m}");
        // Walk down: 31 tables, then the 32nd level's "a" is a long string
        // holding the rest, raw.
        let mut t: FieldTable = hostile.headers().clone().unwrap();
        for level in 2..=MAX_HEADER_DEPTH {
            t = match t.inner().get("a") {
                Some(AMQPValue::FieldTable(inner)) => inner.clone(),
                other => panic!("level {level}: {other:?}"),
            };
        }
        match t.inner().get("a") {
            Some(AMQPValue::LongString(raw)) => assert_eq!(raw.as_bytes().len(), deep_tables(10_000 - MAX_HEADER_DEPTH).len() - 4),
            other => panic!("{other:?}"),
        }
        assert!(marker(&props[0]).is_none() && marker(&props[2]).is_none());
    }

    #[test]
    fn arrays_nested_ten_thousand_deep_are_cut_at_the_depth_bound() {
        let mut data = deliver(1, b"", b"q");
        data.extend(header(1, 2, &[(HEADERS, deep_arrays(10_000))]));
        data.extend(body(1, b"{}"));
        for chunk in [1, 777, usize::MAX] {
            let props = headers_of(&parsed(&read_through(&data, chunk, 8192, false).0));
            let m = marker(&props[0]).expect("marked");
            assert!(m.contains("header \"arr[0][0]"), "{m}");
            let mut v = props[0].headers().as_ref().unwrap().inner().get("arr").cloned().unwrap();
            let mut levels = 1;
            while let AMQPValue::FieldArray(a) = v {
                v = a.as_slice()[0].clone();
                levels += 1;
            }
            assert!(matches!(v, AMQPValue::LongString(_)), "{v:?}");
            assert_eq!(levels, MAX_HEADER_DEPTH);
        }
    }

    #[test]
    fn short_strings_that_are_not_utf8_are_repaired_one_byte_for_one_and_quoted() {
        let headers = table(&[(b"ok", b'S', long(b"v")), (b"k\xffey", b'S', long(b"\xff raw long strings are fine"))]);
        let data = header(
            1,
            2,
            &[
                (CONTENT_TYPE, short(b"application/json")),
                (HEADERS, headers),
                (MESSAGE_ID, short(b"id-\xff\xfe")),
                (TYPE, short(b"t\xc3")),
            ],
        );
        let props = headers_of(&filtered(&data));
        let p = &props[0];
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "id-??");
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "t?");
        let h = p.headers().as_ref().unwrap().inner();
        assert!(h.contains_key("k?ey") && h.contains_key("ok"));
        match h.get("k?ey") {
            Some(AMQPValue::LongString(s)) => assert_eq!(s.as_bytes(), b"\xff raw long strings are fine"),
            other => panic!("{other:?}"),
        }
        let m = marker(p).unwrap();
        assert!(m.contains(r#"message_id: not UTF-8, was "id-\xff\xfe""#), "{m}");
        assert!(m.contains(r#"type: not UTF-8, was "t\xc3""#), "{m}");
        assert!(m.contains(r#"header name "k\xffey": not UTF-8"#), "{m}");
    }

    #[test]
    fn a_message_without_headers_gets_a_table_for_the_marker() {
        let data = header(1, 2, &[(CONTENT_TYPE, short(b"application/json")), (DELIVERY_MODE, vec![2]), (MESSAGE_ID, short(b"\x80"))]);
        let p = &headers_of(&filtered(&data))[0];
        assert_eq!(p.content_type().as_ref().unwrap().as_str(), "application/json");
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "?");
        assert!(marker(p).unwrap().contains("message_id"));
    }

    #[test]
    fn a_deliver_whose_routing_key_is_not_utf8_marks_its_channels_next_header() {
        let mut data = deliver(3, b"ex-\xff", b"rk-\xfe");
        data.extend(deliver(4, b"", b"clean"));
        data.extend(header(4, 2, &[(MESSAGE_ID, short(b"other-channel"))]));
        data.extend(body(4, b"{}"));
        data.extend(header(3, 2, &[(MESSAGE_ID, short(b"clean-id"))]));
        data.extend(body(3, b"{}"));
        let frames = filtered(&data);
        match &frames[0] {
            AMQPFrame::Method(3, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
                assert_eq!(d.exchange.as_str(), "ex-?");
                assert_eq!(d.routing_key.as_str(), "rk-?");
            }
            other => panic!("{other:?}"),
        }
        let props = headers_of(&frames);
        assert!(marker(&props[0]).is_none(), "channel 4 is not marked");
        let m = marker(&props[1]).unwrap();
        assert!(m.contains(r#"basic.deliver routing key: not UTF-8, was "rk-\xfe""#), "{m}");
        assert!(m.contains(r#"basic.deliver exchange: not UTF-8, was "ex-\xff""#), "{m}");
        assert_eq!(props[1].message_id().as_ref().unwrap().as_str(), "clean-id");
    }

    #[test]
    fn get_ok_and_return_strings_are_repaired_too() {
        let mut get_ok = 9u64.to_be_bytes().to_vec();
        get_ok.push(0);
        get_ok.extend(short(b"\xff"));
        get_ok.extend(short(b"q\xff"));
        get_ok.extend_from_slice(&0u32.to_be_bytes());
        let mut ret = 312u16.to_be_bytes().to_vec();
        ret.extend(short(b"NO_ROUTE"));
        ret.extend(short(b""));
        ret.extend(short(b"\xfe"));
        let mut data = method(1, 60, 71, &get_ok);
        data.extend(header(1, 0, &[]));
        data.extend(method(2, 60, 50, &ret));
        data.extend(header(2, 0, &[]));
        let frames = filtered(&data);
        let props = headers_of(&frames);
        assert!(marker(&props[0]).unwrap().contains("basic.get-ok routing key"));
        assert!(marker(&props[1]).unwrap().contains("basic.return routing key"));
    }

    #[test]
    fn an_unknown_type_letter_turns_the_smallest_table_around_it_into_a_long_string() {
        let inner = table(&[(b"fine", b'I', 5i32.to_be_bytes().to_vec()), (b"bad", b'Z', b"xyz".to_vec())]);
        let headers = table(&[(b"before", b'S', long(b"kept")), (b"outer", b'F', table(&[(b"inner", b'F', inner.clone())]))]);
        let p = &headers_of(&filtered(&header(1, 0, &[(HEADERS, headers)])))[0];
        let h = p.headers().as_ref().unwrap().inner();
        assert!(matches!(h.get("before"), Some(AMQPValue::LongString(_))));
        match h.get("outer") {
            Some(AMQPValue::FieldTable(t)) => match t.inner().get("inner") {
                Some(AMQPValue::LongString(raw)) => assert_eq!(raw.as_bytes(), &inner[4..]),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        let m = marker(p).unwrap();
        assert!(m.contains(r#"header "outer.inner.bad": unknown field type "Z"; the table "outer.inner" kept as a long string"#), "{m}");
    }

    #[test]
    fn an_unknown_type_letter_at_the_top_keeps_the_entries_before_it_and_the_rest_raw() {
        let headers = table(&[(b"x-acemq-id", b'S', long(b"m-1")), (b"bad", b'Z', b"xyz".to_vec()), (b"after", b'V', vec![])]);
        let p = &headers_of(&filtered(&header(1, 2, &[(HEADERS, headers.clone())])))[0];
        let h = p.headers().as_ref().unwrap().inner();
        assert!(matches!(h.get("x-acemq-id"), Some(AMQPValue::LongString(s)) if s.as_bytes() == b"m-1"));
        assert!(!h.contains_key("after"));
        match h.get(MALFORMED_RAW_HEADER) {
            Some(AMQPValue::LongString(raw)) => assert!(raw.as_bytes().starts_with(b"\x03badZxyz")),
            other => panic!("{other:?}"),
        }
        assert!(marker(p).unwrap().contains(r#"header "bad": unknown field type "Z""#));
    }

    #[test]
    fn lengths_that_overrun_their_container_are_contained() {
        // An array that claims more than its table holds.
        let mut lying = vec![b'A'];
        lying.extend_from_slice(&1000u32.to_be_bytes());
        lying.extend_from_slice(b"tx");
        let nested = table(&[(b"liar", lying[0], lying[1..].to_vec())]);
        let p = &headers_of(&filtered(&header(1, 0, &[(HEADERS, table(&[(b"n", b'F', nested)]))])))[0];
        assert!(matches!(p.headers().as_ref().unwrap().inner().get("n"), Some(AMQPValue::LongString(_))));
        assert!(marker(p).unwrap().contains("runs past the end"));
        // A message_id longer than the frame: nothing after it can be found,
        // so the properties are replaced, the body size kept.
        let mut payload = 60u16.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u16.to_be_bytes());
        payload.extend_from_slice(&2u64.to_be_bytes());
        payload.extend_from_slice(&(1u16 << MESSAGE_ID).to_be_bytes());
        payload.extend_from_slice(&[200, b'x']);
        let frames = filtered(&frame(FRAME_HEADER, 1, &payload));
        match &frames[0] {
            AMQPFrame::Header(1, h) => {
                assert_eq!(h.body_size, 2);
                assert!(marker(&h.properties).unwrap().contains("message_id runs past the end of the frame"));
                assert!(h.properties.message_id().is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn continuation_flags_and_trailing_bytes_are_dropped() {
        let mut payload = 60u16.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u16.to_be_bytes());
        payload.extend_from_slice(&0u64.to_be_bytes());
        payload.extend_from_slice(&((1u16 << MESSAGE_ID) | 1).to_be_bytes());
        payload.extend_from_slice(&0u16.to_be_bytes());
        payload.extend(short(b"m-1"));
        payload.extend_from_slice(b"junk");
        let p = &headers_of(&filtered(&frame(FRAME_HEADER, 1, &payload)))[0];
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m-1");
        let m = marker(p).unwrap();
        assert!(m.contains("continued property flags dropped") && m.contains("4 bytes after the properties dropped"), "{m}");
    }

    #[test]
    fn a_repaired_header_stays_within_frame_max() {
        // frame_max 4096 and a header frame that already fills it, with one
        // bad name: the marker does not fit beside the headers, so they go.
        let filler = vec![b'x'; 4050];
        let headers = table(&[(b"k\xff", b'S', long(&filler))]);
        let mut data = tune(4096);
        data.extend(header(1, 2, &[(HEADERS, headers), (MESSAGE_ID, short(b"m-1"))]));
        let hdr_len = data.len() - tune(4096).len();
        assert!(hdr_len <= 4096 && hdr_len > 4050);
        let (out, _) = read_through(&data, usize::MAX, 65_536, false);
        let frames = parsed(&out);
        let len = out.len() - tune(4096).len();
        assert!(len <= 4096, "{len}");
        let p = &headers_of(&frames)[0];
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m-1");
        let m = marker(p).unwrap();
        assert!(m.contains("header name") && m.contains("dropped to keep the frame within frame_max (4096 bytes)"), "{m}");
        assert!(!p.headers().as_ref().unwrap().inner().contains_key("k?"));
    }

    #[test]
    fn the_marker_is_bounded() {
        let entries: Vec<(Vec<u8>, u8, Vec<u8>)> =
            (0..400).map(|i| (format!("key-{i:03}-\u{1}").into_bytes().into_iter().chain([0xff]).collect(), b'V', vec![])).collect();
        let refs: Vec<(&[u8], u8, Vec<u8>)> = entries.iter().map(|(k, t, v)| (k.as_slice(), *t, v.clone())).collect();
        let p = &headers_of(&filtered(&header(1, 0, &[(HEADERS, table(&refs))])))[0];
        let m = marker(p).unwrap();
        assert!(m.len() <= MAX_MARKER, "{}", m.len());
        assert!(m.contains("more"), "{m}");
        assert_eq!(p.headers().as_ref().unwrap().inner().len(), 401);
    }

    #[test]
    fn a_frame_is_buffered_as_its_bytes_arrive_not_as_large_as_it_claims() {
        // Found by the frame_filter fuzz target (fuzz/, issue 30): a tune
        // proposing a 4 GiB frame_max, then a method frame claiming 1.5 GiB
        // whose bytes never came, had the filter allocate and zero 1.5 GiB
        // (200 MB here). lapin refuses such a frame; the filter must not
        // have paid for it first.
        let mut data = tune(u32::MAX);
        let mut huge = method(1, 60, 60, b"");
        huge[3..7].copy_from_slice(&200_000_000u32.to_be_bytes());
        huge.truncate(20);
        data.extend_from_slice(&huge);
        let script = Script { data: data.clone(), pos: 0, chunk: 8, pending: false, owed: false, last_was_pending: false };
        let mut filtered = Filtered::new(script, 0);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut buf = vec![0u8; 1 << 16];
        let mut out = Vec::new();
        loop {
            match Pin::new(&mut filtered).poll_read(&mut cx, &mut buf) {
                Poll::Ready(Ok(0)) => break,
                Poll::Ready(Ok(n)) => out.extend_from_slice(&buf[..n]),
                other => panic!("{other:?}"),
            }
            let buffered = filtered.input.capacity() + filtered.output.capacity();
            assert!(buffered <= 4 * READ_AHEAD, "buffered {buffered} bytes");
        }
        assert_eq!(out, data, "passed on as it came at the end of the stream");
    }

    #[test]
    fn what_is_not_amqp_framing_switches_the_filter_off() {
        // The broker refusing our protocol version, then closing.
        let refusal = b"AMQP\x00\x00\x09\x01".to_vec();
        assert_eq!(read_through(&refusal, 3, 5, true).0, refusal);
        // A bad frame-end byte: from there on nothing is touched, not even
        // a header lapin would choke on (lapin reports the broken frame).
        let mut broken = header(1, 0, &[(MESSAGE_ID, short(b"ok"))]);
        *broken.last_mut().unwrap() = 0;
        broken.extend(header(1, 0, &[(MESSAGE_ID, short(b"\xff"))]));
        assert_eq!(read_through(&broken, usize::MAX, 4096, false).0, broken);
        let mut unknown = frame(9, 0, b"??");
        unknown.extend(header(1, 0, &[(MESSAGE_ID, short(b"\xff"))]));
        assert_eq!(read_through(&unknown, 2, 4096, false).0, unknown);
    }

    #[test]
    fn connection_start_server_properties_are_depth_bounded_in_place() {
        let mut args = vec![0, 9];
        args.extend(deep_tables(100));
        args.extend(long(b"PLAIN"));
        args.extend(long(b"en_US"));
        let data = method(0, 10, 10, &args);
        let (out, _) = read_through(&data, 100, 4096, false);
        assert_eq!(out.len(), data.len(), "repaired in place");
        match &parsed(&out)[0] {
            AMQPFrame::Method(0, AMQPClass::Connection(_)) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn connection_start_gives_the_broker_version_past_nested_tables() {
        let caps = table(&[(b"basic.nack", b't', vec![1])]);
        let props = table(&[
            (b"capabilities", b'F', caps),
            (b"copyright", b'S', long(b"(c) someone")),
            (b"version", b'S', long(b"4.3.6")),
        ]);
        let mut args = vec![0, 9];
        args.extend(props);
        args.extend(long(b"PLAIN"));
        args.extend(long(b"en_US"));
        let mut frames = Frames::new(0);
        let slot = ServerVersion::default();
        frames.server = Some(slot.clone());
        let mut data = method(0, 10, 10, &args);
        let _ = frames.step(&mut data);
        assert_eq!(slot.lock().unwrap().as_deref(), Some("4.3.6"));
        assert_eq!(server_version(&[3, b'a']), None, "cut short");
        assert_eq!(server_version(&[1, b'v', b'Q']), None, "unknown type letter");
    }

    /// Through lapin itself, on a socket: a broker that sends a hostile
    /// delivery between two good ones. Without the filter lapin's I/O
    /// thread would close the connection at the second (or overflow its
    /// stack); with it all three arrive, the middle one marked, and the
    /// connection stays up.
    #[tokio::test(flavor = "multi_thread")]
    async fn lapin_reads_hostile_deliveries_through_the_filter() {
        use futures_lite::StreamExt;
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let broker = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut proto = [0u8; 8];
            s.read_exact(&mut proto).unwrap();
            let mut start = vec![0, 9];
            start.extend(table(&[(b"product", b'S', long(b"fake"))]));
            start.extend(long(b"PLAIN"));
            start.extend(long(b"en_US"));
            s.write_all(&method(0, 10, 10, &start)).unwrap();
            loop {
                let mut prefix = [0u8; 7];
                if s.read_exact(&mut prefix).is_err() {
                    return;
                }
                let mut rest = vec![0u8; be32(&prefix[3..7]) as usize + 1];
                s.read_exact(&mut rest).unwrap();
                if prefix[0] != FRAME_METHOD {
                    continue;
                }
                let channel = be16(&prefix[1..3]);
                let reply = match (be16(&rest[0..2]), be16(&rest[2..4])) {
                    (10, 11) => tune_with(131_072, 0),
                    (10, 40) => method(0, 10, 41, &short(b"")),
                    (20, 10) => method(channel, 20, 11, &long(b"")),
                    (60, 20) => {
                        let mut out = method(channel, 60, 21, &short(b"ctag"));
                        let mut deep = deep_tables(10_000);
                        deep = table(&[(b"deep", b'F', deep)]);
                        type Case<'a> = (&'a [u8], Vec<(u8, Vec<u8>)>);
                        let cases: [Case; 4] = [
                            (b"q", vec![(MESSAGE_ID, short(b"good-1"))]),
                            (b"q-\xff", vec![(MESSAGE_ID, short(b"id-\xff")), (HEADERS, table(&[(b"k", b'Z', vec![])]))]),
                            (b"q", vec![(HEADERS, deep), (MESSAGE_ID, short(b"deep"))]),
                            (b"q", vec![(MESSAGE_ID, short(b"good-2"))]),
                        ];
                        for (rk, props) in cases {
                            let mut props = props;
                            props.sort_by_key(|p| std::cmp::Reverse(p.0));
                            let mut a = short(b"ctag");
                            a.extend_from_slice(&1u64.to_be_bytes());
                            a.push(0);
                            a.extend(short(b""));
                            a.extend(short(rk));
                            out.extend(method(channel, 60, 60, &a));
                            out.extend(header(channel, 2, &props));
                            out.extend(body(channel, b"{}"));
                        }
                        out
                    }
                    (10, 50) => {
                        let _ = s.write_all(&method(0, 10, 51, &[]));
                        return;
                    }
                    _ => continue,
                };
                s.write_all(&reply).unwrap();
            }
        });
        let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
        let conn = lapin::Connection::connect_with_runtime(&url, lapin::ConnectionProperties::default(), runtime(0, None, Default::default())).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        let mut consumer = ch
            .basic_consume("q".into(), "".into(), lapin::options::BasicConsumeOptions::default(), FieldTable::default())
            .await
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..4 {
            let d = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await.expect("a delivery").unwrap().unwrap();
            let props = &d.properties;
            let mark = props.headers().as_ref().and_then(|h| h.inner().get(MALFORMED_HEADER).cloned());
            got.push((props.message_id().as_ref().map(|s| s.to_string()), d.routing_key.to_string(), mark.is_some()));
        }
        assert_eq!(got[0], (Some("good-1".into()), "q".into(), false));
        assert_eq!(got[1], (Some("id-?".into()), "q-?".into(), true));
        assert_eq!(got[2], (Some("deep".into()), "q".into(), true));
        assert_eq!(got[3], (Some("good-2".into()), "q".into(), false));
        assert!(conn.status().connected());
        let _ = conn.close(200, "OK".into()).await;
        let _ = broker.join();
    }
}
