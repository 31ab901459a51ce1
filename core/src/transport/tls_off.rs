//! `amqps://` in a build without the `tls` feature: the same names as
//! tls.rs, so the dial is written once, and a connection to an `amqps://`
//! URL refused with what to do. Nothing here can be built: `Tls` and
//! `TlsDial` have no values, so every method past `Tls::new` is unreachable
//! by construction.

use crate::transport::TlsOptions;
use crate::error::{Error, ErrorKind, Result};
use futures_lite::{AsyncRead, AsyncWrite};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Never built: see [`Tls::new`].
pub(crate) enum Tls {}

/// The reason a handshake failed; there is none without TLS.
pub(crate) enum Failure {}

impl Tls {
    /// Refused: this build has no TLS stack.
    pub(crate) fn new(_options: &TlsOptions) -> Result<Tls> {
        Err(Error::new(
            ErrorKind::Tls,
            "amqps:// needs acemq's `tls` feature, which this build leaves out: add \"tls\" to acemq's features in Cargo.toml (it is a default feature), or connect with amqp://",
        ))
    }

    pub(crate) fn dial(&self, _host: &str) -> Result<TlsDial> {
        match *self {}
    }

    pub(crate) fn refused_client_certificate(&self, _dial: &TlsDial, _endpoint: &str) -> Option<Error> {
        match *self {}
    }

    pub(crate) fn explain(&self, _e: &Failure, _endpoint: &str, _name: &str) -> Error {
        match *self {}
    }
}

/// Never built.
#[derive(Clone)]
pub(crate) enum TlsDial {}

impl TlsDial {
    pub(crate) fn failure(&self) -> Option<Failure> {
        match *self {}
    }

    pub(crate) fn name(&self) -> String {
        match *self {}
    }

    pub(crate) fn handshake<S>(&self, _tcp: S) -> std::future::Ready<io::Result<Socket<S>>> {
        match *self {}
    }
}

/// A broker connection's byte stream: plain TCP only.
pub(crate) enum Socket<S> {
    Plain(S),
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Socket<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let Socket::Plain(s) = self.get_mut();
        Pin::new(s).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Socket<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let Socket::Plain(s) = self.get_mut();
        Pin::new(s).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let Socket::Plain(s) = self.get_mut();
        Pin::new(s).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Socket::Plain(s) = self.get_mut();
        Pin::new(s).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Socket::Plain(s) = self.get_mut();
        Pin::new(s).poll_close(cx)
    }
}
