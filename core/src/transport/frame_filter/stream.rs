//! A stream whose reads are filtered frame by frame; writes pass straight through.

use super::*;

/// A stream whose reads are filtered frame by frame (see the module docs);
/// writes pass straight through.
pub(crate) struct Filtered<S> {
    pub(super) inner: S,
    pub(super) frames: Frames,
    /// Read and not yet passed on: the start of a method or content-header
    /// frame that is not complete yet (and what came after it in that read).
    pub(super) input: Vec<u8>,
    /// Ready to be passed on, in order, before anything else: frames that
    /// were rewritten, or that were completed in `input`.
    pub(super) output: Vec<u8>,
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
    pub(super) fn filter_in_place(&mut self, buf: &mut [u8]) -> usize {
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
    pub(super) fn filter_input(&mut self) {
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
