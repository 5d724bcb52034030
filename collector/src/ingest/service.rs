//! The gRPC edge of ingest: `startline.v1.IngestService`. Validates each event (rejections name the field and
//! the reason; the rest of the batch goes on), prepares the log encoding off the committer thread, and hands
//! batches to the committer under the configured full-queue policy. Acks go out in batch order, each only after
//! its events are durable.
//!
//! [`IngestServer`] routes the service's two methods with the collector's own codec ([`super::codec`]), so a
//! batch over the event cap is refused before it is decoded, and maps every failure of the request stream to a
//! documented status: an oversized message is `RESOURCE_EXHAUSTED`, a malformed one `INVALID_ARGUMENT`, and a
//! stream that fails mid-way ends with that error after the acks of the batches read before it, never with OK.
//! [`Intake::close`] takes the committer's sender away from every copy of the service at once, so lingering
//! connections cannot keep the committer from draining at shutdown.

use super::codec::{inbound_error, single_message, PublishCodec};
use super::guard::{status_of, Caller};
use super::WhenFull;
use crate::applier::{CommitError, CommitRequest, CommitResult, PreparedEvent};
use crate::auth::{Auth, Denied, Held, Identity, LongCall};
use crate::health::IngestStats;
use crate::job::CompactEvent;
use crate::store::encode_log_value;
use startline_proto::pb::{self, ingest_service_server::IngestService};
use startline_proto::validate::validate_event;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, StdError};
use tonic::{Request, Response, Status, Streaming};

/// Settings of the gRPC edge.
#[derive(Debug, Clone)]
pub struct EdgeSettings {
    /// Most events in one batch.
    pub max_batch_events: usize,
    /// Batches in flight per stream.
    pub max_inflight_batches: usize,
    /// Full-queue policy.
    pub when_full: WhenFull,
    /// Event limits.
    pub limits: startline_proto::Limits,
    /// Largest message, bytes (enforced by tonic from the length prefix; named in the error).
    pub max_message_bytes: usize,
    /// Identities: per-event job-id and source restrictions, rate limits.
    pub auth: Arc<Auth>,
    /// The store's write halt: once set, batches are answered `UNAVAILABLE` with its cause before they queue.
    pub halt: Arc<crate::health::WriteHalt>,
}

/// The committer's sender, shared by every copy of the service until [`Intake::close`] takes it away.
#[derive(Clone)]
pub struct Intake(Arc<Mutex<Option<mpsc::Sender<CommitRequest>>>>);

impl Intake {
    fn new(tx: mpsc::Sender<CommitRequest>) -> Self {
        Intake(Arc::new(Mutex::new(Some(tx))))
    }

    /// The sender, while intake is open.
    fn sender(&self) -> Option<mpsc::Sender<CommitRequest>> {
        self.0.lock().ok().and_then(|tx| tx.clone())
    }

    /// Stops handing batches to the committer: later batches are answered `UNAVAILABLE`, and once the sends
    /// already under way finish, the committer's channel has no sender left, so it drains and stops.
    pub fn close(&self) {
        if let Ok(mut tx) = self.0.lock() {
            tx.take();
        }
    }
}

fn shutting_down() -> Status {
    Status::unavailable("collector is shutting down; batch not acknowledged, retry")
}

/// The ingest service. Cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    intake: Intake,
    settings: Arc<EdgeSettings>,
    stats: Arc<IngestStats>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

/// A batch on its way to its ack.
enum Pending {
    /// Nothing to commit (every event rejected or an empty batch).
    Ready(pb::PublishAck),
    /// Waiting for the committer; `origin` maps a committed event's position to its index in the batch.
    Committing { ack: pb::PublishAck, origin: Vec<u32>, rx: oneshot::Receiver<Result<CommitResult, CommitError>> },
}

impl Pending {
    async fn resolve(self) -> Result<pb::PublishAck, Status> {
        match self {
            Pending::Ready(ack) => Ok(ack),
            Pending::Committing { mut ack, origin, rx } => match rx.await {
                Ok(Ok(r)) if r.refused.is_some() => Err(Status::resource_exhausted(r.refused.unwrap_or_default())),
                Ok(Ok(r)) => {
                    ack.accepted = r.accepted;
                    ack.duplicates = r.duplicates;
                    if !r.rejections.is_empty() {
                        // Events the committer did not store (per-job cap), among validation's, in batch order.
                        ack.rejections.extend(r.rejections.into_iter().map(|x| pb::Rejection {
                            index: origin.get(x.index).copied().unwrap_or(u32::MAX),
                            event_id: x.event_id,
                            field: x.field.to_string(),
                            reason: x.reason,
                        }));
                        ack.rejections.sort_by_key(|x| x.index);
                    }
                    Ok(ack)
                }
                Ok(Err(e)) => Err(Status::unavailable(format!(
                    "{e}; batch not acknowledged, retry later (events of it a failed write kept are answered as \
                     duplicates)"
                ))),
                Err(_) => Err(shutting_down()),
            },
        }
    }
}

impl Ingest {
    /// Builds the service around the committer's channel.
    pub fn new(
        tx: mpsc::Sender<CommitRequest>,
        settings: EdgeSettings,
        stats: Arc<IngestStats>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        Ingest { intake: Intake::new(tx), settings: Arc::new(settings), stats, shutdown, tasks }
    }

    /// The handle that closes intake for every copy of this service.
    pub fn intake(&self) -> Intake {
        self.intake.clone()
    }

    /// Validates a batch and queues its valid events for commit.
    async fn submit(&self, req: pb::PublishRequest, caller: Option<&Caller>) -> Result<Pending, Status> {
        if req.events.len() > self.settings.max_batch_events {
            return Err(Status::invalid_argument(format!(
                "events: batch has {} events, at most {} allowed",
                req.events.len(),
                self.settings.max_batch_events
            )));
        }
        let anonymous;
        let identity = match caller {
            Some(c) => &c.0,
            None => {
                anonymous = Arc::new(Identity::anonymous());
                &anonymous
            }
        };
        // Store writes halted: nothing can be acknowledged until the restart (see `applier::halt`).
        if let Some(cause) = self.settings.halt.cause() {
            return Err(Status::unavailable(format!(
                "storage unavailable: {cause}; batch not acknowledged, retry later (the collector restarts once \
                 its store is writable)"
            )));
        }
        // A batch over the identity's rate is refused whole, before any of it is stored.
        self.settings.auth.take_events(identity, req.events.len() as u64).map_err(|d| status_of(&d))?;
        let now = startline_proto::time::now_ms();
        let mut ack = pb::PublishAck { batch_seq: req.batch_seq, ..Default::default() };
        let mut prepared = Vec::with_capacity(req.events.len());
        let mut origin = Vec::with_capacity(req.events.len());
        for (i, ev) in req.events.into_iter().enumerate() {
            let checked = self.check_event(&ev, identity, now).map_err(|r| r.error);
            match checked {
                Ok(compact) => {
                    origin.push(i as u32);
                    prepared.push(PreparedEvent {
                        source: crate::job::event_id_hash(&ev.source),
                        encoded: encode_log_value(&ev),
                        job_id: ev.job_id,
                        event_id: ev.event_id,
                        compact,
                    })
                }
                Err(e) => ack.rejections.push(pb::Rejection {
                    index: i as u32,
                    event_id: ev.event_id,
                    field: e.field,
                    reason: e.reason,
                }),
            }
        }
        IngestStats::add(&self.stats.rejected, ack.rejections.len() as u64);
        if prepared.is_empty() {
            return Ok(Pending::Ready(ack));
        }
        let (reply, rx) = oneshot::channel();
        // Jobs the batch opens count against the identity's open-jobs budget (the committer refuses a batch
        // that would take it past it).
        let owner = (identity.max_open_jobs > 0).then(|| crate::applier::Owner {
            name: identity.name.as_str().into(),
            max_open_jobs: identity.max_open_jobs,
        });
        let commit = CommitRequest { events: prepared, reply, owner };
        let tx = self.intake.sender().ok_or_else(shutting_down)?;
        match self.settings.when_full {
            WhenFull::Wait => tx.send(commit).await.map_err(|_| shutting_down())?,
            WhenFull::Reject => tx.try_send(commit).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    IngestStats::add(&self.stats.refused_full, 1);
                    Status::resource_exhausted("ingest queue is full; batch not stored, retry with backoff")
                }
                mpsc::error::TrySendError::Closed(_) => shutting_down(),
            })?,
        }
        Ok(Pending::Committing { ack, origin, rx })
    }
}

impl Ingest {
    /// The checks every event passes before it is handed to the committer, in order: the protocol's
    /// validation, the identity's job-id prefixes and sources, and the nodes its events may name. A refusal
    /// names the field (`job_id` or `source` when the identity may not write it).
    fn check_event(
        &self,
        ev: &pb::LifecycleEvent,
        identity: &Identity,
        now: i64,
    ) -> Result<CompactEvent, EventRefused> {
        let invalid = |error| EventRefused { error, not_permitted: false };
        validate_event(ev, now, &self.settings.limits).map_err(invalid)?;
        let compact = CompactEvent::from_pb(ev, 0).ok_or_else(|| invalid(field_error("kind", "is required")))?;
        let refused = |field: &str, what: &str| {
            IngestStats::add(&self.settings.auth.stats.not_permitted, 1);
            EventRefused {
                error: field_error(field, &format!("{what}not permitted for identity {:?}", identity.name)),
                not_permitted: true,
            }
        };
        identity.permits_event(&ev.job_id, &ev.source).map_err(|field| refused(field, ""))?;
        if let Some(field) = super::node_health::event_node_refused(identity, ev) {
            return Err(refused(&field, "node "));
        }
        Ok(compact)
    }

    /// A batch that is stored whole or not at all (the HTTP JSON edge, [`super::http`]): every event is checked
    /// first, and the first refusal is returned with its index (nothing is queued); otherwise the batch goes the
    /// way of `PublishBatch` and the ack comes once its events are durable. Refusals by the committer (a job's
    /// event cap) are in the ack's rejections, as over gRPC.
    pub async fn publish_whole(
        &self,
        events: Vec<pb::LifecycleEvent>,
        identity: Arc<Identity>,
    ) -> Result<pb::PublishAck, WholeRefused> {
        if self.shutdown.is_cancelled() {
            return Err(WholeRefused::Status(shutting_down()));
        }
        if events.len() > self.settings.max_batch_events {
            return Err(WholeRefused::Status(Status::invalid_argument(format!(
                "events: batch has {} events, at most {} allowed",
                events.len(),
                self.settings.max_batch_events
            ))));
        }
        let now = startline_proto::time::now_ms();
        for (i, ev) in events.iter().enumerate() {
            if let Err(EventRefused { error, not_permitted }) = self.check_event(ev, &identity, now) {
                IngestStats::add(&self.stats.rejected, 1);
                return Err(WholeRefused::Event { index: i, error, not_permitted });
            }
        }
        let caller = Caller(identity);
        let pending = self
            .submit(pb::PublishRequest { batch_seq: 0, events }, Some(&caller))
            .await
            .map_err(WholeRefused::Status)?;
        pending.resolve().await.map_err(WholeRefused::Status)
    }
}

/// An event refused before commit.
struct EventRefused {
    error: startline_proto::FieldError,
    /// By the identity's restrictions, not by validation.
    not_permitted: bool,
}

/// Why [`Ingest::publish_whole`] stored nothing.
#[derive(Debug)]
pub enum WholeRefused {
    /// Event `index` was refused (`not_permitted`: by the identity's restrictions, not by validation).
    Event {
        /// Its position in the batch.
        index: usize,
        /// The field and the reason.
        error: startline_proto::FieldError,
        /// Refused by the identity's job-id, source or node restrictions.
        not_permitted: bool,
    },
    /// The batch was refused as gRPC would answer it (shutting down, storage halted, queue full, rate limit,
    /// over the batch cap).
    Status(Status),
}

impl Ingest {
    /// Counts, logs and answers a `Publish` stream ended by a reload.
    fn revoke(&self, d: &Denied, held: Option<&Held>) -> Status {
        self.settings.auth.stats.count_revoked(LongCall::Publish, d);
        let identity = held.map(|h| h.identity().name.as_str());
        tracing::warn!(reason = d.reason(), identity, "Publish stream ended by a reload: {}", d.message());
        d.revoked_status()
    }
}

/// Resolves when a reload took the call's credential or scope away; never for a call without a held identity.
async fn revoked(held: &mut Option<Held>) -> Denied {
    match held {
        Some(h) => h.revoked().await,
        None => std::future::pending().await,
    }
}

fn field_error(field: &str, reason: &str) -> startline_proto::FieldError {
    startline_proto::FieldError { field: field.into(), reason: reason.into() }
}

#[tonic::async_trait]
impl IngestService for Ingest {
    type PublishStream = ReceiverStream<Result<pb::PublishAck, Status>>;

    async fn publish(
        &self,
        request: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        let mut caller = request.extensions().get::<Caller>().cloned();
        // The identity as the guard proved it, checked again after each reload before the next batch.
        let mut held = request.extensions().get::<Held>().cloned();
        let mut inbound = request.into_inner();
        let cap = self.settings.max_inflight_batches;
        let (out_tx, out_rx) = mpsc::channel(cap);
        let (pending_tx, mut pending_rx) = mpsc::channel::<Result<Pending, Status>>(cap);
        let svc = self.clone();
        let max_message_bytes = self.settings.max_message_bytes;
        // Reader: stops at end of stream, on a stream error, or when shutdown starts; batches already read are
        // still committed and acknowledged by the acker below. A stream error (an oversized or malformed
        // message) or the shutdown goes into the queue after them, so the client gets their acks and then the
        // error status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED or UNAVAILABLE), never OK with batches unread. A
        // reload that takes the caller's credential or ingest scope away ends the stream the same way
        // (UNAUTHENTICATED or PERMISSION_DENIED), at once when idle and in any case before another batch is
        // taken; a reload that keeps them applies the identity's new restrictions from the next batch.
        self.tasks.spawn(async move {
            loop {
                let msg = tokio::select! {
                    biased;
                    _ = svc.shutdown.cancelled() => {
                        // Whatever the client sends next is not read: say so after the acks, rather than OK.
                        let _ = pending_tx.send(Err(shutting_down())).await;
                        break;
                    }
                    d = revoked(&mut held) => {
                        let _ = pending_tx.send(Err(svc.revoke(&d, held.as_ref()))).await;
                        break;
                    }
                    m = inbound.message() => m,
                };
                let req = match msg {
                    Ok(Some(req)) => req,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "publish stream ended with an error");
                        let _ = pending_tx.send(Err(inbound_error(status, max_message_bytes))).await;
                        break;
                    }
                };
                if let Some(h) = held.as_mut() {
                    match h.check() {
                        Ok(id) => caller = Some(Caller(id.clone())),
                        Err(d) => {
                            let _ = pending_tx.send(Err(svc.revoke(&d, held.as_ref()))).await;
                            break;
                        }
                    }
                }
                let item = svc.submit(req, caller.as_ref()).await;
                let stop = item.is_err();
                if pending_tx.send(item).await.is_err() || stop {
                    break;
                }
            }
        });
        // Acker: answers batches in order.
        self.tasks.spawn(async move {
            while let Some(item) = pending_rx.recv().await {
                let answer = match item {
                    Ok(p) => p.resolve().await,
                    Err(status) => Err(status),
                };
                let stop = answer.is_err();
                if out_tx.send(answer).await.is_err() || stop {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(out_rx)))
    }

    async fn publish_batch(&self, request: Request<pb::PublishRequest>) -> Result<Response<pb::PublishAck>, Status> {
        if self.shutdown.is_cancelled() {
            return Err(shutting_down());
        }
        let caller = request.extensions().get::<Caller>().cloned();
        let pending = self.submit(request.into_inner(), caller.as_ref()).await?;
        pending.resolve().await.map(Response::new)
    }
}

/// `startline.v1.IngestService` over HTTP/2: the generated server's routing, with [`PublishCodec`] in place of
/// the plain prost codec and the request stream's failures mapped by [`inbound_error`]. `PublishBatch` is served
/// as a one-message client stream (the same bytes on the wire as unary) so that a refused message is answered
/// by the collector, not with tonic's own wording.
#[derive(Clone)]
pub struct IngestServer {
    inner: Arc<Ingest>,
}

impl IngestServer {
    /// Serves `ingest`.
    pub fn new(ingest: Ingest) -> Self {
        IngestServer { inner: Arc::new(ingest) }
    }

    fn grpc(&self) -> tonic::server::Grpc<PublishCodec> {
        let max = self.inner.settings.max_message_bytes;
        tonic::server::Grpc::new(PublishCodec::new(self.inner.settings.max_batch_events))
            .apply_max_message_size_config(Some(max), Some(max))
    }
}

impl tonic::server::NamedService for IngestServer {
    const NAME: &'static str = pb::ingest_service_server::SERVICE_NAME;
}

/// `Publish`: a stream of batches, a stream of acks.
struct PublishMethod(Arc<Ingest>);

impl tonic::server::StreamingService<pb::PublishRequest> for PublishMethod {
    type Response = pb::PublishAck;
    type ResponseStream = ReceiverStream<Result<pb::PublishAck, Status>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<pb::PublishRequest>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.publish(request).await })
    }
}

/// `PublishBatch`: one batch, one ack.
struct PublishBatchMethod(Arc<Ingest>);

impl tonic::server::ClientStreamingService<pb::PublishRequest> for PublishBatchMethod {
    type Response = pb::PublishAck;
    type Future = BoxFuture<Response<pb::PublishAck>, Status>;

    fn call(&mut self, request: Request<Streaming<pb::PublishRequest>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            let (metadata, extensions, mut stream) = request.into_parts();
            let batch = single_message(&mut stream, "PublishRequest", inner.settings.max_message_bytes).await?;
            inner.publish_batch(Request::from_parts(metadata, extensions, batch)).await
        })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for IngestServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let mut grpc = self.grpc();
        let inner = self.inner.clone();
        match req.uri().path() {
            "/startline.v1.IngestService/Publish" => {
                Box::pin(async move { Ok(grpc.streaming(PublishMethod(inner), req).await) })
            }
            "/startline.v1.IngestService/PublishBatch" => {
                Box::pin(async move { Ok(grpc.client_streaming(PublishBatchMethod(inner), req).await) })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use startline_proto::pb::lifecycle_event::Kind;

    fn svc(cap: usize, when_full: WhenFull) -> (Ingest, mpsc::Receiver<CommitRequest>) {
        let (tx, rx) = mpsc::channel(cap);
        let settings = EdgeSettings {
            max_batch_events: 100,
            max_inflight_batches: 4,
            when_full,
            limits: startline_proto::Limits::default(),
            max_message_bytes: 1 << 20,
            auth: Arc::new(Auth::open()),
            halt: Arc::default(),
        };
        let ingest =
            Ingest::new(tx, settings, Arc::new(IngestStats::default()), CancellationToken::new(), TaskTracker::new());
        (ingest, rx)
    }

    fn batch(seq: u64) -> Request<pb::PublishRequest> {
        let ev = pb::LifecycleEvent {
            event_id: format!("e{seq}"),
            job_id: "j".into(),
            attempt: None,
            source: "t".into(),
            occurred_at: Some(startline_proto::time::ms_to_timestamp(startline_proto::time::now_ms())),
            kind: Some(Kind::NodeLost(pb::NodeLost::default())),
        };
        Request::new(pb::PublishRequest { batch_seq: seq, events: vec![ev] })
    }

    #[tokio::test]
    async fn full_queue_with_reject_policy_answers_resource_exhausted() {
        let (ingest, _rx) = svc(1, WhenFull::Reject);
        let first = ingest.clone();
        // The first batch takes the only slot and waits for a committer that never answers.
        let pending = tokio::spawn(async move { first.publish_batch(batch(1)).await });
        tokio::task::yield_now().await;
        while ingest.intake.sender().is_some_and(|tx| tx.capacity() > 0) {
            tokio::task::yield_now().await;
        }
        let err = ingest.publish_batch(batch(2)).await.expect_err("queue is full");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert_eq!(ingest.stats.refused_full.load(std::sync::atomic::Ordering::Relaxed), 1);
        pending.abort();
    }

    /// Once store writes are halted, a batch is answered `UNAVAILABLE` with the cause at once, without
    /// queueing for a committer that may be stuck behind the failed store.
    #[tokio::test]
    async fn a_halted_store_refuses_batches_at_once_with_the_cause() {
        let (ingest, mut rx) = svc(4, WhenFull::Wait);
        assert!(ingest.settings.halt.halt("no space left on device"));
        let err = ingest.publish_batch(batch(1)).await.expect_err("halted");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("no space left on device"), "{}", err.message());
        assert!(rx.try_recv().is_err(), "nothing queued for the committer");
    }

    #[tokio::test]
    async fn closed_intake_refuses_batches_and_leaves_the_committer_no_sender() {
        let (ingest, mut rx) = svc(4, WhenFull::Wait);
        let copies = [ingest.clone(), ingest.clone()];
        ingest.intake().close();
        let err = copies[0].publish_batch(batch(1)).await.expect_err("intake is closed");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        // Copies of the service are still alive, yet the committer's channel reports that every sender is gone.
        assert!(rx.recv().await.is_none());
        drop(copies);
    }

    #[tokio::test]
    async fn full_queue_with_wait_policy_waits_for_room_and_loses_nothing() {
        let (ingest, mut rx) = svc(1, WhenFull::Wait);
        let a = ingest.clone();
        let b = ingest.clone();
        let first = tokio::spawn(async move { a.publish_batch(batch(1)).await });
        let second = tokio::spawn(async move { b.publish_batch(batch(2)).await });
        // Act as the committer: answer both, in order; the second could only enter after the first left.
        for _ in 0..2 {
            let req = rx.recv().await.expect("a batch arrives");
            let _ = req.reply.send(Ok(CommitResult { accepted: req.events.len() as u32, ..Default::default() }));
        }
        for h in [first, second] {
            let ack = h.await.expect("task").expect("acked").into_inner();
            assert_eq!(ack.accepted, 1);
        }
    }
}
