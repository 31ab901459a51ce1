//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), built only
//! with the `fuzzing` feature. Not API: the engine's private pieces that
//! read what a broker or a publisher wrote, reachable from outside the crate
//! so that libFuzzer can drive them, and nothing else. See
//! docs/hostile-input.md, "Fuzzing".

use crate::transport::Filtered;
use futures_lite::AsyncRead;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use crate::decode::{decode_as, Payload, Undecodable};
pub use crate::wire::{envelope_of, props_for, Props, RawDelivery, MALFORMED_HEADER, MALFORMED_RAW_HEADER};

/// The broker's side of a socket: hands out `data` in reads of the sizes
/// in `chunks` (cycled), answering Pending before every other read.
struct Script<'a> {
    data: &'a [u8],
    pos: usize,
    chunks: &'a [usize],
    reads: usize,
    owed: bool,
    last_was_pending: bool,
}

impl AsyncRead for Script<'_> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        if self.reads % 2 == 1 && !self.owed {
            self.owed = true;
            self.last_was_pending = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.owed = false;
        self.last_was_pending = false;
        let chunk = self.chunks[self.reads % self.chunks.len()].max(1);
        self.reads += 1;
        let n = chunk.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Poll::Ready(Ok(n))
    }
}

/// What lapin reads when the broker sends `data`: `data` passed through the
/// frame filter in reads of `chunks` bytes from the socket (cycled; empty
/// means one read), into lapin's buffers of `buf_len` bytes.
///
/// Panics where the filter breaks the contract lapin relies on: Pending
/// without the socket's Pending, or 0 (the end) before the end of `data`.
pub fn filter(data: &[u8], chunks: &[usize], buf_len: usize, client_frame_max: u32) -> Vec<u8> {
    let all = [usize::MAX];
    let chunks = if chunks.is_empty() { &all[..] } else { chunks };
    let script = Script { data, pos: 0, chunks, reads: 0, owed: false, last_was_pending: false };
    let mut filtered = Filtered::new(script, client_frame_max);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut buf = vec![0u8; buf_len.max(1)];
    let mut out = Vec::new();
    loop {
        match Pin::new(&mut filtered).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(0)) => break,
            Poll::Ready(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Poll::Ready(Err(e)) => panic!("the filter failed a read: {e}"),
            Poll::Pending => assert!(filtered.inner().last_was_pending, "Pending without the socket's Pending"),
        }
    }
    assert_eq!(filtered.inner().pos, data.len(), "0 (the end) before the end of the stream");
    out
}

/// What a copy (a retry, a dead letter, a replay) sends of `props`
/// (`limits::copy_props`).
pub fn copy_props(props: &mut Props) {
    crate::limits::copy_props(props)
}

/// The body check's fast path (`wire::utf8`), which must agree with
/// `std::str::from_utf8`.
pub fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    crate::wire::utf8(bytes)
}

/// The engine's properties for a content header's properties as lapin
/// parsed them (the header table stays as it arrived until read).
pub fn from_basic_properties(b: lapin::BasicProperties) -> Props {
    crate::transport::amqp::from_basic_properties(b)
}

/// The properties lapin is given to send a copy (a retry, a dead letter).
pub fn to_basic_properties(p: &Props) -> lapin::BasicProperties {
    crate::transport::amqp::to_basic_properties(p)
}
