//! The front door: which TCP connections the gRPC server takes and how long it
//! waits for them. At most `max_connections` are open (more wait in the kernel's
//! backlog); a connection that sends nothing within `first_byte_timeout` (a port
//! scan, a TLS client that never starts its handshake) is closed; an accept error
//! (out of file descriptors) backs off instead of spinning a core.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Limits on the connections the server takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub first_byte_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            // CA keeps one connection; health probes and a few operators add some.
            max_connections: 256,
            first_byte_timeout: Duration::from_secs(10),
        }
    }
}

/// Longest pause after an accept error.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepted connections, at most `max_connections` open at once.
pub fn incoming(
    listener: TcpListener,
    limits: ConnectionLimits,
) -> impl Stream<Item = io::Result<LimitedStream>> + Send + 'static {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    futures::stream::unfold(
        (listener, slots, Duration::from_millis(10)),
        move |(listener, slots, mut backoff)| async move {
            let permit = slots.clone().acquire_owned().await.ok()?;
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        // No Nagle: unary answers are small, and a delayed ACK would
                        // add ~40 ms each.
                        let _ = stream.set_nodelay(true);
                        let conn = LimitedStream::new(stream, permit, limits.first_byte_timeout);
                        return Some((Ok(conn), (listener, slots, Duration::from_millis(10))));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "accept failed; backing off");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    }
                }
            }
        },
    )
}

/// A TCP connection that holds one of the server's connection slots and is closed if
/// its peer says nothing within the first-byte timeout.
pub struct LimitedStream {
    inner: TcpStream,
    _slot: OwnedSemaphorePermit,
    first_byte: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl LimitedStream {
    fn new(inner: TcpStream, slot: OwnedSemaphorePermit, first_byte_timeout: Duration) -> Self {
        Self {
            inner,
            _slot: slot,
            first_byte: Some(Box::pin(tokio::time::sleep(first_byte_timeout))),
        }
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.first_byte = None,
            Poll::Pending => {
                if let Some(t) = self.first_byte.as_mut() {
                    if t.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client sent nothing within the first-byte timeout",
                        )));
                    }
                }
            }
            _ => {}
        }
        r
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl Connected for LimitedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
