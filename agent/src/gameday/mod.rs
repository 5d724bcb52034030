//! `startline-agent gameday SCENARIO`: rehearses a failure against a collector and checks that Startline tells
//! the story that was injected. A small simulated fleet runs as background traffic ([`crate::simulate`]); the
//! scenario's own jobs (ids `gameday/<run>/<scenario>/<job>`) get scripted events, some sent before and some after
//! a disruption (waiting for a page, a kill -9 of the collector, an uplink outage through a real spool). At the
//! end every scenario job is explained from what the collector reports (its job detail; its job changes, SLO
//! decisions and alerts from the stream out, `StreamService.Subscribe`), each injected fact is checked, and the
//! report says which held. The scripts are in [`plan`]; the collector is either one the game day starts itself
//! ([`Spawned`], needed for `collector-restart`) or one given by address.

pub mod plan;

use crate::uplink::{Publisher, UplinkSettings};
use plan::{Disruption, Page, Plan, Scenario};
use serde_json::{json, Value};
use startline_proto::pb::{self, lifecycle_event::Kind, stream_record::Record};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why a game day could not run (a failed check is not an error: the report says it).
#[derive(Debug, thiserror::Error)]
pub enum GameDayError {
    /// Starting or reaching the collector failed.
    #[error("collector: {0}")]
    Collector(String),
    /// Publishing failed.
    #[error(transparent)]
    Uplink(#[from] crate::uplink::UplinkError),
    /// The HTTP API failed.
    #[error("API: {0}")]
    Api(String),
    /// Something did not happen in time (the collector never paged, never applied events).
    #[error("timed out: {0}")]
    Timeout(String),
}

/// A collector the game day started: its binary, data directory and ports (kept across restarts).
pub struct Spawned {
    bin: PathBuf,
    data_dir: PathBuf,
    child: Option<Child>,
    /// gRPC address.
    pub grpc: String,
    /// HTTP address.
    pub http: String,
}

impl Spawned {
    /// Starts `bin` on `data_dir` with free loopback ports and waits for its ready line.
    pub fn start(bin: PathBuf, data_dir: PathBuf) -> Result<Spawned, GameDayError> {
        let mut s = Spawned { bin, data_dir, child: None, grpc: "127.0.0.1:0".into(), http: "127.0.0.1:0".into() };
        s.launch()?;
        Ok(s)
    }

    fn launch(&mut self) -> Result<(), GameDayError> {
        let err = |e: String| GameDayError::Collector(e);
        let log = self.data_dir.with_extension("log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| err(format!("log file {}: {e}", log.display())))?;
        let mut child = Command::new(&self.bin)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--grpc-listen", &self.grpc, "--http-listen", &self.http])
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| err(format!("cannot start {}: {e}", self.bin.display())))?;
        let stdout = child.stdout.take().ok_or_else(|| err("no stdout".into()))?;
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                return Err(err(format!("exited before its ready line (log: {})", log.display())));
            };
            if let Some(rest) = line.strip_prefix("startline-collector ready ") {
                for part in rest.split_whitespace() {
                    if let Some(a) = part.strip_prefix("grpc=") {
                        self.grpc = a.to_string();
                    }
                    if let Some(a) = part.strip_prefix("http=") {
                        self.http = a.to_string();
                    }
                }
                std::thread::spawn(move || for _ in lines {});
                self.child = Some(child);
                return Ok(());
            }
        }
    }

    /// kill -9, then start again on the same data and ports.
    pub fn crash_and_restart(&mut self) -> Result<(), GameDayError> {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.launch()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }
}

/// Where the game day sends and reads.
pub struct Target {
    /// gRPC endpoint (`http://...`).
    pub grpc: String,
    /// HTTP API base (`http://...`).
    pub api: String,
    /// Bearer token for both, if any.
    pub token: Option<String>,
    /// Uplink settings (TLS, token) for the gRPC side, with the endpoint filled in per use.
    pub uplink: UplinkSettings,
    /// The collector the game day started, if it did.
    pub spawned: Option<Spawned>,
}

/// One scenario job's outcome in the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobReport {
    /// The job.
    pub job_id: String,
    /// What was injected.
    pub injected: String,
    /// The job's story as Startline tells it.
    pub explanation: Vec<String>,
    /// Each check: (what, expected, reported, held).
    pub checks: Vec<(String, String, String, bool)>,
}

/// A scenario's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// What it rehearses.
    pub description: String,
    /// Per job.
    pub jobs: Vec<JobReport>,
    /// Disruptions as they happened.
    pub timeline: Vec<String>,
    /// Whether every check held.
    pub passed: bool,
}

impl Report {
    /// Human-readable text.
    pub fn text(&self) -> String {
        let mut s = format!(
            "game day: {} — {}\n{}\n",
            self.scenario,
            self.description,
            if self.passed { "RESULT: what was injected is what Startline reports" } else { "RESULT: MISMATCH" }
        );
        for t in &self.timeline {
            s.push_str(&format!("  · {t}\n"));
        }
        for j in &self.jobs {
            s.push_str(&format!("\njob {}\n  injected: {}\n", j.job_id, j.injected));
            for e in &j.explanation {
                s.push_str(&format!("  {e}\n"));
            }
            for (what, want, got, ok) in &j.checks {
                s.push_str(&format!(
                    "  [{}] {what}: expected {want}, reported {got}\n",
                    if *ok { "ok" } else { "FAIL" }
                ));
            }
        }
        s
    }
}

fn submitted_for(spec: &plan::JobSpec) -> Kind {
    let (pool_kind, provider, pool, gpu) = if spec.managed {
        (pb::PoolKind::Managed, "vertex", "gameday-a3", "h100")
    } else {
        (pb::PoolKind::Dedicated, "slurm", "gameday-a100", "a100")
    };
    Kind::Submitted(pb::Submitted {
        pool_kind: pool_kind as i32,
        provider: provider.into(),
        pool: pool.into(),
        priority: if spec.urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
        gpu_class: gpu.into(),
        gpu_count: 8,
        node_count: 1,
        region: "gameday".into(),
        team: "gameday".into(),
        project: "rehearsal".into(),
        ..Default::default()
    })
}

/// The scenario's events of one phase, stamped from `now_ms`.
fn events(p: &Plan, prefix: &str, now_ms: i64, phase: u8) -> Vec<pb::LifecycleEvent> {
    p.steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.phase == phase)
        .map(|(i, s)| {
            let spec = &p.jobs[s.job];
            let kind = match &s.kind {
                Kind::Submitted(_) => submitted_for(spec),
                k => k.clone(),
            };
            pb::LifecycleEvent {
                event_id: format!("gd-{i}"),
                job_id: format!("{prefix}{}", spec.name),
                source: "startline-gameday".into(),
                occurred_at: Some(startline_proto::time::ms_to_timestamp(now_ms + (s.at_min * 60_000.0) as i64)),
                attempt: None,
                kind: Some(kind),
            }
        })
        .collect()
}

/// The stream records of the run's jobs, collected by a task that resumes after its last cursor.
#[derive(Default, Clone)]
struct Tap(Arc<Mutex<Vec<pb::StreamRecord>>>);

impl Tap {
    fn records(&self) -> Vec<pb::StreamRecord> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn follow(
        self,
        mut up: Publisher,
        prefix: String,
        after: Option<u64>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut last = after;
        loop {
            if stop.is_cancelled() {
                return;
            }
            let req = pb::SubscribeRequest { after_cursor: last, job_id_prefix: prefix.clone(), ..Default::default() };
            let mut s = match up.subscribe(req).await {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            loop {
                let msg = tokio::select! {
                    m = s.message() => m,
                    _ = stop.cancelled() => return,
                };
                match msg {
                    Ok(Some(r)) => {
                        last = Some(r.cursor);
                        if !matches!(r.record, Some(Record::Progress(_))) {
                            self.0.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                        }
                    }
                    _ => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// HTTP GET of an API path as JSON.
async fn api_get(http: &reqwest::Client, t: &Target, path: &str) -> Result<(u16, Value), GameDayError> {
    let mut req = http.get(format!("{}{path}", t.api));
    if let Some(tok) = &t.token {
        req = req.bearer_auth(tok);
    }
    let resp = req.send().await.map_err(|e| GameDayError::Api(format!("GET {path}: {e}")))?;
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.map_err(|e| GameDayError::Api(format!("GET {path}: {e}")))?;
    Ok((status, body))
}

fn publisher(t: &Target) -> Result<Publisher, GameDayError> {
    let mut s = t.uplink.clone();
    s.endpoint = t.grpc.clone();
    s.give_up_after = Some(Duration::from_secs(30));
    s.retry_auth_failures = false;
    Ok(Publisher::new(s)?)
}

async fn publish(t: &Target, events: Vec<pb::LifecycleEvent>) -> Result<crate::uplink::Totals, GameDayError> {
    let mut up = publisher(t)?;
    up.send(events).await?;
    up.flush().await?;
    Ok(up.totals().clone())
}

fn is_page(r: &pb::StreamRecord, job_id: &str, firing: bool) -> bool {
    matches!(&r.record, Some(Record::Alert(a))
        if a.labels.get("alertname").map(String::as_str) == Some("StartlineJobStartBreach")
            && a.labels.get("job_id").map(String::as_str) == Some(job_id)
            && (a.status == "firing") == firing)
}

fn hms(secs: f64) -> String {
    let s = secs.round() as i64;
    if s >= 3600 {
        format!("{}h{:02}m{:02}s", s / 3600, s % 3600 / 60, s % 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

fn at_text(r: &pb::StreamRecord, run_start_ms: i64) -> String {
    let ms = r.recorded_at.as_ref().map_or(0, startline_proto::time::timestamp_to_ms);
    format!("{:+.1}s into the run (cursor {})", (ms - run_start_ms) as f64 / 1000.0, r.cursor)
}

/// Runs one scenario: background fleet, phases, disruptions, then the report.
pub async fn run(
    scenario: Scenario,
    target: &mut Target,
    background_jobs: u64,
    seed: u64,
) -> Result<Report, GameDayError> {
    let p = plan::plan(scenario);
    if p.disruptions.contains(&Disruption::RestartCollector) && target.spawned.is_none() {
        return Err(GameDayError::Collector(format!(
            "{} needs a collector the game day starts itself (leave out --api)",
            scenario.name()
        )));
    }
    let run_id = format!("{:x}", startline_proto::time::now_ms());
    let prefix = format!("gameday/{run_id}/{}/", scenario.name());
    let now_ms = startline_proto::time::now_ms();
    let mut timeline = Vec::new();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| GameDayError::Api(e.to_string()))?;

    // Follow the stream out for the run's jobs from now on.
    let stop_tap = tokio_util::sync::CancellationToken::new();
    let tap = Tap::default();
    let tap_task = tokio::spawn(tap.clone().follow(publisher(target)?, prefix.clone(), None, stop_tap.clone()));
    // The tap must be subscribed before anything is sent: wait for the collector to count it.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Background: a small simulated fleet (its own job ids), so the scenario runs among ordinary traffic.
    if background_jobs > 0 {
        let settings = crate::simulate::SimSettings {
            seed,
            history: Duration::from_secs(3600),
            jobs: Some(background_jobs),
            jobs_per_hour: background_jobs as f64,
            speedup: 0.0,
            rate: 0.0,
            follow: false,
            disorder: 0.02,
            duplicates: 0.02,
            batch_size: 500,
            end_ms: Some(now_ms),
            pools: 0,
            gpu_classes: 0,
            chains: 0.0,
            crunch: false,
            backfill: true,
        };
        let mut up = publisher(target)?;
        let r = crate::simulate::run(settings, &mut up, tokio_util::sync::CancellationToken::new()).await?;
        timeline.push(format!("background: {} simulated jobs, {} events sent", r.jobs, r.events_sent));
    }

    let phase0 = events(&p, &prefix, now_ms, 0);
    let phase1 = events(&p, &prefix, now_ms, 1);
    let outage = p.disruptions.contains(&Disruption::UplinkOutage);
    if !outage {
        let t = publish(target, phase0.clone()).await?;
        timeline.push(format!("phase 1: {} scenario events sent, {} accepted", phase0.len(), t.accepted));
    }
    for d in &p.disruptions {
        match *d {
            Disruption::AwaitPage(j) => {
                let job_id = format!("{prefix}{}", p.jobs[j].name);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                loop {
                    if let Some(r) = tap.records().iter().find(|r| is_page(r, &job_id, true)) {
                        timeline
                            .push(format!("page StartlineJobStartBreach for {job_id} raised {}", at_text(r, now_ms)));
                        break;
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(GameDayError::Timeout(format!("no page for {job_id} within 60 s")));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Disruption::RestartCollector => {
                let Some(sp) = target.spawned.as_mut() else {
                    return Err(GameDayError::Collector(
                        "collector-restart needs a collector the game day starts itself (leave out --api)".into(),
                    ));
                };
                sp.crash_and_restart()?;
                timeline.push("collector killed (kill -9) and restarted on the same data".into());
                let t = publish(target, phase0.clone()).await?;
                timeline.push(format!(
                    "phase 1 sent again after the restart: {} accepted, {} duplicates",
                    t.accepted, t.duplicates
                ));
                if t.accepted != 0 || t.duplicates != phase0.len() as u64 {
                    timeline.push("MISMATCH: redelivered events must all be duplicates".into());
                }
            }
            Disruption::UplinkOutage => {
                let dir = std::env::temp_dir().join(format!("startline-gameday-spool-{run_id}"));
                let spool = crate::spool::Spool::open(&dir, crate::spool::SpoolLimits::default())
                    .map_err(|e| GameDayError::Collector(format!("spool: {e}")))?;
                spool.append(&phase0).map_err(|e| GameDayError::Collector(format!("spool: {e}")))?;
                timeline.push(format!("uplink down: {} events held in the node agent's spool", spool.len()));
                tokio::time::sleep(Duration::from_secs(2)).await;
                let stop = tokio_util::sync::CancellationToken::new();
                let task = tokio::spawn(crate::uplink::delivery::deliver(
                    spool.clone(),
                    vec![(target.grpc.clone(), publisher(target)?)],
                    500,
                    stop.clone(),
                    None,
                ));
                let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                while !spool.is_empty() {
                    if tokio::time::Instant::now() > deadline {
                        return Err(GameDayError::Timeout("the spool did not drain within 60 s".into()));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                stop.cancel();
                let _ = task.await;
                drop(spool);
                let _ = std::fs::remove_dir_all(&dir);
                timeline.push("uplink back: the spool delivered everything".into());
                for e in &p.expect {
                    if e.page == Page::WhileWaitingThenResolved {
                        let job_id = format!("{prefix}{}", p.jobs[e.job].name);
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                        while !tap.records().iter().any(|r| is_page(r, &job_id, true)) {
                            if tokio::time::Instant::now() > deadline {
                                return Err(GameDayError::Timeout(format!("no page for {job_id} within 60 s")));
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        }
    }
    if !phase1.is_empty() {
        let t = publish(target, phase1.clone()).await?;
        timeline.push(format!("phase 2: {} scenario events sent, {} accepted", phase1.len(), t.accepted));
    }
    // Let the pages resolve and the stream catch up: every job with a page expectation of "resolved" must see it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let recs = tap.records();
        let pending = p.expect.iter().any(|e| {
            let id = format!("{prefix}{}", p.jobs[e.job].name);
            e.page == Page::WhileWaitingThenResolved && !recs.iter().any(|r| is_page(r, &id, false))
        });
        if !pending || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tap.cancel();
    let _ = tap_task.await;
    let recs = tap.records();

    let mut jobs = Vec::new();
    for e in &p.expect {
        let spec = &p.jobs[e.job];
        let job_id = format!("{prefix}{}", spec.name);
        let (status, detail) = api_get(&http, target, &format!("/api/v1/jobs/{job_id}")).await?;
        if status != 200 {
            return Err(GameDayError::Api(format!("job {job_id}: HTTP {status}: {detail}")));
        }
        jobs.push(judge(e, spec, &job_id, &detail, &recs, now_ms));
    }
    let passed =
        jobs.iter().all(|j| j.checks.iter().all(|c| c.3)) && !timeline.iter().any(|t| t.starts_with("MISMATCH"));
    Ok(Report { scenario: scenario.name().into(), description: scenario.describe().into(), jobs, timeline, passed })
}

/// Explains one job from its detail and its stream records, and checks each injected fact.
fn judge(
    e: &plan::Expect,
    spec: &plan::JobSpec,
    job_id: &str,
    d: &Value,
    recs: &[pb::StreamRecord],
    run_start_ms: i64,
) -> JobReport {
    let mut checks = Vec::new();
    let mut check = |what: &str, want: String, got: String, ok: bool| checks.push((what.to_string(), want, got, ok));
    let str_of = |v: &Value| v.as_str().unwrap_or("none").to_string();
    let state = str_of(&d["state"]);
    check("state", e.state.into(), state.clone(), state == e.state);
    if let Some(o) = e.outcome {
        let got = str_of(&d["outcome"]);
        check("outcome", o.into(), got.clone(), got == o);
    }
    let tl = &d["timeline"];
    for (field, want) in &e.figures {
        let got = match *field {
            "events" => d["events"].as_array().map(|a| a.len() as f64),
            "time_to_first_step_seconds" => d[field].as_f64(),
            f => tl[f].as_f64(),
        };
        let ok = got.is_some_and(|g| (g - want).abs() <= 1.0);
        check(field, format!("{want}"), got.map_or("none".into(), |g| format!("{g}")), ok);
    }
    if let Some((seg, min)) = e.segment {
        let got = tl["initial_wait_seconds"][seg].as_f64().unwrap_or(0.0);
        check(&format!("time in {seg}"), format!(">= {}", hms(min)), hms(got), got >= min);
    }
    let events = d["events"].as_array().cloned().unwrap_or_default();
    let last =
        events.iter().max_by_key(|ev| (ev["occurred_at"].as_str().unwrap_or("").to_string(), ev["seq"].as_u64()));
    if let Some(m) = e.last_message {
        let got = last.map(|ev| ev["detail"]["message"].as_str().unwrap_or("").to_string()).unwrap_or_default();
        check("last event's message", format!("contains {m:?}"), format!("{got:?}"), got.contains(m));
    }
    // From the stream: SLO decisions and pages.
    let mine: Vec<&pb::StreamRecord> = recs.iter().filter(|r| r.job_id == job_id).collect();
    // The last decision: a decision can be revised when late events arrive (a wait judged past the deadline
    // before the delivered first step showed it started in time).
    let decision = mine.iter().rev().find_map(|r| match &r.record {
        Some(Record::Change(c)) => c.slo_decisions.iter().find(|x| Some(x.slo.as_str()) == e.slo.map(|s| s.0)).cloned(),
        _ => None,
    });
    if let Some((slo, verdict)) = e.slo {
        let got = decision.as_ref().map_or("undecided".to_string(), |x| x.verdict.clone());
        check(&format!("SLO {slo}"), verdict.into(), got.clone(), got == verdict);
    }
    let fired = mine.iter().find(|r| is_page(r, job_id, true));
    let resolved = mine.iter().find(|r| is_page(r, job_id, false));
    // The change where the job stopped waiting (started or ended).
    let stopped_waiting =
        mine.iter().find(|r| matches!(&r.record, Some(Record::Change(c)) if c.state == "running" || c.state == "done"));
    match e.page {
        Page::Never => check(
            "page StartlineJobStartBreach",
            "never".into(),
            if fired.is_some() { "raised" } else { "never" }.into(),
            fired.is_none(),
        ),
        Page::WhileWaitingThenResolved => {
            let while_waiting = match (fired, stopped_waiting) {
                (Some(f), Some(s)) => f.cursor < s.cursor,
                (Some(_), None) => true,
                _ => false,
            };
            let got = match (fired, resolved) {
                (Some(_), Some(_)) if while_waiting => "raised while waiting, then resolved",
                (Some(_), Some(_)) => "raised after the job stopped waiting",
                (Some(_), None) => "raised, never resolved",
                _ => "never raised",
            };
            check(
                "page StartlineJobStartBreach",
                "raised while waiting, then resolved".into(),
                got.into(),
                got == "raised while waiting, then resolved",
            );
        }
    }

    // The story.
    let mut explanation = Vec::new();
    let outcome = d["outcome"].as_str();
    if let Some(ev) = last {
        let msg =
            ev["detail"]["message"].as_str().filter(|m| !m.is_empty()).map(|m| format!(": {m:?}")).unwrap_or_default();
        explanation.push(format!(
            "final status: {state}{} — last event `{}` (seq {}) at {}{msg}",
            outcome.map(|o| format!(" ({o})")).unwrap_or_default(),
            ev["kind"].as_str().unwrap_or("?"),
            ev["seq"],
            ev["occurred_at"].as_str().unwrap_or("?"),
        ));
    }
    if let Some(w) = tl["initial_wait_seconds"].as_object() {
        let mut parts: Vec<(String, f64)> = w.iter().filter_map(|(k, v)| v.as_f64().map(|s| (k.clone(), s))).collect();
        parts.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = parts.iter().map(|p| p.1).sum();
        let list: Vec<String> = parts.iter().map(|(k, s)| format!("{k} {}", hms(*s))).collect();
        match d["time_to_first_step_seconds"].as_f64() {
            Some(t) => explanation.push(format!("started after {} ({})", hms(t), list.join(", "))),
            None => explanation.push(format!("never started: waited {} ({})", hms(total), list.join(", "))),
        }
    }
    let f = |k: &str| tl[k].as_f64().unwrap_or(0.0);
    let mut lost = Vec::new();
    if f("node_losses") > 0.0 {
        lost.push(format!("{} node loss(es)", f("node_losses")));
    }
    if f("preemptions") > 0.0 {
        lost.push(format!("{} preemption(s)", f("preemptions")));
    }
    if f("attempts") > 1.0 {
        lost.push(format!("{} attempts", f("attempts")));
    }
    if f("lost_work_seconds") > 0.0 {
        lost.push(format!("work lost {} ({} steps)", hms(f("lost_work_seconds")), f("lost_steps")));
    }
    if f("failed_work_seconds") > 0.0 {
        lost.push(format!("work lost to the failure {}", hms(f("failed_work_seconds"))));
    }
    if f("requeue_wait_seconds") > 0.0 {
        lost.push(format!("waited again {}", hms(f("requeue_wait_seconds"))));
    }
    explanation.push(if lost.is_empty() { "no work lost".into() } else { lost.join("; ") });
    match &decision {
        Some(x) => explanation.push(format!(
            "SLO {}: {}{}",
            x.slo,
            x.verdict,
            x.time_to_first_step_seconds.map(|t| format!(" (time to first step {})", hms(t))).unwrap_or_default()
        )),
        None => explanation.push("no start-SLO decision in the stream".into()),
    }
    let alerts: Vec<String> = mine
        .iter()
        .filter_map(|r| match &r.record {
            Some(Record::Alert(a)) => Some(format!(
                "{} {} {}",
                a.labels.get("alertname").map(String::as_str).unwrap_or("?"),
                a.status,
                at_text(r, run_start_ms)
            )),
            _ => None,
        })
        .collect();
    explanation.push(if alerts.is_empty() { "alerts: none".into() } else { format!("alerts: {}", alerts.join("; ")) });
    let changes: Vec<String> = mine
        .iter()
        .filter_map(|r| match &r.record {
            Some(Record::Change(c)) if c.previous_state != c.state => {
                Some(format!("{}->{}", if c.previous_state.is_empty() { "new" } else { &c.previous_state }, c.state))
            }
            _ => None,
        })
        .collect();
    explanation.push(format!("state changes (stream): {}", changes.join(", ")));
    JobReport { job_id: job_id.into(), injected: spec.injected.into(), explanation, checks }
}

/// The report as JSON.
pub fn to_json(reports: &[Report]) -> Value {
    json!({ "passed": reports.iter().all(|r| r.passed), "scenarios": reports })
}
