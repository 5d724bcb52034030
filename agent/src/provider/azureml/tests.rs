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
