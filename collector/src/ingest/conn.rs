//! gRPC connections as the ingest server accepts them: caps on how many are open at once (in all, from one
//! client address, and within the descriptor budget both listeners share), a deadline for the HTTP/2 handshake,
//! and one switch that closes every open connection at the end of the shutdown drain.
//!
//! [`accept`] reads tonic's `TcpIncoming` (which sets `TCP_NODELAY` and TCP keepalive) in its own task, runs the
//! TLS handshake when `[tls]` is configured (each in its own task, under the handshake deadline; the verified client
//! certificate's names go into [`Peer`], which tonic puts in every request's extensions). Each accepted socket
//! takes a [`ConnPermit`]: at most `grpc.max_connections` in all and `grpc.max_connections_per_ip` from one
//! client address, within the descriptor budget ([`crate::conn_limit`]). Without one the socket is closed at
//! once, before a byte is read (the client sees the connection reset and retries with backoff), and the refusal
//! is counted by reason. Each [`GuardedConn`] holds its permit until it is dropped and fails its reads and
//! writes:
//! - when the peer has not sent the HTTP/2 preface and its first frame within `grpc.handshake_timeout` (after
//!   the handshake, hyper's HTTP/2 keepalive pings find silent and half-open peers);
//! - once the collector's close switch is thrown (shutdown, after the drain deadline), whatever the connection
//!   is doing. hyper then ends the connection, which drops the service it holds, so nothing on a connection can
//!   keep the committer's channel open.

use crate::auth::tls::{peer_names, Listener, TlsState};
use crate::auth::Peer;
use crate::conn_limit::{ConnLimiter, ConnPermit, DescriptorBudget, Refusal};
use crate::health::IngestStats;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpIncoming};

/// The HTTP/2 client connection preface (RFC 9113, section 3.4).
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header: 24-bit length, type, flags, stream id.
const FRAME_HEADER_LEN: usize = 9;

/// Limits on accepted gRPC connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one client address (IPv4 address, IPv6 /64).
    pub max_connections_per_ip: usize,
    /// Time a new connection has to send the HTTP/2 preface and its first frame.
    pub handshake_timeout: Duration,
}

/// The accepted-connection stream handed to tonic's server: an accept task feeds it, so a slow TLS handshake
/// never holds up the next accept.
pub type Incoming = ReceiverStream<io::Result<GuardedConn>>;

/// Starts accepting on `inner`. With `tls`, each connection's TLS handshake runs in its own task under the
/// handshake deadline and the connection is handed over once it completes, with the verified client
/// certificate's names. Connections count against `budget`, shared with the HTTP listener. The accept task ends
/// when tonic drops the stream (at shutdown).
pub fn accept(
    inner: TcpIncoming,
    limits: ConnectionLimits,
    budget: Arc<DescriptorBudget>,
    close: CancellationToken,
    stats: Arc<IngestStats>,
    tls: Option<Arc<TlsState>>,
) -> Incoming {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut inner = inner;
        let caps = ConnLimiter::new(limits.max_connections, limits.max_connections_per_ip, budget);
        loop {
            let next = tokio::select! {
                _ = tx.closed() => break,
                n = inner.next() => n,
            };
            let stream = match next {
                None => break,
                Some(Err(e)) => {
                    if tx.send(Err(e)).await.is_err() {
                        break;
                    }
                    continue;
                }
                Some(Ok(stream)) => stream,
            };
            let remote = stream.peer_addr().ok();
            let permit = match caps.try_acquire(remote.map(|a| a.ip())) {
                Ok(permit) => permit,
                Err(refusal) => {
                    refused(&caps, &stats, refusal, remote);
                    drop(stream);
                    continue;
                }
            };
            match &tls {
                None => {
                    let peer = Peer { remote, cert_names: Arc::from(Vec::new()), tls: false };
                    let conn = GuardedConn::new(Io::Plain(stream), peer, permit, &limits, &close, stats.clone());
                    if tx.send(Ok(conn)).await.is_err() {
                        break;
                    }
                }
                Some(tls) => {
                    let acceptor = tls.acceptor(Listener::Grpc);
                    let (tx, close, stats) = (tx.clone(), close.clone(), stats.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
                            Ok(Ok(tls_stream)) => {
                                let names = peer_names(tls_stream.get_ref().1);
                                let peer = Peer { remote, cert_names: Arc::from(names), tls: true };
                                let io = Io::Tls(Box::new(tls_stream));
                                let conn = GuardedConn::new(io, peer, permit, &limits, &close, stats);
                                let _ = tx.send(Ok(conn)).await;
                            }
                            Ok(Err(e)) => {
                                count(&stats.tls_handshake_failures);
                                tracing::debug!(peer = ?remote, error = %e, "grpc tls handshake failed");
                            }
                            Err(_) => {
                                count(&stats.connections_timed_out);
                                tracing::debug!(peer = ?remote, "grpc connection closed: no tls handshake in time");
                            }
                        }
                    });
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Counts a connection refused at accept, and logs the first refusal of each reason and then one in a thousand
/// (a flood must not flood the log too).
fn refused(caps: &ConnLimiter, stats: &IngestStats, refusal: Refusal, peer: Option<std::net::SocketAddr>) {
    let counter = match refusal {
        Refusal::Listener => &stats.connections_refused,
        Refusal::Address => &stats.connections_refused_per_ip,
        Refusal::Descriptors => &stats.connections_refused_descriptors,
    };
    let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
    if n % 1000 == 1 {
        let why = match refusal {
            Refusal::Listener => "grpc.max_connections are open",
            Refusal::Address => "grpc.max_connections_per_ip are open from this address",
            Refusal::Descriptors => "connections hold every descriptor of the budget under the open-file limit",
        };
        tracing::warn!(
            max_connections = caps.max(),
            max_connections_per_ip = caps.per_address(),
            descriptor_budget = caps.budget().limit(),
            refused_so_far = n,
            ?peer,
            "grpc connection refused: {why}"
        );
    }
}

/// A connection's byte stream: plain TCP or TLS over it.
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, data),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
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
    stream: Io,
    peer: Peer,
    _permit: ConnPermit,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    handshake: Option<Handshake>,
    handshake_timeout: Duration,
    stats: Arc<IngestStats>,
}

impl GuardedConn {
    fn new(
        stream: Io,
        peer: Peer,
        permit: ConnPermit,
        limits: &ConnectionLimits,
        close: &CancellationToken,
        stats: Arc<IngestStats>,
    ) -> Self {
        GuardedConn {
            stream,
            peer,
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
                    peer = ?self.peer.remote,
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
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
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
