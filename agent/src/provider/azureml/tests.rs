//! Azure ML adapter tests over payloads in the documented ARM (2024-04-01) and run-history shapes.

use super::*;

fn job_json() -> Value {
    serde_json::from_str(include_str!("../fixtures/azureml-job-command.json")).expect("json")
}

fn run_json() -> Value {
    serde_json::from_str(include_str!("../fixtures/azureml-run-history.json")).expect("json")
}

fn mapping() -> Mapping {
    Mapping {
        resource_group: "ml-rg".into(),
        workspace: "ml-ws".into(),
        region: "westeurope".into(),
        urgent_prefixes: Vec::new(),
        gpus: GpuTable::default(),
    }
}

fn with_status(status: &str) -> AzureJob {
    let mut v = job_json();
    v["properties"]["status"] = status.into();
    parse_job(&v).expect("job")
}

fn at(e: &pb::LifecycleEvent) -> i64 {
    startline_proto::time::timestamp_to_ms(e.occurred_at.as_ref().expect("time"))
}

fn kinds(evs: &[pb::LifecycleEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| match e.kind.as_ref() {
            Some(Kind::Submitted(_)) => "submitted".into(),
            Some(Kind::Queued(q)) => format!("queued:{}", q.raw_reason),
            Some(Kind::Preparing(p)) => format!("preparing:{:?}", p.phase()),
            Some(Kind::FirstStep(_)) => "first_step".into(),
            Some(Kind::Done(d)) => format!("done:{:?}", d.outcome()),
            _ => "other".into(),
        })
        .collect()
}

const CREATED: i64 = 1_796_025_600_123; // 2026-11-30T08:00:00.1234567Z, to the millisecond
const VM: &str = "STANDARD_ND96ISR_H100_V5";

#[test]
fn the_documented_resource_and_run_parse() {
    let j = parse_job(&job_json()).expect("job");
    assert_eq!(j.name, "llm-sft-7f3a9c21");
    assert_eq!((j.status.as_str(), j.job_type.as_str(), j.compute.as_str()), ("Completed", "Command", "h100-cluster"));
    assert_eq!((j.created_ms, j.instance_count), (CREATED, 2));
    assert_eq!(j.tags.get("team").map(String::as_str), Some("nlp"));
    let r = parse_run(&run_json());
    assert_eq!(r.start_ms, Some(1_796_028_075_250));
    assert_eq!(r.end_ms, Some(1_796_034_657_350));
    assert_eq!(r.error, "");
    let failed = parse_run(&serde_json::json!({"status": "Failed", "startTimeUtc": "2026-11-30T08:41:15.250Z",
        "endTimeUtc": "2026-11-30T08:45:00Z",
        "error": {"error": {"code": "UserError", "message": "Execution failed. User process 'python' exited with status code 1."}}}));
    assert!(failed.error.starts_with("Execution failed"));
}

/// Polls see NotStarted, Starting, Preparing, Queued, Running, Completed in Azure's order; transitions seen at
/// a poll are dated at it, the start and end from the run history.
#[test]
fn a_job_followed_through_every_status_in_azures_order() {
    let m = mapping();
    let mut mem = JobMemory::default();
    let mut all = Vec::new();
    let polls = [
        ("NotStarted", CREATED + 1_000),
        ("Starting", CREATED + 30_000),
        ("Preparing", CREATED + 60_000),
        ("Queued", CREATED + 600_000),
        ("Running", CREATED + 2_500_000),
        ("Completed", CREATED + 9_100_000),
    ];
    let run = parse_run(&run_json());
    for (status, now) in polls {
        let j = with_status(status);
        let history = matches!(status, "Running" | "Completed").then_some(&run);
        let (evs, next) = diff(&m, &j, VM, history, &mem, now);
        mem = next;
        all.extend(evs);
    }
    assert_eq!(
        kinds(&all),
        ["submitted", "preparing:Other", "preparing:ImagePull", "queued:Queued", "first_step", "done:Succeeded"]
    );
    let times: Vec<i64> = all.iter().map(at).collect();
    assert_eq!(
        times,
        [CREATED, CREATED + 30_000, CREATED + 60_000, CREATED + 600_000, 1_796_028_075_250, 1_796_034_657_350]
    );
    let Some(Kind::Submitted(s)) = &all[0].kind else { panic!("submitted") };
    assert_eq!((s.gpu_count, s.node_count, s.gpu_class.as_str()), (16, 2, "h100"), "2 x ND96isr_H100_v5");
    assert_eq!((s.pool.as_str(), s.team.as_str(), s.project.as_str()), ("h100-cluster", "nlp", "assistant"));
    assert_eq!(s.priority(), pb::PriorityClass::Urgent, "tag startline-priority=urgent");
    assert_eq!(all[0].job_id, "azureml/ml-rg/ml-ws/llm-sft-7f3a9c21");
    let Some(Kind::Queued(q)) = &all[3].kind else { panic!("queued") };
    assert!(q.message.ends_with("(time: poll)"), "{}", q.message);
    let Some(Kind::Done(d)) = &all[5].kind else { panic!("done") };
    assert!(d.message.ends_with("(time: run history)"), "{}", d.message);
    assert!(mem.done);
    for e in &all {
        startline_proto::validate::validate_event(e, i64::MAX / 4, &Default::default()).expect("valid");
    }
    assert!(
        diff(&m, &with_status("Completed"), VM, Some(&run), &mem, CREATED + 9_999_999).0.is_empty(),
        "nothing twice"
    );
}

/// ARM writes `+00:00` and seven fractional digits; any other offset is honoured too (it used to be cut off,
/// so `+02:00` was read two hours late and `-05:00` did not parse, losing the job).
#[test]
fn offset_times_in_the_resource_and_the_run_history_are_dated_in_utc() {
    let mut v = job_json();
    v["systemData"]["createdAt"] = "2026-11-30T10:00:00.1234567+02:00".into();
    v["systemData"]["lastModifiedAt"] = "2026-11-30T05:30:57.350-05:00".into();
    let j = parse_job(&v).expect("a -05:00 or +02:00 time parses");
    assert_eq!(j.created_ms, CREATED, "10:00:00.1234567+02:00 is 08:00:00.123 UTC");
    assert_eq!(j.modified_ms, Some(1_796_034_657_350), "05:30:57.350-05:00 is 10:30:57.350 UTC");
    // `date -u -d 2026-11-30T08:41:15.250Z +%s%3N` and `date -u -d 2026-11-30T10:30:57.350Z +%s%3N`.
    let r = parse_run(&serde_json::json!({"status": "Completed", "startTimeUtc": "2026-11-30T03:41:15.250-05:00",
        "endTimeUtc": "2026-11-30T12:30:57.3504321+02:00"}));
    assert_eq!((r.start_ms, r.end_ms), (Some(1_796_028_075_250), Some(1_796_034_657_350)));
    let (evs, _) = diff(&mapping(), &j, VM, Some(&r), &JobMemory::default(), CREATED + 9_100_000);
    assert_eq!(kinds(&evs), ["submitted", "first_step", "done:Succeeded"]);
    assert_eq!(evs.iter().map(at).collect::<Vec<_>>(), [CREATED, 1_796_028_075_250, 1_796_034_657_350]);
}

#[test]
fn first_sight_dates_a_wait_at_submit_and_a_run_without_history_at_the_poll() {
    let m = mapping();
    let (evs, _) = diff(&m, &with_status("Queued"), VM, None, &JobMemory::default(), CREATED + 500_000);
    assert_eq!(kinds(&evs), ["submitted", "queued:Queued"]);
    assert_eq!(at(&evs[1]), CREATED, "the first state seen began no later than submit");
    let (evs, _) = diff(&m, &with_status("Running"), VM, None, &JobMemory::default(), CREATED + 500_000);
    assert_eq!(kinds(&evs), ["submitted", "first_step"]);
    assert_eq!(at(&evs[1]), CREATED + 500_000, "no history: dated at the poll, never at submit");
}

#[test]
fn failures_keep_the_run_history_message_and_a_cancel_before_start_has_no_first_step() {
    let m = mapping();
    let run = parse_run(&serde_json::json!({"status": "Failed", "startTimeUtc": "2026-11-30T08:41:15.250Z",
        "endTimeUtc": "2026-11-30T08:45:00Z",
        "error": {"error": {"code": "UserError", "message": "Execution failed.\nUser process 'python' exited with status code 1."}}}));
    let (evs, mem) = diff(&m, &with_status("Failed"), VM, Some(&run), &JobMemory::default(), CREATED + 3_600_000);
    assert_eq!(kinds(&evs), ["submitted", "first_step", "done:Failed"]);
    let Some(Kind::Done(d)) = &evs[2].kind else { panic!("done") };
    assert!(d.message.starts_with("Execution failed. User process"), "newline made a space: {}", d.message);
    assert!(mem.done);
    for e in &evs {
        startline_proto::validate::validate_event(e, i64::MAX / 4, &Default::default()).expect("valid");
    }
    let (evs, _) = diff(&m, &with_status("Canceled"), VM, None, &JobMemory::default(), CREATED + 60_000);
    assert_eq!(kinds(&evs), ["submitted", "done:Cancelled"]);
    let Some(Kind::Done(d)) = &evs[1].kind else { panic!("done") };
    assert_eq!(d.message, "azure Canceled (time: poll)");
}

#[test]
fn serverless_instance_types_count_and_unknown_sizes_are_flagged() {
    let m = mapping();
    let mut v = job_json();
    v["properties"]["computeId"] = Value::Null;
    v["properties"]["resources"] = serde_json::json!({"instanceCount": 4, "instanceType": "Standard_NC24ads_A100_v4"});
    let j = parse_job(&v).expect("job");
    assert_eq!(j.compute, "");
    assert_eq!(gpus(&m, &j, &j.instance_type), (4, "a100-80g".to_string(), false));
    let (evs, _) = diff(&m, &j, &j.instance_type, None, &JobMemory::default(), CREATED);
    let Some(Kind::Submitted(s)) = &evs[0].kind else { panic!("submitted") };
    assert_eq!(s.pool, "serverless");
    assert_eq!(gpus(&m, &j, "Standard_ND96isr_B300_v7"), (0, String::new(), true));
    assert_eq!(gpus(&m, &j, "Standard_D16s_v5"), (0, String::new(), false));
}

#[test]
fn form_bodies_are_url_encoded() {
    assert_eq!(
        form(&[("a b", "x/y=z&"), ("scope", "https://management.azure.com/.default")]),
        "a+b=x%2Fy%3Dz%26&scope=https%3A%2F%2Fmanagement.azure.com%2F.default"
    );
}

/// A fixture of `tests/fixtures/azureml/` (shapes from Azure's REST API specs and the azure-ai-ml SDK's test
/// configurations; see the README there).
fn shared_fixture(name: &str) -> Value {
    let text = match name {
        "job-command-system-tags.json" => {
            include_str!("../../../../tests/fixtures/azureml/job-command-system-tags.json")
        }
        "job-pipeline.json" => include_str!("../../../../tests/fixtures/azureml/job-pipeline.json"),
        "run-history-rerun.json" => include_str!("../../../../tests/fixtures/azureml/run-history-rerun.json"),
        other => panic!("no fixture {other}"),
    };
    serde_json::from_str(text).expect("json")
}

fn valid(e: &pb::LifecycleEvent) -> Result<(), startline_proto::validate::FieldError> {
    startline_proto::validate::validate_event(e, i64::MAX / 4, &Default::default())
}

/// Azure puts its own tags on jobs (`_aml_system_ComputeTargetStatus`, capitals and all) and users may use any
/// key: the job's `submitted` used to carry them as label keys and the collector refused it, so the job never
/// appeared. Keys are mapped onto the collector's rule or dropped with a count.
#[test]
fn tags_with_capitals_or_any_character_never_cost_the_job_its_submitted() {
    let j = parse_job(&shared_fixture("job-command-system-tags.json")).expect("job");
    let (evs, _) = diff(&mapping(), &j, "", None, &JobMemory::default(), j.created_ms + 60_000);
    assert_eq!(kinds(&evs), ["submitted", "first_step", "done:Succeeded"]);
    for e in &evs {
        valid(e).unwrap_or_else(|err| panic!("{err:?}: {e:?}"));
    }
    let Some(Kind::Submitted(s)) = &evs[0].kind else { panic!("submitted") };
    assert!(s.labels.get("_aml_system_computetargetstatus").is_some_and(|v| v.contains("AllocationState")));
    assert_eq!(s.labels.get("experiment").map(String::as_str), Some("Default"));

    // Many tags, odd keys, a team with an invisible character: still one valid submitted, the surplus counted.
    let mut v = shared_fixture("job-command-system-tags.json");
    for i in 0..20 {
        v["properties"]["tags"][format!("Tag {i}")] = "x".into();
    }
    v["properties"]["tags"]["日本"] = "y".into();
    v["properties"]["tags"]["team"] = "nlp\u{200B}".into();
    let j = parse_job(&v).expect("job");
    let (evs, _) = diff(&mapping(), &j, "", None, &JobMemory::default(), j.created_ms + 60_000);
    valid(&evs[0]).expect("valid submitted");
    let Some(Kind::Submitted(s)) = &evs[0].kind else { panic!("submitted") };
    assert_eq!(s.team, "nlp");
    assert!(s.labels.len() <= 16);
    // 22 tags besides team: 13 kept, 9 dropped (the unmappable key among them).
    assert_eq!(s.labels.get(super::super::TAGS_DROPPED_LABEL).map(String::as_str), Some("9"));
}

/// `Paused` (Azure's JobStatus: the job is paused) is not a start: a job paused before it ran used to get its
/// first step at that poll, ending its wait early. It is a hold until it runs.
#[test]
fn paused_is_not_the_first_step() {
    let m = mapping();
    let mut mem = JobMemory::default();
    let mut all = Vec::new();
    for (status, now) in [("Queued", CREATED + 60_000), ("Paused", CREATED + 120_000), ("Paused", CREATED + 180_000)] {
        let (evs, next) = diff(&m, &with_status(status), VM, None, &mem, now);
        all.extend(evs);
        mem = next;
    }
    assert_eq!(kinds(&all), ["submitted", "queued:Queued", "queued:Paused"]);
    let Some(Kind::Queued(q)) = &all[2].kind else { panic!("queued") };
    assert_eq!(q.reason(), pb::WaitReason::DependencyOrHold);
    // Resumed and running: the first step, at the run history's start.
    let run = parse_run(&run_json());
    let (evs, _) = diff(&m, &with_status("Running"), VM, Some(&run), &mem, CREATED + 9_000_000);
    assert_eq!(kinds(&evs), ["first_step"]);
    assert_eq!(at(&evs[0]), 1_796_028_075_250);
    // First seen paused, never started: no first step either.
    let (evs, _) = diff(&m, &with_status("Paused"), VM, None, &JobMemory::default(), CREATED + 60_000);
    assert_eq!(kinds(&evs), ["submitted", "queued:Paused"]);
}

fn preempted_count(evs: &[pb::LifecycleEvent]) -> (usize, usize) {
    let n = |f: fn(&Kind) -> bool| evs.iter().filter(|e| e.kind.as_ref().is_some_and(f)).count();
    (n(|k| matches!(k, Kind::Preempted(_))), n(|k| matches!(k, Kind::Requeued(_))))
}

/// A job on low-priority nodes goes Running -> Queued -> Running when Azure takes its nodes back and requeues
/// it. The adapter used to see nothing (each status was reported once per job): now the stop is a preemption
/// and a requeue, and the second run has its own wait and first step (at the run history's `lastStartTimeUtc`).
#[test]
fn a_low_priority_job_requeued_after_running_is_preempted_and_requeued() {
    let m = mapping();
    let start1 = CREATED + 600_000;
    let start2 = CREATED + 3_000_000;
    let end = CREATED + 5_000_000;
    let first = RunTimes { start_ms: Some(start1), last_start_ms: Some(start1), ..Default::default() };
    // The run history's shape (`startTimeUtc` the first run, `lastStartTimeUtc` the latest).
    let rerun = parse_run(&shared_fixture("run-history-rerun.json"));
    assert_eq!(
        (rerun.start_ms, rerun.last_start_ms, rerun.end_ms),
        (Some(CREATED + 600_000), Some(CREATED + 3_000_000), None)
    );
    let second = rerun;
    let done =
        RunTimes { start_ms: Some(start1), last_start_ms: Some(start2), end_ms: Some(end), ..Default::default() };
    let polls: [(&str, i64, Option<&RunTimes>); 6] = [
        ("Queued", CREATED + 30_000, None),
        ("Running", CREATED + 900_000, Some(&first)),
        ("Queued", CREATED + 2_000_000, None),
        ("Queued", CREATED + 2_100_000, None),
        ("Running", CREATED + 3_100_000, Some(&second)),
        ("Completed", CREATED + 5_100_000, Some(&done)),
    ];
    let mut mem = JobMemory::default();
    let mut all = Vec::new();
    for (status, now, run) in polls {
        let mut j = with_status(status);
        j.modified_ms = None;
        let (evs, next) = diff(&m, &j, VM, run, &mem, now);
        all.extend(evs);
        mem = next;
    }
    assert_eq!(
        kinds(&all),
        ["submitted", "queued:Queued", "first_step", "other", "other", "queued:Queued", "first_step", "done:Succeeded"]
    );
    assert_eq!(preempted_count(&all), (1, 1));
    let times: Vec<i64> = all.iter().map(at).collect();
    assert_eq!(times[2], start1);
    assert_eq!((times[3], times[4], times[5]), (CREATED + 2_000_000, CREATED + 2_000_000, CREATED + 2_000_000));
    assert_eq!(times[6], start2, "the second run's start from lastStartTimeUtc");
    assert_eq!(times[7], end);
    let ids: std::collections::BTreeSet<&str> = all.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), all.len(), "each transition its own id");
    assert_eq!(mem.restarts, 1);
    for e in &all {
        valid(e).expect("valid");
    }
}

/// A local ARM replay: the job list in two pages, the second answered `page2_delay` late; every token request
/// counted.
struct ArmReplay {
    addr: std::net::SocketAddr,
    tokens: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

const WS_PATH: &str =
    "/subscriptions/sub-1/resourceGroups/ml-rg/providers/Microsoft.MachineLearningServices/workspaces/ml-ws";

async fn arm_replay(jobs: Vec<Value>, page2_delay: std::time::Duration, token: Value) -> ArmReplay {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let tokens = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (t, c) = (tokens.clone(), calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let (t, c, jobs, token) = (t.clone(), c.clone(), jobs.clone(), token.clone());
        async move {
            let path = uri.path().to_string();
            let q = uri.query().unwrap_or("").to_string();
            if path.ends_with("/oauth2/v2.0/token") || path.ends_with("/metadata/identity/oauth2/token") {
                t.fetch_add(1, Ordering::SeqCst);
                return axum::Json(token).into_response();
            }
            c.fetch_add(1, Ordering::SeqCst);
            if path == format!("{WS_PATH}/jobs") && q.contains("skipToken=p2") {
                tokio::time::sleep(page2_delay).await;
                return axum::Json(serde_json::json!({"value": jobs[1..].to_vec()})).into_response();
            }
            if path == format!("{WS_PATH}/jobs") {
                let next =
                    format!("http://{addr}{WS_PATH}/jobs?api-version={API_VERSION}&listViewType=All&$skipToken=p2");
                return axum::Json(serde_json::json!({"value": jobs[..1].to_vec(), "nextLink": next})).into_response();
            }
            (axum::http::StatusCode::NOT_FOUND, "{}").into_response()
        }
    });
    use axum::response::IntoResponse;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    ArmReplay { addr, tokens, calls }
}

fn serverless(name: &str, status: &str, created: i64) -> Value {
    let mut v = job_json();
    v["name"] = name.into();
    v["properties"]["status"] = status.into();
    v["properties"]["computeId"] = Value::Null;
    v["properties"]["resources"] = serde_json::json!({"instanceCount": 1, "instanceType": "Standard_NC24ads_A100_v4"});
    v["systemData"]["createdAt"] = startline_proto::rfc3339::format_ms(created).into();
    v["systemData"]["lastModifiedAt"] = startline_proto::rfc3339::format_ms(created).into();
    v
}

fn workspace() -> Workspace {
    Workspace { subscription: "sub-1".into(), resource_group: "ml-rg".into(), workspace: "ml-ws".into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_a_late_page_is_dated_when_its_page_came_not_at_the_polls_start() {
    let created = startline_proto::time::now_ms() - 3_600_000;
    let jobs = vec![serverless("job-a", "Queued", created), serverless("job-b", "Queued", created)];
    let token = serde_json::json!({"access_token": "t", "expires_in": 3599});
    let arm = arm_replay(jobs, std::time::Duration::from_millis(1500), token).await;
    let client = Client::new(
        &format!("http://{}", arm.addr),
        None,
        &workspace(),
        Credential::Static(crate::auth::Secret::new("t")),
    )
    .expect("client");
    let dir = tempfile::tempdir().expect("tempdir");
    let spool = crate::spool::Spool::open(dir.path(), crate::spool::SpoolLimits::default()).expect("spool");
    let memory = MemoryStore::open(&spool, "azureml").expect("memory");
    // Both jobs were seen before, not yet queued: a Queued now is a transition to date.
    for name in ["job-a", "job-b"] {
        let mut mem = JobMemory::default();
        mem.emitted.insert("submitted".into());
        memory.put(&format!("azureml/ml-rg/ml-ws/{name}"), &mem).expect("put");
    }
    let m = Mapping { gpus: GpuTable::default(), ..mapping() };
    let started = startline_proto::time::now_ms();
    let report =
        poll_once(&m, &client, std::time::Duration::from_secs(86_400), &spool, &memory, None).await.expect("poll");
    let queued_at = |job: &str| report.events.iter().find(|e| e.job_id.ends_with(job)).map(at).expect("queued");
    assert!(queued_at("job-a") < started + 1_000, "the first page came at once");
    assert!(queued_at("job-b") >= started + 1_500, "dated when its page came, not at the poll's start {started}");
    use std::sync::atomic::Ordering;
    assert_eq!(
        (arm.calls.load(Ordering::SeqCst), arm.tokens.load(Ordering::SeqCst)),
        (2, 0),
        "two pages, a fixed token"
    );
}

/// A pipeline's parent job (Azure's PipelineJob example, `jobType: Pipeline`) orchestrates its steps, which are
/// jobs of their own: it used to be reported as one more training job (its wait and start are its first step's).
#[test]
fn pipeline_parent_jobs_are_not_reported_as_training_jobs() {
    let j = parse_job(&shared_fixture("job-pipeline.json")).expect("job");
    assert_eq!(j.job_type, "Pipeline");
    for status in ["NotStarted", "Running", "Completed"] {
        let mut j = j.clone();
        j.status = status.into();
        let (evs, mem) = diff(&mapping(), &j, "", None, &JobMemory::default(), j.created_ms + 60_000);
        assert!(evs.is_empty(), "{status}: {}", kinds(&evs).join(","));
        assert!(mem.done, "not fetched again");
    }
    assert!(followed(&parse_job(&shared_fixture("job-command-system-tags.json")).expect("job")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_skips_pipeline_parents_without_remembering_them() {
    let created = startline_proto::time::now_ms() - 3_600_000;
    let mut pipeline = shared_fixture("job-pipeline.json");
    pipeline["systemData"]["createdAt"] = startline_proto::rfc3339::format_ms(created).into();
    let jobs = vec![pipeline, serverless("step-1", "Queued", created)];
    let arm = arm_replay(jobs, std::time::Duration::ZERO, serde_json::json!({})).await;
    let client = Client::new(
        &format!("http://{}", arm.addr),
        None,
        &workspace(),
        Credential::Static(crate::auth::Secret::new("t")),
    )
    .expect("client");
    let dir = tempfile::tempdir().expect("tempdir");
    let spool = crate::spool::Spool::open(dir.path(), crate::spool::SpoolLimits::default()).expect("spool");
    let memory = MemoryStore::open(&spool, "azureml").expect("memory");
    let report = poll_once(&mapping(), &client, std::time::Duration::from_secs(86_400), &spool, &memory, None)
        .await
        .expect("poll");
    assert!(report.events.iter().all(|e| e.job_id.ends_with("/step-1")), "only the step is followed");
    assert_eq!(kinds(&report.events), ["submitted", "queued:Queued"]);
    assert_eq!(memory.entries().len(), 1, "the pipeline is not remembered");
}

#[test]
fn token_lifetimes_come_from_expires_in_or_expires_on_and_renew_shortly_before() {
    use std::time::Duration;
    let now = 1_800_000_000;
    let life = |v: Value| token_lifetime(&v, now);
    assert_eq!(life(serde_json::json!({"expires_in": 3599})), Duration::from_secs(3599), "Entra: a number");
    assert_eq!(
        life(serde_json::json!({"expires_in": "86399", "expires_on": "1800086399"})),
        Duration::from_secs(86399)
    );
    assert_eq!(
        life(serde_json::json!({"expires_on": "1800003600"})),
        Duration::from_secs(3600),
        "App Service: only expires_on"
    );
    assert_eq!(life(serde_json::json!({"expires_on": 1_800_000_120})), Duration::from_secs(120));
    assert_eq!(life(serde_json::json!({})), Duration::from_secs(300));
    assert_eq!(life(serde_json::json!({"expires_on": "1799999000"})), Duration::ZERO, "already expired");
    assert_eq!(renew_after(Duration::from_secs(3600)), Duration::from_secs(3300));
    assert_eq!(renew_after(Duration::from_secs(300)), Duration::from_secs(240), "a short token is still reused");
    assert_eq!(renew_after(Duration::ZERO), Duration::ZERO);
}

/// Every ARM call used to fetch a new token when the identity endpoint answered with `expires_on` only (or a
/// token of 5 minutes or less): a token is now reused until shortly before it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_reused_across_calls_until_shortly_before_it_expires() {
    use std::sync::atomic::Ordering;
    let created = startline_proto::time::now_ms() - 3_600_000;
    let jobs = vec![serverless("job-a", "Queued", created), serverless("job-b", "Queued", created)];
    let expires_on = (startline_proto::time::now_ms() / 1000 + 3600).to_string();
    // The shape of a managed identity token answer that has `expires_on` and no `expires_in`.
    let token = serde_json::json!({"access_token": "tok", "expires_on": expires_on,
        "resource": "https://management.azure.com/", "token_type": "Bearer"});
    let arm = arm_replay(jobs, std::time::Duration::ZERO, token).await;
    let endpoint = format!("http://{}", arm.addr);
    let identity = Credential::ManagedIdentity { endpoint: endpoint.clone(), client_id: None };
    let client = Client::new(&endpoint, None, &workspace(), identity).expect("client");
    for _ in 0..5 {
        assert_eq!(client.list(0).await.expect("list").len(), 2);
    }
    assert_eq!(arm.calls.load(Ordering::SeqCst), 10, "five listings of two pages");
    assert_eq!(arm.tokens.load(Ordering::SeqCst), 1, "one token for every call");
    // A token that lives 5 minutes is reused too (it used to be refetched for every call).
    let short = serde_json::json!({"access_token": "tok", "expires_in": "300", "token_type": "Bearer"});
    let arm = arm_replay(
        vec![serverless("job-a", "Queued", created), serverless("job-b", "Queued", created)],
        std::time::Duration::ZERO,
        short,
    )
    .await;
    let endpoint = format!("http://{}", arm.addr);
    let identity = Credential::ManagedIdentity { endpoint: endpoint.clone(), client_id: None };
    let client = Client::new(&endpoint, None, &workspace(), identity).expect("client");
    for _ in 0..3 {
        client.list(0).await.expect("list");
    }
    assert_eq!(arm.tokens.load(Ordering::SeqCst), 1);
}
