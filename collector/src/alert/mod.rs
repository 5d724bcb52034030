//! Alerts: per-job pages (an urgent job past its start threshold while still waiting) and multi-window
//! burn-rate alerts per SLO; their state (firing since, resolved at) kept in the store; delivery to
//! Alertmanager and webhooks through [`notify`], over HTTP or HTTPS with the credentials of [`config`]
//! (secrets read from files at start, kept as [`client::Secret`]s).
//!
//! The alert loop is one task. It sleeps until the earliest SLO deadline (the deadline index), a wake-up from
//! the committer (a job changed), the evaluation tick (burn rates) or the resend tick (re-post firing alerts),
//! whichever comes first. Deliveries go through bounded queues to notifier tasks, so a slow or failing
//! notifier never blocks the loop, and never ingest.

pub mod burn;
pub mod client;
pub mod config;
pub mod notify;
pub mod record;

pub use config::AlertConfig;
pub use record::AlertRecord;

use crate::index::{JobIndex, SharedIndex};
use crate::store::Store;
use crate::time::{format_ms, Clock};
use startline_proto::labels::Label;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

/// The current alerts, shared with the API.
#[derive(Debug, Clone, Default)]
pub struct AlertBoard(Arc<Mutex<BTreeMap<String, AlertRecord>>>);

impl AlertBoard {
    /// A copy of every alert.
    pub fn snapshot(&self) -> Vec<AlertRecord> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Adds or replaces an alert (used when restoring stored state).
    pub fn insert(&self, a: AlertRecord) {
        self.with(|b| b.insert(a.key.clone(), a));
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<String, AlertRecord>) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Counters of the alert path.
#[derive(Debug, Default)]
pub struct AlertStats {
    /// Notifications dropped because a notifier's queue was full (the next resend covers firing alerts).
    pub dropped: std::sync::atomic::AtomicU64,
    /// Each notifier's outcomes by its config name (`alerts.webhook[0]`), in the order of the loop's queues.
    /// Replaced when a reload changes the targets; a target that keeps its name keeps its counters.
    pub notifiers: Mutex<Vec<(String, Arc<notify::NotifierStats>)>>,
}

impl AlertStats {
    /// The current notifiers' counters.
    pub fn notifiers(&self) -> Vec<(String, Arc<notify::NotifierStats>)> {
        self.notifiers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// How the alert loop takes new settings on a reload: it re-creates its timers and its notifier tasks (the old
/// ones finish what they already queued, then stop).
pub struct Reconfigure {
    /// New settings, validated (their notifier files already read).
    pub settings: tokio::sync::watch::Receiver<AlertConfig>,
    /// Where notifier tasks run.
    pub tasks: tokio_util::task::TaskTracker,
    /// Stops notifier tasks at shutdown.
    pub shutdown: CancellationToken,
}

/// What the alerts that scan every job need: suspect nodes, chain SLOs, breach predictions.
#[derive(Debug, Clone, Default)]
pub struct ScanAlerts {
    /// The suspect-node rule and whether to alert on it.
    pub nodes: crate::index::nodes::NodeSettings,
    /// GPU health readings.
    pub node_health: crate::index::nodes::HealthBook,
    /// Where node figures are published for the metrics.
    pub node_board: crate::index::nodes::NodeBoard,
    /// Chain SLOs (`[[chain_slo]]`).
    pub chain_slos: Arc<Vec<crate::slo::chain::ChainSloDef>>,
    /// Stages that complete a chain.
    pub final_stages: Arc<Vec<String>>,
    /// How often chain SLOs are evaluated, ms.
    pub chain_interval_ms: i64,
    /// Where chain SLO figures are published for the metrics.
    pub chain_board: crate::index::chains::ChainSloBoard,
    /// Breach prediction (`[prediction]`).
    pub prediction: crate::slo::predict::PredictSettings,
}

/// Everything the alert loop needs.
pub struct AlertLoop {
    /// The job index (with the SLO engine inside).
    pub index: SharedIndex,
    /// The store, for alert state.
    pub store: Store,
    /// The clock.
    pub clock: Clock,
    /// Settings.
    pub config: AlertConfig,
    /// Shared alert state.
    pub board: AlertBoard,
    /// Woken by the committer when jobs change.
    pub wake: Arc<Notify>,
    /// Queues of the notifier tasks.
    pub notifiers: Vec<mpsc::Sender<Vec<AlertRecord>>>,
    /// Counters.
    pub stats: Arc<AlertStats>,
    /// The collector's URL when `alerts.external_url` is not set (derived from the HTTP listener), without a
    /// trailing slash: the base of alert links.
    pub base_url: String,
    /// Settings reloads (None: fixed settings).
    pub reconfigure: Option<Reconfigure>,
    /// The alerts that scan every job: suspect nodes, chain SLOs, breach predictions.
    pub scans: ScanAlerts,
    /// Page conditions whose job's source is still replaying a backlog: (SLO index, job id), judged again once
    /// the source has caught up (see [`crate::index::SourceMarks`]).
    pub deferred: Mutex<std::collections::BTreeSet<(u16, String)>>,
    /// The stream out, which receives every alert change (when kept).
    pub stream: Option<Arc<crate::stream::Stream>>,
    /// Where the loop asks the applier to advance the SLO deadline index when a deadline passes (the loop keeps
    /// the timer; the applier, the index's one writer, applies it and wakes the loop).
    pub deadlines: Arc<crate::index::deadlines::DeadlineRequests>,
}

/// A job id as one URL fragment segment (its `/` kept: the dashboard reads the rest of the fragment as the id).
fn url_path_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn secs_text(ms: i64) -> String {
    humantime::format_duration(Duration::from_secs((ms.max(0) / 1000) as u64)).to_string()
}

impl AlertLoop {
    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let timers = |c: &AlertConfig| {
            let mut eval = tokio::time::interval(c.evaluation_interval);
            let mut resend = tokio::time::interval(c.resend_interval);
            eval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            (eval, resend)
        };
        let (mut eval, mut resend) = timers(&self.config);
        let mut reconfigure = self.reconfigure.take();
        let mut first = true;
        let mut slo_generation = self.index.read().slo_generation;
        let mut last_node_eval: Option<i64> = None;
        let mut last_chain_eval: Option<i64> = None;
        let mut wait_model = crate::slo::predict::WaitModel::default();
        // Deadlines at or before this were handed to the applier: their timer is not armed again until it
        // applied them (it wakes the loop), so a passed deadline never spins the loop.
        let mut requested_through = i64::MIN;
        loop {
            let next = self.index.read().slo.next_deadline().filter(|d| *d > requested_through);
            let settings_changed = async {
                match reconfigure.as_mut() {
                    Some(r) => r.settings.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let deadline = async {
                match next {
                    Some(d) => tokio::time::sleep_until(self.clock.instant_at(d)).await,
                    None => std::future::pending().await,
                }
            };
            let (mut do_eval, mut do_resend, mut reloaded) = (false, false, false);
            let has_deferred = !self.deferred.lock().map(|d| d.is_empty()).unwrap_or(true);
            let recheck = async {
                if has_deferred {
                    tokio::time::sleep(Duration::from_millis(crate::index::SourceMarks::QUIET_MS as u64)).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = recheck => {}
                ok = settings_changed => {
                    if ok {
                        reloaded = true;
                    } else {
                        // The sender is gone (shutdown under way): keep the settings in force.
                        reconfigure = None;
                    }
                }
                _ = deadline => {
                    let now = self.clock.now_ms();
                    self.deadlines.request(now);
                    requested_through = now;
                }
                _ = self.wake.notified() => {}
                _ = eval.tick() => do_eval = true,
                _ = resend.tick() => do_resend = true,
            }
            if let (true, Some(r)) = (reloaded, reconfigure.as_mut()) {
                self.config = r.settings.borrow_and_update().clone();
                (eval, resend) = timers(&self.config);
                self.notifiers =
                    notify::spawn_all(&self.config, self.clock, &self.base_url, &r.tasks, &r.shutdown, &self.stats);
                tracing::info!(
                    alertmanagers = self.config.alertmanagers.len(),
                    webhooks = self.config.webhooks.len(),
                    "alert settings reloaded"
                );
            }
            let now = self.clock.now_ms();
            // A reload that replaced the SLOs: reconcile firing alerts with the new definitions.
            let generation = self.index.read().slo_generation;
            if generation != slo_generation {
                // SLO indices changed: the new engine raises every page condition again.
                self.deferred.lock().unwrap_or_else(|p| p.into_inner()).clear();
            }
            let mut changed = self.job_pages(now, first || generation != slo_generation);
            if generation != slo_generation {
                changed.extend(self.resolve_burns_of_removed_slos(now));
                slo_generation = generation;
            }
            first = false;
            if do_eval {
                changed.extend(self.burn_alerts(now));
                if last_node_eval.is_none_or(|t| now - t >= self.scans.nodes.evaluation_interval_ms) {
                    last_node_eval = Some(now);
                    changed.extend(self.node_alerts(now).await);
                }
                if self.scans.prediction.enabled {
                    if wait_model.built_at_ms == 0
                        || now - wait_model.built_at_ms >= self.scans.prediction.model_interval_ms
                    {
                        wait_model = self.wait_model(now).await;
                    }
                    changed.extend(self.predicted_breaches(&wait_model, now));
                }
                if !self.scans.chain_slos.is_empty()
                    && last_chain_eval.is_none_or(|t| now - t >= self.scans.chain_interval_ms)
                {
                    last_chain_eval = Some(now);
                    changed.extend(self.chain_alerts(now).await);
                }
                let keep_from = now - self.config.resolved_retention.as_millis() as i64;
                let expired: Vec<String> = self.board.with(|b| {
                    let old: Vec<String> = b
                        .values()
                        .filter(|a| a.resolved_at_ms.is_some_and(|r| r < keep_from))
                        .map(|a| a.key.clone())
                        .collect();
                    for k in &old {
                        b.remove(k);
                    }
                    old
                });
                if !expired.is_empty() {
                    if let Err(e) = self.store.delete_alerts(&expired) {
                        tracing::error!(error = %e, "cannot forget expired alerts");
                        self.store.halt_after(&e);
                    }
                }
            }
            if !changed.is_empty() {
                // Stored before delivery, so a crash in between cannot page twice. Inline: alert changes are
                // rare and a small sled write plus flush takes about a millisecond; keeping it on this task also
                // keeps paused-clock tests exact.
                let saved = record::encode_all(&changed).map_err(|e| e.to_string()).and_then(|values| {
                    self.store.save_alerts(&values).map_err(|e| {
                        self.store.halt_after(&e);
                        e.to_string()
                    })
                });
                if let Err(e) = saved {
                    tracing::error!(error = %e, "cannot save alert state");
                }
                for a in &changed {
                    tracing::info!(key = %a.key, firing = a.firing(), "alert");
                }
                if let Some(stream) = &self.stream {
                    stream.post_alerts(changed.iter().map(|a| crate::stream::AlertNote {
                        key: a.key.clone(),
                        labels: a.labels.clone(),
                        annotations: a.annotations.clone(),
                        starts_at_ms: a.starts_at_ms,
                        resolved_at_ms: a.resolved_at_ms,
                    }));
                }
                self.deliver(changed);
            }
            if do_resend {
                // Re-post every firing alert (and those resolved in the last few intervals, in case a resolve was
                // lost), so Alertmanager keeps them open past their endsAt.
                let recent = now - 3 * self.config.resend_interval.as_millis() as i64;
                let all: Vec<AlertRecord> = self
                    .board
                    .snapshot()
                    .into_iter()
                    .filter(|a| a.resolved_at_ms.is_none_or(|r| r >= recent))
                    .collect();
                if !all.is_empty() {
                    self.deliver(all);
                }
            }
        }
        tracing::info!("alert loop stopped");
    }

    fn deliver(&self, alerts: Vec<AlertRecord>) {
        for (i, n) in self.notifiers.iter().enumerate() {
            if n.try_send(alerts.clone()).is_err() {
                self.stats.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some((_, s)) = self.stats.notifiers().get(i) {
                    s.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                tracing::warn!("notifier queue full; notification dropped (firing alerts are re-sent)");
            }
        }
    }

    /// Turns the page-condition changes the applier recorded (commits, deadlines it advanced) into alert
    /// changes, under the index's read lock. On the first pass after start, firing per-job alerts whose
    /// condition no longer holds are resolved.
    fn job_pages(&self, now: i64, reconcile: bool) -> Vec<AlertRecord> {
        let mut out = Vec::new();
        let idx = self.index.read();
        let mut changes = idx.slo.take_changes();
        // Conditions deferred while their source replayed a backlog: raised again once it caught up, if they
        // still hold (a first step further down the backlog cleared them: no page at all).
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        deferred.retain(|(slo, job)| {
            let holds = idx.jobs.get(job).is_some_and(|h| h.slo.iter().any(|c| c.slo == *slo && c.breached_waiting));
            if holds && !idx.catching_up(job, now) {
                changes.push(crate::slo::PageChange { slo: *slo, job_id: job.clone(), firing: true });
                return false;
            }
            holds
        });
        let JobIndex { jobs, slo, .. } = &*idx;
        for ch in changes {
            let Some(def) = slo.defs().get(ch.slo as usize) else { continue };
            if !def.page_on_breach {
                continue;
            }
            let key = format!("job/{}/{}", def.name, ch.job_id);
            if ch.firing {
                if idx.catching_up(&ch.job_id, now) {
                    deferred.insert((ch.slo, ch.job_id.clone()));
                    continue;
                }
                let Some(rec) = jobs.get(&ch.job_id) else { continue };
                let t = &rec.rec.timeline;
                let Some(attrs) = t.attrs.as_ref() else { continue };
                let sub = t.submitted_at.unwrap_or(now);
                if now - (sub + def.threshold_ms) > self.config.page_max_age.as_millis() as i64 {
                    // A crossing long past when first seen (history being caught up): counted, not paged.
                    continue;
                }
                let reason = t.current_wait.map_or_else(|| "unreported".to_string(), |(s, _)| s.label());
                let raw = t.current_raw_reason.as_deref().unwrap_or("").to_string();
                let waited = now - sub;
                let labels: BTreeMap<String, String> = [
                    ("alertname", "StartlineJobStartBreach".to_string()),
                    ("severity", "page".to_string()),
                    ("slo", def.name.clone()),
                    ("job_id", ch.job_id.clone()),
                    ("pool_kind", attrs.pool_kind.label().to_string()),
                    ("provider", attrs.provider.clone()),
                    ("pool", attrs.pool.clone()),
                    ("priority", attrs.priority.label().to_string()),
                    ("gpu_class", attrs.gpu_class.clone()),
                    ("region", attrs.region.clone()),
                    ("team", attrs.team.clone()),
                ]
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v))
                .chain(self.config.labels.clone())
                .collect();
                let mut annotations: BTreeMap<String, String> = [
                    (
                        "summary",
                        format!(
                            "{} job {} has waited {} for its first step (threshold {}): {}{}",
                            attrs.priority.label(),
                            ch.job_id,
                            secs_text(waited),
                            secs_text(def.threshold_ms),
                            reason,
                            if raw.is_empty() { String::new() } else { format!(" ({raw})") }
                        ),
                    ),
                    ("waiting_reason", reason),
                    ("raw_reason", raw),
                    ("waited_seconds", (waited / 1000).to_string()),
                    ("threshold_seconds", (def.threshold_ms / 1000).to_string()),
                    ("submitted_at", format_ms(sub)),
                    ("dashboard_url", format!("{}/#job/{}", self.base(), url_path_escape(&ch.job_id))),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                self.add_runbook(&mut annotations, "StartlineJobStartBreach");
                let fire = self.board.with(|b| match b.get(&key) {
                    Some(a) if a.firing() => None,
                    _ => {
                        let a = AlertRecord {
                            key: key.clone(),
                            labels,
                            annotations,
                            starts_at_ms: sub + def.threshold_ms,
                            resolved_at_ms: None,
                        };
                        b.insert(key.clone(), a.clone());
                        Some(a)
                    }
                });
                out.extend(fire);
            } else {
                out.extend(self.resolve(&key, now));
            }
        }
        if reconcile {
            let firing_jobs: Vec<(String, String, String)> = self.board.with(|b| {
                b.values()
                    .filter(|a| a.firing() && a.key.starts_with("job/"))
                    .filter_map(|a| {
                        Some((a.key.clone(), a.labels.get("slo")?.clone(), a.labels.get("job_id")?.clone()))
                    })
                    .collect()
            });
            for (key, slo_name, job_id) in firing_jobs {
                let still = slo.defs().iter().position(|d| d.name == slo_name && d.page_on_breach).is_some_and(|i| {
                    jobs.get(&job_id).is_some_and(|r| r.slo.iter().any(|c| c.slo as usize == i && c.breached_waiting))
                });
                if !still {
                    out.extend(self.resolve(&key, now));
                }
            }
        }
        out
    }

    /// The base of alert links: `alerts.external_url`, else the listener's URL.
    fn base(&self) -> &str {
        self.config.external_url.as_deref().unwrap_or(&self.base_url)
    }

    fn add_runbook(&self, annotations: &mut BTreeMap<String, String>, alertname: &str) {
        if let Some(u) = self.config.runbook_urls.get(alertname) {
            annotations.insert("runbook_url".into(), u.clone());
        } else if let Some(base) = &self.config.runbook_base_url {
            annotations.insert("runbook_url".into(), config::runbook_link(base, alertname));
        }
    }

    /// Resolves burn-rate alerts of SLOs that a reload removed (those of kept SLOs are re-evaluated as usual).
    fn resolve_burns_of_removed_slos(&self, now: i64) -> Vec<AlertRecord> {
        let names: Vec<String> = self.index.read().slo.defs().iter().map(|d| d.name.clone()).collect();
        let gone: Vec<String> = self.board.with(|b| {
            b.values()
                .filter(|a| a.firing() && a.key.starts_with("burn/"))
                .filter(|a| a.labels.get("slo").is_none_or(|n| !names.contains(n)))
                .map(|a| a.key.clone())
                .collect()
        });
        gone.iter().filter_map(|k| self.resolve(k, now)).collect()
    }

    fn resolve(&self, key: &str, now: i64) -> Option<AlertRecord> {
        self.board.with(|b| match b.get_mut(key) {
            Some(a) if a.firing() => {
                a.resolved_at_ms = Some(now);
                Some(a.clone())
            }
            _ => None,
        })
    }

    /// Judges every node (at most every `[nodes] evaluation_interval`: a judgement scans every job) over the
    /// `[nodes]` window, publishes the figures for the metrics, and raises
    /// `StartlineNodeSuspect` (severity `ticket`) for each suspect node, resolving those no longer suspect.
    async fn node_alerts(&self, now: i64) -> Vec<AlertRecord> {
        let (index, health, settings) = (self.index.clone(), self.scans.node_health.clone(), self.scans.nodes);
        let from = now - settings.window_ms;
        let rep = match tokio::task::spawn_blocking(move || {
            crate::index::nodes::report(&index, &health, from, now, &settings.rule)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "node evaluation failed");
                return Vec::new();
            }
        };
        self.scans.node_board.publish(&rep);
        let mut out = Vec::new();
        let mut firing_now = std::collections::BTreeSet::new();
        if settings.alert {
            for n in rep.suspects() {
                let key = format!("node/{}/{}", n.pool, n.node);
                firing_now.insert(key.clone());
                let v = &n.verdict;
                let mut why = Vec::new();
                if v.reasons.contains(&"failure_rate") {
                    why.push(format!(
                        "{} of {} placements failed or were lost (pool {:.1}%, p = {:.2e})",
                        v.bad,
                        v.placements,
                        v.pool_rate * 100.0,
                        v.p_value
                    ));
                }
                if let Some(h) = n.health.filter(|h| h.ecc_corrected + h.ecc_uncorrected + h.xid_errors > 0) {
                    why.push(format!(
                        "GPU errors: {} correctable ECC, {} uncorrectable ECC, {} XID",
                        h.ecc_corrected, h.ecc_uncorrected, h.xid_errors
                    ));
                }
                let mut jobs: Vec<&crate::job::nodes::Incident> = n.stats.incidents.iter().collect();
                jobs.sort_by_key(|i| std::cmp::Reverse(i.at_ms));
                let labels: BTreeMap<String, String> = [
                    ("alertname", "StartlineNodeSuspect".to_string()),
                    ("severity", "ticket".to_string()),
                    ("node", n.node.to_string()),
                    ("pool", n.pool.clone()),
                ]
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v))
                .chain(self.config.labels.clone())
                .collect();
                let mut annotations: BTreeMap<String, String> = [
                    (
                        "summary",
                        format!(
                            "node {}{} stands out: {}",
                            n.node,
                            if n.pool.is_empty() { String::new() } else { format!(" in pool {}", n.pool) },
                            why.join("; ")
                        ),
                    ),
                    ("reasons", v.reasons.join(",")),
                    ("bad_placements", v.bad.to_string()),
                    ("placements", v.placements.to_string()),
                    ("p_value", format!("{:.3e}", v.p_value)),
                    (
                        "jobs",
                        jobs.iter()
                            .take(10)
                            .map(|i| format!("{} ({})", i.job_id, i.end.label()))
                            .collect::<Vec<_>>()
                            .join(", "),
                    ),
                    ("dashboard_url", format!("{}/#nodes/{}", self.base(), url_path_escape(&n.node))),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                self.add_runbook(&mut annotations, "StartlineNodeSuspect");
                out.extend(self.fire_or_update(&key, labels, annotations, now));
            }
        }
        out.extend(self.resolve_stale("node/", &firing_now, now));
        out
    }

    /// The recent times to first step by pool and priority (one scan of every job).
    async fn wait_model(&self, now: i64) -> crate::slo::predict::WaitModel {
        let (index, from) = (self.index.clone(), now - self.scans.prediction.lookback_ms);
        let built = tokio::task::spawn_blocking(move || {
            let mut samples = Vec::new();
            index.for_each_job(4096, |_, job| {
                let t = job.timeline;
                if let (Some(a), Some(sub), Some(first)) = (t.attrs.as_ref(), t.submitted_at, t.first_step_at) {
                    if sub >= from && sub <= now {
                        samples.push((a.pool.clone(), a.priority, first - sub));
                    }
                }
            });
            crate::slo::predict::WaitModel::build(samples, now.max(1))
        })
        .await;
        built.unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot build the wait model");
            crate::slo::predict::WaitModel::build(Vec::new(), now.max(1))
        })
    }

    /// Raises `StartlineJobStartBreachPredicted` (severity `warning`) for each job waiting for its first step that
    /// is predicted to miss the deadline of a paging SLO ([`crate::slo::predict`]); resolves it when the job
    /// starts or ends, the prediction clears, or the deadline passes (the breach page takes over then, so the two
    /// never fire together for one job).
    fn predicted_breaches(&self, model: &crate::slo::predict::WaitModel, now: i64) -> Vec<AlertRecord> {
        use crate::slo::predict::{predict, Basis, Waiting};
        let mut out = Vec::new();
        let mut firing = std::collections::BTreeSet::new();
        {
            let idx = self.index.read();
            let defs = idx.slo.defs();
            // Jobs waiting past each SLO's threshold, by SLO, GPU class (pool when none) and priority (the stall
            // basis: a capacity crunch hits every pool of a class).
            let scope = |a: &crate::job::JobAttrs| crate::slo::predict::class_scope(&a.pool, &a.gpu_class);
            // The capacity basis: jobs of the class queued for capacity lately with none started.
            let capacity = if self.scans.prediction.capacity_jobs > 0 {
                idx.capacity_signals(self.scans.prediction.capacity_window_ms, now)
            } else {
                crate::slo::predict::CapacitySignals::default()
            };
            let mut past: std::collections::HashMap<(u16, String, startline_proto::pb::PriorityClass), usize> =
                std::collections::HashMap::new();
            for h in idx.jobs.values() {
                let Some(a) = h.rec.timeline.attrs.as_ref() else { continue };
                for c in h.slo.iter().filter(|c| c.breached_waiting) {
                    *past.entry((c.slo, scope(a), a.priority)).or_default() += 1;
                }
            }
            for (id, h) in &idx.jobs {
                let t = &h.rec.timeline;
                let (Some(a), Some(sub)) = (t.attrs.as_ref(), t.submitted_at) else { continue };
                if !t.state.is_waiting() || t.first_step_at.is_some() || idx.catching_up(id, now) {
                    continue;
                }
                for c in &h.slo {
                    let crate::slo::Standing::Pending { deadline_ms } = c.standing else { continue };
                    let Some(def) = defs.get(c.slo as usize).filter(|d| d.page_on_breach) else { continue };
                    let job = Waiting {
                        pool: &a.pool,
                        priority: a.priority,
                        submitted_ms: sub,
                        estimated_start_ms: t.current_estimated_start,
                        others_waiting_past: past.get(&(c.slo, scope(a), a.priority)).copied().unwrap_or(0),
                        capacity_queued: capacity.out_of_capacity(&scope(a)),
                    };
                    let Some(basis) = predict(model, &self.scans.prediction, job, def.threshold_ms, now) else {
                        continue;
                    };
                    let key = format!("predict/{}/{id}", def.name);
                    firing.insert(key.clone());
                    let why = match basis {
                        Basis::Scheduler { estimated_start_ms } => {
                            format!("the scheduler estimates its start at {}", format_ms(estimated_start_ms))
                        }
                        Basis::Stall { waiting_past } => format!(
                            "{waiting_past} other {} job(s) of {} are already waiting past this threshold",
                            a.priority.label(),
                            if a.gpu_class.is_empty() {
                                format!("pool {}", a.pool)
                            } else {
                                format!("GPU class {}", a.gpu_class)
                            }
                        ),
                        Basis::Capacity { queued } => format!(
                            "{queued} job(s) of {} were queued for capacity in the last {} and none started",
                            if a.gpu_class.is_empty() {
                                format!("pool {}", a.pool)
                            } else {
                                format!("GPU class {}", a.gpu_class)
                            },
                            secs_text(self.scans.prediction.capacity_window_ms)
                        ),
                        Basis::History { probability, samples } => format!(
                            "{:.0}% of {samples} recent {} jobs of pool {} that waited this long waited past it",
                            probability * 100.0,
                            a.priority.label(),
                            a.pool
                        ),
                    };
                    let reason = t.current_wait.map_or_else(|| "unreported".to_string(), |(s, _)| s.label());
                    let labels: BTreeMap<String, String> = [
                        ("alertname", "StartlineJobStartBreachPredicted".to_string()),
                        ("severity", "warning".to_string()),
                        ("slo", def.name.clone()),
                        ("job_id", id.clone()),
                        ("pool_kind", a.pool_kind.label().to_string()),
                        ("provider", a.provider.clone()),
                        ("pool", a.pool.clone()),
                        ("priority", a.priority.label().to_string()),
                        ("gpu_class", a.gpu_class.clone()),
                        ("region", a.region.clone()),
                        ("team", a.team.clone()),
                    ]
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(k, v)| (k.to_string(), v))
                    .chain(self.config.labels.clone())
                    .collect();
                    let mut annotations: BTreeMap<String, String> = [
                        (
                            "summary",
                            format!(
                                "{} job {id} is predicted to miss its {} start deadline ({}): {why}; waiting: {reason}",
                                a.priority.label(),
                                secs_text(def.threshold_ms),
                                format_ms(deadline_ms)
                            ),
                        ),
                        ("basis", basis.label().to_string()),
                        ("deadline", format_ms(deadline_ms)),
                        ("waited_seconds", ((now - sub) / 1000).to_string()),
                        ("waiting_reason", reason),
                        ("dashboard_url", format!("{}/#job/{}", self.base(), url_path_escape(id))),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                    match basis {
                        Basis::Scheduler { estimated_start_ms } => {
                            annotations.insert("estimated_start".into(), format_ms(estimated_start_ms));
                        }
                        Basis::Stall { waiting_past } => {
                            annotations.insert("waiting_past_threshold".into(), waiting_past.to_string());
                        }
                        Basis::Capacity { queued } => {
                            annotations.insert("queued_for_capacity".into(), queued.to_string());
                        }
                        Basis::History { probability, samples } => {
                            annotations.insert("probability".into(), format!("{probability:.3}"));
                            annotations.insert("samples".into(), samples.to_string());
                        }
                    }
                    self.add_runbook(&mut annotations, "StartlineJobStartBreachPredicted");
                    out.extend(self.fire_or_update(&key, labels, annotations, now));
                }
            }
        }
        out.extend(self.resolve_stale("predict/", &firing, now));
        out
    }

    /// Evaluates every chain SLO (at most every `[chains] evaluation_interval`: an evaluation scans every job):
    /// `StartlineChainLate` (severity `page`) for each covered chain still open past its deadline (when the SLO
    /// pages), resolved when it completes; `StartlineChainSLOBurnRate` by the same multi-window rules as the start
    /// SLOs; figures published for the metrics.
    async fn chain_alerts(&self, now: i64) -> Vec<AlertRecord> {
        use crate::slo::chain::{counts, verdict, Verdict};
        let (index, finals) = (self.index.clone(), self.scans.final_stages.clone());
        let chains = match tokio::task::spawn_blocking(move || crate::index::chains::chains(&index, &finals, now)).await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "chain SLO evaluation failed");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        let mut late_now = std::collections::BTreeSet::new();
        let mut figures = Vec::new();
        for def in self.scans.chain_slos.iter() {
            let mut verdicts = Vec::new();
            let mut fig = crate::index::chains::ChainSloFigures { slo: def.name.clone(), ..Default::default() };
            for (id, c) in &chains {
                if !def.selector.matches(id, &c.kind(), c.team()) {
                    continue;
                }
                let v = verdict(def, c, now);
                match v {
                    Verdict::Pending { .. } => fig.pending += 1,
                    Verdict::Bad { open: true, decided_ms } => {
                        fig.late_open += 1;
                        let key = format!("chain/{}/{id}", def.name);
                        let fresh = now - decided_ms <= self.config.page_max_age.as_millis() as i64;
                        if def.page_on_breach && (fresh || self.board.with(|b| b.get(&key).is_some_and(|a| a.firing())))
                        {
                            late_now.insert(key.clone());
                            out.extend(self.chain_late_alert(&key, def, id, c, decided_ms, now));
                        }
                    }
                    _ => {}
                }
                verdicts.push(v);
            }
            let c = counts(&verdicts, now, def.window_ms);
            (fig.good, fig.bad) = (c.good, c.bad);
            figures.push(fig);
            // Burn rates over the chain SLO's decisions, as for the start SLOs.
            let mut firing: Vec<(burn::BurnRule, f64, f64, f64)> = Vec::new();
            for r in burn::RULES {
                let (long, short) = (counts(&verdicts, now, r.long_ms), counts(&verdicts, now, r.short_ms));
                if long.total() < self.config.min_jobs || short.bad == 0 {
                    continue;
                }
                let factor = r.factor(def.window_ms);
                let (lb, sb) =
                    (crate::slo::burn_rate(long, def.objective), crate::slo::burn_rate(short, def.objective));
                if lb >= factor && sb >= factor {
                    firing.push((r, factor, lb, sb));
                }
            }
            for severity in ["page", "ticket"] {
                let key = format!("chainburn/{}/{severity}", def.name);
                let rules: Vec<&(burn::BurnRule, f64, f64, f64)> =
                    firing.iter().filter(|f| f.0.severity == severity).collect();
                if rules.is_empty() {
                    out.extend(self.resolve(&key, now));
                    continue;
                }
                let detail = rules
                    .iter()
                    .map(|(r, f, l, s)| format!("{}: {l:.1}x/{s:.1}x >= {f:.1}x", r.windows))
                    .collect::<Vec<_>>()
                    .join("; ");
                let labels: BTreeMap<String, String> = [
                    ("alertname", "StartlineChainSLOBurnRate".to_string()),
                    ("severity", severity.to_string()),
                    ("slo", def.name.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .chain(self.config.labels.clone())
                .collect();
                let mut annotations: BTreeMap<String, String> = [
                    ("summary", format!("chain SLO {} is burning its error budget: {detail}", def.name)),
                    ("windows", rules.iter().map(|f| f.0.windows).collect::<Vec<_>>().join(",")),
                    ("dashboard_url", format!("{}/#chains", self.base())),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                self.add_runbook(&mut annotations, "StartlineChainSLOBurnRate");
                out.extend(self.fire_or_update(&key, labels, annotations, now));
            }
        }
        self.scans.chain_board.publish(figures);
        out.extend(self.resolve_stale("chain/", &late_now, now));
        out
    }

    /// Fires `StartlineChainLate` for a chain past its deadline (once; later evaluations refresh its text).
    fn chain_late_alert(
        &self,
        key: &str,
        def: &crate::slo::chain::ChainSloDef,
        id: &str,
        c: &crate::job::chain::Chain,
        deadline: i64,
        now: i64,
    ) -> Option<AlertRecord> {
        let last = c.members.iter().max_by_key(|m| m.submitted_at);
        let stage = last.map_or_else(String::new, |m| {
            let state = if m.done_at.is_some() {
                "ended, next stage not submitted"
            } else if m.first_step_at.is_some() {
                "running"
            } else {
                "waiting"
            };
            format!("{} ({state})", if m.stage.is_empty() { "(none)" } else { m.stage.as_str() })
        });
        let labels: BTreeMap<String, String> = [
            ("alertname", "StartlineChainLate".to_string()),
            ("severity", "page".to_string()),
            ("slo", def.name.clone()),
            ("chain_id", id.to_string()),
            ("team", c.team().to_string()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v))
        .chain(self.config.labels.clone())
        .collect();
        let mut annotations: BTreeMap<String, String> = [
            (
                "summary",
                format!(
                    "chain {id} ({}) has been open for {}, past its {} deadline (SLO {}); latest stage: {stage}",
                    c.kind(),
                    secs_text(now - c.start_ms),
                    secs_text(def.threshold_ms),
                    def.name
                ),
            ),
            ("kind", c.kind()),
            ("latest_stage", stage),
            ("started_at", format_ms(c.start_ms)),
            ("deadline", format_ms(deadline)),
            ("threshold_seconds", (def.threshold_ms / 1000).to_string()),
            ("dashboard_url", format!("{}/#chains", self.base())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        self.add_runbook(&mut annotations, "StartlineChainLate");
        self.fire_or_update(key, labels, annotations, deadline)
    }

    /// Fires an alert (or refreshes the annotations of one already firing, without a new notification).
    fn fire_or_update(
        &self,
        key: &str,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        starts_at_ms: i64,
    ) -> Option<AlertRecord> {
        self.board.with(|b| match b.get_mut(key) {
            Some(a) if a.firing() => {
                a.annotations = annotations;
                None
            }
            _ => {
                let a = AlertRecord { key: key.to_string(), labels, annotations, starts_at_ms, resolved_at_ms: None };
                b.insert(key.to_string(), a.clone());
                Some(a)
            }
        })
    }

    /// Resolves the firing alerts whose key starts with `prefix` and is not in `keep`.
    fn resolve_stale(&self, prefix: &str, keep: &std::collections::BTreeSet<String>, now: i64) -> Vec<AlertRecord> {
        let stale: Vec<String> = self.board.with(|b| {
            b.values()
                .filter(|a| a.firing() && a.key.starts_with(prefix) && !keep.contains(&a.key))
                .map(|a| a.key.clone())
                .collect()
        });
        stale.iter().filter_map(|k| self.resolve(k, now)).collect()
    }

    fn burn_alerts(&self, now: i64) -> Vec<AlertRecord> {
        let mut out = Vec::new();
        let idx = self.index.read();
        for (i, def) in idx.slo.defs().iter().enumerate() {
            let firing = burn::evaluate(&idx.slo, i, now, self.config.min_jobs);
            for severity in ["page", "ticket"] {
                let key = format!("burn/{}/{severity}", def.name);
                let rules: Vec<&burn::Firing> = firing.iter().filter(|f| f.severity == severity).collect();
                if rules.is_empty() {
                    out.extend(self.resolve(&key, now));
                    continue;
                }
                let detail = rules
                    .iter()
                    .map(|f| format!("{}: {:.1}x/{:.1}x >= {:.1}x", f.windows, f.long_burn, f.short_burn, f.factor))
                    .collect::<Vec<_>>()
                    .join("; ");
                let labels: BTreeMap<String, String> = [
                    ("alertname", "StartlineSLOBurnRate".to_string()),
                    ("severity", severity.to_string()),
                    ("slo", def.name.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .chain(self.config.labels.clone())
                .collect();
                let mut annotations: BTreeMap<String, String> = [
                    ("summary", format!("SLO {} is burning its error budget: {detail}", def.name)),
                    ("windows", rules.iter().map(|f| f.windows).collect::<Vec<_>>().join(",")),
                    ("dashboard_url", format!("{}/#slos", self.base())),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                self.add_runbook(&mut annotations, "StartlineSLOBurnRate");
                out.extend(self.fire_or_update(&key, labels, annotations, now));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
