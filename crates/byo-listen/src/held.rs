//! The two ways a connection could be held once its head is in: a body trickled forever and
//! an answer never read. Each is a wrapper with its own timer.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pin_project! {
    /// A request body that fails once `deadline` has passed since the request's head,
    /// however its bytes trickle: the body-read timeout restarts with every byte, this
    /// does not.
    pub struct DeadlineBody<B> {
        #[pin]
        inner: B,
        #[pin]
        deadline: Sleep,
    }
}

impl<B> DeadlineBody<B> {
    pub fn new(inner: B, deadline: Duration) -> Self {
        DeadlineBody {
            inner,
            deadline: tokio::time::sleep(deadline),
        }
    }
}

/// The error a body past its deadline fails with.
#[derive(Debug)]
pub struct BodyDeadline;

impl std::fmt::Display for BodyDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive whole in time")
    }
}

impl std::error::Error for BodyDeadline {}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyDeadline))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection whose writes fail once one has made no progress for `timeout`: a client
/// that stops reading an answer is closed, not waited on.
pub struct WriteTimeout<T> {
    inner: T,
    timeout: Duration,
    stalled: Pin<Box<Sleep>>,
    // Whether `stalled` runs: set by a write that could not proceed, cleared by one that did.
    armed: bool,
}

impl<T> WriteTimeout<T> {
    pub fn new(inner: T, timeout: Duration) -> Self {
        WriteTimeout {
            inner,
            timeout,
            stalled: Box::pin(tokio::time::sleep(timeout)),
            armed: false,
        }
    }
}

impl<T: AsyncWrite + Unpin> WriteTimeout<T> {
    /// `poll` on the inner stream, timed: Pending for `timeout` without progress is an error.
    fn timed<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Ready(r) => {
                self.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                if !self.armed {
                    self.armed = true;
                    let at = Instant::now() + self.timeout;
                    self.stalled.as_mut().reset(at);
                }
                ready!(self.stalled.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client stopped reading the answer",
                )))
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.timed(cx, |inner, cx| inner.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.timed(cx, |inner, cx| inner.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.timed(cx, |inner, cx| inner.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.timed(cx, |inner, cx| inner.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
