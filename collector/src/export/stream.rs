//! The `StreamService.Subscribe` reader: validates a subscription, reads the retained records after the client's
//! cursor from the store's `stream` tree, then follows the live hub, in cursor order and without gaps (see the
//! `stream` module doc). One task per subscriber; it never holds up ingest: the hub drops a subscriber that
//! falls more than `[stream] subscriber_buffer` records behind, and this task then ends the call with
//! `RESOURCE_EXHAUSTED` naming the cursor to resume after.

use crate::store::Store;
use crate::stream::{Ended, Filter, Stream};
use startline_proto::pb;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Records read from the store per step of a catch-up.
const CATCH_UP_CHUNK: usize = 1000;

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

    async fn run(self, mut after: u64, filter: Filter, tx: mpsc::Sender<Result<pb::StreamRecord, Status>>) {
        let progress_every = self.stream.settings.progress_interval;
        let mut last_sent = after;
        let mut last_sent_at = tokio::time::Instant::now();
        // Sends one record (or ends the task when the client left).
        macro_rules! send {
            ($r:expr) => {
                if tx.send(Ok($r)).await.is_err() {
                    return;
                }
            };
        }
        // Catch up from the store, subscribe, then read the store once more for records published in between.
        let mut live = None;
        loop {
            let chunk = match self.read(after).await {
                Ok(c) => c,
                Err(s) => {
                    let _ = tx.send(Err(s)).await;
                    return;
                }
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
            live = Some(self.stream.hub.subscribe(self.stream.settings.subscriber_buffer));
        }
        let Some(mut live) = live else { return };
        let mut tick = tokio::time::interval(progress_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let batch = tokio::select! {
                _ = self.shutdown.cancelled() => Err(Ended::Closed),
                // The client left: free the call's slot now, not at the next record.
                _ = tx.closed() => return,
                b = live.recv() => b,
                _ = tick.tick() => {
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
            };
            let batch = match batch {
                Ok(b) => b,
                Err(Ended::Overflow { .. }) => {
                    self.stream.overflows.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = tx
                        .send(Err(Status::resource_exhausted(format!(
                            "subscriber too slow: more than {} records behind the live stream; resume with \
                             after_cursor = {after}",
                            self.stream.settings.subscriber_buffer
                        ))))
                        .await;
                    return;
                }
                Err(Ended::Closed) => {
                    let _ = tx
                        .send(Err(Status::unavailable(format!(
                            "collector shutting down; resume with after_cursor = {after}"
                        ))))
                        .await;
                    return;
                }
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
    type SubscribeStream = ReceiverStream<Result<pb::StreamRecord, Status>>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        if !self.stream.settings.enabled {
            return Err(Status::failed_precondition("the stream is not kept here ([stream] enabled = false)"));
        }
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
        let (tx, rx) = mpsc::channel(256);
        let this = self.clone();
        tokio::spawn(async move {
            this.run(after, filter, tx).await;
            drop(slot);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
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
        let mut rx = s.subscribe(Request::new(req)).await?.into_inner().into_inner();
        let mut out = Vec::new();
        while out.len() < n {
            match tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await {
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
}
