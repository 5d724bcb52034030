//! The uplink: how every agent mode delivers events to the collector. One long-lived `Publish` stream carries
//! batches with a window of unacknowledged batches in flight; acks come back in order. When the stream or the
//! connection fails, the uplink reconnects with jittered exponential backoff and re-sends every unacknowledged
//! batch: event ids make redelivery harmless (the collector answers duplicates).
//!
//! Batches come from the caller's memory, or from the durable on-disk spool (`crate::spool`) through
//! [`delivery`], which drives one publisher per collector.
//!
//! # Credentials and TLS
//! An `https://` endpoint is reached over TLS (rustls): the collector's certificate is verified against
//! [`TlsFiles::ca_file`] (a PEM bundle) or, without one, the webpki roots; a client certificate and key make it
//! mutual TLS. An `http://` endpoint stays plaintext, and TLS files given with one are a configuration error
//! (rather than a silently unencrypted uplink). A bearer token ([`UplinkSettings::token`]) goes in the
//! `authorization` metadata of every call (an interceptor); a token file is read again at each (re)connect,
//! so a rotated token is picked up without a restart. The token is never logged.
//!
//! A collector that answers `UNAUTHENTICATED` or `PERMISSION_DENIED` (a wrong, removed or under-scoped token)
//! is logged at error level once per distinct answer, and, when [`UplinkSettings::retry_auth_failures`] is
//! set (the spooled modes: nothing is lost, the batches stay unacknowledged), retried with the usual backoff
//! until the credentials are fixed; otherwise the publisher stops with [`UplinkError::Refused`]. A per-event
//! "not permitted" (a job id or source outside the token's restriction) is an ordinary rejection in the ack.

pub mod delivery;

use crate::auth::{CredentialError, Secret, TokenSource};
use crate::rng::Rng;
use startline_proto::pb::{self, ingest_service_client::IngestServiceClient};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status, Streaming};

/// Why publishing stopped.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// The collector address is not a valid URI.
    #[error("invalid collector endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The collector refused a batch for a reason a retry cannot fix.
    #[error("collector refused the batch: {0}")]
    Refused(Status),
    /// The TLS settings cannot be used (unreadable files, not PEM, TLS files with an `http://` endpoint).
    #[error("TLS: {0}")]
    Tls(String),
    /// The token cannot be used.
    #[error(transparent)]
    Credential(#[from] CredentialError),
    /// The spool that feeds the uplink failed.
    #[error("spool: {0}")]
    Spool(String),
    /// The collector stayed unreachable for longer than the retry budget.
    #[error("collector unreachable for {waited:?}: {last}")]
    GaveUp {
        /// How long the uplink retried.
        waited: Duration,
        /// The last failure.
        last: String,
    },
}

/// Settings of the uplink.
#[derive(Debug, Clone)]
pub struct UplinkSettings {
    /// Collector gRPC endpoint, e.g. `http://127.0.0.1:50051`.
    pub endpoint: String,
    /// Batches in flight before `send` waits for acks.
    pub window: usize,
    /// First retry delay.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Give up after failing continuously for this long (`None`: never).
    pub give_up_after: Option<Duration>,
    /// Bearer token sent in the `authorization` metadata of every call.
    pub token: Option<TokenSource>,
    /// TLS files for an `https://` endpoint.
    pub tls: TlsFiles,
    /// Retry `UNAUTHENTICATED` / `PERMISSION_DENIED` with backoff (logged once per distinct answer) instead of
    /// stopping: right for a spooled mode, whose events wait on disk until the credentials are fixed.
    pub retry_auth_failures: bool,
}

/// PEM files for TLS to the collector.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// CA bundle that verifies the collector's certificate (default: the webpki roots).
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain, for mutual TLS (with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// Client private key, for mutual TLS (with `client_cert`).
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    fn any(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some() || self.client_key.is_some()
    }

    /// The rustls client configuration these files describe.
    fn client_config(&self) -> Result<ClientTlsConfig, UplinkError> {
        let read = |p: &PathBuf, what: &str| {
            std::fs::read(p).map_err(|e| UplinkError::Tls(format!("cannot read {what} {}: {e}", p.display())))
        };
        let mut cfg = ClientTlsConfig::new();
        cfg = match &self.ca_file {
            Some(p) => {
                let pem = read(p, "CA file")?;
                if !contains(&pem, b"-----BEGIN CERTIFICATE-----") {
                    return Err(UplinkError::Tls(format!("CA file {} holds no PEM certificate", p.display())));
                }
                cfg.ca_certificate(Certificate::from_pem(pem))
            }
            None => cfg.with_webpki_roots(),
        };
        match (&self.client_cert, &self.client_key) {
            (Some(c), Some(k)) => {
                let (cert, key) = (read(c, "client certificate")?, read(k, "client key")?);
                if !contains(&cert, b"-----BEGIN CERTIFICATE-----") {
                    return Err(UplinkError::Tls(format!("client certificate {} is not PEM", c.display())));
                }
                if !contains(&key, b"PRIVATE KEY-----") {
                    return Err(UplinkError::Tls(format!("client key {} is not a PEM private key", k.display())));
                }
                cfg = cfg.identity(Identity::from_pem(cert, key));
            }
            (None, None) => {}
            _ => return Err(UplinkError::Tls("a client certificate needs both --client-cert and --client-key".into())),
        }
        Ok(cfg)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Puts `authorization: Bearer <token>` on every call.
#[derive(Clone)]
struct BearerInterceptor(Option<MetadataValue<Ascii>>);

impl BearerInterceptor {
    fn new(token: Option<&Secret>) -> Result<Self, UplinkError> {
        let Some(token) = token else {
            return Ok(BearerInterceptor(None));
        };
        let mut value = MetadataValue::try_from(format!("Bearer {}", token.expose()))
            .map_err(|_| CredentialError::NotVisibleAscii("for the collector".into()))?;
        // Never indexed by HPACK (kept out of the connection's header tables).
        value.set_sensitive(true);
        Ok(BearerInterceptor(Some(value)))
    }
}

impl Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

impl UplinkSettings {
    /// Defaults for an endpoint: window 16, backoff 100 ms to 10 s, never give up.
    pub fn new(endpoint: impl Into<String>) -> Self {
        UplinkSettings {
            endpoint: endpoint.into(),
            window: 16,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            give_up_after: None,
            token: None,
            tls: TlsFiles::default(),
            retry_auth_failures: true,
        }
    }
}

/// Totals over everything acknowledged so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Batches acknowledged.
    pub batches: u64,
    /// Events stored for the first time.
    pub accepted: u64,
    /// Events the collector already had.
    pub duplicates: u64,
    /// Events rejected, with the field and reason of each (the first 100 are kept).
    pub rejected: u64,
    /// The first rejections, for the caller to report.
    pub rejections: Vec<pb::Rejection>,
    /// Reconnects after failures.
    pub reconnects: u64,
    /// Calls the collector answered `UNAUTHENTICATED` or `PERMISSION_DENIED`.
    pub auth_failures: u64,
}

struct Conn {
    tx: mpsc::Sender<pb::PublishRequest>,
    rx: Streaming<pb::PublishAck>,
}

/// A pipelined, retrying publisher over one stream.
pub struct Publisher {
    endpoint: Endpoint,
    settings: UplinkSettings,
    conn: Option<Conn>,
    inflight: VecDeque<pb::PublishRequest>,
    next_seq: u64,
    totals: Totals,
    rng: Rng,
    /// When the current run of failures started.
    failing_since: Option<tokio::time::Instant>,
    backoff: Duration,
    /// The last token loaded (kept when a re-read of the token file fails).
    token: Option<Secret>,
    /// The last credential refusal logged, so each distinct one is logged once.
    auth_logged: Option<(Code, String)>,
    /// Whether the current run of failures was logged.
    failure_logged: bool,
    /// Where acks and failures are counted (`/metrics`), if anywhere.
    metrics: Option<crate::metrics::Metrics>,
}

/// Whether a failure is worth retrying as it is. Credential refusals are decided by
/// [`UplinkSettings::retry_auth_failures`]; a malformed batch or an unknown method never heals.
fn retryable(status: &Status) -> bool {
    !matches!(status.code(), Code::InvalidArgument | Code::Unimplemented)
}

fn is_auth_failure(status: &Status) -> bool {
    matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied)
}

/// An error with its causes, `a: b: c` (tonic's transport error alone says only "transport error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

impl Publisher {
    /// A publisher for the settings' endpoint; connects lazily.
    ///
    /// Reads the token and the TLS files now: a missing or empty token file, an unreadable CA file or TLS
    /// files with an `http://` endpoint are errors here, at startup.
    pub fn new(settings: UplinkSettings) -> Result<Self, UplinkError> {
        let bad_endpoint = |reason: String| UplinkError::Endpoint { endpoint: settings.endpoint.clone(), reason };
        let mut endpoint = Endpoint::from_shared(settings.endpoint.clone())
            .map_err(|e| bad_endpoint(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20));
        match endpoint.uri().scheme_str() {
            Some("https") => {
                endpoint =
                    endpoint.tls_config(settings.tls.client_config()?).map_err(|e| bad_endpoint(error_chain(&e)))?;
            }
            Some("http") if settings.tls.any() => {
                return Err(UplinkError::Tls(
                    "a CA file or client certificate is given but the collector URL is http://: use https://".into(),
                ));
            }
            Some("http") => {}
            _ => return Err(bad_endpoint("the scheme must be http:// or https://".into())),
        }
        let token = settings.token.as_ref().map(TokenSource::load).transpose()?;
        BearerInterceptor::new(token.as_ref())?;
        let seed = startline_proto::time::now_ms() as u64;
        Ok(Publisher {
            token,
            auth_logged: None,
            failure_logged: false,
            endpoint,
            backoff: settings.backoff_initial,
            settings,
            conn: None,
            inflight: VecDeque::new(),
            next_seq: 1,
            totals: Totals::default(),
            rng: Rng::new(seed),
            failing_since: None,
            metrics: None,
        })
    }

    /// Counts acks and failures in `metrics` from now on.
    pub fn set_metrics(&mut self, metrics: crate::metrics::Metrics) {
        metrics.register_collector(&self.settings.endpoint);
        self.metrics = Some(metrics);
    }

    /// Totals so far.
    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// Batches sent and not yet acknowledged.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// Queues a batch for delivery, waiting for acks first if the window is full.
    pub async fn send(&mut self, events: Vec<pb::LifecycleEvent>) -> Result<(), UplinkError> {
        if events.is_empty() {
            return Ok(());
        }
        while self.inflight.len() >= self.settings.window.max(1) {
            self.await_ack().await?;
        }
        let req = pb::PublishRequest { batch_seq: self.next_seq, events };
        self.next_seq += 1;
        self.inflight.push_back(req.clone());
        match &self.conn {
            Some(conn) => {
                if conn.tx.send(req).await.is_err() {
                    // The stream died; the batch is in `inflight` and is re-sent on reconnect.
                    self.conn = None;
                }
            }
            // Connecting sends everything in flight, this batch included; a failure is retried when acks are
            // awaited.
            None => {
                if let Ok(c) = self.connect().await {
                    self.conn = Some(c);
                }
            }
        }
        Ok(())
    }

    /// Waits until every batch sent is acknowledged.
    pub async fn flush(&mut self) -> Result<(), UplinkError> {
        while !self.inflight.is_empty() {
            self.await_ack().await?;
        }
        Ok(())
    }

    /// The token for the next connection: a token file is read again (a rotated token takes effect); if that
    /// fails, the last good token is kept and the failure logged.
    fn current_token(&mut self) -> Option<&Secret> {
        if let Some(source @ TokenSource::File(_)) = &self.settings.token {
            match source.load() {
                Ok(t) => self.token = Some(t),
                Err(e) => tracing::warn!(error = %e, "cannot re-read the token file; the last token read is used"),
            }
        }
        self.token.as_ref()
    }

    /// Sends GPU health readings with one unary call (no retry: the caller reads again next interval).
    pub async fn report_health(&mut self, req: pb::ReportHealthRequest) -> Result<pb::ReportHealthResponse, Status> {
        let channel: Channel =
            self.endpoint.connect().await.map_err(|e| Status::unavailable(format!("connect: {}", error_chain(&e))))?;
        let bearer = BearerInterceptor::new(self.current_token())
            .map_err(|_| Status::unauthenticated("the token holds characters a header cannot carry"))?;
        let mut client = pb::node_health_service_client::NodeHealthServiceClient::with_interceptor(channel, bearer);
        Ok(client.report(req).await?.into_inner())
    }

    /// Opens a `StreamService.Subscribe` call (no retry here: `tail` resumes from its last cursor).
    pub async fn subscribe(&mut self, req: pb::SubscribeRequest) -> Result<tonic::Streaming<pb::StreamRecord>, Status> {
        let channel: Channel =
            self.endpoint.connect().await.map_err(|e| Status::unavailable(format!("connect: {}", error_chain(&e))))?;
        let bearer = BearerInterceptor::new(self.current_token())
            .map_err(|_| Status::unauthenticated("the token holds characters a header cannot carry"))?;
        let mut client = pb::stream_service_client::StreamServiceClient::with_interceptor(channel, bearer)
            .max_decoding_message_size(64 << 20);
        Ok(client.subscribe(req).await?.into_inner())
    }

    async fn connect(&mut self) -> Result<Conn, Status> {
        let channel: Channel =
            self.endpoint.connect().await.map_err(|e| Status::unavailable(format!("connect: {}", error_chain(&e))))?;
        let bearer = BearerInterceptor::new(self.current_token())
            .map_err(|_| Status::unauthenticated("the token holds characters a header cannot carry"))?;
        let mut client = IngestServiceClient::with_interceptor(channel, bearer).max_decoding_message_size(64 << 20);
        let (tx, rx) = mpsc::channel(self.settings.window.max(1) + 1);
        // Everything unacknowledged goes first, in order.
        for req in &self.inflight {
            tx.try_send(req.clone()).map_err(|_| Status::internal("resend queue overflow"))?;
        }
        let resp = client.publish(ReceiverStream::new(rx)).await?;
        Ok(Conn { tx, rx: resp.into_inner() })
    }

    async fn on_failure(&mut self, status: Status) -> Result<(), UplinkError> {
        self.conn = None;
        if let Some(m) = &self.metrics {
            m.uplink_failed(&self.settings.endpoint, status.code(), self.backoff);
        }
        if is_auth_failure(&status) {
            self.totals.auth_failures += 1;
            if !self.settings.retry_auth_failures {
                return Err(UplinkError::Refused(status));
            }
            let key = (status.code(), status.message().to_string());
            if self.auth_logged.as_ref() != Some(&key) {
                tracing::error!(
                    code = ?status.code(),
                    message = status.message(),
                    endpoint = %self.settings.endpoint,
                    "collector refused the agent's credentials; events stay unacknowledged (spooled) and are \
                     retried with backoff: check the token (--token-file) and the collector's identities"
                );
                self.auth_logged = Some(key);
            }
        } else if !retryable(&status) {
            return Err(UplinkError::Refused(status));
        } else if !self.failure_logged {
            tracing::warn!(%status, endpoint = %self.settings.endpoint, "collector unreachable; retrying with backoff");
            self.failure_logged = true;
        }
        let since = *self.failing_since.get_or_insert_with(tokio::time::Instant::now);
        if let Some(limit) = self.settings.give_up_after {
            if since.elapsed() >= limit {
                return Err(UplinkError::GaveUp { waited: since.elapsed(), last: status.to_string() });
            }
        }
        // Full jitter: sleep a random time up to the current backoff, then double it.
        let delay = self.backoff.mul_f64(self.rng.uniform(0.5, 1.0));
        tracing::debug!(%status, ?delay, "uplink retry");
        tokio::time::sleep(delay).await;
        self.backoff = (self.backoff * 2).min(self.settings.backoff_max);
        self.totals.reconnects += 1;
        Ok(())
    }

    async fn await_ack(&mut self) -> Result<(), UplinkError> {
        loop {
            if self.conn.is_none() {
                match self.connect().await {
                    Ok(c) => self.conn = Some(c),
                    Err(status) => {
                        self.on_failure(status).await?;
                        continue;
                    }
                }
            }
            let Some(conn) = self.conn.as_mut() else {
                continue;
            };
            match conn.rx.message().await {
                Ok(Some(ack)) => {
                    let Some(front) = self.inflight.front() else {
                        return Ok(());
                    };
                    if ack.batch_seq != front.batch_seq {
                        // Acks come in order; anything else means the stream is confused: start over.
                        self.on_failure(Status::internal("ack out of order")).await?;
                        continue;
                    }
                    self.inflight.pop_front();
                    self.failing_since = None;
                    if self.auth_logged.take().is_some() || self.failure_logged {
                        tracing::info!(endpoint = %self.settings.endpoint, "collector accepts batches again");
                    }
                    self.failure_logged = false;
                    self.backoff = self.settings.backoff_initial;
                    self.totals.batches += 1;
                    self.totals.accepted += u64::from(ack.accepted);
                    self.totals.duplicates += u64::from(ack.duplicates);
                    self.totals.rejected += ack.rejections.len() as u64;
                    if let Some(m) = &self.metrics {
                        m.uplink_acked(
                            &self.settings.endpoint,
                            ack.accepted.into(),
                            ack.duplicates.into(),
                            ack.rejections.len() as u64,
                        );
                    }
                    for r in ack.rejections {
                        if self.totals.rejections.len() < 100 {
                            self.totals.rejections.push(r);
                        }
                    }
                    return Ok(());
                }
                Ok(None) => self.on_failure(Status::unavailable("stream closed by collector")).await?,
                Err(status) => self.on_failure(status).await?,
            }
        }
    }
}
