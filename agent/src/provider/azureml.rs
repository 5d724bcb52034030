//! The Azure Machine Learning adapter. Pure core: [`parse_job`] reads a job resource of the ARM REST API
//! (`Microsoft.MachineLearningServices/workspaces/jobs`, api-version 2024-04-01), [`parse_run`] a run of the
//! workspace's run history, and [`diff`] turns them plus the job's memory into lifecycle events. Shell:
//! [`Client`] (ARM listing with `nextLink` paging, one job, one compute, run history; Microsoft Entra tokens from
//! a service principal, workload identity or managed identity, see [`Credential`]) and [`run`] polls.
//!
//! Pipeline parent jobs (`jobType: Pipeline`) are not followed: they orchestrate steps, which are jobs of their
//! own; a pipeline's wait and first step would be its first step's, counted twice.
//!
//! Azure's statuses, in the order Azure goes through them (Preparing comes before Queued and is kept so):
//! `NotStarted` (nothing yet), `Starting` -> preparing:other, `Provisioning` -> preparing:provisioning (serverless
//! or on-demand compute being created), `Preparing` -> preparing:image_pull (the environment image is built or
//! pulled), `Queued` -> queued:capacity (waiting for compute-cluster nodes, raw `Queued`), `Running` ->
//! first_step (the job's processes started: Azure's nearest signal), `Finalizing`, `CancelRequested`,
//! `NotResponding` (no wait state), `Paused` (not a start: before the job ran, queued:dependency_or_hold with raw
//! `Paused`; after, nothing), and the terminal ones -> done: `Completed` -> succeeded, `Failed` -> failed,
//! `Canceled` -> cancelled.
//!
//! Times: the ARM job resource carries `systemData.createdAt` (the submit time) but no start or end time and no
//! error. Exact start and end times and the failure message come from the run history
//! (`GET https://<region>.api.azureml.ms/history/v1.0/.../runs/<name>`: `startTimeUtc`, `endTimeUtc`,
//! `error.error.message`) when it is reachable; otherwise a transition is dated at the poll that saw it (the
//! first status seen at `createdAt`), and every event's message says which (`time: run history` or
//! `time: poll`). The list has no status or time filter: pages come newest first, so paging stops at the first
//! page older than the lookback, and jobs followed but no longer listed are fetched one by one until they end.

use super::gpus::{GpuTable, Known};
use super::retry::{with_retries, Attempt, RetryPolicy};
use super::{JobMemory, MemoryStore, PollError, PollReport};
use crate::metrics::{PollErrorKind, Provider};
use serde_json::Value;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::rfc3339::json_ms;
use std::collections::{BTreeMap, HashMap};

/// The ARM api-version the adapter speaks.
pub const API_VERSION: &str = "2024-04-01";

/// A job as the adapter sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AzureJob {
    /// The job's name (its id within the workspace).
    pub name: String,
    /// Display name.
    pub display_name: String,
    /// `properties.status`.
    pub status: String,
    /// `properties.jobType` (Command, Sweep, Pipeline, ...).
    pub job_type: String,
    /// `systemData.createdAt`, Unix ms.
    pub created_ms: i64,
    /// `systemData.lastModifiedAt`, Unix ms.
    pub modified_ms: Option<i64>,
    /// The compute's name (last segment of `properties.computeId`); empty for serverless jobs.
    pub compute: String,
    /// `properties.resources.instanceType` (serverless jobs; clusters have it on the compute).
    pub instance_type: String,
    /// `properties.resources.instanceCount` (default 1).
    pub instance_count: u32,
    /// `properties.experimentName`.
    pub experiment: String,
    /// `properties.tags`.
    pub tags: BTreeMap<String, String>,
}

/// What the run history says about a job.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunTimes {
    /// `startTimeUtc`, Unix ms.
    pub start_ms: Option<i64>,
    /// `lastStartTimeUtc`: the last time the run went (back) to running, Unix ms ("initialized with
    /// StartTimeUtc").
    pub last_start_ms: Option<i64>,
    /// `endTimeUtc`, Unix ms.
    pub end_ms: Option<i64>,
    /// `error.error.message`.
    pub error: String,
}

/// Parses a job resource (one element of the list's `value`, or a single GET).
pub fn parse_job(v: &Value) -> Option<AzureJob> {
    let p = &v["properties"];
    Some(AzureJob {
        name: v["name"].as_str()?.to_string(),
        display_name: p["displayName"].as_str().unwrap_or("").to_string(),
        status: p["status"].as_str().unwrap_or("").to_string(),
        job_type: p["jobType"].as_str().unwrap_or("").to_string(),
        created_ms: json_ms(&v["systemData"]["createdAt"])?,
        modified_ms: json_ms(&v["systemData"]["lastModifiedAt"]),
        compute: p["computeId"].as_str().and_then(|c| c.rsplit('/').next()).unwrap_or("").to_string(),
        instance_type: p["resources"]["instanceType"].as_str().unwrap_or("").to_string(),
        instance_count: p["resources"]["instanceCount"]
            .as_u64()
            .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX))
            .max(1),
        experiment: p["experimentName"].as_str().unwrap_or("").to_string(),
        tags: p["tags"]
            .as_object()
            .map(|o| o.iter().filter_map(|(k, x)| Some((k.clone(), x.as_str()?.to_string()))).collect())
            .unwrap_or_default(),
    })
}

/// Parses a run-history run.
pub fn parse_run(v: &Value) -> RunTimes {
    RunTimes {
        start_ms: json_ms(&v["startTimeUtc"]),
        last_start_ms: json_ms(&v["lastStartTimeUtc"]),
        end_ms: json_ms(&v["endTimeUtc"]),
        error: v["error"]["error"]["message"].as_str().or(v["error"]["message"].as_str()).unwrap_or("").to_string(),
    }
}

/// How Azure ML jobs map onto Startline's attributes.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    /// The workspace's resource group (part of job ids).
    pub resource_group: String,
    /// The workspace (part of job ids).
    pub workspace: String,
    /// The workspace's region: the jobs' region attribute.
    pub region: String,
    /// Display-name prefixes that mark urgent jobs (besides the tag `startline-priority=urgent`).
    pub urgent_prefixes: Vec<String>,
    /// GPUs of VM sizes, with `--instance-type` overrides.
    pub gpus: GpuTable,
}

/// The Startline job id: `azureml/<resource group>/<workspace>/<job name>`.
pub fn startline_id(m: &Mapping, j: &AzureJob) -> String {
    format!("azureml/{}/{}/{}", m.resource_group, m.workspace, j.name)
}

/// Whether the adapter follows a job: every job but a pipeline's parent (`jobType: Pipeline`), which orchestrates
/// its steps and never trains; its steps are jobs of their own, listed and followed as such.
pub fn followed(j: &AzureJob) -> bool {
    !j.job_type.eq_ignore_ascii_case("Pipeline")
}

/// Statuses after which nothing more happens.
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "Completed" | "Failed" | "Canceled")
}

/// The job's GPUs and class on `vm_size` (the serverless instance type or the compute cluster's VM size), and
/// whether the size is unknown.
pub fn gpus(m: &Mapping, j: &AzureJob, vm_size: &str) -> (u32, String, bool) {
    match m.gpus.azure(vm_size) {
        Known::Gpus(per, c) => (per.saturating_mul(j.instance_count), c, false),
        Known::Cpu => (0, String::new(), false),
        Known::Unknown => (0, String::new(), true),
    }
}

/// The events the job's current resource (and its run history, when reachable) implies beyond its memory, and
/// the new memory. `vm_size` is the VM size the job runs on (empty when unknown); `now_ms` is when the adapter
/// received the resource (a transition without a time of the provider's own is dated then).
pub fn diff(
    m: &Mapping,
    j: &AzureJob,
    vm_size: &str,
    run: Option<&RunTimes>,
    mem: &JobMemory,
    now_ms: i64,
) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    let mut mem = mem.clone();
    let mut out = Vec::new();
    if !followed(j) {
        // Not a training job: nothing is reported, and it is not fetched again.
        mem.done = true;
        return (out, mem);
    }
    let job = startline_id(m, j);
    let source = format!("azureml-adapter/{}", m.workspace);
    let mut emit = |mem: &mut JobMemory, key: &str, at: i64, kind: Kind| {
        super::emit_once(&mut out, mem, &job, &source, key, at, kind)
    };
    let first_sight = mem.emitted.is_empty();
    let urgent = j.tags.get("startline-priority").is_some_and(|p| p == "urgent")
        || m.urgent_prefixes.iter().any(|p| j.display_name.starts_with(p.as_str()));
    let (gpu_count, gpu_class, _) = gpus(m, j, vm_size);
    // Azure's tag keys may hold capitals (its own `_aml_system_ComputeTargetStatus`) and any character: mapped
    // onto valid label keys, or dropped and counted, so no tag can get the job's `submitted` refused.
    let tags = j.tags.iter().filter(|(k, _)| !matches!(k.as_str(), "startline-priority" | "team" | "project"));
    let (mut labels, dropped) = super::provider_labels(tags.map(|(k, v)| (k.as_str(), v.as_str())), 13);
    if dropped > 0 {
        labels.insert(super::TAGS_DROPPED_LABEL.into(), dropped.to_string());
    }
    if !j.experiment.is_empty() {
        labels.insert("experiment".into(), super::free_text(&j.experiment, 256));
    }
    if !j.job_type.is_empty() {
        labels.insert("job_type".into(), j.job_type.to_ascii_lowercase());
    }
    emit(
        &mut mem,
        "submitted",
        j.created_ms,
        Kind::Submitted(pb::Submitted {
            pool_kind: pb::PoolKind::Managed as i32,
            provider: "azureml".into(),
            pool: if j.compute.is_empty() { "serverless".into() } else { j.compute.clone() },
            priority: if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
            gpu_class,
            gpu_count,
            node_count: j.instance_count,
            region: m.region.clone(),
            team: j.tags.get("team").map(|t| super::attribute(t, 64)).unwrap_or_default(),
            project: j.tags.get("project").map(|p| super::attribute(p, 128)).unwrap_or_default(),
            labels,
            ..Default::default()
        }),
    );
    // When a transition seen now happened: the provider's own times where it has them (the run history's start
    // and end, used below), otherwise when seen, the moment this poll received the job (never the poll's start,
    // nor before the job's last dated transition). A wait state seen at first sight began no later than submit
    // (nothing earlier is known).
    let floor = mem.reason_at_ms.max(j.created_ms);
    let seen_at = if first_sight { j.created_ms } else { now_ms.max(floor) };
    let note = |from_history: bool| if from_history { "time: run history" } else { "time: poll" };
    let running = matches!(j.status.as_str(), "Running" | "Finalizing" | "NotResponding" | "Completed");
    let waiting = matches!(j.status.as_str(), "NotStarted" | "Starting" | "Provisioning" | "Preparing" | "Queued");
    // Each run after the first keys its transitions by its number (the first run's keys are bare).
    let keyed = |k: &str, attempt: u32| if attempt == 0 { k.to_string() } else { format!("{k}:{attempt}") };
    // Back to waiting after running: the run was stopped (a low-priority node reclaimed, a node lost) and Azure
    // requeued the job: preempted and requeued, and the next run is a new attempt.
    if waiting && mem.emitted.contains(&keyed("first_step", mem.restarts)) {
        let attempt = mem.restarts;
        let reason = format!("azure job back to {} after running: its nodes were taken ({})", j.status, note(false));
        emit(
            &mut mem,
            &format!("preempted:{attempt}"),
            seen_at,
            Kind::Preempted(pb::Preempted { reason: super::free_text(&reason, 1024), checkpoint_saved: false }),
        );
        emit(&mut mem, &format!("requeued:{attempt}"), seen_at, Kind::Requeued(pb::Requeued { resume_step: 0 }));
        mem.restarts += 1;
        mem.reason_at_ms = seen_at;
    }
    let attempt = mem.restarts;
    let preparing = |phase: pb::PreparingPhase, what: &str| {
        Kind::Preparing(pb::Preparing { phase: phase as i32, message: format!("azure {what} ({})", note(false)) })
    };
    let queued = |reason: pb::WaitReason, raw: &str, message: &str| {
        Kind::Queued(pb::Queued {
            reason: reason as i32,
            raw_reason: raw.into(),
            message: format!("{message} ({})", note(false)),
            estimated_start: None,
            queue_position: None,
        })
    };
    let wait = match j.status.as_str() {
        "Starting" => Some(("starting", preparing(pb::PreparingPhase::Other, "Starting"))),
        "Provisioning" => Some(("provisioning", preparing(pb::PreparingPhase::Provisioning, "Provisioning"))),
        "Preparing" => Some(("preparing", preparing(pb::PreparingPhase::ImagePull, "Preparing"))),
        "Queued" => Some(("queued", queued(pb::WaitReason::Capacity, "Queued", "waiting for compute nodes"))),
        "Paused" if !mem.emitted.contains(&keyed("first_step", attempt)) => {
            Some(("paused", queued(pb::WaitReason::DependencyOrHold, "Paused", "paused before it ran")))
        }
        _ => None,
    };
    if let Some((k, kind)) = wait {
        let before = mem.emitted.len();
        emit(&mut mem, &keyed(k, attempt), seen_at, kind);
        if mem.emitted.len() > before {
            mem.reason_at_ms = seen_at;
        }
    }
    let start = run.and_then(|r| if attempt == 0 { r.start_ms } else { r.last_start_ms.filter(|t| *t > floor) });
    let end = run.and_then(|r| r.end_ms);
    // `Paused` is not a start: a job paused before it ran has not run (the run history's start says when one
    // did).
    let started = running || start.is_some();
    if started {
        // Without the run history, a job first seen running is dated when seen (dating it at submit would claim
        // no wait at all); one first seen completed, at its end.
        let seen = if first_sight { now_ms } else { seen_at };
        let at = start.or(if j.status == "Completed" { end } else { None }).unwrap_or(seen).max(j.created_ms);
        let before = mem.emitted.len();
        emit(&mut mem, &keyed("first_step", attempt), at, super::container_start());
        if mem.emitted.len() > before {
            mem.reason_at_ms = mem.reason_at_ms.max(at);
        }
    }
    let outcome = match j.status.as_str() {
        "Completed" => Some(pb::Outcome::Succeeded),
        "Failed" => Some(pb::Outcome::Failed),
        "Canceled" => Some(pb::Outcome::Cancelled),
        _ => None,
    };
    if let Some(o) = outcome {
        let seen = if first_sight { now_ms } else { seen_at };
        let at = end.unwrap_or(seen).max(j.created_ms);
        let error = run.map(|r| r.error.as_str()).unwrap_or("");
        let what = if error.is_empty() { format!("azure {}", j.status) } else { super::free_text(error, 900) };
        let message = format!("{what} ({})", note(end.is_some()));
        emit(&mut mem, "done", at, Kind::Done(pb::Done { outcome: o as i32, exit_code: None, message }));
        mem.done = true;
    }
    (out, mem)
}

/// Where Microsoft Entra ID access tokens for `https://management.azure.com/` come from.
#[derive(Debug, Clone)]
pub enum Credential {
    /// A service principal's client secret (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET` or a file).
    ClientSecret {
        /// Authority host, e.g. `https://login.microsoftonline.com` (`AZURE_AUTHORITY_HOST`).
        authority: String,
        /// Tenant.
        tenant: String,
        /// Application (client) id.
        client_id: String,
        /// The secret.
        secret: crate::auth::Secret,
    },
    /// Workload identity (AKS): a federated token file (`AZURE_FEDERATED_TOKEN_FILE`), re-read for each token.
    WorkloadIdentity {
        /// Authority host.
        authority: String,
        /// Tenant.
        tenant: String,
        /// Application (client) id.
        client_id: String,
        /// The projected service-account token.
        token_file: std::path::PathBuf,
    },
    /// The VM's or pod's managed identity through the instance metadata service.
    ManagedIdentity {
        /// IMDS base URL, `http://169.254.169.254`.
        endpoint: String,
        /// A user-assigned identity's client id (None: the system-assigned one).
        client_id: Option<String>,
    },
    /// A fixed token (`AZURE_ACCESS_TOKEN`; tests and short runs).
    Static(crate::auth::Secret),
}

/// How long a token answer is good for from `now_s` (Unix seconds): `expires_in` (seconds; Entra answers a number,
/// IMDS a string), else `expires_on` (Unix seconds, number or string: the App Service and Arc identity endpoints
/// answer only that), else 5 minutes.
pub fn token_lifetime(v: &Value, now_s: i64) -> std::time::Duration {
    let num = |x: &Value| x.as_i64().or_else(|| x.as_str().and_then(|s| s.trim().parse::<i64>().ok()));
    let secs = num(&v["expires_in"]).or_else(|| num(&v["expires_on"]).map(|on| on - now_s)).unwrap_or(300);
    std::time::Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

use super::renew_after;

/// The ARM scope/resource tokens are asked for.
const ARM_RESOURCE: &str = "https://management.azure.com/";

fn form(pairs: &[(&str, &str)]) -> String {
    fn enc(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
                b' ' => "+".to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
    pairs.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

/// An Azure ML REST client: ARM for jobs and computes, the regional endpoint for run history.
pub struct Client {
    http: reqwest::Client,
    arm: String,
    history: Option<String>,
    workspace_path: String,
    credential: Credential,
    token: tokio::sync::Mutex<Option<(crate::auth::Secret, std::time::Instant)>>,
    retry: RetryPolicy,
    metrics: Option<crate::metrics::Metrics>,
    history_warned: std::sync::atomic::AtomicBool,
    /// Each compute's VM size, read once per process (a compute's size cannot change while it exists).
    sizes: std::sync::Mutex<HashMap<String, String>>,
}

/// Where the workspace is.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// Subscription id.
    pub subscription: String,
    /// Resource group.
    pub resource_group: String,
    /// Workspace name.
    pub workspace: String,
}

impl Client {
    /// A client for the ARM endpoint `arm` (`https://management.azure.com`) and the run-history endpoint
    /// `history` (`https://<region>.api.azureml.ms`; None: dates come from polls).
    pub fn new(arm: &str, history: Option<&str>, ws: &Workspace, credential: Credential) -> Result<Client, String> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Client {
            http,
            arm: arm.trim_end_matches('/').to_string(),
            history: history.map(|h| h.trim_end_matches('/').to_string()),
            workspace_path: format!(
                "subscriptions/{}/resourceGroups/{}/providers/Microsoft.MachineLearningServices/workspaces/{}",
                ws.subscription, ws.resource_group, ws.workspace
            ),
            credential,
            token: tokio::sync::Mutex::new(None),
            retry: RetryPolicy::default(),
            metrics: None,
            history_warned: std::sync::atomic::AtomicBool::new(false),
            sizes: std::sync::Mutex::new(HashMap::new()),
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

    /// A token, from the cache until shortly before it expires ([`renew_after`]).
    async fn token(&self) -> Result<crate::auth::Secret, PollError> {
        let mut cached = self.token.lock().await;
        if let Some((t, renew_at)) = cached.as_ref() {
            if std::time::Instant::now() < *renew_at {
                return Ok(t.clone());
            }
        }
        let asked = std::time::Instant::now();
        let (token, lifetime) = self.fetch_token().await?;
        *cached = Some((token.clone(), asked + renew_after(lifetime)));
        Ok(token)
    }

    async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    async fn fetch_token(&self) -> Result<(crate::auth::Secret, std::time::Duration), PollError> {
        let failed = |m: String| PollError::new(PollErrorKind::Credentials, format!("azure token: {m}"));
        let req = match &self.credential {
            Credential::Static(t) => return Ok((t.clone(), std::time::Duration::from_secs(3600))),
            Credential::ClientSecret { authority, tenant, client_id, secret } => self
                .http
                .post(format!("{}/{tenant}/oauth2/v2.0/token", authority.trim_end_matches('/')))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id),
                    ("client_secret", secret.expose()),
                    ("scope", "https://management.azure.com/.default"),
                ])),
            Credential::WorkloadIdentity { authority, tenant, client_id, token_file } => {
                let assertion = std::fs::read_to_string(token_file).map_err(|e| {
                    PollError::new(PollErrorKind::Credentials, format!("azure token: {}: {e}", token_file.display()))
                })?;
                self.http
                    .post(format!("{}/{tenant}/oauth2/v2.0/token", authority.trim_end_matches('/')))
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(form(&[
                        ("grant_type", "client_credentials"),
                        ("client_id", client_id),
                        ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
                        ("client_assertion", assertion.trim()),
                        ("scope", "https://management.azure.com/.default"),
                    ]))
            }
            Credential::ManagedIdentity { endpoint, client_id } => {
                let mut q = vec![("api-version", "2018-02-01"), ("resource", ARM_RESOURCE)];
                if let Some(c) = client_id {
                    q.push(("client_id", c.as_str()));
                }
                self.http
                    .get(format!("{}/metadata/identity/oauth2/token", endpoint.trim_end_matches('/')))
                    .query(&q)
                    .header("Metadata", "true")
            }
        };
        let resp =
            req.send().await.map_err(|e| PollError::new(PollErrorKind::Credentials, format!("azure token: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| failed(e.to_string()))?;
        if !(200..300).contains(&status) {
            // The body is Entra's error JSON (no secret in it); cut it short.
            return Err(failed(format!("{status}: {}", text.chars().take(300).collect::<String>())));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| failed(format!("invalid json: {e}")))?;
        let token = v["access_token"].as_str().ok_or_else(|| failed("no access_token in the answer".into()))?;
        let now_s = startline_proto::time::now_ms().div_euclid(1000);
        Ok((crate::auth::Secret::new(token), token_lifetime(&v, now_s)))
    }

    /// GETs a JSON document with per-call retries; a 401 drops the cached token and is retried once with a new one.
    async fn get(&self, url: &str) -> Result<Value, PollError> {
        let mut renewed = false;
        loop {
            let token = self.token().await?;
            let r = with_retries(
                &self.retry,
                || self.get_once(url, &token),
                |e| {
                    if let Some(m) = &self.metrics {
                        m.call_retried(Provider::Azureml, e.kind);
                    }
                },
            )
            .await;
            match r {
                Err(e) if !renewed && e.message.contains(" answered 401") => {
                    renewed = true;
                    self.forget_token().await;
                }
                other => return other,
            }
        }
    }

    async fn get_once(&self, url: &str, token: &crate::auth::Secret) -> Result<Value, Attempt> {
        let transport = |e: reqwest::Error| Attempt::from(PollError::new(PollErrorKind::Transport, e.to_string()));
        let resp = self.http.get(url).bearer_auth(token.expose()).send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let retry_after = super::retry::retry_after(resp.headers());
        let text = resp.text().await.map_err(transport)?;
        if !(200..300).contains(&status) {
            return Err(Attempt { error: PollError::http("azureml", status, &text), retry_after });
        }
        serde_json::from_str(&text).map_err(|e| {
            Attempt::from(PollError::new(PollErrorKind::Parse, format!("azureml answered invalid json: {e}")))
        })
    }

    /// Jobs created after `since_ms`: pages (newest first) are followed through `nextLink` until one holds only
    /// older jobs.
    /// Each job comes with when its page was received (Unix ms): the moment the adapter saw its state.
    pub async fn list(&self, since_ms: i64) -> Result<Vec<(Value, i64)>, PollError> {
        let mut url = format!("{}/{}/jobs?api-version={API_VERSION}&listViewType=All", self.arm, self.workspace_path);
        let mut out = Vec::new();
        loop {
            let v = self.get(&url).await?;
            let seen = startline_proto::time::now_ms();
            let page = v["value"].as_array().cloned().unwrap_or_default();
            let mut any_recent = false;
            for j in page {
                if json_ms(&j["systemData"]["createdAt"]).is_some_and(|c| c >= since_ms) {
                    any_recent = true;
                    out.push((j, seen));
                }
            }
            match v["nextLink"].as_str() {
                Some(next) if any_recent && !next.is_empty() => url = next.to_string(),
                _ => return Ok(out),
            }
        }
    }

    /// One job by name.
    pub async fn job(&self, name: &str) -> Result<Value, PollError> {
        self.get(&format!("{}/{}/jobs/{name}?api-version={API_VERSION}", self.arm, self.workspace_path)).await
    }

    /// A compute's VM size (`properties.properties.vmSize`), cached.
    pub async fn vm_size(&self, compute: &str) -> Result<String, PollError> {
        if let Some(s) = self.sizes.lock().ok().and_then(|c| c.get(compute).cloned()) {
            return Ok(s);
        }
        let url = format!("{}/{}/computes/{compute}?api-version={API_VERSION}", self.arm, self.workspace_path);
        let v = self.get(&url).await?;
        let size = v["properties"]["properties"]["vmSize"].as_str().unwrap_or("").to_string();
        if let Ok(mut c) = self.sizes.lock() {
            c.insert(compute.to_string(), size.clone());
        }
        Ok(size)
    }

    /// The job's run in the run history; None when no history endpoint is configured or it cannot be read (the
    /// adapter then dates transitions at polls; the first failure is logged).
    pub async fn run_times(&self, name: &str) -> Option<RunTimes> {
        let base = self.history.as_ref()?;
        match self.get(&format!("{base}/history/v1.0/{}/runs/{name}", self.workspace_path)).await {
            Ok(v) => Some(parse_run(&v)),
            Err(e) => {
                if !self.history_warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(error = %e, "run history not readable: start and end times are dated at polls");
                }
                None
            }
        }
    }
}

/// How often the adapter polls, and how far back it lists.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Jobs created within this window are listed.
    pub lookback: std::time::Duration,
    /// Poll interval.
    pub interval: std::time::Duration,
}

/// Polls until `stop`.
pub async fn run(
    m: Mapping,
    client: Client,
    Schedule { lookback, interval }: Schedule,
    spool: crate::spool::Spool,
    memory: MemoryStore,
    metrics: crate::metrics::Metrics,
    stop: tokio_util::sync::CancellationToken,
) {
    super::poll_loop(Provider::Azureml, metrics.clone(), interval, stop, || {
        poll_once(&m, &client, lookback, &spool, &memory, Some(&metrics))
    })
    .await
}

/// One poll. Returns the jobs followed and the events spooled.
pub async fn poll_once(
    m: &Mapping,
    client: &Client,
    lookback: std::time::Duration,
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<PollReport, PollError> {
    let now = startline_proto::time::now_ms();
    let mut report = PollReport::default();
    let mut listed = std::collections::BTreeSet::new();
    // Each job with when the adapter received it: transitions without a provider time are dated then, not at the
    // poll's start (a long listing would date the last pages' changes before they happened).
    let mut jobs: Vec<(AzureJob, i64)> = client
        .list(now - lookback.as_millis() as i64)
        .await?
        .iter()
        .filter_map(|(v, seen)| Some((parse_job(v)?, *seen)))
        .inspect(|(j, _)| {
            listed.insert(j.name.clone());
        })
        .collect();
    // Followed, not finished, and no longer on the listed pages: fetched one by one.
    let prefix = format!("azureml/{}/{}/", m.resource_group, m.workspace);
    for (key, mem) in memory.entries() {
        let Some(name) = key.strip_prefix(&prefix) else { continue };
        if mem.done || listed.contains(name) {
            continue;
        }
        let v = client.job(name).await?;
        if let Some(j) = parse_job(&v) {
            jobs.push((j, startline_proto::time::now_ms()));
        }
    }
    for (job, seen) in jobs {
        let key = startline_id(m, &job);
        let mem = memory.get(&key);
        if mem.done || (!followed(&job) && mem == JobMemory::default()) {
            continue;
        }
        let vm_size =
            if job.compute.is_empty() { job.instance_type.clone() } else { client.vm_size(&job.compute).await? };
        if mem.emitted.is_empty() && gpus(m, &job, &vm_size).2 {
            super::gpus::warn_unknown_once("azureml", &vm_size);
            if let Some(metrics) = metrics {
                metrics.unknown_type(Provider::Azureml);
            }
        }
        // The run history for a start or end not reported yet (of the current run: after a requeue, its own).
        let first_step =
            if mem.restarts == 0 { "first_step".to_string() } else { format!("first_step:{}", mem.restarts) };
        let needs_times = (!mem.emitted.contains(&first_step) || !mem.emitted.contains("done"))
            && (is_terminal(&job.status) || matches!(job.status.as_str(), "Running" | "Finalizing"));
        let run = if needs_times { client.run_times(&job.name).await } else { None };
        let (events, new_mem) = diff(m, &job, &vm_size, run.as_ref(), &mem, seen.max(now));
        super::record(spool, memory, &key, &mem, events, &new_mem, &mut report)?;
    }
    super::flush(memory)?;
    Ok(report)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod credential_tests;
