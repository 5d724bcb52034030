//! Runs the HTTP API on a listener, HTTP/1.1 and HTTP/2 (prior knowledge, or ALPN over TLS when `[tls]` is set),
//! with the limits `axum::serve` lacks. Each connection's [`Peer`] (address, verified client certificate names)
//! goes into every request's extensions for the auth middleware.
//!
//! - **connection caps** ([`Limits::caps`]): at most `http.max_connections` open, `http.max_connections_per_ip`
//!   from one client address, within the descriptor budget shared with gRPC ([`crate::conn_limit`]). A socket
//!   over a cap is closed as it is accepted, before a byte is read, and counted by reason ([`HttpStats`]).
//! - **header-read timeout** ([`Timeouts::header_read`]): a request's head (request line and headers) must
//!   arrive within it, counted from its first byte; a new connection must send its first request's head within it
//!   of being accepted (the TLS handshake included). A slow or half-sent head closes the connection.
//! - **body-read timeout** ([`Timeouts::body_read`]): a request's body must arrive within it of the end of the
//!   head. A late one is answered 408 with a JSON `{"error": ...}` and the connection is closed (HTTP/1.1; an
//!   HTTP/2 stream ends and the connection goes on).
//! - **request timeout** ([`Timeouts::request`]): from a request's first byte to its answer: 408 when the body
//!   is still arriving, 503 when the handler has not answered; the answer's own writing gets
//!   [`WRITE_GRACE`] more, after which the connection is closed (a client that does not read its answer).
//! - **idle timeout** ([`Timeouts::idle`]): a keep-alive connection with no request in progress is closed once
//!   no new request has started for this long (HTTP/2 pings and window updates do not keep it open).
//! - **bounded shutdown** ([`Timeouts::drain`]): once the shutdown future completes, no connection is
//!   accepted, open ones are asked to finish (in-flight requests complete, idle ones close), and after the drain
//!   deadline every connection still open is closed. [`serve`] returns within about that deadline.
//!
//! hyper's own header-read timer is off: it starts as soon as a response is written, so it closed idle
//! keep-alive connections after the header-read timeout instead of the idle timeout. Each connection's
//! `ConnState` knows instead whether a request is in progress, a head is arriving or the connection is idle,
//! and its `ConnIo` fails reads and writes past the deadline of that phase.

use crate::api::ApiError;
use crate::auth::tls::{peer_names, Listener, TlsState};
use crate::auth::Peer;
use crate::conn_limit::{ConnLimiter, ConnPermit, Refusal};
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Default time allowed for a request's head, from its first byte (and for a new connection's first head).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time allowed for a request's body, from the end of its head.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time allowed for a whole request, from its first byte to its answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a keep-alive connection may wait for its next request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default most HTTP connections open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Default most HTTP connections open at once from one client address.
pub const MAX_CONNECTIONS_PER_IP: usize = 64;
/// Largest HTTP/1.1 request head (request line and headers) read.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Default time open connections get to finish at shutdown before they are closed.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// Past the request timeout, the time a connection has to write the answer before it is closed.
pub const WRITE_GRACE: Duration = Duration::from_secs(2);

/// The HTTP server's timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For a request's head, from its first byte; for a new connection's first head, from its accept.
    pub header_read: Duration,
    /// For a request's body, from the end of its head.
    pub body_read: Duration,
    /// For a whole request, from its first byte to its answer.
    pub request: Duration,
    /// For a keep-alive connection's next request.
    pub idle: Duration,
    /// For open connections to finish after shutdown begins.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: HEADER_READ_TIMEOUT,
            body_read: BODY_READ_TIMEOUT,
            request: REQUEST_TIMEOUT,
            idle: IDLE_TIMEOUT,
            drain: DRAIN_DEADLINE,
        }
    }
}

/// Why a connection was closed or a request cut short by a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// A head did not arrive in time (or a new connection sent none).
    HeaderRead,
    /// A body did not arrive in time (answered 408).
    BodyRead,
    /// A request was not received and answered in time (408 or 503), or its answer not written.
    Request,
    /// A keep-alive connection waited too long for its next request.
    Idle,
}

impl Timeout {
    /// The `reason` attribute of `startline.collector.http.timeouts`.
    pub fn reason(self) -> &'static str {
        match self {
            Timeout::HeaderRead => "header_read",
            Timeout::BodyRead => "body_read",
            Timeout::Request => "request",
            Timeout::Idle => "idle",
        }
    }
}

/// Counters of the HTTP listener, read by the metrics exporter.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections closed at accept over `http.max_connections`.
    pub refused_limit: AtomicU64,
    /// Connections closed at accept over `http.max_connections_per_ip`.
    pub refused_per_ip: AtomicU64,
    /// Connections closed at accept because connections held the whole descriptor budget.
    pub refused_descriptors: AtomicU64,
    /// Connections closed because a head did not arrive within `http.header_read_timeout`.
    pub timeouts_header_read: AtomicU64,
    /// Requests answered 408 because their body did not arrive within `http.body_read_timeout`.
    pub timeouts_body_read: AtomicU64,
    /// Requests answered 408 or 503 past `http.request_timeout`, and connections closed because an answer was
    /// not written within it (plus [`WRITE_GRACE`]).
    pub timeouts_request: AtomicU64,
    /// Keep-alive connections closed after `http.idle_timeout` without a new request.
    pub timeouts_idle: AtomicU64,
}

impl crate::export::HttpCounters for HttpStats {
    fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    fn refusals(&self) -> Vec<(&'static str, u64)> {
        HttpStats::refusals(self).into_iter().map(|(r, c)| (r, c.load(Ordering::Relaxed))).collect()
    }

    fn timeouts(&self) -> Vec<(&'static str, u64)> {
        HttpStats::timeouts(self).into_iter().map(|(r, c)| (r, c.load(Ordering::Relaxed))).collect()
    }
}

impl HttpStats {
    /// The refusal counters by `reason` attribute.
    pub fn refusals(&self) -> [(&'static str, &AtomicU64); 3] {
        [
            (Refusal::Listener.reason(), &self.refused_limit),
            (Refusal::Address.reason(), &self.refused_per_ip),
            (Refusal::Descriptors.reason(), &self.refused_descriptors),
        ]
    }

    /// The timeout counters by `reason` attribute.
    pub fn timeouts(&self) -> [(&'static str, &AtomicU64); 4] {
        [
            (Timeout::HeaderRead.reason(), &self.timeouts_header_read),
            (Timeout::BodyRead.reason(), &self.timeouts_body_read),
            (Timeout::Request.reason(), &self.timeouts_request),
            (Timeout::Idle.reason(), &self.timeouts_idle),
        ]
    }

    fn refused(&self, refusal: Refusal) -> u64 {
        let counter = match refusal {
            Refusal::Listener => &self.refused_limit,
            Refusal::Address => &self.refused_per_ip,
            Refusal::Descriptors => &self.refused_descriptors,
        };
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn timed_out(&self, timeout: Timeout) {
        let counter = match timeout {
            Timeout::HeaderRead => &self.timeouts_header_read,
            Timeout::BodyRead => &self.timeouts_body_read,
            Timeout::Request => &self.timeouts_request,
            Timeout::Idle => &self.timeouts_idle,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The HTTP listener's limits: timeouts, connection caps, and the counters they feed.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Connection caps (per listener, per client address, the shared descriptor budget).
    pub caps: Arc<ConnLimiter>,
    /// Refusals, timeouts and open connections.
    pub stats: Arc<HttpStats>,
}

/// Serves `router` on `listener` until `shutdown` completes, then drains (see the module notes). Accept errors
/// (such as running out of file descriptors) are logged and retried, never fatal.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<TlsState>>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let conns = TaskTracker::new();
    let graceful = CancellationToken::new();
    let force = CancellationToken::new();
    let timeouts = limits.timeouts;
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
        let permit = match limits.caps.try_acquire(Some(peer.ip())) {
            Ok(permit) => permit,
            Err(refusal) => {
                refused(&limits, refusal, peer);
                drop(stream);
                continue;
            }
        };
        let open = OpenConn::new(permit, limits.stats.clone());
        let state = Arc::new(ConnState::new(timeouts, limits.stats.clone()));
        let _ = stream.set_nodelay(true);
        let (router, graceful, force) = (router.clone(), graceful.clone(), force.clone());
        match &tls {
            None => {
                let peer = Peer { remote: Some(peer), cert_names: Arc::from(Vec::new()), tls: false };
                conns.spawn(connection(stream, peer, router, state, open, graceful, force));
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
                            Err(_) => {
                                state.stats.timed_out(Timeout::HeaderRead);
                                return;
                            }
                        },
                        () = graceful.cancelled() => return,
                    };
                    let names = peer_names(stream.get_ref().1);
                    let peer = Peer { remote: Some(peer), cert_names: Arc::from(names), tls: true };
                    connection(stream, peer, router, state, open, graceful, force).await
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

/// Counts a connection refused at accept, and logs the first refusal of each reason and then one in a thousand
/// (a flood must not flood the log too).
fn refused(limits: &Limits, refusal: Refusal, peer: SocketAddr) {
    let n = limits.stats.refused(refusal);
    if n % 1000 == 1 {
        let why = match refusal {
            Refusal::Listener => "http.max_connections are open",
            Refusal::Address => "http.max_connections_per_ip are open from this address",
            Refusal::Descriptors => "connections hold every descriptor of the budget under the open-file limit",
        };
        tracing::warn!(
            max_connections = limits.caps.max(),
            max_connections_per_ip = limits.caps.per_address(),
            descriptor_budget = limits.caps.budget().limit(),
            refused_so_far = n,
            %peer,
            "http connection refused: {why}"
        );
    }
}

/// An accepted connection's permit, counted in [`HttpStats::open`] while it lives.
struct OpenConn {
    _permit: ConnPermit,
    stats: Arc<HttpStats>,
}

impl OpenConn {
    fn new(permit: ConnPermit, stats: Arc<HttpStats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        OpenConn { _permit: permit, stats }
    }
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection until it ends, times out, or shutdown forces it closed.
async fn connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    peer: Peer,
    router: Router,
    state: Arc<ConnState>,
    _open: OpenConn,
    graceful: CancellationToken,
    force: CancellationToken,
) {
    let io = TokioIo::new(ConnIo::new(stream, state.clone()));
    let mut builder = Builder::new(TokioExecutor::new());
    // Header size limits: 64 KiB of request head on HTTP/1.1 (hyper answers 431 beyond it), 16 KiB of header
    // list on HTTP/2. hyper's header-read timer is off ([`ConnIo`] keeps the deadlines, see the module notes).
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None).max_buf_size(MAX_HEAD_BYTES);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(16 << 10);
    // Handlers and the auth middleware see who is connected (address, client certificate names); every request
    // runs under the body-read and request timeouts.
    let service = router.layer(axum::Extension(peer)).layer(axum::middleware::from_fn_with_state(state, limit_request));
    let conn = builder.serve_connection(io, TowerToHyperService::new(service));
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

/// Where one connection is: idle, receiving a head, or serving requests; the deadline of each phase.
#[derive(Debug)]
struct ConnState {
    timeouts: Timeouts,
    stats: Arc<HttpStats>,
    phase: Mutex<Phase>,
}

#[derive(Debug)]
struct Phase {
    /// Requests begun and not yet answered in full.
    in_flight: usize,
    /// The connection speaks HTTP/2 (seen on its first request): bytes while idle are frames, not a head.
    h2: bool,
    /// HTTP/1.1: when the first byte of the next head arrived, while no request was in progress.
    head_since: Option<Instant>,
    /// When the connection last had no request in progress (its accept, or the end of its last answer).
    idle_since: Instant,
    /// Whether a request has been answered (after that, idle waits get the idle timeout, not the header one).
    served: bool,
    /// With requests in progress: the latest of their deadlines (request timeout plus [`WRITE_GRACE`]).
    busy_until: Instant,
    /// The connection task's waker, woken when a request ends so the connection takes its new deadline.
    waker: Option<Waker>,
}

impl ConnState {
    fn new(timeouts: Timeouts, stats: Arc<HttpStats>) -> Self {
        let now = Instant::now();
        let phase = Phase {
            in_flight: 0,
            h2: false,
            head_since: None,
            idle_since: now,
            served: false,
            busy_until: now,
            waker: None,
        };
        ConnState { timeouts, stats, phase: Mutex::new(phase) }
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        // Every update is a few plain assignments: a poisoned lock still holds a usable phase.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The deadline of the connection's phase and the timeout it stands for; `waker` is woken when it changes.
    fn deadline(&self, waker: &Waker) -> (Instant, Timeout) {
        let t = &self.timeouts;
        let mut p = self.phase();
        if !p.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            p.waker = Some(waker.clone());
        }
        if p.in_flight > 0 {
            (p.busy_until, Timeout::Request)
        } else if let Some(since) = p.head_since {
            (since + t.header_read, Timeout::HeaderRead)
        } else if p.served {
            (p.idle_since + t.idle, Timeout::Idle)
        } else {
            (p.idle_since + t.header_read, Timeout::HeaderRead)
        }
    }

    /// Bytes arrived: on an idle HTTP/1.1 connection they start the next head.
    fn read_bytes(&self) {
        let mut p = self.phase();
        if p.in_flight == 0 && !p.h2 && p.head_since.is_none() {
            p.head_since = Some(Instant::now());
        }
    }

    /// A request's head has been read: returns when the request began (its head's first byte on HTTP/1.1).
    fn begin(&self, h2: bool) -> Instant {
        let now = Instant::now();
        let mut p = self.phase();
        p.h2 |= h2;
        let start = match p.head_since.take() {
            Some(since) if !h2 => since,
            _ => now,
        };
        p.in_flight += 1;
        let until = start + self.timeouts.request + WRITE_GRACE;
        if p.in_flight == 1 || until > p.busy_until {
            p.busy_until = until;
        }
        start
    }

    /// A request's answer has been written in full (or dropped).
    fn end(&self) {
        let mut p = self.phase();
        p.in_flight = p.in_flight.saturating_sub(1);
        if p.in_flight == 0 {
            p.idle_since = Instant::now();
            p.served = true;
        }
        let waker = p.waker.take();
        drop(p);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A request in progress on its connection, ended when dropped (with the answer's body, once written).
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The middleware every request runs under: the body-read and request timeouts, and its connection's phase.
async fn limit_request(State(conn): State<Arc<ConnState>>, req: Request, next: Next) -> Response {
    let h1 = req.version() < Version::HTTP_2;
    let start = conn.begin(!h1);
    let in_flight = InFlight(conn.clone());
    let t = conn.timeouts;
    let body_done = Arc::new(AtomicBool::new(req.body().is_end_stream()));
    let req = req.map(|inner| Body::new(WatchedBody { inner, done: body_done.clone() }));
    let body_deadline = Instant::now() + t.body_read;
    let body_late = async {
        tokio::time::sleep_until(body_deadline).await;
        if body_done.load(Ordering::Acquire) {
            std::future::pending::<()>().await;
        }
    };
    let response = tokio::select! {
        biased;
        () = body_late => {
            timed_out(&conn, Timeout::BodyRead, h1, StatusCode::REQUEST_TIMEOUT, format!(
                "request body not received within http.body_read_timeout ({})",
                humantime::format_duration(t.body_read)
            ))
        }
        () = tokio::time::sleep_until(start + t.request) => {
            let (status, what) = if body_done.load(Ordering::Acquire) {
                (StatusCode::SERVICE_UNAVAILABLE, "not answered")
            } else {
                (StatusCode::REQUEST_TIMEOUT, "not received")
            };
            timed_out(&conn, Timeout::Request, h1, status, format!(
                "request {what} within http.request_timeout ({})",
                humantime::format_duration(t.request)
            ))
        }
        r = next.run(req) => r,
    };
    response.map(|inner| Body::new(AnswerBody { inner, _in_flight: in_flight }))
}

/// The answer to a request cut short: a JSON error, and on HTTP/1.1 the end of the connection (the rest of a
/// late body is never read).
fn timed_out(conn: &ConnState, timeout: Timeout, h1: bool, status: StatusCode, message: String) -> Response {
    conn.stats.timed_out(timeout);
    tracing::debug!(reason = timeout.reason(), %message, "http request cut short");
    let mut r = ApiError::new(status, message).into_response();
    if h1 {
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// A request body that notes when it has been read to its end.
struct WatchedBody {
    inner: Body,
    done: Arc<AtomicBool>,
}

impl HttpBody for WatchedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.done.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// An answer's body, holding its request in progress until hyper has written it (and drops it).
struct AnswerBody {
    inner: Body,
    _in_flight: InFlight,
}

impl HttpBody for AnswerBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's byte stream that fails with `TimedOut` when it waits for a read or a write past the deadline
/// of its connection's phase ([`ConnState::deadline`]), and tells the phase when bytes arrive.
struct ConnIo<S> {
    inner: S,
    state: Arc<ConnState>,
    timer: Pin<Box<Sleep>>,
    armed: Instant,
    expired: bool,
}

impl<S> ConnIo<S> {
    fn new(inner: S, state: Arc<ConnState>) -> Self {
        let armed = Instant::now() + state.timeouts.header_read;
        ConnIo { inner, state, timer: Box::pin(tokio::time::sleep_until(armed)), armed, expired: false }
    }

    /// When the inner stream is pending: an error if the phase's deadline passed (the timer is registered
    /// otherwise).
    fn expired<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if self.expired {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "http connection timed out")));
        }
        let (deadline, timeout) = self.state.deadline(cx.waker());
        if deadline != self.armed {
            self.timer.as_mut().reset(deadline);
            self.armed = deadline;
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.expired = true;
                self.state.stats.timed_out(timeout);
                tracing::debug!(reason = timeout.reason(), "http connection closed: timed out");
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "http connection timed out")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// After a write attempt: a pending write checks the deadline.
    fn wrote(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match r {
            Poll::Pending => self.expired(cx),
            ready => ready,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ConnIo<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.state.read_bytes();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.expired(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ConnIo<S> {
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
    use crate::conn_limit::DescriptorBudget;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpSocket, TcpStream};

    fn timeouts(header_read_ms: u64, body_read_ms: u64, request_ms: u64, idle_ms: u64) -> Timeouts {
        Timeouts {
            header_read: Duration::from_millis(header_read_ms),
            body_read: Duration::from_millis(body_read_ms),
            request: Duration::from_millis(request_ms),
            idle: Duration::from_millis(idle_ms),
            drain: DRAIN_DEADLINE,
        }
    }

    fn limits(timeouts: Timeouts, max: usize, per_ip: usize) -> Limits {
        let caps = ConnLimiter::new(max, per_ip, Arc::new(DescriptorBudget::new(usize::MAX)));
        Limits { timeouts, caps, stats: Arc::default() }
    }

    async fn start(limits: Limits) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<io::Result<()>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let router = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/echo", post(|body: String| async move { body }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    "late"
                }),
            );
        let s = stop.clone();
        let task = tokio::spawn(serve(listener, router, limits, None, async move { s.cancelled().await }));
        (addr, stop, task)
    }

    /// Reads until the peer closes; returns what was read and how long it took.
    async fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, Duration) {
        let t = Instant::now();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
        (out, t.elapsed())
    }

    /// Reads one whole answer to a request without a body (headers and a `Content-Length` body).
    async fn read_answer(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n =
                tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("answer").expect("read");
            assert!(n > 0, "closed before an answer: {:?}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    return text;
                }
            }
        }
    }

    async fn connect_from(source: &str, addr: SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind(format!("{source}:0").parse().expect("source")).expect("bind source");
        socket.connect(addr).await.expect("connect")
    }

    /// Whether the server closed the connection within a second without answering (refused at accept).
    async fn closed_at_once(s: &mut TcpStream) -> bool {
        let mut buf = [0u8; 64];
        matches!(tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
    }

    async fn eventually(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(5), "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn silent_and_half_sent_connections_are_closed_after_the_header_timeout() {
        let l = limits(timeouts(300, 10_000, 30_000, 1_000), 100, 100);
        let stats = l.stats.clone();
        let (addr, _stop, _task) = start(l).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut half = TcpStream::connect(addr).await.expect("connect");
        half.write_all(b"GET /hea").await.expect("write");
        let (_, a) = read_until_closed(&mut silent).await;
        let (_, b) = read_until_closed(&mut half).await;
        assert!(a < Duration::from_secs(3) && b < Duration::from_secs(3), "closed after {a:?} and {b:?}");
        assert_eq!(stats.timeouts_header_read.load(Ordering::Relaxed), 2);
        // A well-behaved request still works, and its keep-alive connection is closed once idle.
        let mut ok = TcpStream::connect(addr).await.expect("connect");
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let (body, _) = read_until_closed(&mut ok).await;
        assert!(String::from_utf8_lossy(&body).starts_with("HTTP/1.1 200"));
        assert_eq!(stats.timeouts_idle.load(Ordering::Relaxed), 1);
        assert_eq!(stats.open.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_head_sent_a_byte_at_a_time_is_cut_at_the_header_timeout_counted_from_its_first_byte() {
        let (addr, _stop, _task) = start(limits(timeouts(600, 10_000, 30_000, 10_000), 100, 100)).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        // Idle before the first byte does not count against the head (only the connection's first-head limit).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        let mut cut = None;
        for b in b"GET / HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n" {
            if s.write_all(&[*b]).await.is_err() {
                break;
            }
            let mut buf = [0u8; 64];
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await {
                assert!(matches!(r, Ok(0) | Err(_)), "answered: {:?}", String::from_utf8_lossy(&buf));
                cut = Some(t.elapsed());
                break;
            }
        }
        let cut = cut.expect("the drip was cut");
        assert!(cut > Duration::from_millis(300) && cut < Duration::from_millis(1_500), "cut after {cut:?}");
    }

    #[tokio::test]
    async fn idle_keep_alive_connections_close_after_the_idle_timeout_not_the_header_timeout() {
        let l = limits(timeouts(300, 10_000, 30_000, 1_500), 100, 100);
        let stats = l.stats.clone();
        let (addr, _stop, _task) = start(l).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
        // Past the header-read timeout the idle connection still takes a request.
        tokio::time::sleep(Duration::from_millis(800)).await;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
        let (rest, idle) = read_until_closed(&mut s).await;
        assert!(rest.is_empty());
        assert!(idle > Duration::from_millis(1_300) && idle < Duration::from_secs(3), "closed after {idle:?}");
        assert_eq!(stats.timeouts_idle.load(Ordering::Relaxed), 1);
        assert_eq!(stats.timeouts_header_read.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_body_that_trickles_in_is_cut_with_408_after_the_body_timeout() {
        let l = limits(timeouts(10_000, 500, 10_000, 10_000), 100, 100);
        let stats = l.stats.clone();
        let (addr, _stop, _task) = start(l).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n").await.expect("write");
        let t = Instant::now();
        let mut answer = Vec::new();
        for _ in 0..100 {
            let _ = s.write_all(b"a").await;
            let mut buf = [0u8; 1024];
            match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
        let took = t.elapsed();
        let (rest, _) = read_until_closed(&mut s).await;
        answer.extend_from_slice(&rest);
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 408"), "{text}");
        assert!(text.contains("connection: close") && text.contains("application/json"), "{text}");
        assert!(text.contains(r#"{"error":"request body not received within http.body_read_timeout (500ms)"}"#));
        assert!(took > Duration::from_millis(400) && took < Duration::from_millis(1_500), "cut after {took:?}");
        assert_eq!(stats.timeouts_body_read.load(Ordering::Relaxed), 1);
        // A body sent in time is read whole.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            .await
            .expect("write");
        let (ok, _) = read_until_closed(&mut s).await;
        let ok = String::from_utf8_lossy(&ok);
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("hello"), "{ok}");
    }

    #[tokio::test]
    async fn a_request_not_answered_within_the_request_timeout_gets_503() {
        let l = limits(timeouts(10_000, 10_000, 700, 10_000), 100, 100);
        let stats = l.stats.clone();
        let (addr, _stop, _task) = start(l).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let t = Instant::now();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let (answer, _) = read_until_closed(&mut s).await;
        let took = t.elapsed();
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 503"), "{text}");
        assert!(text.contains("not answered within http.request_timeout (700ms)"), "{text}");
        assert!(took > Duration::from_millis(600) && took < Duration::from_millis(2_000), "answered after {took:?}");
        assert_eq!(stats.timeouts_request.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn http2_requests_run_under_the_same_limits() {
        let l = limits(timeouts(10_000, 10_000, 700, 10_000), 100, 100);
        let stats = l.stats.clone();
        let (addr, _stop, _task) = start(l).await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("h2 connect");
        let send = |path: &str| {
            let mut c = channel.clone();
            let req = axum::http::Request::get(format!("http://{addr}{path}"))
                .body(tonic::body::Body::empty())
                .expect("request");
            async move {
                use tower::{Service, ServiceExt};
                let r = c.ready().await.expect("ready").call(req).await.expect("answer");
                let status = r.status();
                let body = http_body_util::BodyExt::collect(r.into_body()).await.expect("body").to_bytes();
                (status, String::from_utf8_lossy(&body).to_string())
            }
        };
        assert_eq!(send("/").await, (StatusCode::OK, "ok".to_string()));
        let (status, body) = send("/slow").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("http.request_timeout"), "{body}");
        // The connection goes on after a stream was cut.
        assert_eq!(send("/").await, (StatusCode::OK, "ok".to_string()));
        assert_eq!(stats.timeouts_request.load(Ordering::Relaxed), 1);
        assert_eq!(stats.open.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn connections_over_the_caps_are_closed_at_accept_and_counted() {
        let l = limits(timeouts(10_000, 10_000, 30_000, 10_000), 3, 2);
        let stats = l.stats.clone();
        let (addr, _stop, _task) = start(l).await;
        let _a1 = connect_from("127.0.0.1", addr).await;
        let mut a2 = connect_from("127.0.0.1", addr).await;
        let mut a3 = connect_from("127.0.0.1", addr).await;
        assert!(closed_at_once(&mut a3).await, "the third from one address is refused");
        assert_eq!(stats.refused_per_ip.load(Ordering::Relaxed), 1);
        let mut b1 = connect_from("127.0.0.2", addr).await;
        let mut c1 = connect_from("127.0.0.3", addr).await;
        assert!(closed_at_once(&mut c1).await, "the listener's cap is reached");
        assert_eq!(stats.refused_limit.load(Ordering::Relaxed), 1);
        // The connections within the caps are served.
        b1.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        assert!(read_answer(&mut b1).await.starts_with("HTTP/1.1 200"));
        assert_eq!(stats.open.load(Ordering::Relaxed), 3);
        // A closed connection gives its place back.
        a2.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let (answer, _) = read_until_closed(&mut a2).await;
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
        eventually("a2 is gone", || stats.open.load(Ordering::Relaxed) == 2).await;
        let mut a4 = connect_from("127.0.0.1", addr).await;
        a4.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        assert!(read_answer(&mut a4).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn shutdown_closes_stuck_connections_after_the_drain_deadline() {
        let mut t = timeouts(60_000, 60_000, 60_000, 60_000);
        t.drain = Duration::from_millis(300);
        let (addr, stop, task) = start(limits(t, 100, 100)).await;
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
