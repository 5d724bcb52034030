//! The Vertex AI adapter. Pure core: [`parse_custom_job`] reads a `CustomJob` resource (v1 REST) and [`diff`]
//! turns it plus the job's memory into lifecycle events. Shell: [`Client`] lists CustomJobs over HTTPS with an
//! OAuth2 bearer token from [`super::google_credentials`] (Application Default Credentials, a fixed token or a
//! token command; cached until shortly before it expires, dropped and fetched again when the API answers 401;
//! the endpoint is configurable, so tests use a local server replaying documented payloads) and [`run`] polls.
//!
//! Job ids are `vertex/<project>/<location>/<id>` with the `--project` value as given (resource names carry the
//! project *number*; the configured id keeps ids stable and as documented). Listing is bounded: the first poll
//! asks for jobs updated within `--lookback`, each later one for jobs updated since the last successful poll
//! (minus a 10-minute overlap for clock skew; the cursor is persisted), so a project with years of history costs
//! one short page per poll. Each page request is retried on 429/5xx with jittered backoff ([`super::retry`]).
//!
//! Vertex keeps no state history, only `createTime`, `startTime` (first RUNNING) and `endTime`, so:
//! `submitted` at `createTime`; the first state seen is dated `createTime`, later ones at the poll that saw them;
//! `JOB_STATE_QUEUED` -> queued:capacity (raw state kept); `JOB_STATE_PENDING` -> preparing:provisioning;
//! `startTime` -> first_step (the replicas started: Vertex's nearest signal); the terminal state at `endTime`:
//! SUCCEEDED -> succeeded, FAILED -> failed (the `error.message`, e.g. "Resources are insufficient in region",
//! kept as the message), CANCELLED -> cancelled, EXPIRED -> timed_out (dated `endTime`, else `updateTime`: an
//! expired job may never have run). Priority comes from the job label
//! `startline-priority` (`urgent` or `normal`) or a display-name prefix.

use super::google_credentials::GoogleCredentials;
use super::gpus::{GpuTable, Known};
use super::retry::{with_retries, Attempt, RetryPolicy};
use super::{JobMemory, MemoryStore, PollError, PollReport};
use crate::metrics::{PollErrorKind, Provider};
use serde_json::Value;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::rfc3339::json_ms;

/// A CustomJob as the adapter sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CustomJob {
    /// Resource name `projects/<p>/locations/<l>/customJobs/<id>`.
    pub name: String,
    /// Display name.
    pub display_name: String,
    /// `JOB_STATE_*`.
    pub state: String,
    /// createTime, Unix ms.
    pub created_ms: i64,
    /// startTime, Unix ms.
    pub start_ms: Option<i64>,
    /// endTime, Unix ms.
    pub end_ms: Option<i64>,
    /// updateTime, Unix ms.
    pub update_ms: Option<i64>,
    /// error.message.
    pub error: String,
    /// Machine type of the first worker pool.
    pub machine_type: String,
    /// Accelerator type of the first worker pool.
    pub accelerator: String,
    /// Accelerators over all pools.
    pub gpus: u32,
    /// Replicas over all pools.
    pub replicas: u32,
    /// Scheduling strategy (STANDARD, SPOT, FLEX_START).
    pub strategy: String,
    /// Labels.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// int64 fields arrive as strings in Google's JSON. Counts beyond `u32` saturate (never wrap).
fn count(v: &Value) -> u32 {
    let n: u64 = v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or(0);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Parses a CustomJob resource.
pub fn parse_custom_job(v: &Value) -> Option<CustomJob> {
    let pools = v["jobSpec"]["workerPoolSpecs"].as_array().cloned().unwrap_or_default();
    let first = pools.first().cloned().unwrap_or_default();
    Some(CustomJob {
        name: v["name"].as_str()?.to_string(),
        display_name: v["displayName"].as_str().unwrap_or("").to_string(),
        state: v["state"].as_str().unwrap_or("").to_string(),
        created_ms: json_ms(&v["createTime"])?,
        start_ms: json_ms(&v["startTime"]),
        end_ms: json_ms(&v["endTime"]),
        update_ms: json_ms(&v["updateTime"]),
        error: v["error"]["message"].as_str().unwrap_or("").to_string(),
        machine_type: first["machineSpec"]["machineType"].as_str().unwrap_or("").to_string(),
        accelerator: first["machineSpec"]["acceleratorType"].as_str().unwrap_or("").to_string(),
        // Saturating: absurd counts from a hostile or broken answer must not overflow (validation refuses them).
        gpus: pools
            .iter()
            .map(|p| count(&p["machineSpec"]["acceleratorCount"]).saturating_mul(count(&p["replicaCount"]).max(1)))
            .fold(0, u32::saturating_add),
        replicas: pools.iter().map(|p| count(&p["replicaCount"]).max(1)).fold(0, u32::saturating_add),
        strategy: v["jobSpec"]["scheduling"]["strategy"].as_str().unwrap_or("STANDARD").to_string(),
        labels: v["labels"]
            .as_object()
            .map(|o| o.iter().filter_map(|(k, x)| Some((k.clone(), x.as_str()?.to_string()))).collect())
            .unwrap_or_default(),
    })
}

/// How Vertex jobs map onto Startline's attributes.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    /// The project as configured (`--project`): the id's project part, whatever the resource name carries.
    pub project: String,
    /// Display-name prefixes that mark urgent jobs (besides the `startline-priority` label).
    pub urgent_prefixes: Vec<String>,
    /// Accelerator classes, with `--instance-type` overrides.
    pub gpus: GpuTable,
}

/// The Startline job id: `vertex/<project>/<location>/<id>`, the project as configured.
pub fn startline_id(m: &Mapping, j: &CustomJob) -> String {
    let parts: Vec<&str> = j.name.split('/').collect();
    match parts.as_slice() {
        ["projects", _, "locations", l, "customJobs", id] => format!("vertex/{}/{l}/{id}", m.project),
        _ => format!("vertex/{}/{}", m.project, j.name),
    }
}

/// The events the job's current resource implies beyond its memory, and the new memory.
pub fn diff(m: &Mapping, j: &CustomJob, mem: &JobMemory, now_ms: i64) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    let mut mem = mem.clone();
    let mut out = Vec::new();
    let job = startline_id(m, j);
    let location = j.name.split('/').nth(3).unwrap_or("").to_string();
    let source = format!("vertex-adapter/{location}");
    let mut emit = |mem: &mut JobMemory, key: &str, at: i64, kind: Kind| {
        super::emit_once(&mut out, mem, &job, &source, key, at, kind)
    };
    let first_sight = mem.emitted.is_empty();
    let urgent = j.labels.get("startline-priority").is_some_and(|p| p == "urgent")
        || m.urgent_prefixes.iter().any(|p| j.display_name.starts_with(p.as_str()));
    // Google Cloud label keys may hold international characters: mapped onto the collector's rule or dropped
    // and counted, so no label can get the job's `submitted` refused.
    let tags = j.labels.iter().filter(|(k, _)| k.as_str() != "startline-priority");
    let (mut labels, dropped) = super::provider_labels(tags.map(|(k, v)| (k.as_str(), v.as_str())), 14);
    if dropped > 0 {
        labels.insert(super::TAGS_DROPPED_LABEL.into(), dropped.to_string());
    }
    labels.insert("strategy".into(), j.strategy.to_ascii_lowercase());
    emit(
        &mut mem,
        "submitted",
        j.created_ms,
        Kind::Submitted(pb::Submitted {
            pool_kind: pb::PoolKind::Managed as i32,
            provider: "vertex".into(),
            pool: if j.machine_type.is_empty() { "vertex".into() } else { j.machine_type.clone() },
            priority: if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
            gpu_class: match m.gpus.vertex(&j.accelerator) {
                Known::Gpus(_, c) => c,
                Known::Cpu | Known::Unknown => String::new(),
            },
            gpu_count: j.gpus,
            node_count: j.replicas.max(1),
            region: location.clone(),
            team: j.labels.get("team").map(|t| super::attribute(t, 64)).unwrap_or_default(),
            labels,
            ..Default::default()
        }),
    );
    let seen_at = if first_sight { j.created_ms } else { now_ms.max(j.created_ms) };
    match j.state.as_str() {
        "JOB_STATE_QUEUED" => emit(
            &mut mem,
            "queued",
            seen_at,
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: j.state.clone(),
                message: String::new(),
                estimated_start: None,
                queue_position: None,
            }),
        ),
        "JOB_STATE_PENDING" => emit(
            &mut mem,
            "pending",
            seen_at,
            Kind::Preparing(pb::Preparing { phase: pb::PreparingPhase::Provisioning as i32, message: j.state.clone() }),
        ),
        _ => {}
    }
    if let Some(s) = j.start_ms {
        emit(&mut mem, "first_step", s, super::container_start());
    }
    let outcome = match j.state.as_str() {
        "JOB_STATE_SUCCEEDED" => Some(pb::Outcome::Succeeded),
        "JOB_STATE_FAILED" => Some(pb::Outcome::Failed),
        "JOB_STATE_CANCELLED" => Some(pb::Outcome::Cancelled),
        "JOB_STATE_EXPIRED" => Some(pb::Outcome::TimedOut),
        _ => None,
    };
    if let Some(o) = outcome {
        let at = j.end_ms.or(j.update_ms).unwrap_or(now_ms).max(j.created_ms);
        let message = if j.error.is_empty() { j.state.clone() } else { super::free_text(&j.error, 1024) };
        emit(&mut mem, "done", at, Kind::Done(pb::Done { outcome: o as i32, exit_code: None, message }));
        mem.done = true;
    }
    (out, mem)
}

/// A Vertex AI REST client (v1) with a bearer token; each page request is retried on 429 and 5xx.
pub struct Client {
    http: reqwest::Client,
    base: String,
    project: String,
    location: String,
    token: GoogleCredentials,
    retry: RetryPolicy,
    metrics: Option<crate::metrics::Metrics>,
}

impl Client {
    /// A client for `base` (e.g. `https://europe-west4-aiplatform.googleapis.com`).
    pub fn new(base: &str, project: &str, location: &str, token: GoogleCredentials) -> Result<Client, String> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            project: project.into(),
            location: location.into(),
            token,
            retry: RetryPolicy::default(),
            metrics: None,
        })
    }

    /// Counts retried calls in these metrics.
    pub fn with_metrics(mut self, m: crate::metrics::Metrics) -> Client {
        self.metrics = Some(m);
        self
    }

    /// Retries calls by this policy.
    pub fn with_retry(mut self, p: RetryPolicy) -> Client {
        self.retry = p;
        self
    }

    /// Every CustomJob of the project and location updated after `since_ms` (all pages).
    pub async fn list(&self, since_ms: i64) -> Result<Vec<Value>, PollError> {
        let mut renewed = false;
        loop {
            match self.list_with(since_ms).await {
                Err(e) if !renewed && e.message.contains(" answered 401") => {
                    tracing::info!(error = %e, "Vertex AI refused the token; fetching a new one");
                    renewed = true;
                    self.token.forget().await;
                }
                other => return other,
            }
        }
    }

    async fn list_with(&self, since_ms: i64) -> Result<Vec<Value>, PollError> {
        let token = self.token.token().await?;
        let url = format!("{}/v1/projects/{}/locations/{}/customJobs", self.base, self.project, self.location);
        let since = startline_proto::rfc3339::format_ms(since_ms.max(0));
        let filter = format!("update_time>\"{since}\"");
        let mut jobs = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let v = with_retries(
                &self.retry,
                || self.page(&url, &filter, page.as_deref(), token.expose()),
                |e| {
                    if let Some(m) = &self.metrics {
                        m.call_retried(Provider::Vertex, e.kind);
                    }
                },
            )
            .await?;
            jobs.extend(v["customJobs"].as_array().cloned().unwrap_or_default());
            match v["nextPageToken"].as_str() {
                Some(t) if !t.is_empty() => page = Some(t.to_string()),
                _ => return Ok(jobs),
            }
        }
    }

    async fn page(&self, url: &str, filter: &str, page: Option<&str>, token: &str) -> Result<Value, Attempt> {
        let transport = |e: reqwest::Error| Attempt::from(PollError::new(PollErrorKind::Transport, e.to_string()));
        let mut query = vec![("pageSize", "100"), ("filter", filter)];
        if let Some(p) = page {
            query.push(("pageToken", p));
        }
        let resp = self.http.get(url).query(&query).bearer_auth(token).send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let retry_after = super::retry::retry_after(resp.headers());
        let text = resp.text().await.map_err(transport)?;
        if !(200..300).contains(&status) {
            return Err(Attempt { error: PollError::http("vertex", status, &text), retry_after });
        }
        serde_json::from_str(&text).map_err(|e| {
            Attempt::from(PollError::new(PollErrorKind::Parse, format!("vertex answered invalid json: {e}")))
        })
    }
}

/// How far back the listing cursor is moved: updates stamped by Google's clock up to this much before ours are
/// still listed.
pub const CURSOR_OVERLAP: std::time::Duration = std::time::Duration::from_secs(600);

/// Polls until `stop`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    m: Mapping,
    client: Client,
    interval: std::time::Duration,
    lookback: std::time::Duration,
    spool: crate::spool::Spool,
    memory: MemoryStore,
    metrics: crate::metrics::Metrics,
    stop: tokio_util::sync::CancellationToken,
) {
    super::poll_loop(Provider::Vertex, metrics.clone(), interval, stop, || {
        poll_once(&m, &client, lookback, &spool, &memory, Some(&metrics))
    })
    .await
}

/// The persisted listing cursor's name.
const CURSOR: &str = "vertex-update-time";

/// One poll; returns the jobs followed (listed and not yet done) and the events spooled. Lists jobs updated
/// since the last successful poll (or within `lookback` on the first), then moves the cursor.
pub async fn poll_once(
    m: &Mapping,
    client: &Client,
    lookback: std::time::Duration,
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<PollReport, PollError> {
    let now = startline_proto::time::now_ms();
    let since = match memory.cursor(CURSOR) {
        Some(c) => c - CURSOR_OVERLAP.as_millis() as i64,
        None => now - lookback.as_millis() as i64,
    };
    let mut report = PollReport::default();
    for v in client.list(since).await? {
        let Some(job) = parse_custom_job(&v) else { continue };
        let key = startline_id(m, &job);
        let mem = memory.get(&key);
        if mem.done {
            continue;
        }
        if mem.emitted.is_empty() && m.gpus.vertex(&job.accelerator) == Known::Unknown {
            super::gpus::warn_unknown_once("vertex", &job.accelerator);
            if let Some(metrics) = metrics {
                metrics.unknown_type(Provider::Vertex);
            }
        }
        let (events, new_mem) = diff(m, &job, &mem, now);
        super::record(spool, memory, &key, &mem, events, &new_mem, &mut report)?;
    }
    memory.set_cursor(CURSOR, now).map_err(|e| PollError::new(PollErrorKind::Spool, e.to_string()))?;
    super::flush(memory)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(s: &str) -> CustomJob {
        parse_custom_job(&serde_json::from_str(s).expect("json")).expect("job")
    }

    fn kinds(evs: &[pb::LifecycleEvent]) -> Vec<String> {
        evs.iter()
            .map(|e| match e.kind.as_ref() {
                Some(Kind::Submitted(_)) => "submitted".into(),
                Some(Kind::Queued(q)) => format!("queued:{}", q.raw_reason),
                Some(Kind::Preparing(_)) => "preparing".into(),
                Some(Kind::FirstStep(_)) => "first_step".into(),
                Some(Kind::Done(d)) => format!("done:{:?}", d.outcome()),
                _ => "other".into(),
            })
            .collect()
    }

    #[test]
    fn a_job_seen_queued_then_pending_then_done() {
        let full = load(include_str!("fixtures/vertex-customjob-succeeded.json"));
        let m = Mapping { project: "ml-prod".into(), ..Mapping::default() };
        let mut j = full.clone();
        j.state = "JOB_STATE_QUEUED".into();
        j.start_ms = None;
        j.end_ms = None;
        let (e1, mem) = diff(&m, &j, &JobMemory::default(), 1_796_000_000_000);
        assert_eq!(kinds(&e1), ["submitted", "queued:JOB_STATE_QUEUED"]);
        assert_eq!(
            startline_proto::time::timestamp_to_ms(e1[1].occurred_at.as_ref().expect("t")),
            full.created_ms,
            "first sight at createTime"
        );
        let Some(Kind::Submitted(s)) = &e1[0].kind else { panic!("submitted") };
        assert_eq!(
            (s.gpu_count, s.node_count, s.gpu_class.as_str(), s.region.as_str()),
            (16, 2, "h100", "europe-west4")
        );
        assert_eq!(e1[0].job_id, "vertex/ml-prod/europe-west4/5478273648572874752");
        j.state = "JOB_STATE_PENDING".into();
        let (e2, mem) = diff(&m, &j, &mem, full.created_ms + 600_000);
        assert_eq!(kinds(&e2), ["preparing"]);
        assert_eq!(
            startline_proto::time::timestamp_to_ms(e2[0].occurred_at.as_ref().expect("t")),
            full.created_ms + 600_000
        );
        let (e3, mem) = diff(&m, &full, &mem, full.created_ms + 9_000_000);
        assert_eq!(kinds(&e3), ["first_step", "done:Succeeded"]);
        assert!(mem.done);
        assert!(diff(&m, &full, &mem, 0).0.is_empty(), "nothing twice");
    }

    #[test]
    fn insufficient_resources_is_a_failure_with_its_message_and_the_label_makes_it_urgent() {
        let j = load(include_str!("fixtures/vertex-customjob-failed.json"));
        // A project, as `--project` always gives one (an empty one would make an id with `//`, which is refused).
        let m = Mapping { project: "ml-prod".into(), ..Mapping::default() };
        let (e, _) = diff(&m, &j, &JobMemory::default(), 0);
        assert_eq!(kinds(&e), ["submitted", "done:Failed"]);
        let Some(Kind::Done(d)) = &e[1].kind else { panic!("done") };
        assert!(d.message.starts_with("Resources are insufficient"));
        let Some(Kind::Submitted(s)) = &e[0].kind else { panic!("submitted") };
        assert_eq!(s.priority(), pb::PriorityClass::Urgent);
        for ev in &e {
            startline_proto::validate::validate_event(ev, i64::MAX / 4, &Default::default()).expect("valid");
        }
    }

    #[test]
    fn ids_carry_the_configured_project_and_an_expired_job_is_dated_by_its_update_time() {
        let mut v: Value = serde_json::from_str(include_str!("fixtures/vertex-customjob-failed.json")).expect("json");
        v["name"] = "projects/123456789012/locations/us-central1/customJobs/42".into();
        v["state"] = "JOB_STATE_EXPIRED".into();
        v["updateTime"] = "2026-11-30T05:00:00.125Z".into();
        if let Some(o) = v.as_object_mut() {
            o.remove("endTime");
            o.remove("startTime");
        }
        let j = parse_custom_job(&v).expect("job");
        let m = Mapping { project: "ml-prod".into(), ..Mapping::default() };
        assert_eq!(startline_id(&m, &j), "vertex/ml-prod/us-central1/42");
        let (e, _) = diff(&m, &j, &JobMemory::default(), 1_900_000_000_000);
        let done = e.last().expect("done");
        assert_eq!(kinds(std::slice::from_ref(done)), ["done:TimedOut"]);
        assert_eq!(
            startline_proto::time::timestamp_to_ms(done.occurred_at.as_ref().expect("t")),
            j.update_ms.expect("updateTime"),
            "updateTime, not the poll"
        );
    }

    /// Google's JSON writes `Z`, but an RFC 3339 offset is honoured (it used to make the job unparseable).
    #[test]
    fn offset_times_are_dated_in_utc() {
        // `date -u -d 2026-11-30T02:00:00Z +%s%3N` and `date -u -d 2026-11-30T03:00:00Z +%s%3N`.
        const TWO_UTC: i64 = 1_796_004_000_000;
        const THREE_UTC: i64 = 1_796_007_600_000;
        let mut v: Value = serde_json::from_str(include_str!("fixtures/vertex-customjob-failed.json")).expect("json");
        v["createTime"] = "2026-11-30T04:00:00+02:00".into();
        v["endTime"] = "2026-11-29T22:00:00.000000000-05:00".into();
        let j = parse_custom_job(&v).expect("job");
        assert_eq!((j.created_ms, j.end_ms), (TWO_UTC, Some(THREE_UTC)));
        let (e, _) = diff(&Mapping::default(), &j, &JobMemory::default(), THREE_UTC + 60_000);
        assert_eq!(kinds(&e), ["submitted", "done:Failed"]);
        let times: Vec<i64> =
            e.iter().map(|ev| startline_proto::time::timestamp_to_ms(ev.occurred_at.as_ref().expect("t"))).collect();
        assert_eq!(times, [TWO_UTC, THREE_UTC]);
    }

    #[test]
    fn huge_accelerator_and_replica_counts_saturate_instead_of_overflowing() {
        // Found by startline-fuzz: these overflowed (a panic in debug builds, a wrapped GPU count in release).
        let mut v: Value = serde_json::from_str(include_str!("fixtures/vertex-customjob-failed.json")).expect("json");
        let pool = serde_json::json!({"machineSpec": {"acceleratorCount": "9223372036854775807"}, "replicaCount": 4294967295u64});
        v["jobSpec"]["workerPoolSpecs"] = serde_json::json!([pool.clone(), pool]);
        let j = parse_custom_job(&v).expect("job");
        assert_eq!((j.gpus, j.replicas), (u32::MAX, u32::MAX));
        let (e, _) = diff(&Mapping::default(), &j, &JobMemory::default(), 0);
        let Some(Kind::Submitted(s)) = &e[0].kind else { panic!("submitted") };
        assert_eq!(s.gpu_count, u32::MAX, "refused by validation, not wrapped to a plausible count");
    }
}
