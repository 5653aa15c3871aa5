//! The front door: which connections (TCP, or a Unix socket's) the gRPC server takes
//! and how long it waits for them. At most `max_connections` are open. At the cap a new connection
//! is never left waiting behind idle ones: the oldest open connection that has sent
//! no request is closed to make room (idle connections must not lock CA out). Only
//! when every open connection has sent a request does the new one wait for a slot.
//! "Sent a request": on plaintext HTTP/2, a HEADERS frame after the client preface
//! (an idle client's preface, SETTINGS and PINGs do not count); on any other
//! protocol (TLS, whose bytes this layer cannot read), any byte. A connection that
//! sends nothing within `first_byte_timeout` (a port scan, a TLS client that never
//! starts its handshake) is closed; an accept error (out of file descriptors) backs
//! off instead of spinning a core.

use std::collections::BTreeMap;
use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::Stream;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Notify;
use tonic::transport::server::Connected;

/// A listener the door takes connections from.
pub trait Acceptor: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static;
    fn accept_one(&self) -> impl std::future::Future<Output = io::Result<Self::Stream>> + Send;
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;
    async fn accept_one(&self) -> io::Result<TcpStream> {
        let (stream, _) = self.accept().await?;
        // No Nagle: unary answers are small, and a delayed ACK would add ~40 ms each.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Acceptor for UnixListener {
    type Stream = UnixStream;
    async fn accept_one(&self) -> io::Result<UnixStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

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

/// The client preface every HTTP/2 connection starts with (RFC 9113 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// HTTP/2 frame type HEADERS: a request (RFC 9113 6.2).
const H2_HEADERS: u8 = 0x1;

/// What the door knows about one open connection.
#[derive(Default)]
struct Conn {
    /// The peer sent a request (see the module doc): never closed to make room.
    requested: AtomicBool,
    /// Closed to make room: the next read fails.
    evicted: AtomicBool,
    /// The reader to wake when evicted.
    waker: Mutex<Option<Waker>>,
}

/// The open connections, oldest first.
struct Slots {
    max: usize,
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    freed: Notify,
}

impl Slots {
    /// Takes a slot for a new connection: a free one, else the one of the oldest
    /// connection that has sent no request (closed now); `None` when every open
    /// connection has sent a request.
    fn take(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.lock();
        if open.len() >= self.max {
            let idle = open
                .iter()
                .find(|(_, c)| !c.requested.load(Ordering::Acquire))
                .map(|(id, _)| *id)?;
            let c = open.remove(&idle).expect("present");
            c.evicted.store(true, Ordering::Release);
            if let Some(w) = c.waker.lock().take() {
                w.wake();
            }
            tracing::debug!(
                "connection cap reached: closing the oldest connection that sent no request"
            );
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::default());
        open.insert(id, conn.clone());
        Some(Slot {
            slots: self.clone(),
            id,
            conn,
        })
    }
}

/// One connection's place among the open ones; given back on drop.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.slots.open.lock().remove(&self.id).is_some() {
            self.slots.freed.notify_one();
        }
    }
}

/// Accepted connections, at most `max_connections` open at once.
pub fn incoming<L: Acceptor>(
    listener: L,
    limits: ConnectionLimits,
) -> impl Stream<Item = io::Result<LimitedStream<L::Stream>>> + Send + 'static {
    let slots = Arc::new(Slots {
        max: limits.max_connections.max(1),
        open: Mutex::new(BTreeMap::new()),
        next: AtomicU64::new(0),
        freed: Notify::new(),
    });
    futures::stream::unfold(
        (listener, slots, Duration::from_millis(10)),
        move |(listener, slots, mut backoff)| async move {
            loop {
                match listener.accept_one().await {
                    Ok(stream) => {
                        // Room is made when a connection arrives, not before: a slot
                        // taken ahead would close the newest connection before it
                        // could send its first request. While every slot is held by
                        // a connection that sent a request, this one waits.
                        let slot = loop {
                            if let Some(slot) = slots.take() {
                                break slot;
                            }
                            slots.freed.notified().await;
                        };
                        let conn = LimitedStream::new(stream, slot, limits.first_byte_timeout);
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

/// Where the reader of a connection is in the peer's byte stream, to tell an HTTP/2
/// request from an idle client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Matched this much of the client preface.
    Preface(usize),
    /// Gathering a 9-byte frame header.
    Header([u8; 9], usize),
    /// Skipping a frame's payload.
    Payload(usize),
    /// A request was seen, or the protocol is not plaintext HTTP/2.
    Done,
}

impl Scan {
    /// Advances over `bytes`; returns whether the peer has now sent a request.
    fn feed(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match *self {
                Scan::Done => return true,
                Scan::Preface(n) => {
                    let take = (H2_PREFACE.len() - n).min(bytes.len());
                    if bytes[..take] != H2_PREFACE[n..n + take] {
                        // Not plaintext HTTP/2 (TLS): any byte counts.
                        *self = Scan::Done;
                        return true;
                    }
                    bytes = &bytes[take..];
                    *self = if n + take == H2_PREFACE.len() {
                        Scan::Header([0; 9], 0)
                    } else {
                        Scan::Preface(n + take)
                    };
                }
                Scan::Header(mut h, n) => {
                    let take = (9 - n).min(bytes.len());
                    h[n..n + take].copy_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if n + take < 9 {
                        *self = Scan::Header(h, n + take);
                    } else if h[3] == H2_HEADERS {
                        *self = Scan::Done;
                        return true;
                    } else {
                        let len = (usize::from(h[0]) << 16)
                            | (usize::from(h[1]) << 8)
                            | usize::from(h[2]);
                        *self = if len == 0 {
                            Scan::Header([0; 9], 0)
                        } else {
                            Scan::Payload(len)
                        };
                    }
                }
                Scan::Payload(left) => {
                    let take = left.min(bytes.len());
                    bytes = &bytes[take..];
                    *self = if left == take {
                        Scan::Header([0; 9], 0)
                    } else {
                        Scan::Payload(left - take)
                    };
                }
            }
        }
        *self == Scan::Done
    }
}

/// A connection that holds one of the server's connection slots, is closed if its
/// peer says nothing within the first-byte timeout, and may be closed to make room
/// until its peer sends a request.
pub struct LimitedStream<S = TcpStream> {
    inner: S,
    slot: Slot,
    scan: Scan,
    first_byte: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> LimitedStream<S> {
    fn new(inner: S, slot: Slot, first_byte_timeout: Duration) -> Self {
        Self {
            inner,
            slot,
            scan: Scan::Preface(0),
            first_byte: Some(Box::pin(tokio::time::sleep(first_byte_timeout))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LimitedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let conn = self.slot.conn.clone();
        if conn.evicted.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room: the connection cap was reached and this connection had sent no request",
            )));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.first_byte = None;
                if !conn.requested.load(Ordering::Relaxed) {
                    let mut scan = self.scan;
                    if scan.feed(&buf.filled()[before..]) {
                        conn.requested.store(true, Ordering::Release);
                        *conn.waker.lock() = None;
                    }
                    self.scan = scan;
                }
            }
            Poll::Pending => {
                if !conn.requested.load(Ordering::Relaxed) {
                    *conn.waker.lock() = Some(cx.waker().clone());
                    // Evicted between the check above and storing the waker.
                    if conn.evicted.load(Ordering::Acquire) {
                        cx.waker().wake_by_ref();
                    }
                }
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

impl<S: AsyncWrite + Unpin> AsyncWrite for LimitedStream<S> {
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

impl<S: Connected> Connected for LimitedStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ty: u8, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, ty, 0, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn an_idle_h2_client_is_not_a_request_and_headers_are_in_any_split() {
        let mut idle = H2_PREFACE.to_vec();
        idle.extend(frame(0x4, &[0; 12])); // SETTINGS
        idle.extend(frame(0x8, &[0, 0, 0, 9])); // WINDOW_UPDATE
        idle.extend(frame(0x6, &[7; 8])); // PING
        idle.extend(frame(0x4, &[])); // SETTINGS ack
        let mut req = idle.clone();
        req.extend(frame(H2_HEADERS, &[1, 2, 3]));
        for split in 1..=idle.len() {
            let mut s = Scan::Preface(0);
            assert!(!idle.chunks(split).any(|c| s.feed(c)), "split {split}");
        }
        for split in 1..=req.len() {
            let mut s = Scan::Preface(0);
            let seen = req.chunks(split).map(|c| s.feed(c)).collect::<Vec<_>>();
            // Seen in the chunk that completes the HEADERS frame header, not before.
            let first = seen.iter().position(|b| *b);
            assert_eq!(first, Some((idle.len() + 8) / split), "split {split}");
        }
    }

    #[test]
    fn anything_but_plaintext_h2_counts_at_its_first_byte() {
        let mut s = Scan::Preface(0);
        assert!(s.feed(&[0x16, 0x03, 0x01])); // a TLS ClientHello
        let mut s = Scan::Preface(0);
        assert!(!s.feed(b"PRI * "));
        assert!(s.feed(b"GET / HTTP/1.1\r\n"));
    }
}
