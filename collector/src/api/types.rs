//! The API's response bodies as typed structs, serialized by serde (the comparison's body is
//! [`crate::compare::Report`], typed where it is computed).
//!
//! Every struct here declares its fields in alphabetical order: that is the order in which the API has always
//! written keys (its bodies used to be `serde_json` maps, which sort their keys), so keep new fields in it.
//! `Option` fields are written as `null` unless marked `skip_serializing_if`, in which case they are absent.
//! Maps keyed by data (segment labels, job states, free-form labels) are `BTreeMap`s, so they come out sorted too.

use crate::job::Timeline;
use crate::time::format_ms;
use serde::Serialize;
use startline_proto::labels::Label;
use startline_proto::pb::{self, lifecycle_event::Kind};
use std::collections::BTreeMap;

fn opt_time(v: Option<i64>) -> Option<String> {
    v.map(format_ms)
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// `{"status": ...}` of `/healthz` and `/readyz`, with the reason when not healthy or not ready.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Status {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub status: &'static str,
}

/// `GET /api/v1/jobs`: one page of job summaries.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct JobList {
    pub jobs: Vec<Job>,
    /// The last job of this page when there are more matches (pass it as `page_token`).
    pub next_page_token: Option<String>,
}

/// A job: its summary in listings; with `attributes`, `events` and `timeline` too in `GET /api/v1/jobs/{id}`.
/// The attribute fields (`pool_kind` .. `team`) are absent, not null, for a job whose `submitted` is not known.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Job {
    /// Detail only; `null` for a job without attributes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Option<Attributes>>,
    pub current_wait: Option<CurrentWait>,
    pub done_at: Option<String>,
    /// Detail only: one page of the raw events, in the job's canonical order (`events_offset`, `events_limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<Event>>,
    /// Detail only: where the next page of events starts (`events_offset`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_next_offset: Option<u64>,
    /// Detail only: the job's events in all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_total: Option<u64>,
    /// When the job is expected to start, while it waits (queued, assigned or preparing); `null` otherwise, or
    /// when neither the history of comparable jobs nor the scheduler gives an estimate.
    pub expected_start: Option<super::eta::ExpectedStart>,
    pub first_step_at: Option<String>,
    /// What `first_step_at` was observed from: `training_process`, or `container_start` / `scheduler_start`
    /// when only an adapter reported the job's start (no first step of its training process in that run), or
    /// `unspecified` (sources older than first-step origins); `null` before the first step.
    pub first_step_origin: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_count: Option<u32>,
    pub job_id: String,
    pub outcome: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub state: &'static str,
    pub submitted_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub time_to_first_step_seconds: Option<f64>,
    /// Detail only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<TimelineDetail>,
    /// Seconds since the current wait began (`null` when not waiting).
    pub waiting_seconds: Option<f64>,
}

impl Job {
    /// The summary of a job shown in listings.
    pub fn summary(job_id: &str, t: &Timeline, now_ms: i64) -> Job {
        let a = t.attrs.as_ref();
        Job {
            attributes: None,
            current_wait: t.current_wait.map(|(seg, since)| CurrentWait {
                raw_reason: t.current_raw_reason.as_deref().map(str::to_string),
                segment: seg.label(),
                since: format_ms(since),
            }),
            done_at: opt_time(t.done_at),
            events: None,
            events_next_offset: None,
            events_total: None,
            expected_start: None,
            first_step_at: opt_time(t.first_step_at),
            first_step_origin: t.first_step_at.and(t.first_step_origin).map(|o| o.label()),
            gpu_class: a.map(|a| a.gpu_class.clone()),
            gpu_count: a.map(|a| a.gpu_count),
            job_id: job_id.to_string(),
            outcome: t.outcome.map(|o| o.label()),
            pool: a.map(|a| a.pool.clone()),
            pool_kind: a.map(|a| a.pool_kind.label()),
            priority: a.map(|a| a.priority.label()),
            project: a.map(|a| a.project.clone()),
            provider: a.map(|a| a.provider.clone()),
            region: a.map(|a| a.region.clone()),
            state: t.state.label(),
            submitted_at: opt_time(t.submitted_at),
            team: a.map(|a| a.team.clone()),
            time_to_first_step_seconds: t.time_to_first_step_ms().map(secs),
            timeline: None,
            waiting_seconds: t.wait_started_at.map(|since| secs((now_ms - since).max(0))),
        }
    }

    /// The job in full: summary, attributes, timeline and raw events.
    pub fn detail(job_id: &str, t: &Timeline, events: &[(u64, pb::LifecycleEvent)], now_ms: i64) -> Job {
        Job {
            attributes: Some(t.attrs.as_ref().map(|a| Attributes {
                chain_id: a.chain_id.clone(),
                chain_stage: a.chain_stage.clone(),
                labels: a.labels.clone(),
                node_count: a.node_count,
            })),
            events: Some(events.iter().map(|(seq, ev)| Event::new(*seq, ev)).collect()),
            timeline: Some(TimelineDetail::new(t, now_ms)),
            ..Job::summary(job_id, t, now_ms)
        }
    }
}

/// The wait a job is in now.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct CurrentWait {
    pub raw_reason: Option<String>,
    pub segment: String,
    pub since: String,
}

/// A job's attributes beyond those in its summary.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Attributes {
    pub chain_id: String,
    pub chain_stage: String,
    pub labels: BTreeMap<String, String>,
    pub node_count: u32,
}

/// The full timeline of a job.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct TimelineDetail {
    pub attempts: u32,
    /// Time spent saving checkpoints (the sum of their `save_seconds`).
    pub checkpoint_save_seconds: f64,
    pub exit_code: Option<i32>,
    /// Training lost when the job failed (its last run since the later of its start and last checkpoint).
    pub failed_work_seconds: f64,
    pub ignored_after_done: u32,
    /// Seconds per wait segment before the first step (a job still in its initial wait: up to now).
    pub initial_wait_seconds: BTreeMap<String, f64>,
    pub lost_gpu_seconds: f64,
    pub lost_steps: u64,
    pub lost_work_seconds: f64,
    pub milestones: Milestones,
    pub node_losses: u32,
    pub preemptions: u32,
    pub requeue_wait_seconds: f64,
    pub runs: u32,
    /// The job's life (submit to its end, or now) by category: `waiting`, `preparing`, `requeue_wait`,
    /// `checkpoint`, `lost`, `failed`, `productive`, in seconds; they add up to it exactly (docs/concepts.md, "Goodput";
    /// multiply by `gpu_count` for GPU-seconds).
    pub time_by_category_seconds: BTreeMap<&'static str, f64>,
}

impl TimelineDetail {
    fn new(t: &Timeline, now_ms: i64) -> TimelineDetail {
        let mut initial: BTreeMap<String, f64> =
            t.initial_wait_ms.iter().map(|(s, ms)| (s.label(), secs(*ms))).collect();
        // A job still in its initial wait: the open segment counts up to now.
        if t.first_step_at.is_none() && t.done_at.is_none() {
            if let Some((seg, since)) = t.current_wait {
                *initial.entry(seg.label()).or_insert(0.0) += secs((now_ms - since).max(0));
            }
        }
        let by_category = crate::job::goodput::account(t, now_ms).map(|a| a.by_category()).unwrap_or_default();
        TimelineDetail {
            attempts: t.attempts,
            checkpoint_save_seconds: secs(t.checkpoint_save_ms),
            exit_code: t.exit_code,
            failed_work_seconds: secs(t.failed_work_ms),
            ignored_after_done: t.ignored_after_done,
            initial_wait_seconds: initial,
            lost_gpu_seconds: t.lost_gpu_seconds(),
            lost_steps: t.lost_steps,
            lost_work_seconds: secs(t.lost_work_ms),
            milestones: Milestones {
                done: opt_time(t.done_at),
                first_queued: opt_time(t.first_queued_at),
                first_step: opt_time(t.first_step_at),
                last_checkpoint: t.last_checkpoint.map(|(at, step)| LastCheckpoint { at: format_ms(at), step }),
                node_assigned: opt_time(t.node_assigned_at),
                preparing: opt_time(t.preparing_at),
                submitted: opt_time(t.submitted_at),
            },
            node_losses: t.node_losses,
            preemptions: t.preemptions,
            requeue_wait_seconds: secs(t.requeue_wait_ms),
            runs: t.runs,
            time_by_category_seconds: crate::job::goodput::CATEGORIES
                .iter()
                .zip(by_category)
                .map(|(c, ms)| (*c, secs(ms)))
                .collect(),
        }
    }
}

/// When a job reached each milestone (`null`: not yet).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Milestones {
    pub done: Option<String>,
    pub first_queued: Option<String>,
    pub first_step: Option<String>,
    pub last_checkpoint: Option<LastCheckpoint>,
    pub node_assigned: Option<String>,
    pub preparing: Option<String>,
    pub submitted: Option<String>,
}

/// The latest checkpoint.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LastCheckpoint {
    pub at: String,
    pub step: u64,
}

/// One raw event as stored.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Event {
    pub attempt: Option<u32>,
    /// The kind's fields (`null` for an event without a kind).
    pub detail: Option<EventDetail>,
    pub event_id: String,
    pub kind: &'static str,
    pub occurred_at: Option<String>,
    pub seq: u64,
    pub source: String,
}

impl Event {
    /// The event at log sequence `seq`.
    pub fn new(seq: u64, ev: &pb::LifecycleEvent) -> Event {
        let (kind, detail) = match &ev.kind {
            None => ("none", None),
            Some(Kind::Submitted(s)) => (
                "submitted",
                Some(EventDetail::Submitted {
                    chain_id: s.chain_id.clone(),
                    chain_stage: s.chain_stage.clone(),
                    gpu_class: s.gpu_class.clone(),
                    gpu_count: s.gpu_count,
                    labels: s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    node_count: s.node_count,
                    pool: s.pool.clone(),
                    pool_kind: s.pool_kind().label(),
                    priority: s.priority().label(),
                    project: s.project.clone(),
                    provider: s.provider.clone(),
                    region: s.region.clone(),
                    team: s.team.clone(),
                }),
            ),
            Some(Kind::Queued(q)) => (
                "queued",
                Some(EventDetail::Queued {
                    estimated_start: q
                        .estimated_start
                        .as_ref()
                        .map(|t| format_ms(startline_proto::time::timestamp_to_ms(t))),
                    message: q.message.clone(),
                    queue_position: q.queue_position,
                    raw_reason: q.raw_reason.clone(),
                    reason: q.reason().label(),
                }),
            ),
            Some(Kind::NodeAssigned(n)) => (
                "node_assigned",
                Some(EventDetail::NodeAssigned { gpu_ids: n.gpu_ids.clone(), nodes: n.nodes.clone() }),
            ),
            Some(Kind::Preparing(p)) => {
                ("preparing", Some(EventDetail::Preparing { message: p.message.clone(), phase: p.phase().label() }))
            }
            Some(Kind::FirstStep(f)) => {
                ("first_step", Some(EventDetail::FirstStep { origin: f.origin().label(), step: f.step }))
            }
            Some(Kind::Checkpoint(c)) => (
                "checkpoint",
                Some(EventDetail::Checkpoint { save_seconds: c.save_seconds, step: c.step, uri: c.uri.clone() }),
            ),
            Some(Kind::Preempted(p)) => (
                "preempted",
                Some(EventDetail::Preempted { checkpoint_saved: p.checkpoint_saved, reason: p.reason.clone() }),
            ),
            Some(Kind::Requeued(r)) => ("requeued", Some(EventDetail::Resume { resume_step: r.resume_step })),
            Some(Kind::Restarted(r)) => ("restarted", Some(EventDetail::Resume { resume_step: r.resume_step })),
            Some(Kind::NodeLost(n)) => {
                ("node_lost", Some(EventDetail::NodeLost { message: n.message.clone(), node: n.node.clone() }))
            }
            Some(Kind::Done(d)) => (
                "done",
                Some(EventDetail::Done {
                    exit_code: d.exit_code,
                    message: d.message.clone(),
                    outcome: d.outcome().label(),
                }),
            ),
        };
        Event {
            attempt: ev.attempt,
            detail,
            event_id: ev.event_id.clone(),
            kind,
            occurred_at: ev.occurred_at.as_ref().map(|t| format_ms(startline_proto::time::timestamp_to_ms(t))),
            seq,
            source: ev.source.clone(),
        }
    }
}

/// The fields of an event's kind (the kind itself is [`Event::kind`]).
#[derive(Debug, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum EventDetail {
    /// `submitted`.
    Submitted {
        chain_id: String,
        chain_stage: String,
        gpu_class: String,
        gpu_count: u32,
        labels: BTreeMap<String, String>,
        node_count: u32,
        pool: String,
        pool_kind: &'static str,
        priority: &'static str,
        project: String,
        provider: String,
        region: String,
        team: String,
    },
    /// `queued`; the scheduler's estimated start and queue position only when it sent them.
    Queued {
        #[serde(skip_serializing_if = "Option::is_none")]
        estimated_start: Option<String>,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        queue_position: Option<u32>,
        raw_reason: String,
        reason: &'static str,
    },
    /// `node_assigned`.
    NodeAssigned { gpu_ids: Vec<String>, nodes: Vec<String> },
    /// `preparing`.
    Preparing { message: String, phase: &'static str },
    /// `first_step`: `origin` is where it was observed (`training_process`, `container_start`,
    /// `scheduler_start`, `unspecified`).
    FirstStep { origin: &'static str, step: u64 },
    /// `checkpoint`.
    Checkpoint { save_seconds: f64, step: u64, uri: String },
    /// `preempted`.
    Preempted { checkpoint_saved: bool, reason: String },
    /// `requeued` and `restarted`.
    Resume { resume_step: u64 },
    /// `node_lost`.
    NodeLost { message: String, node: String },
    /// `done`.
    Done { exit_code: Option<i32>, message: String, outcome: &'static str },
}

/// `GET /api/v1/slos`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SloList {
    pub as_of: String,
    pub slos: Vec<Slo>,
}

/// An SLO's definition and its status over a window.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Slo {
    /// `GET /api/v1/slos/{name}` only (the list has one for all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<String>,
    pub description: String,
    pub exclude_cancelled: bool,
    pub name: String,
    pub objective_percent: f64,
    pub page_on_breach: bool,
    pub selector: SloSelector,
    /// `null` when the engine has no figures for it.
    pub status: Option<SloStatus>,
    pub threshold_seconds: f64,
    /// Its own window, as text (`28days`).
    pub window: String,
    pub window_seconds: i64,
}

impl Slo {
    /// The definition, with the given status.
    pub fn new(d: &crate::slo::SloDef, status: Option<&crate::slo::SloStatus>) -> Slo {
        let sel = &d.selector;
        Slo {
            as_of: None,
            description: d.description.clone(),
            exclude_cancelled: d.exclude_cancelled,
            name: d.name.clone(),
            objective_percent: d.objective * 100.0,
            page_on_breach: d.page_on_breach,
            selector: SloSelector {
                gpu_class: sel.gpu_class.clone(),
                gpu_count_max: sel.gpu_count_max,
                gpu_count_min: sel.gpu_count_min,
                hours: sel.hours.as_ref().map(|h| {
                    format!(
                        "{:02}:{:02}-{:02}:{:02} {}",
                        h.from_min / 60,
                        h.from_min % 60,
                        h.to_min / 60,
                        h.to_min % 60,
                        h.tz_name
                    )
                }),
                pool: sel.pool.clone(),
                pool_kind: sel.pool_kind.iter().map(|p| p.label()).collect(),
                priority: sel.priority.iter().map(|p| p.label()).collect(),
                provider: sel.provider.clone(),
                region: sel.region.clone(),
            },
            status: status.map(SloStatus::new),
            threshold_seconds: d.threshold_ms as f64 / 1000.0,
            window: humantime::format_duration(std::time::Duration::from_millis(d.window_ms as u64)).to_string(),
            window_seconds: d.window_ms / 1000,
        }
    }
}

/// Which jobs an SLO covers (empty lists: any).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SloSelector {
    pub gpu_class: Vec<String>,
    pub gpu_count_max: Option<u32>,
    pub gpu_count_min: Option<u32>,
    /// `HH:MM-HH:MM Zone`.
    pub hours: Option<String>,
    pub pool: Vec<String>,
    pub pool_kind: Vec<&'static str>,
    pub priority: Vec<&'static str>,
    pub provider: Vec<String>,
    pub region: Vec<String>,
}

/// An SLO's figures over a window.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SloStatus {
    pub bad: u64,
    pub breached_waiting: u64,
    pub burn_rates: Vec<BurnRate>,
    pub compliance: f64,
    pub error_budget_remaining: f64,
    /// The jobs `time_to_first_step_seconds` covers (started in the window), by where their first step came from.
    pub first_step_sources: crate::compare::FirstStepSources,
    pub good: u64,
    pub objective: f64,
    pub pending: u64,
    pub time_to_first_step_seconds: Option<Percentiles>,
    pub total: u64,
    pub window_seconds: i64,
}

impl SloStatus {
    fn new(s: &crate::slo::SloStatus) -> SloStatus {
        SloStatus {
            bad: s.bad,
            breached_waiting: s.breached_waiting,
            burn_rates: s
                .burn_rates
                .iter()
                .map(|(w, r, n)| BurnRate { burn_rate: *r, decided_jobs: *n, window: w.clone() })
                .collect(),
            compliance: s.compliance,
            error_budget_remaining: s.error_budget_remaining,
            first_step_sources: {
                let mut f = crate::compare::FirstStepSources::default();
                for (i, n) in s.first_steps_by_origin.iter().enumerate() {
                    f.add(pb::StepOrigin::try_from(i as i32).unwrap_or_default(), *n);
                }
                f
            },
            good: s.good,
            objective: s.objective,
            pending: s.pending,
            time_to_first_step_seconds: s.ttfs_seconds.map(|p| Percentiles {
                count: p.count,
                max: p.max,
                p50: p.p50,
                p90: p.p90,
                p95: p.p95,
                p99: p.p99,
            }),
            total: s.total,
            window_seconds: s.window_ms / 1000,
        }
    }
}

/// The burn rate over one alerting window.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct BurnRate {
    pub burn_rate: f64,
    pub decided_jobs: u64,
    pub window: String,
}

/// Time-to-first-step percentiles, seconds ([`crate::slo::Percentiles`] with its keys in API order).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Percentiles {
    pub count: u64,
    pub max: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
}

/// `GET /api/v1/slos/{name}/history`: the SLO at evenly spaced points, for error-budget and burn-rate charts.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SloHistory {
    pub as_of: String,
    /// The multi-window burn-rate alert rules the collector evaluates, with this SLO's factors.
    pub burn_rules: Vec<BurnRuleInfo>,
    pub name: String,
    pub objective: f64,
    /// Oldest first; the last point is `as_of`.
    pub points: Vec<SloHistoryPoint>,
    pub step_seconds: i64,
    /// The SLO window each point's `good`, `bad`, compliance and error budget cover (ending at the point).
    pub window_seconds: i64,
}

/// One burn-rate alert rule: it fires when both windows burn at `factor` or faster.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct BurnRuleInfo {
    pub factor: f64,
    pub long_window_seconds: i64,
    /// `page` or `ticket`.
    pub severity: &'static str,
    pub short_window_seconds: i64,
    /// `long/short`, e.g. `1h/5m`.
    pub windows: &'static str,
}

/// The SLO as it stood at `at`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SloHistoryPoint {
    pub at: String,
    pub at_ms: i64,
    /// Bad jobs decided in the SLO window ending at `at`.
    pub bad: u64,
    /// Burn rates at `at`, one per rule of `burn_rules`, in its order.
    pub burn_rates: Vec<RuleBurn>,
    /// good / (good + bad); 1 when the window holds no decided job.
    pub compliance: f64,
    /// 1 - bad / ((good + bad) x (1 - objective)); negative when overspent.
    pub error_budget_remaining: f64,
    pub good: u64,
}

/// A rule's two burn rates at a point.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RuleBurn {
    pub long: f64,
    pub short: f64,
    pub windows: &'static str,
}

/// `GET /api/v1/goodput`: where the GPU time of the jobs submitted in a window went, by category, overall and
/// per group (job/goodput.rs defines the categories; they add up to `total` exactly).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Goodput {
    pub as_of: String,
    /// The attribute the groups are by.
    pub by: &'static str,
    /// Category names, in the order the dashboard stacks them.
    pub categories: Vec<&'static str>,
    /// One per value of `by`, largest total first; at most `limit` of them (see `truncated`).
    pub groups: Vec<GoodputGroup>,
    /// Values of `by` the jobs had, shown or not.
    pub groups_total: usize,
    /// Whether the groups with the least GPU time were left out to keep the answer within `limit` (`total` still
    /// counts every job).
    pub truncated: bool,
    /// Every job of the window.
    pub total: GoodputGroup,
    pub window_seconds: i64,
}

/// GPU-hours of a set of jobs (each job's time weighted by the GPUs it asked for).
#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct GoodputGroup {
    /// Checkpoint save time.
    pub checkpoint_gpu_hours: f64,
    /// Training since the last checkpoint of runs that ended with the job failed.
    pub failed_gpu_hours: f64,
    /// productive / total; `null` when the jobs hold no GPU time.
    pub goodput: Option<f64>,
    /// The group's value of `by` (`(none)` when unset; absent for `total`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub jobs: u64,
    /// Training lost to preemptions, node losses and restarts (since the last checkpoint).
    pub lost_gpu_hours: f64,
    /// Share of the GPU time the jobs held (preparing + checkpoint + lost + failed + productive) that was not
    /// useful training; `null` when they held none.
    pub overhead_share: Option<f64>,
    pub preparing_gpu_hours: f64,
    /// Preparing by phase (`preparing:image_pull`, ...).
    pub preparing_by_phase: BTreeMap<String, f64>,
    pub productive_gpu_hours: f64,
    pub requeue_wait_gpu_hours: f64,
    pub total_gpu_hours: f64,
    /// Waiting before the first step, by segment (`queued:capacity`, `unreported`, `assigned`, ...).
    pub waiting_by_segment: BTreeMap<String, f64>,
    pub waiting_gpu_hours: f64,
}

/// `GET /api/v1/cost`: each pool's cost over the window from `[cost]` (docs/concepts.md, "Cost"), and the managed and
/// dedicated totals side by side.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Cost {
    pub as_of: String,
    /// Whether `[cost]` prices anything (without it every pool is `unpriced`).
    pub configured: bool,
    /// The part of the window the collector holds jobs for (from the earliest submit it knows, or the window's
    /// start, to now): amortised pools are charged for this long.
    pub covered_seconds: i64,
    pub currency: String,
    /// `managed` and `dedicated` (the pools of each kind together), when they have jobs.
    pub pool_kinds: Vec<KindCost>,
    /// One per pool with jobs in the window, largest cost first.
    pub pools: Vec<PoolCost>,
    pub window_seconds: i64,
}

/// One pool's cost and use over the window.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PoolCost {
    /// Dedicated pools with `[[cost.dedicated]]`.
    /// GPU-hours the pool had over the covered window, by its time-of-day capacity (amortised pools).
    pub capacity_gpu_hours: Option<f64>,
    pub capacity_gpus: Option<u32>,
    /// `null` when unpriced.
    pub cost: Option<f64>,
    pub cost_per_useful_gpu_hour: Option<f64>,
    /// GPU-hours jobs held (preparing, checkpoint saves, lost and failed work, productive).
    pub held_gpu_hours: f64,
    pub jobs: u64,
    /// `per_use`, `amortised` or `unpriced`.
    pub model: &'static str,
    pub pool: String,
    pub pool_kind: &'static str,
    pub productive_gpu_hours: f64,
    pub provider: String,
    /// Jobs of a per-use pool that no `[[cost.price]]` matched (left out of `cost`).
    pub unpriced_jobs: u64,
    /// Amortised pools: productive GPU-hours / (capacity x window hours).
    pub useful_utilisation: Option<f64>,
    /// Waiting GPU-hours at the pool's price (an opportunity figure, not a bill).
    pub waiting_cost: Option<f64>,
    pub waiting_gpu_hours: f64,
}

/// The pools of one kind together.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct KindCost {
    /// Sum over the kind's priced pools.
    pub cost: f64,
    /// cost / productive GPU-hours of the priced pools.
    pub cost_per_useful_gpu_hour: Option<f64>,
    pub jobs: u64,
    pub pool_kind: &'static str,
    /// Productive GPU-hours of the priced pools.
    pub productive_gpu_hours: f64,
    /// Pools left out because nothing prices them.
    pub unpriced_pools: u64,
    pub waiting_cost: f64,
}

/// `GET /api/v1/chains`: chains that started in the window, newest first, and time to artifact by chain kind.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainList {
    pub as_of: String,
    /// Time to artifact of the complete chains of each kind (stage names in order, e.g. `train>evaluate`);
    /// exact order statistics (nearest rank).
    pub by_kind: Vec<ChainKind>,
    pub chains: Vec<ChainSummary>,
    /// Stages that complete a chain (`[chains] final_stages`; empty: every member done).
    pub final_stages: Vec<String>,
    /// Each `[[chain_slo]]`, over its own window (not the listing's).
    pub slos: Vec<ChainSloStatus>,
    /// Chains matched; `chains` holds at most 500 of them.
    pub total: u64,
    pub window_seconds: i64,
}

/// One chain SLO now: chains decided good and late in its window, open ones, error budget and burn rates.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainSloStatus {
    /// Chains decided late in the window (complete after the deadline, or open past it).
    pub bad: u64,
    /// Burn rate per alert rule: bad share over the long and short windows divided by the error budget.
    pub burn_rates: Vec<ChainBurn>,
    /// good / (good + bad); null when nothing was decided.
    pub compliance: Option<f64>,
    pub description: String,
    /// 1 - bad / (allowed bad); negative when overspent.
    pub error_budget_remaining: Option<f64>,
    pub good: u64,
    /// Open chains already past their deadline (each pages when the SLO pages).
    pub late_open: u64,
    pub name: String,
    pub objective: f64,
    pub page_on_breach: bool,
    /// Open chains, deadline ahead.
    pub pending: u64,
    pub threshold_seconds: i64,
    pub window_seconds: i64,
}

/// A chain SLO's burn over one alert rule's windows.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainBurn {
    pub factor: f64,
    pub long_burn_rate: f64,
    /// Chains decided in the long window.
    pub long_decided: u64,
    pub severity: String,
    pub short_burn_rate: f64,
    pub windows: String,
}

/// A chain against one chain SLO.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainVerdict {
    /// First submit + threshold.
    pub deadline: String,
    pub slo: String,
    /// `good`, `late` or `pending`.
    pub verdict: String,
}

/// Percentiles of time to artifact for one chain kind, seconds.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainKind {
    pub complete: u64,
    pub kind: String,
    pub max: Option<f64>,
    pub open: u64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

/// A chain in a listing.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainSummary {
    pub chain_id: String,
    pub complete: bool,
    /// The latest member's end (complete chains).
    pub ended_at: Option<String>,
    /// Time nobody ran anything for it, seconds.
    pub gap_seconds: f64,
    pub jobs: u64,
    pub kind: String,
    /// The chain SLOs that cover it and their verdicts.
    pub slos: Vec<ChainVerdict>,
    /// Time to artifact (complete) or so far (open), seconds.
    pub span_seconds: f64,
    pub started_at: String,
}

/// `GET /api/v1/chains/{chain_id}`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainDetail {
    pub as_of: String,
    /// From the first member to the member that ended last: its gap, wait and run add up to `span_seconds`
    /// (complete chains).
    pub critical_path: Vec<ChainStep>,
    /// Stretches with no member in existence.
    pub gaps: Vec<ChainGap>,
    pub members: Vec<ChainMember>,
    /// Per stage, in order of first submit.
    pub stages: Vec<ChainStage>,
    #[serde(flatten)]
    pub summary: ChainSummary,
}

/// One step of a critical path.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainStep {
    /// Since the previous step's end (the chain's start for the first step) until this job's submit.
    pub gap_before_seconds: f64,
    pub job_id: String,
    /// First step to end (or now).
    pub run_seconds: f64,
    pub stage: String,
    /// Submit to first step (or to its end if it never started).
    pub wait_seconds: f64,
}

/// Idle time inside a chain.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainGap {
    pub from: String,
    pub seconds: f64,
    pub to: String,
}

/// A member job.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainMember {
    pub done_at: Option<String>,
    pub first_step_at: Option<String>,
    pub job_id: String,
    pub stage: String,
    pub submitted_at: String,
    pub succeeded: bool,
}

/// A stage's jobs together.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ChainStage {
    pub first_submitted_at: String,
    pub jobs: u64,
    /// The stage's last end, when all its jobs ended.
    pub last_ended_at: Option<String>,
    /// Summed over its jobs: first step to end (or now).
    pub run_seconds: f64,
    pub stage: String,
    /// Summed over its jobs: submit to first step (or end, or now).
    pub wait_seconds: f64,
}

/// `GET /api/v1/alerts`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AlertList {
    pub alerts: Vec<Alert>,
}

/// One alert, firing or resolved.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Alert {
    pub annotations: BTreeMap<String, String>,
    pub key: String,
    pub labels: BTreeMap<String, String>,
    pub resolved_at: Option<String>,
    pub starts_at: String,
    /// `firing` or `resolved`.
    pub state: &'static str,
}

impl Alert {
    /// The API's view of an alert record.
    pub fn new(a: &crate::alert::AlertRecord) -> Alert {
        Alert {
            annotations: a.annotations.clone(),
            key: a.key.clone(),
            labels: a.labels.clone(),
            resolved_at: a.resolved_at_ms.map(format_ms),
            starts_at: format_ms(a.starts_at_ms),
            state: if a.firing() { "firing" } else { "resolved" },
        }
    }
}

/// `GET /api/v1/overview`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Overview {
    pub as_of: String,
    pub bucket_seconds: i64,
    /// When set (RFC 3339), jobs that ended before it were deleted to keep folded jobs within
    /// `store.folded_budget_mib`: counts over earlier times leave them out.
    pub history_deleted_through: Option<String>,
    pub jobs_by_state: BTreeMap<&'static str, u64>,
    /// Longest current wait per pool and priority, longest first.
    pub oldest_wait: Vec<OldestWait>,
    pub ttfs_by_pool: Vec<PoolTtfs>,
    pub ttfs_series: Vec<SeriesPoint>,
    pub waiting_by_segment: BTreeMap<String, i64>,
    pub waiting_total: i64,
    pub window_seconds: i64,
}

/// The longest current wait in one pool and priority.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OldestWait {
    pub pool: String,
    pub pool_kind: &'static str,
    pub priority: &'static str,
    pub provider: String,
    pub seconds: f64,
}

/// Time-to-first-step percentiles (seconds) of the jobs of one pool and priority that started in the window.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PoolTtfs {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub pool: String,
    pub pool_kind: String,
    pub priority: String,
    pub provider: String,
    pub started: usize,
}

/// p50 and p90 time to first step (seconds) of one pool kind's jobs that started in one bucket.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SeriesPoint {
    pub at: String,
    pub at_ms: i64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub pool_kind: String,
    pub started: usize,
}

/// `POST /api/v1/admin/reload`: what the reload loaded.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Reloaded {
    /// Identities now configured.
    pub identities: usize,
    /// Whether TLS certificates were reloaded.
    pub tls: bool,
    /// SLOs now in force, by name.
    pub slos: Vec<String>,
    /// Alert notifier targets now in force.
    pub notifiers: usize,
    /// Sections whose effective settings differ from those in force before (`slo`, `alerts`, `grpc`, ...).
    pub changed: Vec<String>,
    /// Changed sections that need a restart (`store`, `grpc`, `http`, `ingest`, `metrics`); kept as they were.
    pub restart_needed: Vec<String>,
}

/// `GET /api/v1/nodes`: the nodes with placements (or GPU health readings) in the window, one page of them, suspects
/// first. The instances of managed pools (fresh for each job) are summed up per pool in `pools` and listed only when
/// suspect or when `name` matches them.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodeList {
    pub as_of: String,
    /// Instances of grouped pools summed up in `pools` rather than listed (the filters do not apply to them).
    pub grouped_instances: u64,
    /// The page size asked for (`limit`, default 100).
    pub limit: u64,
    /// Where the next page starts (`offset`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// This page of the nodes matched: suspects first, then by p-value, pool and name.
    pub nodes: Vec<NodeRow>,
    /// The page's first node among those matched (`offset`, default 0).
    pub offset: u64,
    /// Per pool (`pool` filters them; `name` and `suspect` do not): nodes, placements, failure and loss rates.
    pub pools: Vec<NodePool>,
    pub rule: NodeRule,
    /// Nodes matched by the filters, over every page.
    pub total: u64,
    pub window_seconds: i64,
}

/// The suspect-node rule in force (`[nodes]`, docs/concepts.md, "Suspect nodes").
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodeRule {
    pub alpha: f64,
    pub ecc_corrected_threshold: u64,
    pub min_bad: u64,
    /// The rule in words.
    pub statement: String,
}

/// One pool's nodes together.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodePool {
    /// Bad (failed + lost) placements over placements.
    pub bad_rate: Option<f64>,
    pub bad: u64,
    /// Placements whose job failed there.
    pub failed: u64,
    /// `failed` over placements.
    pub failed_rate: Option<f64>,
    /// Whether the pool's nodes are one-off instances of a managed pool, summed up here and listed in `nodes` only
    /// when suspect (or when `name` matches them).
    pub grouped: bool,
    /// `managed` or `dedicated` as the jobs placed in the pool say; `unspecified` when they do not say or disagree.
    pub kind: &'static str,
    /// Placements lost with the node (`node_lost` naming it or no node).
    pub lost: u64,
    /// `lost` over placements.
    pub lost_rate: Option<f64>,
    /// Nodes (for a grouped pool: instances) with placements in the window.
    pub nodes: u64,
    pub placements: u64,
    pub pool: String,
    pub suspects: u64,
}

/// One node over the window.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodeRow {
    /// Failed plus lost placements.
    pub bad: u64,
    pub bad_rate: Option<f64>,
    pub cancelled: u64,
    pub failed: u64,
    /// Its GPU health in the window, when its agent reports it.
    pub health: Option<NodeHealthWindow>,
    /// `node_lost` naming it (or naming no node) while a job ran on it.
    pub lost: u64,
    pub node: String,
    /// Still running or preparing there.
    pub open: u64,
    /// `P[Binom(placements, pool_rate) >= bad]`.
    pub p_value: f64,
    /// Placements assigned in the window (a job counts once per node per stay).
    pub placements: u64,
    /// Empty for a node that only reported health.
    pub pool: String,
    /// Its pool's `kind` (see `NodePool`).
    pub pool_kind: &'static str,
    /// The rest of its pool's bad rate, smoothed: (bad elsewhere + 1) / (placements elsewhere + 2).
    pub pool_rate: f64,
    pub preempted: u64,
    /// Why it is suspect: `failure_rate`, `ecc_uncorrected`, `ecc_corrected`, `xid`.
    pub reasons: Vec<String>,
    /// Went back to the queue, restarted, or another node of the job was lost.
    pub requeued: u64,
    /// Placements that reached a first step.
    pub started: u64,
    /// Median seconds from assignment to first step.
    pub startup_p50_seconds: Option<f64>,
    pub succeeded: u64,
    pub suspect: bool,
    /// alpha / nodes of the pool.
    pub threshold: f64,
    pub timed_out: u64,
    /// Median time to first step of the jobs whose first run was here, seconds.
    pub time_to_first_step_p50_seconds: Option<f64>,
}

/// A node's GPU errors in the window (increases of the driver's cumulative counters).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodeHealthWindow {
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
    pub last_report: String,
    pub xid_errors: u64,
}

/// `GET /api/v1/nodes/{node}`: the node in each pool it served, with the jobs that failed or were lost on it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodeDetail {
    pub as_of: String,
    /// Failed and lost placements, newest first (at most 200).
    pub incidents: Vec<NodeIncident>,
    /// The latest GPU health reading, summed over its GPUs.
    pub latest_health: Option<NodeReading>,
    pub node: String,
    pub rows: Vec<NodeRow>,
    pub window_seconds: i64,
}

/// One job that failed or was lost on a node.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodeIncident {
    pub at: String,
    /// `failed` or `lost`.
    pub end: String,
    pub job_id: String,
    pub pool: String,
}

/// One health reading as reported (cumulative counters).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NodeReading {
    pub at: String,
    pub ecc_corrected_total: u64,
    pub ecc_uncorrected_total: u64,
    pub gpus: u32,
    pub xid_errors: u64,
}
