//! The uplink: how every agent mode delivers events to the collector. One long-lived `Publish` stream carries
//! batches with a window of unacknowledged batches in flight; acks come back in order. When the stream or the
//! connection fails, the uplink reconnects with jittered exponential backoff and re-sends every unacknowledged
//! batch: event ids make redelivery harmless (the collector answers duplicates).
//!
//! Batches come from the caller's memory here; the durable on-disk spool (issue 5) feeds the same publisher.

use crate::rng::Rng;
use startline_proto::pb::{self, ingest_service_client::IngestServiceClient};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
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
}

fn retryable(status: &Status) -> bool {
    !matches!(
        status.code(),
        Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated | Code::Unimplemented
    )
}

impl Publisher {
    /// A publisher for the settings' endpoint; connects lazily.
    pub fn new(settings: UplinkSettings) -> Result<Self, UplinkError> {
        let endpoint = Endpoint::from_shared(settings.endpoint.clone())
            .map_err(|e| UplinkError::Endpoint { endpoint: settings.endpoint.clone(), reason: e.to_string() })?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20));
        let seed = startline_proto::time::now_ms() as u64;
        Ok(Publisher {
            endpoint,
            backoff: settings.backoff_initial,
            settings,
            conn: None,
            inflight: VecDeque::new(),
            next_seq: 1,
            totals: Totals::default(),
            rng: Rng::new(seed),
            failing_since: None,
        })
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

    async fn connect(&mut self) -> Result<Conn, Status> {
        let channel: Channel =
            self.endpoint.connect().await.map_err(|e| Status::unavailable(format!("connect: {e}")))?;
        let mut client = IngestServiceClient::new(channel).max_decoding_message_size(64 << 20);
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
        if !retryable(&status) {
            return Err(UplinkError::Refused(status));
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
                    self.backoff = self.settings.backoff_initial;
                    self.totals.batches += 1;
                    self.totals.accepted += u64::from(ack.accepted);
                    self.totals.duplicates += u64::from(ack.duplicates);
                    self.totals.rejected += ack.rejections.len() as u64;
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
