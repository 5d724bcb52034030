//! gRPC connections as the ingest server accepts them: a cap on how many are open at once, a deadline for the
//! HTTP/2 handshake, and one switch that closes every open connection at the end of the shutdown drain.
//!
//! [`Incoming`] wraps tonic's `TcpIncoming` (which sets `TCP_NODELAY` and TCP keepalive). Each accepted socket
//! takes a permit of a semaphore of `grpc.max_connections`; with none left the socket is closed at once, before
//! a byte is read (the client sees the connection reset and retries with backoff). Each [`GuardedConn`] holds its
//! permit until it is dropped and fails its reads and writes:
//! - when the peer has not sent the HTTP/2 preface and its first frame within `grpc.handshake_timeout` (after
//!   the handshake, hyper's HTTP/2 keepalive pings find silent and half-open peers);
//! - once the collector's close switch is thrown (shutdown, after the drain deadline), whatever the connection
//!   is doing. hyper then ends the connection, which drops the service it holds, so nothing on a connection can
//!   keep the committer's channel open.

use super::IngestStats;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// The HTTP/2 client connection preface (RFC 9113, section 3.4).
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header: 24-bit length, type, flags, stream id.
const FRAME_HEADER_LEN: usize = 9;

/// Limits on accepted gRPC connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Time a new connection has to send the HTTP/2 preface and its first frame.
    pub handshake_timeout: Duration,
}

/// The accepted-connection stream handed to tonic's server.
pub struct Incoming {
    inner: TcpIncoming,
    permits: Arc<Semaphore>,
    limits: ConnectionLimits,
    close: CancellationToken,
    stats: Arc<IngestStats>,
}

impl Incoming {
    /// Wraps `inner`; `close` closes every connection it accepted (and any it accepts later).
    pub fn new(
        inner: TcpIncoming,
        limits: ConnectionLimits,
        close: CancellationToken,
        stats: Arc<IngestStats>,
    ) -> Self {
        Incoming { inner, permits: Arc::new(Semaphore::new(limits.max_connections)), limits, close, stats }
    }
}

impl Stream for Incoming {
    type Item = io::Result<GuardedConn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let stream = match ready!(Pin::new(&mut self.inner).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(stream)) => stream,
            };
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let conn = GuardedConn::new(stream, permit, &self.limits, &self.close, self.stats.clone());
                    return Poll::Ready(Some(Ok(conn)));
                }
                Err(_) => {
                    let n = self.stats.connections_refused.fetch_add(1, Ordering::Relaxed) + 1;
                    // The first refusal and then one in a thousand: a flood must not flood the log too.
                    if n % 1000 == 1 {
                        tracing::warn!(
                            max_connections = self.limits.max_connections,
                            refused_so_far = n,
                            peer = ?stream.peer_addr().ok(),
                            "grpc connection refused: grpc.max_connections are open"
                        );
                    }
                    drop(stream);
                }
            }
        }
    }
}

/// Progress of the HTTP/2 handshake, as far as the connection has read.
#[derive(Debug)]
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    /// The first bytes read: the preface and the first frame's header.
    head: [u8; PREFACE_LEN + FRAME_HEADER_LEN],
    /// Bytes read so far (saturating).
    read: usize,
}

impl Handshake {
    /// Notes bytes read; true once the preface and one whole frame have arrived.
    fn advance(&mut self, bytes: &[u8]) -> bool {
        let head_len = self.head.len();
        if self.read < head_len {
            let n = bytes.len().min(head_len - self.read);
            self.head[self.read..self.read + n].copy_from_slice(&bytes[..n]);
        }
        self.read = self.read.saturating_add(bytes.len());
        if self.read < head_len {
            return false;
        }
        let h = &self.head[PREFACE_LEN..];
        let payload = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
        self.read >= head_len + payload
    }
}

/// An accepted gRPC connection: a TCP stream, its connection permit, its handshake deadline and the close
/// switch.
pub struct GuardedConn {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    handshake: Option<Handshake>,
    handshake_timeout: Duration,
    stats: Arc<IngestStats>,
}

impl GuardedConn {
    fn new(
        stream: TcpStream,
        permit: OwnedSemaphorePermit,
        limits: &ConnectionLimits,
        close: &CancellationToken,
        stats: Arc<IngestStats>,
    ) -> Self {
        GuardedConn {
            stream,
            _permit: permit,
            closed: Box::pin(close.clone().cancelled_owned()),
            handshake: Some(Handshake {
                deadline: Box::pin(tokio::time::sleep(limits.handshake_timeout)),
                head: [0; PREFACE_LEN + FRAME_HEADER_LEN],
                read: 0,
            }),
            handshake_timeout: limits.handshake_timeout,
            stats,
        }
    }

    /// An error once the connection must end: closed by the collector, or its handshake is overdue.
    fn check(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(io::ErrorKind::ConnectionAborted, "grpc connection closed by shutdown"));
        }
        if let Some(h) = &mut self.handshake {
            if h.deadline.as_mut().poll(cx).is_ready() {
                self.handshake = None;
                count(&self.stats.connections_timed_out);
                tracing::debug!(
                    timeout = ?self.handshake_timeout,
                    peer = ?self.stream.peer_addr().ok(),
                    "grpc connection closed: no http/2 handshake in time"
                );
                return Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no http/2 handshake within grpc.handshake_timeout",
                ));
            }
        }
        None
    }
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl AsyncRead for GuardedConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.check(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(h)) = (&polled, &mut this.handshake) {
            if h.advance(&buf.filled()[before..]) {
                this.handshake = None;
            }
        }
        polled
    }
}

impl AsyncWrite for GuardedConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for GuardedConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake() -> Handshake {
        Handshake {
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(1))),
            head: [0; PREFACE_LEN + FRAME_HEADER_LEN],
            read: 0,
        }
    }

    #[tokio::test]
    async fn handshake_completes_after_the_preface_and_one_whole_frame_in_any_split() {
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend_from_slice(&[0, 0, 6, 0x4, 0, 0, 0, 0, 0]);
        wire.extend_from_slice(&[0, 3, 0, 0, 0, 100]);
        for split in 1..wire.len() {
            let mut h = handshake();
            let mut done_at = None;
            for (i, chunk) in wire.chunks(split).enumerate() {
                if h.advance(chunk) && done_at.is_none() {
                    done_at = Some((i + 1) * split);
                }
            }
            assert_eq!(done_at.map(|n| n.min(wire.len())), Some(wire.len()), "split {split}");
            let mut short = handshake();
            assert!(!short.advance(&wire[..wire.len() - 1]), "split {split}: one byte short is not done");
        }
    }
}
