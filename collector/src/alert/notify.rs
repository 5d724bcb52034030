//! Notifiers: one task per target, fed by a bounded queue. Alertmanager gets its API v2 (`POST
//! /api/v2/alerts`, firing alerts with `endsAt` three resend intervals ahead, resolved ones with `endsAt` at the
//! resolve time); a webhook gets a JSON document shaped like Alertmanager's own webhook payload. Failed posts
//! are retried with exponential backoff; a notifier that stays down only loses deliveries that the next
//! resend repeats.

use super::http::{post_json, HttpUrl};
use super::AlertRecord;
use crate::time::{format_ms, Clock};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Where notifications go.
#[derive(Debug, Clone)]
pub enum Target {
    /// An Alertmanager (base URL).
    Alertmanager(HttpUrl),
    /// A generic JSON webhook.
    Webhook(HttpUrl),
}

/// Queue capacity of each notifier.
pub const QUEUE: usize = 256;
const ATTEMPTS: u32 = 5;

/// Renders the Alertmanager API v2 body.
pub fn alertmanager_body(alerts: &[AlertRecord], now_ms: i64, resend: Duration, generator_url: &str) -> Value {
    let ends_ahead = 3 * resend.as_millis() as i64;
    Value::Array(
        alerts
            .iter()
            .map(|a| {
                json!({
                    "labels": a.labels,
                    "annotations": a.annotations,
                    "startsAt": format_ms(a.starts_at_ms),
                    "endsAt": format_ms(a.resolved_at_ms.unwrap_or(now_ms + ends_ahead)),
                    "generatorURL": generator_url,
                })
            })
            .collect(),
    )
}

/// Renders the webhook body.
pub fn webhook_body(alerts: &[AlertRecord]) -> Value {
    let status = if alerts.iter().any(AlertRecord::firing) { "firing" } else { "resolved" };
    json!({
        "version": "startline/1",
        "receiver": "startline",
        "status": status,
        "alerts": alerts.iter().map(|a| json!({
            "status": if a.firing() { "firing" } else { "resolved" },
            "labels": a.labels,
            "annotations": a.annotations,
            "startsAt": format_ms(a.starts_at_ms),
            "endsAt": a.resolved_at_ms.map(format_ms),
        })).collect::<Vec<_>>(),
    })
}

/// Starts a notifier task; returns its queue.
pub fn spawn(
    target: Target,
    clock: Clock,
    resend: Duration,
    generator_url: String,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> mpsc::Sender<Vec<AlertRecord>> {
    let (tx, mut rx) = mpsc::channel::<Vec<AlertRecord>>(QUEUE);
    tasks.spawn(async move {
        loop {
            let alerts = tokio::select! {
                _ = shutdown.cancelled() => break,
                a = rx.recv() => match a { Some(a) => a, None => break },
            };
            let (url, body) = match &target {
                Target::Alertmanager(u) => {
                    (u.with_path("/api/v2/alerts"), alertmanager_body(&alerts, clock.now_ms(), resend, &generator_url))
                }
                Target::Webhook(u) => (u.clone(), webhook_body(&alerts)),
            };
            let bytes = body.to_string().into_bytes();
            let mut delay = Duration::from_millis(200);
            for attempt in 1..=ATTEMPTS {
                match post_json(&url, &bytes, Duration::from_secs(5)).await {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(target = %url.authority, attempt, error = %e, "notification failed");
                        if attempt == ATTEMPTS {
                            break;
                        }
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    });
    tx
}
