//! The `StreamService.Subscribe` reader: validates a subscription, reads the retained records after the client's
//! cursor from the store's `stream` tree, then follows the live hub, in cursor order and without gaps (see the
//! `stream` module doc). One task per subscriber; it never holds up ingest: the hub drops a subscriber that
//! falls more than `[stream] subscriber_buffer` records behind, and this task then ends the call with
//! `RESOURCE_EXHAUSTED` naming the cursor to resume after.
//!
//! Between the task and the transport sits an [`Outgoing`] queue of [`OUTBOX_RECORDS`] records. A send that
//! finds it full (the client stopped reading: HTTP/2 flow control holds the transport) waits at most
//! `[stream] send_timeout`; then the call ends with `RESOURCE_EXHAUSTED`, its slot among `max_subscribers`
//! freed at once. However a call ends (too slow, not reading, shutdown, a reload that took the caller's
//! credential or `read` scope away, a storage failure), the records still queued are dropped and the status
//! follows the last record handed to the transport: its message says `resume with after_cursor = N` and the
//! trailer [`RESUME_CURSOR`] carries `N`, the cursor of the last record the client can have received.

use crate::auth::{Denied, Held, LongCall};
use crate::store::Store;
use crate::stream::{Ended, Filter, Rec, Stream};
use startline_proto::pb;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Records read from the store per step of a catch-up.
const CATCH_UP_CHUNK: usize = 1000;

/// Records queued between a subscriber's task and its transport.
pub const OUTBOX_RECORDS: usize = 256;

/// The trailer (gRPC metadata of the ending status) with the cursor to resume after: the last record sent
/// before the status.
pub const RESUME_CURSOR: &str = "startline-resume-cursor";

/// The service.
#[derive(Clone)]
pub struct StreamService {
    /// Where retained records are read.
    pub store: Store,
    /// Settings and the live hub.
    pub stream: Arc<Stream>,
    /// Ends every subscription at shutdown.
    pub shutdown: CancellationToken,
    /// The clock (progress records).
    pub clock: crate::time::Clock,
}

fn storage(e: crate::store::StoreError) -> Status {
    Status::unavailable(format!("stream storage unavailable: {}", e.cause()))
}

/// The transport's side of a call: the records its task queued, then the status that ends it.
struct Outbox {
    rx: mpsc::Receiver<pb::StreamRecord>,
    /// Set by the task before it lets go of its sender.
    end: Option<Status>,
    /// The cursor of the last record handed to the transport (where the call started, before the first).
    handed: u64,
}

fn lock(o: &Mutex<Outbox>) -> std::sync::MutexGuard<'_, Outbox> {
    o.lock().unwrap_or_else(|p| p.into_inner())
}

/// A Subscribe call's response stream: the records its task queued, then the status that ended the call.
pub struct Outgoing(Arc<Mutex<Outbox>>);

impl tokio_stream::Stream for Outgoing {
    type Item = Result<pb::StreamRecord, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut o = lock(&self.0);
        match o.rx.poll_recv(cx) {
            Poll::Ready(Some(r)) => {
                o.handed = r.cursor;
                Poll::Ready(Some(Ok(r)))
            }
            Poll::Ready(None) => Poll::Ready(o.end.take().map(Err)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        // The client left: the task's next send fails and its `closed()` wakes it.
        lock(&self.0).rx.close();
    }
}

/// Why a subscription's task stopped.
enum Stop {
    /// The client left: nothing to say.
    Gone,
    /// A send waited more than `send_timeout` for room.
    Stalled,
    /// The hub dropped it for falling behind.
    Overflow,
    /// The collector is stopping.
    Closed,
    /// A reload took its credential or scope away.
    Revoked(Denied),
    /// Reading the store failed.
    Failed(Status),
}

/// The task's side of a call.
struct Sink {
    tx: mpsc::Sender<pb::StreamRecord>,
    outbox: Arc<Mutex<Outbox>>,
    timeout: Duration,
}

impl Sink {
    /// A call's two sides, starting after cursor `after`.
    fn new(after: u64, timeout: Duration) -> (Sink, Outgoing) {
        let (tx, rx) = mpsc::channel(OUTBOX_RECORDS);
        let outbox = Arc::new(Mutex::new(Outbox { rx, end: None, handed: after }));
        (Sink { tx, outbox: outbox.clone(), timeout }, Outgoing(outbox))
    }

    /// Queues a record, waiting at most the timeout for room.
    async fn send(&self, r: pb::StreamRecord) -> Result<(), Stop> {
        let r = match self.tx.try_send(r) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(Stop::Gone),
            Err(mpsc::error::TrySendError::Full(r)) => r,
        };
        match tokio::time::timeout(self.timeout, self.tx.send(r)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Stop::Gone),
            Err(_) => Err(Stop::Stalled),
        }
    }

    /// Ends the call: the records still queued are dropped, and `status(resume)` (with the [`RESUME_CURSOR`]
    /// trailer) follows the last record handed to the transport, whose cursor is `resume`.
    fn end(self, status: impl FnOnce(u64) -> Status) {
        let mut o = lock(&self.outbox);
        o.rx.close();
        while o.rx.try_recv().is_ok() {}
        let resume = o.handed;
        let mut s = status(resume);
        s.metadata_mut().insert(RESUME_CURSOR, resume.into());
        o.end = Some(s);
        // Dropping the sender (with `self`) wakes the transport, which finds the queue empty and sends the status.
    }
}

/// What the live loop waits for.
enum Next {
    Batch(Result<Arc<[Rec]>, Ended>),
    Tick,
    Revoked(Denied),
    Gone,
}

/// Resolves when a reload took the call's credential or scope away; never for a call without a held identity.
async fn revoked(held: &mut Option<Held>) -> Denied {
    match held {
        Some(h) => h.revoked().await,
        None => std::future::pending().await,
    }
}

impl StreamService {
    /// Retained records after `after`, up to the newest durable one (a written record not yet flushed comes live
    /// once it is).
    async fn read(&self, after: u64) -> Result<Vec<pb::StreamRecord>, Status> {
        let store = self.store.clone();
        let durable = self.stream.durable.load(std::sync::atomic::Ordering::Acquire);
        let mut recs = tokio::task::spawn_blocking(move || store.stream_read(after, CATCH_UP_CHUNK))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(storage)?;
        recs.retain(|r| r.cursor <= durable);
        Ok(recs)
    }

    /// Where a subscription starts: the cursor it resumes after.
    async fn start(&self, req: &pb::SubscribeRequest) -> Result<u64, Status> {
        let store = self.store.clone();
        let bounds = tokio::task::spawn_blocking(move || store.stream_bounds())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(storage)?;
        let last = bounds.map_or(0, |(_, l)| l).min(self.stream.durable.load(std::sync::atomic::Ordering::Acquire));
        match (req.after_cursor, bounds) {
            (Some(c), _) if c > last => Err(Status::out_of_range(format!(
                "after_cursor: {c} is ahead of the newest record ({last}); was the collector's data replaced?"
            ))),
            (Some(c), Some((first, _))) if c.saturating_add(1) < first => Err(Status::out_of_range(format!(
                "after_cursor: {c} is older than the retained stream: the oldest retained record is {first} \
                 ([stream] retention); resume with after_cursor = {} (records in between are gone) or from_oldest",
                first - 1
            ))),
            (Some(c), _) => Ok(c),
            (None, Some((first, _))) if req.from_oldest => Ok(first - 1),
            (None, _) => Ok(last),
        }
    }

    /// Follows the stream for one call until it ends, then ends the call with the reason's status.
    async fn run(self, after: u64, filter: Filter, out: Sink, mut held: Option<Held>) {
        let mut live = None;
        let stop = self.follow(after, &filter, &out, &mut held, &mut live).await;
        let settings = &self.stream.settings;
        let counter = |c: &std::sync::atomic::AtomicU64| c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A subscriber stalled past the deadline that had also fallen more than its buffer behind is counted and
        // told as too slow: the hub had already dropped it.
        let stop = match stop {
            Stop::Stalled if live.as_ref().is_some_and(crate::stream::Live::overflowed) => Stop::Overflow,
            s => s,
        };
        match stop {
            Stop::Gone => {}
            Stop::Stalled => {
                counter(&self.stream.send_timeouts);
                out.end(|resume| {
                    Status::resource_exhausted(format!(
                        "subscriber not reading: a record waited more than {} for room ([stream] send_timeout); \
                         the first record not delivered comes after cursor {resume}; resume with after_cursor = \
                         {resume}",
                        crate::settings::format_duration(settings.send_timeout)
                    ))
                });
            }
            Stop::Overflow => {
                counter(&self.stream.overflows);
                out.end(|resume| {
                    Status::resource_exhausted(format!(
                        "subscriber too slow: more than {} records behind the live stream; resume with \
                         after_cursor = {resume}",
                        settings.subscriber_buffer
                    ))
                });
            }
            Stop::Closed => out.end(|resume| {
                Status::unavailable(format!("collector shutting down; resume with after_cursor = {resume}"))
            }),
            Stop::Revoked(d) => {
                let identity = held.as_ref().map(|h| h.identity().name.clone());
                if let Some(h) = &held {
                    h.count_revoked(LongCall::Subscribe, &d);
                }
                tracing::warn!(reason = d.reason(), identity, "Subscribe call ended by a reload: {}", d.message());
                out.end(|resume| {
                    let s = d.revoked_status();
                    Status::new(s.code(), format!("{}; resume with after_cursor = {resume}", s.message()))
                });
            }
            Stop::Failed(s) => {
                out.end(|resume| Status::new(s.code(), format!("{}; resume with after_cursor = {resume}", s.message())))
            }
        }
    }

    /// Sends the call's records: a catch-up from the store, then the live hub (left in `live`).
    async fn follow(
        &self,
        mut after: u64,
        filter: &Filter,
        out: &Sink,
        held: &mut Option<Held>,
        live: &mut Option<crate::stream::Live>,
    ) -> Stop {
        let progress_every = self.stream.settings.progress_interval;
        let mut last_sent = after;
        let mut last_sent_at = tokio::time::Instant::now();
        // Sends one record, once the caller is proven still allowed (one atomic load unless a reload happened).
        macro_rules! send {
            ($r:expr) => {
                if let Some(h) = held.as_mut() {
                    if let Err(d) = h.check() {
                        return Stop::Revoked(d);
                    }
                }
                if let Err(stop) = out.send($r).await {
                    return stop;
                }
            };
        }
        // Catch up from the store, subscribe, then read the store once more for records published in between.
        loop {
            let chunk = match self.read(after).await {
                Ok(c) => c,
                Err(s) => return Stop::Failed(s),
            };
            // The store returns whole blocks until at least the limit: fewer means the end was reached.
            let full = chunk.len() >= CATCH_UP_CHUNK;
            for r in chunk {
                after = r.cursor;
                if filter.matches(&r) {
                    last_sent = r.cursor;
                    last_sent_at = tokio::time::Instant::now();
                    send!(r);
                }
            }
            if full {
                continue;
            }
            if live.is_some() {
                break;
            }
            *live = Some(self.stream.hub.subscribe(self.stream.settings.subscriber_buffer));
        }
        let Some(sub) = live.as_mut() else { return Stop::Closed };
        let mut tick = tokio::time::interval(progress_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                _ = self.shutdown.cancelled() => Next::Batch(Err(Ended::Closed)),
                // The client left: free the call's slot now, not at the next record.
                _ = out.tx.closed() => Next::Gone,
                // A reload took the caller's credential or scope away: end now, even with nothing to send.
                d = revoked(held) => Next::Revoked(d),
                b = sub.recv() => Next::Batch(b),
                _ = tick.tick() => Next::Tick,
            };
            let batch = match next {
                Next::Gone => return Stop::Gone,
                Next::Revoked(d) => return Stop::Revoked(d),
                Next::Tick => {
                    if after > last_sent && last_sent_at.elapsed() >= progress_every {
                        last_sent = after;
                        last_sent_at = tokio::time::Instant::now();
                        send!(pb::StreamRecord {
                            cursor: after,
                            recorded_at: Some(startline_proto::time::ms_to_timestamp(self.clock.now_ms())),
                            record: Some(pb::stream_record::Record::Progress(pb::Progress {})),
                            ..Default::default()
                        });
                    }
                    continue;
                }
                Next::Batch(Ok(b)) => b,
                Next::Batch(Err(Ended::Overflow { .. })) => return Stop::Overflow,
                Next::Batch(Err(Ended::Closed)) => return Stop::Closed,
            };
            for rec in batch.iter() {
                if rec.cursor <= after {
                    continue;
                }
                after = rec.cursor;
                if let Some(r) = filter.decode_if_match(rec) {
                    last_sent = r.cursor;
                    last_sent_at = tokio::time::Instant::now();
                    send!(r);
                }
            }
        }
    }
}

#[tonic::async_trait]
impl pb::stream_service_server::StreamService for StreamService {
    type SubscribeStream = Outgoing;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        if !self.stream.settings.enabled {
            return Err(Status::failed_precondition("the stream is not kept here ([stream] enabled = false)"));
        }
        // The identity as the guard proved it, checked again after each reload before the next record.
        let held = request.extensions().get::<Held>().cloned();
        let req = request.into_inner();
        let filter = Filter::of(&req).map_err(|(field, why)| Status::invalid_argument(format!("{field}: {why}")))?;
        // Every open call counts, catching up from disk or following live: each costs a task and store reads.
        let Some(slot) = self.stream.open_call() else {
            return Err(Status::resource_exhausted(format!(
                "at most {} subscribers at once ([stream] max_subscribers)",
                self.stream.settings.max_subscribers
            )));
        };
        let after = self.start(&req).await?;
        let (sink, outgoing) = Sink::new(after, self.stream.settings.send_timeout);
        let this = self.clone();
        tokio::spawn(async move {
            this.run(after, filter, sink, held).await;
            drop(slot);
        });
        Ok(Response::new(outgoing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::stream_service_server::StreamService as _;
    use prost::Message;

    fn record(cursor: u64) -> (u64, Vec<u8>) {
        let r = pb::StreamRecord {
            cursor,
            job_id: format!("j{cursor}"),
            record: Some(pb::stream_record::Record::Change(pb::JobChange::default())),
            recorded_at: Some(startline_proto::time::ms_to_timestamp(cursor as i64 * 1000)),
            ..Default::default()
        };
        (cursor, r.encode_to_vec())
    }

    async fn collect(s: &StreamService, req: pb::SubscribeRequest, n: usize) -> Result<Vec<u64>, Status> {
        use tokio_stream::StreamExt;
        let mut rx = s.subscribe(Request::new(req)).await?.into_inner();
        let mut out = Vec::new();
        while out.len() < n {
            match tokio::time::timeout(std::time::Duration::from_secs(5), rx.next()).await {
                Ok(Some(Ok(r))) => out.push(r.cursor),
                Ok(Some(Err(s))) => return Err(s),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Retention trimmed records 1-3: a cursor before the oldest retained one is refused with OUT_OF_RANGE
    /// naming it; the cursor just before it (nothing missed) and from_oldest start there.
    #[tokio::test]
    async fn a_cursor_older_than_the_retained_stream_is_out_of_range() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        let recs: Vec<(u64, Vec<u8>)> = (1..=6).map(record).collect();
        for r in &recs {
            store.stream_put(std::slice::from_ref(r), None, r.0 as i64 * 1000).expect("put");
        }
        assert_eq!(store.stream_trim(4000, 100).expect("trim"), 3);
        let stream = Stream::new(Default::default());
        // Durable through 6 (the writer marks what its flushes made durable).
        stream.durable.store(6, std::sync::atomic::Ordering::Release);
        let svc =
            StreamService { store, stream, shutdown: CancellationToken::new(), clock: crate::time::Clock::system() };
        let after = |c| pb::SubscribeRequest { after_cursor: Some(c), ..Default::default() };
        for c in [0, 1, 2] {
            let e = collect(&svc, after(c), 1).await.expect_err("trimmed");
            assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
            assert!(e.message().contains("the oldest retained record is 4"), "{e}");
            assert!(e.message().contains("resume with after_cursor = 3"), "{e}");
        }
        assert_eq!(collect(&svc, after(3), 3).await.expect("resume"), vec![4, 5, 6]);
        assert_eq!(collect(&svc, after(5), 1).await.expect("resume"), vec![6]);
        let oldest = pb::SubscribeRequest { from_oldest: true, ..Default::default() };
        assert_eq!(collect(&svc, oldest, 3).await.expect("oldest"), vec![4, 5, 6]);
        let e = collect(&svc, after(7), 1).await.expect_err("ahead");
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(e.message().contains("ahead of the newest record (6)"), "{e}");
        // A record written and not yet durable is not read from the store (it comes live once flushed), nor does
        // it count as the newest.
        svc.store.stream_put(&[record(7)], None, 7000).expect("put");
        assert!(svc.read(6).await.expect("read").is_empty());
        let e = collect(&svc, after(7), 1).await.expect_err("ahead");
        assert!(e.message().contains("ahead of the newest record (6)"), "{e}");
        svc.stream.durable.store(7, std::sync::atomic::Ordering::Release);
        assert_eq!(svc.read(6).await.expect("read").iter().map(|r| r.cursor).collect::<Vec<_>>(), vec![7]);
    }

    fn service(settings: crate::stream::StreamSettings) -> (tempfile::TempDir, StreamService) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        let svc = StreamService {
            store,
            stream: Stream::new(settings),
            shutdown: CancellationToken::new(),
            clock: crate::time::Clock::system(),
        };
        (dir, svc)
    }

    /// Live records `from..=to`, as the committer hands them to the hub.
    fn live(svc: &StreamService, from: u64, to: u64) {
        let recs: Arc<[Rec]> = (from..=to)
            .map(|c| Rec { cursor: c, kind: crate::stream::KIND_CHANGE, bytes: record(c).1.into() })
            .collect();
        svc.stream.hub.publish(recs);
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn resume_cursor(s: &Status) -> Option<u64> {
        s.metadata().get(RESUME_CURSOR)?.to_str().ok()?.parse().ok()
    }

    /// A transport that takes ten records and then nothing (a client that stopped reading): once its queue is
    /// full, the next record waits `send_timeout`, then the call ends at once: its slot is free, the end is
    /// counted, and the queued records give way to the status, which names the last record handed over.
    #[tokio::test]
    async fn a_subscriber_not_reading_is_ended_at_the_send_deadline_with_its_cursor() {
        use tokio_stream::StreamExt;
        let timeout = Duration::from_millis(300);
        let settings = crate::stream::StreamSettings { send_timeout: timeout, ..Default::default() };
        let (_dir, svc) = service(settings);
        let mut out = svc.subscribe(Request::new(Default::default())).await.expect("subscribe").into_inner();
        until("the live subscription", || svc.stream.hub.subscribers() == 1).await;
        live(&svc, 1, 10);
        for c in 1..=10 {
            let r = out.next().await.expect("open").expect("record");
            assert_eq!(r.cursor, c);
        }
        live(&svc, 11, 400);
        let stalled = std::time::Instant::now();
        until("the slot to free", || svc.stream.open_calls() == 0).await;
        let waited = stalled.elapsed();
        assert!(waited >= timeout, "ended after {waited:?}, before the deadline");
        assert_eq!(svc.stream.send_timeouts.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(svc.stream.overflows.load(std::sync::atomic::Ordering::Relaxed), 0);
        let end = out.next().await.expect("a status").expect_err("the status, not the queued records");
        assert_eq!(end.code(), tonic::Code::ResourceExhausted, "{end:?}");
        assert!(end.message().contains("[stream] send_timeout"), "{end:?}");
        assert!(end.message().contains("resume with after_cursor = 10"), "{end:?}");
        assert_eq!(resume_cursor(&end), Some(10));
        assert!(out.next().await.is_none(), "nothing after the status");
        // The slot is reusable.
        let _next = svc.subscribe(Request::new(Default::default())).await.expect("a new call gets the slot");
    }

    /// A reader slower than the stream, but reading: every send waits a little, none the whole deadline.
    #[tokio::test]
    async fn a_slow_reader_that_reads_is_not_ended() {
        use tokio_stream::StreamExt;
        let settings = crate::stream::StreamSettings { send_timeout: Duration::from_millis(300), ..Default::default() };
        let (_dir, svc) = service(settings);
        let mut out = svc.subscribe(Request::new(Default::default())).await.expect("subscribe").into_inner();
        until("the live subscription", || svc.stream.hub.subscribers() == 1).await;
        live(&svc, 1, 600);
        let started = std::time::Instant::now();
        for c in 1..=600 {
            let r = out.next().await.expect("open").expect("record");
            assert_eq!(r.cursor, c);
            if c % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        assert!(started.elapsed() > Duration::from_millis(900), "slower than the deadline in all");
        assert_eq!(svc.stream.send_timeouts.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(svc.stream.open_calls(), 1);
    }

    /// A reload that removes the subscriber's token ends its call with UNAUTHENTICATED before another record,
    /// naming the cursor it reached; one that only takes `read` away ends another with PERMISSION_DENIED; a
    /// third identity's call goes on.
    #[tokio::test]
    async fn a_reload_that_revokes_the_caller_ends_the_call_before_the_next_record() {
        use crate::auth::{Auth, Credentials, Identity, Keyring, Scope, Scopes, TokenHash};
        use tokio_stream::StreamExt;
        let reader = |name: &str, scopes: Scopes| Identity { name: name.into(), scopes, ..Identity::anonymous() };
        let read = Scopes::default().with(Scope::Read);
        let keyring = |ids: &[(&str, Scopes)]| {
            Keyring::new(
                ids.iter().map(|(n, s)| (reader(n, *s), vec![TokenHash::of(&format!("tok-{n}"))], vec![])).collect(),
            )
        };
        let auth = Arc::new(Auth::new(keyring(&[("a", read), ("b", read), ("c", read)]), false, false));
        let (_dir, svc) = service(Default::default());
        let mut calls = Vec::new();
        for n in ["a", "b", "c"] {
            let header = format!("Bearer tok-{n}");
            let creds = Credentials { authorization: Some(header.as_bytes()), session: None, cert_names: &[] };
            let held = auth.hold(creds, Some(Scope::Read)).expect("proven");
            let mut req = Request::new(pb::SubscribeRequest::default());
            req.extensions_mut().insert(held);
            calls.push(svc.subscribe(req).await.expect("subscribe").into_inner());
        }
        until("three live subscriptions", || svc.stream.hub.subscribers() == 3).await;
        live(&svc, 1, 3);
        for out in &mut calls {
            for c in 1..=3 {
                assert_eq!(out.next().await.expect("open").expect("record").cursor, c);
            }
        }
        // a's token is gone, b keeps its token without `read`.
        auth.reload(keyring(&[("b", Scopes::default().with(Scope::Ingest)), ("c", read)]), false, false);
        live(&svc, 4, 5);
        let a = calls[0].next().await.expect("a status").expect_err("a ended before record 4");
        assert_eq!(a.code(), tonic::Code::Unauthenticated, "{a:?}");
        assert!(a.message().contains("resume with after_cursor = 3"), "{a:?}");
        assert_eq!(resume_cursor(&a), Some(3));
        let b = calls[1].next().await.expect("b status").expect_err("b ended before record 4");
        assert_eq!(b.code(), tonic::Code::PermissionDenied, "{b:?}");
        assert!(b.message().contains("\"read\""), "{b:?}");
        for c in 4..=5 {
            assert_eq!(calls[2].next().await.expect("open").expect("c goes on").cursor, c);
        }
        assert_eq!(
            auth.stats
                .revoked_calls()
                .iter()
                .filter(|(call, _, _)| *call == "subscribe")
                .map(|x| x.2)
                .collect::<Vec<_>>(),
            vec![1, 1]
        );
        until("the revoked calls' slots to free", || svc.stream.open_calls() == 1).await;
    }
}
