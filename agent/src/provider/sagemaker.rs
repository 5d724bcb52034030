//! The SageMaker adapter. Pure core: [`parse_describe`] reads a `DescribeTrainingJob` response (JSON 1.1:
//! timestamps are Unix seconds as numbers) and [`diff`] turns it plus the job's memory into lifecycle events.
//! Shell: [`Client`] calls `ListTrainingJobs` and `DescribeTrainingJob` over HTTPS with SigV4 (the endpoint is
//! configurable, so tests point it at a local server replaying documented payloads), each call signed with the
//! credentials [`super::aws_credentials`] resolves then (renewed before they expire), and [`run`] polls.
//!
//! Mapping of `SecondaryStatusTransitions` (each dated by its own `StartTime`):
//! `Starting` -> preparing:provisioning, or queued:capacity while its message is EC2's capacity retry (SageMaker
//! rewrites the one transition's message: the poll that sees the message appear or clear splits the wait there,
//! dated when the description was received); `Pending` -> queued:capacity (raw `Pending`); `Downloading` ->
//! preparing:image_pull when the message names the image, else preparing:data_staging; `Training` ->
//! first_step (the training container started: SageMaker's nearest signal; a node agent in the container can
//! report the real first step); `Interrupted` -> preempted (spot reclaim, no checkpoint assumed);
//! `Restarting` -> requeued; the terminal status -> done: Completed -> succeeded, Failed -> failed (the
//! `FailureReason`, e.g. `CapacityError: ...`, kept as the message), Stopped -> cancelled,
//! MaxRuntimeExceeded/MaxWaitTimeExceeded -> timed_out. `Uploading` and `Stopping` are not wait states.

use super::aws_credentials::AwsCredentials;
use super::gpus::{GpuTable, Known};
use super::retry::{with_retries, Attempt, RetryPolicy};
use super::sigv4::{amz_date, authorization};
use super::{JobMemory, MemoryStore, PollError, PollReport};
use crate::metrics::{PollErrorKind, Provider};
use serde_json::{json, Value};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;

/// One status transition.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// `Starting`, `Pending`, `Downloading`, `Training`, ...
    pub status: String,
    /// When it started, Unix ms.
    pub start_ms: i64,
    /// The status message.
    pub message: String,
}

/// A training job as the adapter sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainingJob {
    /// Job name.
    pub name: String,
    /// When the adapter received this description, Unix ms (0: not known): a change SageMaker gives no time for
    /// (a status message appearing or clearing) is dated by it.
    pub received_ms: i64,
    /// `InProgress`, `Completed`, `Failed`, `Stopping`, `Stopped`.
    pub status: String,
    /// The current secondary status.
    pub secondary: String,
    /// Creation time, Unix ms.
    pub created_ms: i64,
    /// End time, Unix ms.
    pub end_ms: Option<i64>,
    /// Failure reason.
    pub failure_reason: String,
    /// Instance type.
    pub instance_type: String,
    /// Instance count.
    pub instance_count: u32,
    /// Heterogeneous clusters (`ResourceConfig.InstanceGroups`): (instance type, count) per group.
    pub instance_groups: Vec<(String, u32)>,
    /// Spot training.
    pub spot: bool,
    /// The transitions, in order.
    pub transitions: Vec<Transition>,
}

fn secs_ms(v: &Value) -> Option<i64> {
    v.as_f64().map(|s| (s * 1000.0).round() as i64)
}

/// Parses a `DescribeTrainingJob` response.
pub fn parse_describe(v: &Value) -> Option<TrainingJob> {
    Some(TrainingJob {
        name: v["TrainingJobName"].as_str()?.to_string(),
        received_ms: 0,
        status: v["TrainingJobStatus"].as_str().unwrap_or("").to_string(),
        secondary: v["SecondaryStatus"].as_str().unwrap_or("").to_string(),
        created_ms: secs_ms(&v["CreationTime"])?,
        end_ms: secs_ms(&v["TrainingEndTime"]),
        failure_reason: v["FailureReason"].as_str().unwrap_or("").to_string(),
        instance_type: v["ResourceConfig"]["InstanceType"].as_str().unwrap_or("").to_string(),
        instance_count: v["ResourceConfig"]["InstanceCount"]
            .as_u64()
            .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        instance_groups: v["ResourceConfig"]["InstanceGroups"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|g| {
                        let n = g["InstanceCount"].as_u64().map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX));
                        Some((g["InstanceType"].as_str()?.to_string(), n))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        spot: v["EnableManagedSpotTraining"].as_bool().unwrap_or(false),
        transitions: v["SecondaryStatusTransitions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| {
                        Some(Transition {
                            status: t["Status"].as_str()?.to_string(),
                            start_ms: secs_ms(&t["StartTime"])?,
                            message: super::free_text(t["StatusMessage"].as_str().unwrap_or(""), 1024),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// The job's GPUs, GPU class and instance count over its instance type or groups, and the first type the table
/// does not know (if any).
pub fn gpus(table: &GpuTable, j: &TrainingJob) -> (u32, String, u32, Option<String>) {
    let groups: Vec<(String, u32)> = if j.instance_groups.is_empty() {
        vec![(j.instance_type.clone(), j.instance_count.max(1))]
    } else {
        j.instance_groups.clone()
    };
    let (mut total, mut nodes, mut class, mut unknown) = (0u32, 0u32, String::new(), None);
    for (ty, n) in &groups {
        nodes = nodes.saturating_add((*n).max(1));
        match table.sagemaker(ty) {
            // Saturating: a hostile or broken InstanceCount must not overflow (validation refuses the count).
            Known::Gpus(per, c) => {
                total = total.saturating_add(per.saturating_mul((*n).max(1)));
                if class.is_empty() {
                    class = c;
                }
            }
            Known::Cpu => {}
            Known::Unknown => unknown = unknown.or_else(|| Some(ty.clone())),
        }
    }
    (total, class, nodes, unknown)
}

/// Whether a status message says the provider is out of capacity (EC2's "Insufficient capacity ... retrying",
/// SageMaker's "CapacityError"): the job waits for capacity, it is not being provisioned.
pub fn is_capacity_message(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("insufficient capacity") || m.contains("capacityerror") || m.contains("insufficientinstancecapacity")
}

/// The `Starting` transition's message as last seen: whether it said capacity (see [`starting_split`]). Set the
/// first time the transition is seen; kept while it is the job's current transition.
fn note_starting(mem: &mut JobMemory, key: &str, current: bool, capacity: bool) {
    if !mem.emitted.contains(key) {
        mem.starting_capacity = Some(capacity);
    } else if !current {
        mem.starting_capacity = None;
    }
}

/// A `Starting` transition whose message turned to or from EC2's capacity retry since the last poll: SageMaker
/// keeps one transition and rewrites its message, so the poll that sees the change splits the wait, dated when the
/// description was received (never before the transition began). The event: `(key, at, kind)`.
fn starting_split(mem: &mut JobMemory, key: &str, t: &Transition, received_ms: i64) -> Option<(String, i64, Kind)> {
    let was = mem.starting_capacity?;
    if !mem.emitted.contains(key) {
        return None;
    }
    let now = is_capacity_message(&t.message);
    if now == was || received_ms <= 0 {
        return None;
    }
    mem.starting_capacity = Some(now);
    mem.starting_splits += 1;
    Some((format!("{key}#{}", mem.starting_splits), received_ms.max(t.start_ms), starting_kind(&t.message)))
}

/// What a `Starting` transition with this message is: a capacity wait while EC2 retries for capacity ("Insufficient
/// capacity error from EC2 while launching instances, retrying!"), else provisioning.
fn starting_kind(message: &str) -> Kind {
    if is_capacity_message(message) {
        Kind::Queued(pb::Queued {
            reason: pb::WaitReason::Capacity as i32,
            raw_reason: "Starting".into(),
            message: message.to_string(),
            estimated_start: None,
            queue_position: None,
        })
    } else {
        Kind::Preparing(pb::Preparing { phase: pb::PreparingPhase::Provisioning as i32, message: message.to_string() })
    }
}

/// How SageMaker jobs map onto Startline's attributes.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    /// AWS region (also the job's region attribute).
    pub region: String,
    /// Job-name prefixes that mark urgent jobs.
    pub urgent_prefixes: Vec<String>,
    /// Account or namespace for job ids: `sagemaker/<namespace>/<job name>`.
    pub namespace: String,
    /// GPU counts and classes of instance types, with `--instance-type` overrides.
    pub gpus: GpuTable,
}

/// The Startline job id.
pub fn startline_id(m: &Mapping, j: &TrainingJob) -> String {
    format!("sagemaker/{}/{}", m.namespace, j.name)
}

/// The events the job's current description implies beyond its memory, and the new memory.
pub fn diff(m: &Mapping, j: &TrainingJob, mem: &JobMemory) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    let mut mem = mem.clone();
    let mut out = Vec::new();
    let job = startline_id(m, j);
    let mut emit = |mem: &mut JobMemory, key: String, at: i64, kind: Kind| {
        if mem.emitted.insert(key.clone()) {
            out.push(pb::LifecycleEvent {
                event_id: format!("{job}:{key}"),
                job_id: job.clone(),
                attempt: Some(mem.restarts + 1),
                source: format!("sagemaker-adapter/{}", m.region),
                occurred_at: Some(ms_to_timestamp(at)),
                kind: Some(kind),
            });
        }
    };
    let urgent = m.urgent_prefixes.iter().any(|p| j.name.starts_with(p.as_str()));
    let (gpu_count, gpu_class, node_count, _) = gpus(&m.gpus, j);
    let mut labels = std::collections::HashMap::new();
    if j.spot {
        labels.insert("capacity".to_string(), "spot".to_string());
    }
    emit(
        &mut mem,
        "submitted".into(),
        j.created_ms,
        Kind::Submitted(pb::Submitted {
            pool_kind: pb::PoolKind::Managed as i32,
            provider: "sagemaker".into(),
            pool: if j.instance_type.is_empty() { "sagemaker".into() } else { j.instance_type.clone() },
            priority: if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
            gpu_class,
            gpu_count,
            node_count,
            region: m.region.clone(),
            labels,
            ..Default::default()
        }),
    );
    for (i, t) in j.transitions.iter().enumerate() {
        let key = format!("t{i}:{}", t.status);
        let kind = match t.status.as_str() {
            "Starting" => starting_kind(&t.message),
            "Pending" => Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: "Pending".into(),
                message: t.message.clone(),
                estimated_start: None,
                queue_position: None,
            }),
            "Downloading" => {
                let phase = if t.message.to_ascii_lowercase().contains("image") {
                    pb::PreparingPhase::ImagePull
                } else {
                    pb::PreparingPhase::DataStaging
                };
                Kind::Preparing(pb::Preparing { phase: phase as i32, message: t.message.clone() })
            }
            "Training" => super::container_start(),
            "Interrupted" => {
                Kind::Preempted(pb::Preempted { reason: "spot-interruption".into(), checkpoint_saved: false })
            }
            "Restarting" => {
                mem.restarts += u32::from(!mem.emitted.contains(&key));
                Kind::Requeued(pb::Requeued { resume_step: 0 })
            }
            _ => continue,
        };
        let starting = t.status == "Starting";
        if starting {
            note_starting(&mut mem, &key, i + 1 == j.transitions.len(), is_capacity_message(&t.message));
        }
        let split = starting.then(|| starting_split(&mut mem, &key, t, j.received_ms)).flatten();
        emit(&mut mem, key, t.start_ms, kind);
        if let Some((key, at, kind)) = split {
            emit(&mut mem, key, at, kind);
        }
    }
    let outcome = match (j.status.as_str(), j.secondary.as_str()) {
        (_, "MaxRuntimeExceeded" | "MaxWaitTimeExceeded") => Some(pb::Outcome::TimedOut),
        ("Completed", _) => Some(pb::Outcome::Succeeded),
        ("Failed", _) => Some(pb::Outcome::Failed),
        ("Stopped", _) => Some(pb::Outcome::Cancelled),
        _ => None,
    };
    if let Some(o) = outcome {
        let at = j.end_ms.or_else(|| j.transitions.last().map(|t| t.start_ms)).unwrap_or(j.created_ms);
        let message = if j.failure_reason.is_empty() {
            format!("sagemaker {}", j.secondary)
        } else {
            super::free_text(&j.failure_reason, 1024)
        };
        emit(&mut mem, "done".into(), at, Kind::Done(pb::Done { outcome: o as i32, exit_code: None, message }));
        mem.done = true;
    }
    (out, mem)
}

/// Failures of the API client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// HTTP transport failure.
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    /// The API answered an error.
    #[error("sagemaker answered {status}: {body}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Body (AWS error JSON).
        body: String,
    },
    /// A 2xx answer that is not JSON.
    #[error("sagemaker answered invalid json: {0}")]
    Parse(String),
}

impl From<ClientError> for PollError {
    fn from(e: ClientError) -> PollError {
        match e {
            ClientError::Http(e) => PollError::new(PollErrorKind::Transport, format!("http: {e}")),
            ClientError::Api { status, body } => PollError::http("sagemaker", status, &body),
            e @ ClientError::Parse(_) => PollError::new(PollErrorKind::Parse, e.to_string()),
        }
    }
}

/// A SigV4-signed SageMaker API client (AWS JSON 1.1 protocol). Each call is retried on throttling, 5xx and
/// transport failures ([`super::retry`]); a call AWS refuses because its credentials expired or were revoked
/// (`ExpiredTokenException`, `UnrecognizedClientException`, ...) drops the cached credentials and is made once more
/// with freshly resolved ones.
pub struct Client {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    region: String,
    creds: AwsCredentials,
    retry: RetryPolicy,
    metrics: Option<crate::metrics::Metrics>,
}

impl Client {
    /// A client for `endpoint` (e.g. `https://api.sagemaker.us-east-1.amazonaws.com`).
    pub fn new(endpoint: &str, region: &str, creds: AwsCredentials) -> Result<Client, String> {
        let endpoint = reqwest::Url::parse(endpoint).map_err(|e| format!("endpoint {endpoint:?}: {e}"))?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Client { http, endpoint, region: region.to_string(), creds, retry: RetryPolicy::default(), metrics: None })
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

    async fn call(&self, target: &str, body: &Value) -> Result<Value, PollError> {
        let mut renewed = false;
        loop {
            let r = with_retries(
                &self.retry,
                || async {
                    let creds = self.creds.get().await?;
                    self.call_once(target, body, &creds)
                        .await
                        .map_err(|(e, retry_after)| Attempt { error: e.into(), retry_after })
                },
                |e| {
                    if let Some(m) = &self.metrics {
                        m.call_retried(Provider::Sagemaker, e.kind);
                    }
                },
            )
            .await;
            match r {
                Err(e) if !renewed && refused_credentials(&e.message) => {
                    tracing::info!(error = %e, "AWS refused the credentials; resolving them again");
                    renewed = true;
                    self.creds.forget().await;
                }
                other => return other,
            }
        }
    }

    async fn call_once(
        &self,
        target: &str,
        body: &Value,
        creds: &super::sigv4::Credentials,
    ) -> Result<Value, (ClientError, Option<std::time::Duration>)> {
        let bytes = body.to_string().into_bytes();
        let host = match self.endpoint.port() {
            Some(p) => format!("{}:{p}", self.endpoint.host_str().unwrap_or("")),
            None => self.endpoint.host_str().unwrap_or("").to_string(),
        };
        let date = amz_date(startline_proto::time::now_ms());
        let mut headers = vec![
            ("content-type".to_string(), "application/x-amz-json-1.1".to_string()),
            ("host".to_string(), host),
            ("x-amz-date".to_string(), date),
            ("x-amz-target".to_string(), format!("SageMaker.{target}")),
        ];
        if let Some(t) = &creds.session_token {
            headers.push(("x-amz-security-token".to_string(), t.clone()));
        }
        let auth = authorization(creds, &self.region, "sagemaker", "POST", self.endpoint.path(), "", &headers, &bytes);
        let mut req = self.http.post(self.endpoint.clone()).header("authorization", auth);
        for (k, v) in headers.iter().filter(|(k, _)| k != "host") {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req.body(bytes).send().await.map_err(|e| (ClientError::Http(e), None))?;
        let status = resp.status().as_u16();
        let wait = super::retry::retry_after(resp.headers());
        let text = resp.text().await.map_err(|e| (ClientError::Http(e), None))?;
        if !(200..300).contains(&status) {
            return Err((ClientError::Api { status, body: text.chars().take(500).collect() }, wait));
        }
        serde_json::from_str(&text).map_err(|e| (ClientError::Parse(e.to_string()), None))
    }

    /// Names of training jobs created after `after_ms`, all pages.
    pub async fn list(&self, after_ms: i64) -> Result<Vec<String>, PollError> {
        let mut names = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut body = json!({"CreationTimeAfter": after_ms as f64 / 1000.0, "MaxResults": 100, "SortBy": "CreationTime", "SortOrder": "Ascending"});
            if let Some(t) = &token {
                body["NextToken"] = json!(t);
            }
            let v = self.call("ListTrainingJobs", &body).await?;
            for s in v["TrainingJobSummaries"].as_array().into_iter().flatten() {
                if let Some(n) = s["TrainingJobName"].as_str() {
                    names.push(n.to_string());
                }
            }
            match v["NextToken"].as_str() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(names),
            }
        }
    }

    /// One job's description.
    pub async fn describe(&self, name: &str) -> Result<Value, PollError> {
        self.call("DescribeTrainingJob", &json!({"TrainingJobName": name})).await
    }
}

/// Whether an AWS error answer says the request's credentials are expired, revoked or unknown (so fresh ones may
/// succeed), as opposed to a missing permission (`AccessDeniedException`), which new credentials would not fix.
pub fn refused_credentials(message: &str) -> bool {
    ["ExpiredToken", "UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException"]
        .iter()
        .any(|code| message.contains(code))
}

/// How often the adapter polls, and how far back it lists.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Jobs created within this window are followed.
    pub lookback: std::time::Duration,
    /// Poll interval.
    pub interval: std::time::Duration,
}

/// Polls until `stop`: list recent jobs, describe those not yet done, spool their transitions.
pub async fn run(
    m: Mapping,
    client: Client,
    Schedule { lookback, interval }: Schedule,
    spool: crate::spool::Spool,
    memory: MemoryStore,
    metrics: crate::metrics::Metrics,
    stop: tokio_util::sync::CancellationToken,
) {
    super::poll_loop(Provider::Sagemaker, metrics, interval, stop, || poll_once(&m, &client, lookback, &spool, &memory))
        .await
}

/// One poll; returns the jobs followed (listed and not yet done) and the events spooled.
pub async fn poll_once(
    m: &Mapping,
    client: &Client,
    lookback: std::time::Duration,
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
) -> Result<PollReport, PollError> {
    let after = startline_proto::time::now_ms() - lookback.as_millis() as i64;
    let names = client.list(after).await?;
    let mut report = PollReport::default();
    for name in names {
        let key = format!("sagemaker/{}/{name}", m.namespace);
        let mem = memory.get(&key);
        if mem.done {
            continue;
        }
        let v = client.describe(&name).await?;
        let received_ms = startline_proto::time::now_ms();
        let Some(mut job) = parse_describe(&v) else {
            tracing::warn!(job = %name, "unreadable DescribeTrainingJob answer");
            continue;
        };
        job.received_ms = received_ms;
        if mem.emitted.is_empty() {
            if let (_, _, _, Some(ty)) = gpus(&m.gpus, &job) {
                super::gpus::warn_unknown_once("sagemaker", &ty);
                if let Some(metrics) = &client.metrics {
                    metrics.unknown_type(Provider::Sagemaker);
                }
            }
        }
        let (events, new_mem) = diff(m, &job, &mem);
        super::record(spool, memory, &key, &mem, events, &new_mem, &mut report)?;
    }
    super::flush(memory)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SageMaker keeps one `Starting` transition and rewrites its message: the poll that sees EC2's capacity
    /// retry appear splits the wait there (a capacity wait from then on), the poll that sees it clear splits it
    /// back to provisioning, each dated when the description was received; polls that see no change, a transition
    /// that is over, and a restarted adapter (its memory read back) add nothing.
    #[test]
    fn a_capacity_message_appearing_and_clearing_inside_starting_splits_the_wait_where_it_was_seen() {
        let t0 = 1_700_000_000_000;
        let job = |received: i64, msgs: &[(&str, i64, &str)]| TrainingJob {
            name: "train-1".into(),
            received_ms: received,
            status: "InProgress".into(),
            secondary: msgs.last().map_or("", |m| m.0).into(),
            created_ms: t0 - 5_000,
            transitions: msgs
                .iter()
                .map(|(st, at, m)| Transition { status: (*st).into(), start_ms: *at, message: (*m).into() })
                .collect(),
            ..Default::default()
        };
        let preparing = "Preparing the instances for training";
        let capacity = "Insufficient capacity error from EC2 while launching instances, retrying!";
        let launching = "Launching requested ML instances";
        let mut mem = JobMemory::default();
        let mut seen = Vec::new();
        for (received, msgs) in [
            (t0 + 10_000, vec![("Starting", t0, preparing)]),
            (t0 + 60_000, vec![("Starting", t0, capacity)]),
            (t0 + 70_000, vec![("Starting", t0, capacity)]),
            (t0 + 300_000, vec![("Starting", t0, launching)]),
            (t0 + 450_000, vec![("Starting", t0, launching), ("Downloading", t0 + 400_000, "Downloading input data")]),
            (t0 + 500_000, vec![("Starting", t0, capacity), ("Downloading", t0 + 400_000, "Downloading input data")]),
        ] {
            let (evs, next) = diff(&mapping(), &job(received, &msgs), &mem);
            // The memory survives a restart of the adapter (it is stored as JSON).
            mem = serde_json::from_value(serde_json::to_value(&next).expect("json")).expect("memory");
            seen.extend(evs.iter().map(|e| {
                let at = e.occurred_at.as_ref().map(startline_proto::time::timestamp_to_ms).unwrap_or(0);
                (kinds(std::slice::from_ref(e)).remove(0), at - t0)
            }));
        }
        assert_eq!(
            seen,
            [
                ("submitted".to_string(), -5_000),
                ("preparing:Provisioning".to_string(), 0),
                ("queued:Starting".to_string(), 60_000),
                ("preparing:Provisioning".to_string(), 300_000),
                ("preparing:DataStaging".to_string(), 400_000),
            ]
        );
        // A first poll that already sees the capacity message dates the capacity wait at the transition's start.
        let (evs, _) = diff(&mapping(), &job(t0 + 90_000, &[("Starting", t0, capacity)]), &JobMemory::default());
        assert_eq!(kinds(&evs), ["submitted", "queued:Starting"]);
    }

    fn mapping() -> Mapping {
        Mapping {
            region: "us-east-1".into(),
            urgent_prefixes: vec!["urgent-".into()],
            namespace: "123456789012".into(),
            gpus: GpuTable::default(),
        }
    }

    fn load(s: &str) -> TrainingJob {
        parse_describe(&serde_json::from_str(s).expect("json")).expect("job")
    }

    fn kinds(evs: &[pb::LifecycleEvent]) -> Vec<String> {
        evs.iter()
            .map(|e| match e.kind.as_ref() {
                Some(Kind::Submitted(_)) => "submitted".into(),
                Some(Kind::Queued(q)) => format!("queued:{}", q.raw_reason),
                Some(Kind::Preparing(p)) => format!("preparing:{:?}", p.phase()),
                Some(Kind::FirstStep(_)) => "first_step".into(),
                Some(Kind::Preempted(_)) => "preempted".into(),
                Some(Kind::Requeued(_)) => "requeued".into(),
                Some(Kind::Done(d)) => format!("done:{:?}", d.outcome()),
                _ => "other".into(),
            })
            .collect()
    }

    #[test]
    fn an_ec2_capacity_retry_while_starting_is_a_capacity_wait_with_its_message() {
        let mut v: Value =
            serde_json::from_str(include_str!("fixtures/sagemaker-describe-completed.json")).expect("json");
        v["SecondaryStatusTransitions"][0]["StatusMessage"] =
            "Insufficient capacity error from EC2 while launching instances, retrying!".into();
        let j = parse_describe(&v).expect("job");
        let (evs, _) = diff(&mapping(), &j, &JobMemory::default());
        assert_eq!(kinds(&evs)[1], "queued:Starting");
        let Some(Kind::Queued(q)) = &evs[1].kind else { panic!("queued") };
        assert_eq!(q.reason(), pb::WaitReason::Capacity);
        assert!(q.message.starts_with("Insufficient capacity error from EC2"));
        assert!(is_capacity_message("CapacityError: Unable to provision requested ML compute capacity"));
        assert!(!is_capacity_message("Launching requested ML instances"));
    }

    #[test]
    fn four_gpu_g4dn_instance_groups_and_unknown_types_are_counted_not_silently_zero() {
        let mut v: Value = serde_json::from_str(include_str!("fixtures/sagemaker-describe-failed.json")).expect("json");
        v["ResourceConfig"] = json!({"InstanceType": "ml.g4dn.12xlarge", "InstanceCount": 2});
        let j = parse_describe(&v).expect("job");
        assert_eq!(gpus(&GpuTable::default(), &j), (8, "t4".to_string(), 2, None));
        // A heterogeneous cluster: GPUs summed over the groups, CPU groups count as nodes only.
        v["ResourceConfig"] = json!({"InstanceGroups": [
            {"InstanceGroupName": "train", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 2},
            {"InstanceGroupName": "data", "InstanceType": "ml.c5.18xlarge", "InstanceCount": 3}
        ]});
        let j = parse_describe(&v).expect("job");
        assert_eq!(gpus(&GpuTable::default(), &j), (16, "h100".to_string(), 5, None));
        // A type the table lacks is reported as unknown; an override makes it known.
        v["ResourceConfig"] = json!({"InstanceType": "ml.p7.48xlarge", "InstanceCount": 1});
        let j = parse_describe(&v).expect("job");
        assert_eq!(gpus(&GpuTable::default(), &j), (0, String::new(), 1, Some("ml.p7.48xlarge".to_string())));
        let table = GpuTable::parse(&["ml.p7.48xlarge=8:b300".to_string()]).expect("spec");
        assert_eq!(gpus(&table, &j), (8, "b300".to_string(), 1, None));
    }

    #[test]
    fn secondary_transitions_become_phases_waits_and_a_preemption() {
        let j = load(include_str!("fixtures/sagemaker-describe-completed.json"));
        let (evs, mem) = diff(&mapping(), &j, &JobMemory::default());
        assert_eq!(
            kinds(&evs),
            [
                "submitted",
                "preparing:Provisioning",
                "queued:Pending",
                "preparing:ImagePull",
                "preparing:DataStaging",
                "first_step",
                "preempted",
                "requeued",
                "first_step",
                "done:Succeeded"
            ]
        );
        let Some(Kind::Submitted(s)) = &evs[0].kind else { panic!("submitted") };
        assert_eq!(
            (s.gpu_count, s.node_count, s.gpu_class.as_str(), s.pool_kind()),
            (16, 2, "a100-40g", pb::PoolKind::Managed)
        );
        assert_eq!(startline_proto::time::timestamp_to_ms(evs[0].occurred_at.as_ref().expect("t")), 1_796_000_000_123);
        assert_eq!(evs[0].job_id, "sagemaker/123456789012/llm-finetune-2026-11-30-01");
        for e in &evs {
            startline_proto::validate::validate_event(e, i64::MAX / 4, &Default::default()).expect("valid");
        }
        assert!(mem.done);
        // Polling again changes nothing.
        assert!(diff(&mapping(), &j, &mem).0.is_empty());
    }

    #[test]
    fn a_multi_line_failure_reason_still_gives_a_valid_done() {
        let mut j = load(include_str!("fixtures/sagemaker-describe-failed.json"));
        j.failure_reason = format!("AlgorithmError: Traceback:\n  File \"train.py\"\n\t{}", "€".repeat(600));
        let (evs, _) = diff(&mapping(), &j, &JobMemory::default());
        let now = startline_proto::time::now_ms();
        for ev in &evs {
            let checked = startline_proto::validate::validate_event(ev, now, &startline_proto::Limits::default());
            assert!(checked.is_ok(), "{checked:?}");
        }
        let Some(Kind::Done(d)) = &evs[3].kind else { panic!("done") };
        assert!(d.message.starts_with("AlgorithmError: Traceback:   File"), "{}", d.message);
    }

    #[test]
    fn capacity_error_keeps_the_failure_reason() {
        let j = load(include_str!("fixtures/sagemaker-describe-failed.json"));
        let (evs, _) = diff(&mapping(), &j, &JobMemory::default());
        assert_eq!(kinds(&evs), ["submitted", "preparing:Provisioning", "queued:Pending", "done:Failed"]);
        let Some(Kind::Done(d)) = &evs[3].kind else { panic!("done") };
        assert!(d.message.starts_with("CapacityError"));
        let Some(Kind::Submitted(s)) = &evs[0].kind else { panic!("submitted") };
        assert_eq!(s.priority(), pb::PriorityClass::Urgent);
    }

    #[test]
    fn a_partial_view_then_the_full_one_emits_each_transition_once() {
        let full = load(include_str!("fixtures/sagemaker-describe-completed.json"));
        let mut partial = full.clone();
        partial.status = "InProgress".into();
        partial.secondary = "Downloading".into();
        partial.end_ms = None;
        partial.transitions.truncate(4);
        let (first, mem) = diff(&mapping(), &partial, &JobMemory::default());
        // Restart: memory round-trips through its stored form.
        let mem: JobMemory = serde_json::from_slice(&serde_json::to_vec(&mem).expect("enc")).expect("dec");
        let (rest, _) = diff(&mapping(), &full, &mem);
        let mut all: Vec<String> = first.iter().chain(rest.iter()).map(|e| e.event_id.clone()).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "no duplicates");
        assert_eq!(n, 10, "no gaps");
    }

    #[test]
    fn a_huge_instance_count_saturates_instead_of_overflowing() {
        // Found by startline-fuzz: 8 GPUs x 761154598 instances overflowed u32 (a panic in debug builds, a
        // wrapped GPU count in release).
        let mut v: Value = serde_json::from_str(include_str!("fixtures/sagemaker-describe-failed.json")).expect("json");
        v["ResourceConfig"] = json!({"InstanceType": "ml.p5.48xlarge", "InstanceCount": 761_154_598});
        let (e, _) = diff(&mapping(), &parse_describe(&v).expect("job"), &JobMemory::default());
        let Some(Kind::Submitted(s)) = &e[0].kind else { panic!("submitted") };
        assert_eq!((s.gpu_count, s.node_count), (u32::MAX, 761_154_598));
        v["ResourceConfig"]["InstanceCount"] = json!(u64::MAX);
        assert_eq!(parse_describe(&v).expect("job").instance_count, u32::MAX, "saturated, not truncated");
    }
}
