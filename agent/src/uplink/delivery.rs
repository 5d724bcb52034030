//! Delivery of the durable spool to the collectors: one task per collector reads batches after its own durable
//! cursor in the spool, sends them through a [`Publisher`] and moves the cursor once the collector acknowledged
//! them. It sits next to the publisher it drives; the spool below it knows nothing of the uplink.

use super::{Publisher, UplinkError};
use crate::spool::Spool;
use startline_proto::pb;
use tokio_util::sync::CancellationToken;

/// Delivers spooled events until `stop` to every collector in `publishers` (name: its endpoint), each at its
/// own pace from its own durable cursor: batches of up to `batch` events after the cursor, the cursor advanced
/// once the collector acknowledged them (after its own durable commit). An event leaves the spool once every
/// collector acknowledged it, or once the collectors that did not have been silent for `give_up` (see
/// [`Spool::ack`]). Collector outages are retried inside each publisher (jittered backoff), and so are
/// credential refusals when the publisher's `retry_auth_failures` is set (the agent modes set it).
pub async fn deliver(
    spool: Spool,
    publishers: Vec<(String, Publisher)>,
    batch: usize,
    stop: CancellationToken,
    give_up: Option<std::time::Duration>,
) -> Result<(), UplinkError> {
    let mut tasks = Vec::new();
    for (name, up) in publishers {
        let cursor = spool.register(&name).map_err(|e| UplinkError::Spool(e.to_string()))?;
        tasks.push(tokio::spawn(deliver_one(spool.clone(), name, cursor, up, batch, stop.clone(), give_up)));
    }
    let mut first_err = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(UplinkError::Spool(format!("delivery task failed: {e}")));
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

async fn deliver_one(
    spool: Spool,
    name: String,
    mut cursor: u64,
    mut up: Publisher,
    batch: usize,
    stop: CancellationToken,
    give_up: Option<std::time::Duration>,
) -> Result<(), UplinkError> {
    loop {
        if stop.is_cancelled() {
            return Ok(());
        }
        let s = spool.clone();
        let items = tokio::task::spawn_blocking(move || s.after(cursor, batch))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        if items.is_empty() {
            tokio::select! {
                _ = spool.appended.notified() => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                _ = stop.cancelled() => return Ok(()),
            }
            continue;
        }
        let last = items.last().map_or(0, |(s, _)| *s);
        let events: Vec<pb::LifecycleEvent> = items.into_iter().map(|(_, e)| e).collect();
        let rejected_before = up.totals().rejected;
        tokio::select! {
            r = async { up.send(events).await?; up.flush().await } => r?,
            _ = stop.cancelled() => return Ok(()),
        }
        let t = up.totals();
        if t.rejected > rejected_before {
            // Rejected events can never be accepted as they are: they leave the spool, loudly.
            let last = t.rejections.last();
            tracing::warn!(
                collector = %name,
                rejected = t.rejected - rejected_before,
                field = last.map_or("", |r| r.field.as_str()),
                reason = last.map_or("", |r| r.reason.as_str()),
                "collector rejected spooled events"
            );
        }
        cursor = last;
        let (s, n) = (spool.clone(), name.clone());
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || s.ack(&n, last, give_up)).await {
            tracing::error!(collector = %name, error = %e, "cannot record a delivery in the spool; it will be redelivered");
        }
    }
}
