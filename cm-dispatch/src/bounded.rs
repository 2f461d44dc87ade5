//! Replies of the mission runtimes' APIs read up to [`MAX_REPLY_BYTES`].
//!
//! kube and bollard read most replies whole before they parse them (a Job, a pod list, a
//! container's inspection, an error's text), with no bound of their own. cm bounds them
//! underneath the clients: kube's client stack takes a layer, so each reply's body becomes a
//! [`Bounded`] body that fails past the bound; bollard's transport must hand back hyper's own
//! body type, so the Docker backend bounds one level lower, on the connection: each connection
//! carries one request and its reply (no pooling), read through a [`Capped`] stream that fails
//! past the bound. Either way the client sees a failed read, which it reports as an error of the
//! call, and what it read so far is dropped.

use std::fmt;

use crate::runtime::MAX_REPLY_BYTES;

/// A reply cut at [`MAX_REPLY_BYTES`]: the error a bounded read ends with, naming the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLarge {
    /// Whose reply: `the Kubernetes API`, `the Docker engine`.
    pub(crate) from: &'static str,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sent a reply longer than {} MiB, the most cm reads of one reply \
             (MAX_REPLY_BYTES); it was not read further",
            self.from,
            MAX_REPLY_BYTES >> 20
        )
    }
}

impl std::error::Error for TooLarge {}

/// Whether `e` is, at its root, a reply cut at the bound.
#[cfg(feature = "docker")]
pub(crate) fn too_large(e: &(dyn std::error::Error + 'static)) -> Option<TooLarge> {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(cut) = e.downcast_ref::<TooLarge>() {
            return Some(*cut);
        }
        cause = e.source();
    }
    None
}

#[cfg(feature = "kubernetes")]
pub(crate) use body::Bounded;

#[cfg(feature = "kubernetes")]
mod body {
    use std::pin::Pin;
    use std::task::{Context, Poll, ready};

    use bytes::Buf as _;
    use http_body::{Body, Frame, SizeHint};

    use super::TooLarge;
    use crate::runtime::MAX_REPLY_BYTES;

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// A reply's body that fails once more than [`MAX_REPLY_BYTES`] of data came through it, or
    /// at once when its declared length (`Content-Length`) is over that.
    pub(crate) struct Bounded<B> {
        inner: B,
        read: u64,
        from: &'static str,
        failed: bool,
    }

    impl<B> Bounded<B> {
        /// `inner`, bounded, a reply of `from`.
        pub(crate) fn new(inner: B, from: &'static str) -> Self {
            Bounded {
                inner,
                read: 0,
                from,
                failed: false,
            }
        }

        fn fail<D>(&mut self) -> Poll<Option<Result<Frame<D>, BoxError>>> {
            self.failed = true;
            Poll::Ready(Some(Err(Box::new(TooLarge { from: self.from }))))
        }
    }

    impl<B> Body for Bounded<B>
    where
        B: Body + Unpin,
        B::Error: Into<BoxError>,
    {
        type Data = B::Data;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            if self.failed {
                return Poll::Ready(None);
            }
            if self.read == 0 && self.inner.size_hint().lower() > MAX_REPLY_BYTES {
                return self.fail();
            }
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let length = frame.data_ref().map_or(0, |data| data.remaining() as u64);
                    self.read = self.read.saturating_add(length);
                    if self.read > MAX_REPLY_BYTES {
                        return self.fail();
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
                None => Poll::Ready(None),
            }
        }

        fn is_end_stream(&self) -> bool {
            self.failed || self.inner.is_end_stream()
        }

        fn size_hint(&self) -> SizeHint {
            self.inner.size_hint()
        }
    }
}

#[cfg(feature = "docker")]
pub(crate) use stream::Capped;

#[cfg(feature = "docker")]
mod stream {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll, ready};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    use super::TooLarge;
    use crate::runtime::MAX_REPLY_BYTES;

    /// A connection whose reads fail once more than [`MAX_REPLY_BYTES`] came through them; its
    /// writes are the connection's own. The bytes of the read that passed the bound are not
    /// handed on.
    #[derive(Debug)]
    pub(crate) struct Capped<S> {
        inner: S,
        read: u64,
        from: &'static str,
    }

    impl<S> Capped<S> {
        /// `inner`, capped, a connection to `from`.
        pub(crate) fn new(inner: S, from: &'static str) -> Self {
            Capped {
                inner,
                read: 0,
                from,
            }
        }

        fn cut(&self) -> io::Error {
            io::Error::other(TooLarge { from: self.from })
        }
    }

    impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if this.read > MAX_REPLY_BYTES {
                return Poll::Ready(Err(this.cut()));
            }
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let read = (buf.filled().len() - before) as u64;
            this.read = this.read.saturating_add(read);
            if this.read > MAX_REPLY_BYTES {
                buf.set_filled(before);
                return Poll::Ready(Err(this.cut()));
            }
            Poll::Ready(Ok(()))
        }
    }

    impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.inner.is_write_vectored()
        }
    }

    #[cfg(test)]
    mod tests {
        use tokio::io::AsyncReadExt as _;

        use super::*;

        /// A connection that sends more than the bound hands on the bound at most, then fails
        /// naming it; one that sends less is read to its end.
        #[tokio::test]
        async fn a_capped_connection_fails_past_the_bound() {
            let long = vec![b'x'; MAX_REPLY_BYTES as usize + 10];
            let mut capped = Capped::new(&long[..], "the Docker engine");
            let mut read = Vec::new();
            let err = capped.read_to_end(&mut read).await.unwrap_err();
            assert!(read.len() as u64 <= MAX_REPLY_BYTES, "{}", read.len());
            assert!(err.to_string().contains("16 MiB"), "{err}");
            let short = b"HTTP/1.1 200 OK\r\n\r\n{}";
            let mut capped = Capped::new(&short[..], "the Docker engine");
            let mut read = Vec::new();
            capped.read_to_end(&mut read).await.unwrap();
            assert_eq!(read, short);
        }
    }
}
