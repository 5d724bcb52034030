//! Runs the HTTP API on a listener, HTTP/1.1 and HTTP/2 (prior knowledge, or ALPN over TLS when `[tls]` is set),
//! with the limits `axum::serve` lacks. Each connection's [`Peer`] (address, verified client certificate names)
//! goes into every request's extensions for the auth middleware.
//!
//! - **header-read timeout** ([`Timeouts::header_read`]): a request's head (request line and headers) must
//!   arrive within it, counted from when the server starts waiting for it, so a half-sent request line, or an
//!   idle keep-alive connection, is closed after it. A connection that sends nothing at all is closed after
//!   it too.
//! - **idle timeout** ([`Timeouts::idle`]): a connection on which no byte is read or written for this long is
//!   closed (HTTP/2 connections and stalled readers included).
//! - **bounded shutdown** ([`Timeouts::drain`]): once the shutdown future completes, no connection is
//!   accepted, open ones are asked to finish (in-flight requests complete, idle ones close), and after the drain
//!   deadline every connection still open is closed. [`serve`] returns within about that deadline.

use crate::auth::tls::{peer_names, Listener, TlsState};
use crate::auth::Peer;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Default time allowed for a request's head (and for a new connection's first byte).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a connection may go without reading or writing a byte.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest HTTP/1.1 request head (request line and headers) read.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Default time open connections get to finish at shutdown before they are closed.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The HTTP server's timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For a request's head, from when the server waits for it; also for a new connection's first byte.
    pub header_read: Duration,
    /// Without a byte read or written.
    pub idle: Duration,
    /// For open connections to finish after shutdown begins.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { header_read: HEADER_READ_TIMEOUT, idle: IDLE_TIMEOUT, drain: DRAIN_DEADLINE }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then drains (see the module notes). Accept errors
/// (such as running out of file descriptors) are logged and retried, never fatal.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: Timeouts,
    tls: Option<Arc<TlsState>>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let conns = TaskTracker::new();
    let graceful = CancellationToken::new();
    let force = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (stream, peer),
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    }
                }
            },
        };
        let (stream, peer) = stream;
        let _ = stream.set_nodelay(true);
        let (router, graceful, force) = (router.clone(), graceful.clone(), force.clone());
        match &tls {
            None => {
                let peer = Peer { remote: Some(peer), cert_names: Arc::from(Vec::new()), tls: false };
                conns.spawn(connection(stream, peer, router, timeouts, graceful, force));
            }
            Some(tls) => {
                let acceptor = tls.acceptor(Listener::Http);
                conns.spawn(async move {
                    // The TLS handshake counts against the header-read timeout, and shutdown ends it at once.
                    let handshake = tokio::time::timeout(timeouts.header_read, acceptor.accept(stream));
                    let stream = tokio::select! {
                        r = handshake => match r {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "http tls handshake failed");
                                return;
                            }
                            Err(_) => return,
                        },
                        () = graceful.cancelled() => return,
                    };
                    let names = peer_names(stream.get_ref().1);
                    let peer = Peer { remote: Some(peer), cert_names: Arc::from(names), tls: true };
                    connection(stream, peer, router, timeouts, graceful, force).await
                });
            }
        }
    }
    drop(listener);
    graceful.cancel();
    conns.close();
    if tokio::time::timeout(timeouts.drain, conns.wait()).await.is_err() {
        tracing::warn!(open = conns.len(), "http drain deadline passed: closing the remaining connections");
        force.cancel();
        conns.wait().await;
    }
    Ok(())
}

/// Serves one connection until it ends, is idle too long, or shutdown forces it closed.
async fn connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    peer: Peer,
    router: Router,
    timeouts: Timeouts,
    graceful: CancellationToken,
    force: CancellationToken,
) {
    let io = TokioIo::new(IdleIo::new(stream, timeouts.header_read, timeouts.idle));
    let mut builder = Builder::new(TokioExecutor::new());
    // Header size limits: 64 KiB of request head on HTTP/1.1 (hyper answers 431 beyond it), 16 KiB of header
    // list on HTTP/2.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(timeouts.header_read).max_buf_size(MAX_HEAD_BYTES);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(16 << 10);
    // Handlers and the auth middleware see who is connected (address, client certificate names).
    let conn = builder.serve_connection(io, TowerToHyperService::new(router.layer(axum::Extension(peer))));
    tokio::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => Some(r),
        () = graceful.cancelled() => None,
    };
    let result = match ended {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => r,
                // Dropping the connection closes the socket.
                () = force.cancelled() => return,
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "http connection ended with an error");
    }
}

/// A TCP stream that fails with `TimedOut` when it waits for a read or a write while no byte has moved for the
/// idle timeout (or, before the first byte read, for the first-byte timeout).
struct IdleIo<S> {
    inner: S,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> IdleIo<S> {
    fn new(inner: S, first_byte: Duration, idle: Duration) -> Self {
        IdleIo { inner, idle, deadline: Box::pin(tokio::time::sleep(first_byte)) }
    }

    fn moved(&mut self) {
        let at = Instant::now() + self.idle;
        self.deadline.as_mut().reset(at);
    }

    /// When the inner stream is pending: an error if the deadline passed (the timer is registered otherwise).
    fn expired<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "http connection idle"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleIo<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.expired(cx),
        }
    }
}

impl<S> IdleIo<S> {
    /// After a write attempt: bytes moved reset the idle clock; a pending write checks the deadline.
    fn wrote(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.expired(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(
        timeouts: Timeouts,
    ) -> (std::net::SocketAddr, CancellationToken, tokio::task::JoinHandle<io::Result<()>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let router = Router::new().route("/", get(|| async { "ok" }));
        let s = stop.clone();
        let task = tokio::spawn(serve(listener, router, timeouts, None, async move { s.cancelled().await }));
        (addr, stop, task)
    }

    /// Reads until the peer closes; returns what was read and how long it took.
    async fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, Duration) {
        let t = Instant::now();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
        (out, t.elapsed())
    }

    #[tokio::test]
    async fn silent_and_half_sent_connections_are_closed_after_the_header_timeout() {
        let t =
            Timeouts { header_read: Duration::from_millis(300), idle: Duration::from_secs(30), drain: DRAIN_DEADLINE };
        let (addr, _stop, _task) = start(t).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut half = TcpStream::connect(addr).await.expect("connect");
        half.write_all(b"GET /hea").await.expect("write");
        let (_, a) = read_until_closed(&mut silent).await;
        let (_, b) = read_until_closed(&mut half).await;
        assert!(a < Duration::from_secs(3) && b < Duration::from_secs(3), "closed after {a:?} and {b:?}");
        // A well-behaved request still works, and its keep-alive connection is closed once idle.
        let mut ok = TcpStream::connect(addr).await.expect("connect");
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let (body, _) = read_until_closed(&mut ok).await;
        assert!(String::from_utf8_lossy(&body).starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn shutdown_closes_stuck_connections_after_the_drain_deadline() {
        let t = Timeouts {
            header_read: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            drain: Duration::from_millis(300),
        };
        let (addr, stop, task) = start(t).await;
        let mut half = TcpStream::connect(addr).await.expect("connect");
        half.write_all(b"GET /hea").await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        stop.cancel();
        let r = tokio::time::timeout(Duration::from_secs(5), task).await;
        assert!(matches!(r, Ok(Ok(Ok(())))), "serve did not return: {r:?}");
        assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
        let (_, took) = read_until_closed(&mut half).await;
        assert!(took < Duration::from_secs(1));
    }
}
