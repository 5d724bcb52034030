//! The stream out (`StreamService.Subscribe`) against a real collector over loopback gRPC: records in cursor
//! order with no gaps across reconnects, a kill -9 and a graceful restart; resume from any cursor; OUT_OF_RANGE
//! and INVALID_ARGUMENT; filters; a subscriber that stops reading is disconnected with the cursor to resume
//! after while ingest keeps acknowledging; `startline-agent tail` prints the same records.

use startline_proto::pb::{
    self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind, stream_record::Record,
    stream_service_client::StreamServiceClient,
};
use startline_tests::{ago, binary, event, submitted, Collector};
use std::collections::BTreeMap;
use std::time::Duration;

fn job_events(job: &str, base: i64, urgent: bool) -> Vec<pb::LifecycleEvent> {
    let prio = if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal };
    let mut sub = submitted(pb::PoolKind::Dedicated, prio, 8);
    if let Kind::Submitted(s) = &mut sub {
        s.pool = if urgent { "h100".into() } else { "a100".into() };
        s.team = "vision".into();
    }
    vec![
        event(job, "s", base, sub),
        event(
            job,
            "q",
            base + 5_000,
            Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
        ),
        event(job, "f", base + 120_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        event(job, "c", base + 200_000, Kind::Checkpoint(pb::Checkpoint { step: 50, ..Default::default() })),
        event(
            job,
            "d",
            base + 300_000,
            Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, exit_code: Some(0), ..Default::default() }),
        ),
    ]
}

async fn publish(endpoint: &str, batch_seq: u64, events: Vec<pb::LifecycleEvent>) -> pb::PublishAck {
    let mut c = IngestServiceClient::connect(endpoint.to_string()).await.expect("connect ingest");
    c.publish_batch(pb::PublishRequest { batch_seq, events }).await.expect("publish").into_inner()
}

async fn subscribe(
    endpoint: &str,
    req: pb::SubscribeRequest,
) -> Result<tonic::Streaming<pb::StreamRecord>, tonic::Status> {
    let mut c = StreamServiceClient::connect(endpoint.to_string()).await.expect("connect stream");
    Ok(c.subscribe(req).await?.into_inner())
}

/// Reads records until `n` arrived (progress records skipped) or 20 s pass.
async fn take(s: &mut tonic::Streaming<pb::StreamRecord>, n: usize) -> Vec<pb::StreamRecord> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        match tokio::time::timeout_at(deadline, s.message()).await {
            Ok(Ok(Some(r))) if matches!(r.record, Some(Record::Progress(_))) => {}
            Ok(Ok(Some(r))) => out.push(r),
            Ok(Ok(None)) => panic!("stream ended after {} of {n} records", out.len()),
            Ok(Err(e)) => panic!("stream failed after {} of {n} records: {e}", out.len()),
            Err(_) => panic!("timed out after {} of {n} records", out.len()),
        }
    }
    out
}

fn oldest() -> pb::SubscribeRequest {
    pb::SubscribeRequest { from_oldest: true, ..Default::default() }
}

fn after(c: u64) -> pb::SubscribeRequest {
    pb::SubscribeRequest { after_cursor: Some(c), ..Default::default() }
}

/// Checks cursors run 1, 2, 3, ... with no gap and no repeat.
fn assert_consecutive(recs: &[pb::StreamRecord], from: u64) {
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.cursor, from + i as u64, "record {i} of {}: {:?}", recs.len(), r.record);
    }
}

/// Every job's records: (event seqs in order, state transitions in order).
fn per_job(recs: &[pb::StreamRecord]) -> BTreeMap<String, (Vec<u64>, Vec<String>)> {
    let mut m: BTreeMap<String, (Vec<u64>, Vec<String>)> = BTreeMap::new();
    for r in recs {
        let e = m.entry(r.job_id.clone()).or_default();
        match &r.record {
            Some(Record::Event(a)) => e.0.push(a.seq),
            Some(Record::Change(c)) => e.1.push(format!("{}>{}", c.previous_state, c.state)),
            _ => {}
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_gaps_across_reconnects_a_kill_and_a_restart_and_resume_from_any_cursor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let c = Collector::start(&db, &[]);
    let ep = c.endpoint();
    let base = ago(3600);

    // A live subscriber from the start, and one job.
    let mut live = subscribe(&ep, pb::SubscribeRequest::default()).await.expect("subscribe");
    let ack = publish(&ep, 1, job_events("slurm/a100/1", base, false)).await;
    assert_eq!(ack.accepted, 5);
    // 5 events in one batch (one group commit), then one change: what the collector learned from them at once
    // (new -> done, the SLO decision, the outcome).
    let first = take(&mut live, 6).await;
    assert_consecutive(&first, 1);
    let kinds: Vec<&str> = first
        .iter()
        .map(|r| match &r.record {
            Some(Record::Event(_)) => "event",
            Some(Record::Change(_)) => "change",
            _ => "other",
        })
        .collect();
    // One batch, one group commit: its event records (written in its flush) come first, then the change they
    // caused (written after the index applied them), naming the job's last event of the group.
    assert_eq!(kinds, ["event", "event", "event", "event", "event", "change"]);
    let changes: Vec<&pb::JobChange> =
        first.iter().filter_map(|r| if let Some(Record::Change(c)) = &r.record { Some(c) } else { None }).collect();
    assert_eq!(changes.len(), 1);
    assert_eq!((changes[0].previous_state.as_str(), changes[0].state.as_str()), ("", "done"));
    assert_eq!(changes[0].event_seq, 5);
    assert_eq!(changes[0].slo_decisions.len(), 1);
    assert_eq!(changes[0].slo_decisions[0].slo, "normal-start");
    assert_eq!(changes[0].slo_decisions[0].verdict, "good");
    let ttfs = changes[0].slo_decisions[0].time_to_first_step_seconds.expect("ttfs");
    assert!((ttfs - 120.0).abs() < 1e-9, "{ttfs}");
    assert_eq!(changes[0].outcome, "succeeded");
    for r in &first {
        assert_eq!(
            (r.pool.as_str(), r.team.as_str(), r.priority),
            ("a100", "vision", pb::PriorityClass::Normal as i32)
        );
    }
    // Resume from every cursor: exactly the rest.
    for k in 0..6u64 {
        let mut s = subscribe(&ep, after(k)).await.expect("resume");
        let got = take(&mut s, (6 - k) as usize).await;
        assert_eq!(got, first[k as usize..].to_vec(), "after {k}");
    }

    // More jobs, then kill -9 while the live subscriber follows.
    for j in 2..=6u64 {
        publish(&ep, j, job_events(&format!("slurm/a100/{j}"), base, j % 2 == 0)).await;
    }
    let mut seen = first.clone();
    seen.extend(take(&mut live, 5 * 6).await);
    assert_consecutive(&seen, 1);
    c.signal_and_wait("KILL");
    let end = tokio::time::timeout(Duration::from_secs(10), live.message()).await.expect("stream ends");
    assert!(!matches!(end, Ok(Some(_))), "no record after the kill: {end:?}");

    // Restart: resume after the last cursor seen; the records after the restart continue the sequence.
    let c = Collector::start(&db, &[]);
    let ep = c.endpoint();
    let mut resumed = subscribe(&ep, after(seen.last().expect("records").cursor)).await.expect("resume after kill");
    for j in 7..=8u64 {
        publish(&ep, j, job_events(&format!("slurm/a100/{j}"), base, false)).await;
    }
    // A duplicate redelivery adds nothing.
    let dup = publish(&ep, 9, job_events("slurm/a100/7", base, false)).await;
    assert_eq!((dup.accepted, dup.duplicates), (0, 5));
    seen.extend(take(&mut resumed, 2 * 6).await);
    assert_consecutive(&seen, 1);

    // Graceful restart: the live subscriber is told to resume, and does.
    let end = {
        let c2 = c;
        let stopper = tokio::task::spawn_blocking(move || c2.signal_and_wait("TERM"));
        let end = tokio::time::timeout(Duration::from_secs(20), resumed.message()).await.expect("stream ends");
        assert!(stopper.await.expect("join").success());
        end
    };
    match end {
        Err(s) => assert!(s.message().contains("resume with after_cursor"), "{s}"),
        Ok(other) => panic!("expected an UNAVAILABLE naming the cursor, got {other:?}"),
    }
    let c = Collector::start(&db, &[]);
    let ep = c.endpoint();
    publish(&ep, 10, job_events("slurm/a100/10", base, false)).await;
    let mut s = subscribe(&ep, after(seen.last().expect("records").cursor)).await.expect("resume");
    seen.extend(take(&mut s, 6).await);
    assert_consecutive(&seen, 1);

    // The whole retained stream read in one go equals what the reconnecting subscriber assembled.
    let mut all = subscribe(&ep, oldest()).await.expect("from oldest");
    let everything = take(&mut all, seen.len()).await;
    assert_eq!(everything, seen);
    let jobs = per_job(&everything);
    assert_eq!(jobs.len(), 9, "{:?}", jobs.keys());
    for (job, (seqs, states)) in &jobs {
        assert_eq!(seqs.len(), 5, "{job}");
        assert_eq!(states, &[">done"], "{job}");
    }
    // Filters: urgent jobs of h100 (2, 4, 6), changes only.
    let mut f = subscribe(
        &ep,
        pb::SubscribeRequest {
            from_oldest: true,
            pools: vec!["h100".into()],
            priorities: vec![pb::PriorityClass::Urgent as i32],
            kinds: vec!["change".into()],
            ..Default::default()
        },
    )
    .await
    .expect("filtered");
    let urgent = take(&mut f, 3).await;
    assert!(urgent.iter().all(|r| matches!(r.record, Some(Record::Change(_))) && r.pool == "h100"));
    let ids: std::collections::BTreeSet<&str> = urgent.iter().map(|r| r.job_id.as_str()).collect();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), ["slurm/a100/2", "slurm/a100/4", "slurm/a100/6"]);
    let mut p = subscribe(
        &ep,
        pb::SubscribeRequest { from_oldest: true, job_id_prefix: "slurm/a100/1".into(), ..Default::default() },
    )
    .await
    .expect("prefix");
    let got = take(&mut p, 12).await;
    let ids: std::collections::BTreeSet<&str> = got.iter().map(|r| r.job_id.as_str()).collect();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), ["slurm/a100/1", "slurm/a100/10"]);

    // Refusals name the field.
    let last = seen.last().expect("records").cursor;
    let e = subscribe(&ep, after(last + 5)).await.expect_err("ahead");
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
    assert!(e.message().contains("after_cursor"), "{e}");
    let e = subscribe(&ep, pb::SubscribeRequest { kinds: vec!["everything".into()], ..Default::default() })
        .await
        .expect_err("bad kind");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("kinds[0]"), "{e}");
    let e = subscribe(&ep, pb::SubscribeRequest { priorities: vec![9], ..Default::default() }).await.expect_err("prio");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("priorities[0]"), "{e}");

    // `startline-agent tail` prints the same records, and resumes from its cursor file.
    let cursor_file = dir.path().join("tail.cursor");
    let ep2 = ep.clone();
    let run_tail = move |extra: &[&str]| {
        let out = std::process::Command::new(binary("startline-agent"))
            .args(["--collector", &ep2, "tail", "--json", "--cursor-file"])
            .arg(&cursor_file)
            .args(extra)
            .output()
            .expect("tail runs");
        assert!(out.status.success(), "tail failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
            .collect::<Vec<_>>()
    };
    let (a, b) = tokio::task::spawn_blocking(move || {
        (run_tail(&["--from-oldest", "--limit", "20"]), run_tail(&["--limit", "25"]))
    })
    .await
    .expect("tail");
    let cursors: Vec<u64> = a.iter().chain(&b).map(|v| v["cursor"].as_u64().expect("cursor")).collect();
    assert_eq!(cursors, (1..=45).collect::<Vec<_>>(), "the second run resumes after the first's last cursor");
    assert_eq!(a[0]["type"], "event");
    assert_eq!(a[0]["event"]["kind"], "submitted");
    assert_eq!(a[0]["job_id"], "slurm/a100/1");
    assert_eq!(a[1]["event"]["kind"], "queued");
    assert_eq!(a[5]["type"], "change");
    assert_eq!(a[5]["change"]["state"], "done");
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_disconnected_with_its_cursor_and_ingest_never_waits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[stream]\nsubscriber_buffer = 100\n").expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf-8")]);
    let ep = c.endpoint();
    let base = ago(7200);
    // Subscribes, reads one record, then stops reading.
    let mut slow = subscribe(&ep, pb::SubscribeRequest::default()).await.expect("subscribe");
    publish(&ep, 1, job_events("warmup", base, false)).await;
    let got = take(&mut slow, 1).await;
    // 6,000 jobs x 5 events, 100 jobs per batch: every batch is acknowledged while the subscriber sleeps.
    let started = std::time::Instant::now();
    for b in 0..60u64 {
        let events: Vec<_> = (0..100).flat_map(|j| job_events(&format!("bulk/{b}/{j}"), base, j % 10 == 0)).collect();
        let ack = publish(&ep, b + 2, events).await;
        assert_eq!(ack.accepted, 500, "batch {b}");
    }
    eprintln!("30,000 events acknowledged in {:?} with a stalled subscriber", started.elapsed());
    // The subscriber reads again: what was buffered, then RESOURCE_EXHAUSTED naming the cursor to resume after.
    let mut received = got;
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(20), slow.message()).await.expect("no stall") {
            Ok(Some(r)) => received.push(r),
            Ok(None) => panic!("ended without a status"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
    let last = received.last().expect("records").cursor;
    assert!(status.message().contains(&format!("after_cursor = {last}")), "{status} (last received {last})");
    assert_consecutive(&received, received[0].cursor);
    // Resuming there reads the rest from disk: nothing missed.
    let mut rest = subscribe(&ep, after(last)).await.expect("resume");
    let mut all = subscribe(&ep, oldest()).await.expect("oldest");
    let total = {
        // 30,005 events plus their changes: read the whole stream once to count it.
        let mut n = 0usize;
        let mut last_cursor = 0;
        loop {
            match tokio::time::timeout(Duration::from_secs(3), all.message()).await {
                Ok(Ok(Some(r))) => {
                    assert_eq!(r.cursor, last_cursor + 1);
                    last_cursor = r.cursor;
                    n += 1;
                }
                Err(_) => break n,
                other => panic!("{other:?}"),
            }
        }
    };
    let remaining = take(&mut rest, total - last as usize).await;
    assert_consecutive(&remaining, last + 1);
    assert_eq!(remaining.last().map(|r| r.cursor), Some(total as u64));
    let events = received.iter().chain(&remaining).filter(|r| matches!(r.record, Some(Record::Event(_)))).count();
    assert_eq!(received[0].cursor, 1, "the subscriber started on an empty collector");
    assert_eq!(events, 30_005, "every accepted event is in the stream once");
    // The collector's metrics count the disconnect.
    let (_, text) = startline_tests::http_get_text(c.http, "/metrics");
    assert!(
        text.lines()
            .any(|l| l.starts_with("startline_collector_stream_subscriber_overflows_total") && l.ends_with(" 1")),
        "metrics lack the overflow count:\n{}",
        text.lines().filter(|l| l.contains("stream")).collect::<Vec<_>>().join("\n")
    );
}

/// A foreign client: Python grpcio (stubs generated from our .proto at test time by grpcio-tools, installed by
/// the test script) subscribes from the oldest record, resumes after a cursor, and is refused out of range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_subscriber_reads_and_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let ep = c.endpoint();
    let base = ago(3600);
    publish(&ep, 1, job_events("py/1", base, true)).await;
    publish(&ep, 2, job_events("py/2", base, false)).await;
    let root = startline_tests::workspace_root();
    let gen = dir.path().join("gen");
    std::fs::create_dir_all(&gen).expect("gen dir");
    let grpc = c.grpc.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(root.join("tests/python/stream_client.py"))
            .arg(grpc)
            .arg(root.join("proto/proto"))
            .arg(&gen)
            .args(["12", "7"])
            .env("PYTHONPATH", root.join("tests/python"))
            .output()
            .expect("python3 runs")
    })
    .await
    .expect("join");
    assert!(out.status.success(), "python subscriber failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    let first = report["first"].as_array().expect("first");
    let cursors: Vec<u64> = first.iter().map(|r| r["cursor"].as_u64().expect("cursor")).collect();
    assert_eq!(cursors, (1..=12).collect::<Vec<_>>());
    assert_eq!(first[0]["type"], "event");
    assert_eq!(first[0]["event"], "submitted");
    assert_eq!(first[0]["pool"], "h100");
    let urgent_start = first.iter().find(|r| r["job_id"] == "py/1" && r["state"] == "done").expect("py/1 started");
    assert_eq!(urgent_start["decisions"], serde_json::json!([["urgent-start", "good", 120.0]]));
    assert_eq!(report["rest"].as_array().map(Vec::len), Some(5));
    assert_eq!(report["rest"][0]["cursor"], 8);
    assert_eq!(report["resumed_equal"], true);
    assert_eq!(report["errors"]["ahead"]["code"], "OUT_OF_RANGE");
    assert_eq!(report["errors"]["bad_kind"]["code"], "INVALID_ARGUMENT");
    assert!(report["errors"]["bad_kind"]["details"].as_str().is_some_and(|d| d.starts_with("kinds[0]")));
}

/// Follows the stream from cursor 0 to `total` records, dropping the call every `drop_every` records (a
/// reconnecting client) and sleeping `pause` every 100 records (a slow one); counts the disconnects the
/// collector made. Returns the records in order.
async fn follow(ep: String, total: u64, drop_every: Option<usize>, pause: Duration) -> (Vec<pb::StreamRecord>, u32) {
    let mut got: Vec<pb::StreamRecord> = Vec::new();
    let mut overflows = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while (got.len() as u64) < total {
        assert!(tokio::time::Instant::now() < deadline, "stuck at {} of {total}", got.len());
        let last = got.last().map_or(0, |r| r.cursor);
        let mut s = subscribe(&ep, after(last)).await.expect("subscribe");
        let mut this_call = 0usize;
        loop {
            match tokio::time::timeout(Duration::from_secs(30), s.message()).await.expect("no stall") {
                Ok(Some(r)) => {
                    if matches!(r.record, Some(Record::Progress(_))) {
                        continue;
                    }
                    got.push(r);
                    this_call += 1;
                    if got.len() % 100 == 0 && !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                    if got.len() as u64 >= total || drop_every.is_some_and(|n| this_call >= n) {
                        break;
                    }
                }
                Ok(None) => break,
                Err(st) => {
                    assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{st}");
                    overflows += 1;
                    break;
                }
            }
        }
    }
    (got, overflows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_slow_and_reconnecting_subscribers_miss_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[stream]\nsubscriber_buffer = 200\n").expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf-8")]);
    let ep = c.endpoint();
    let base = ago(7200);
    // Every job gives 5 events and one change record (its batch is one group commit): 4,000 jobs are 24,000
    // records.
    let jobs = 4_000u64;
    let total = jobs * 6;
    let reconnecting = tokio::spawn(follow(ep.clone(), total, Some(1_500), Duration::ZERO));
    let slow = tokio::spawn(follow(ep.clone(), total, None, Duration::from_millis(15)));
    // Four publishers at once, 50 jobs per batch.
    let mut pubs = Vec::new();
    for p in 0..4u64 {
        let ep = ep.clone();
        pubs.push(tokio::spawn(async move {
            let mut client = IngestServiceClient::connect(ep).await.expect("connect");
            for b in 0..(jobs / 4 / 50) {
                let events: Vec<_> =
                    (0..50).flat_map(|j| job_events(&format!("load/{p}/{b}/{j}"), base, j % 7 == 0)).collect();
                let ack = client.publish_batch(pb::PublishRequest { batch_seq: b + 1, events }).await.expect("ack");
                assert_eq!(ack.into_inner().accepted, 250);
            }
        }));
    }
    for p in pubs {
        p.await.expect("publisher");
    }
    let (a, _) = reconnecting.await.expect("reconnecting subscriber");
    let (b, overflows) = slow.await.expect("slow subscriber");
    assert_consecutive(&a, 1);
    assert_consecutive(&b, 1);
    assert_eq!(a, b, "both assembled the same stream");
    let events = a.iter().filter(|r| matches!(r.record, Some(Record::Event(_)))).count() as u64;
    assert_eq!(events, jobs * 5);
    eprintln!("slow subscriber was disconnected {overflows} times and resumed each time");
    for (job, (seqs, states)) in per_job(&a) {
        assert_eq!(seqs.len(), 5, "{job}");
        assert_eq!(states, [">done"], "{job}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_calls_are_capped_catching_up_or_live_and_a_closed_one_frees_its_slot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[stream]\nmax_subscribers = 2\n").expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf-8")]);
    let ep = c.endpoint();
    publish(&ep, 1, job_events("cap/1", ago(3600), false)).await;
    let mut a = subscribe(&ep, oldest()).await.expect("first");
    let b = subscribe(&ep, pb::SubscribeRequest::default()).await.expect("second");
    assert_eq!(take(&mut a, 6).await.len(), 6);
    let e = subscribe(&ep, oldest()).await.expect_err("third");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("max_subscribers"), "{e}");
    drop(b);
    // The collector frees the slot when the client's reset arrives (nothing is published meanwhile).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match subscribe(&ep, oldest()).await {
            Ok(mut s) => {
                assert_eq!(take(&mut s, 6).await.len(), 6);
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
                assert!(std::time::Instant::now() < deadline, "the slot of the closed call was never freed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A deadline that passes while a job waits, with no new event, is decided by the collector's committer (the
/// alert loop only keeps the timer): the stream carries the bad decision as a job change right after the
/// deadline, the page follows as an alert record, and the job's state is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_while_the_job_waits_puts_its_bad_decision_in_the_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let c = Collector::start(&db, &[]);
    let ep = c.endpoint();
    let mut live = subscribe(&ep, pb::SubscribeRequest::default()).await.expect("subscribe");
    // Urgent (10-minute threshold), submitted 9 min 56 s ago: its deadline passes about 4 s from now.
    let job = "slurm/h100/deadline";
    let submitted_at = ago(596);
    let mut events = job_events(job, submitted_at, true);
    events.truncate(2); // submitted, queued: it waits.
    let ack = publish(&ep, 1, events).await;
    assert_eq!(ack.accepted, 2);
    let first = take(&mut live, 3).await;
    let Some(Record::Change(c0)) = &first[2].record else { panic!("expected a change: {:?}", first[2]) };
    assert_eq!(c0.state, "queued");
    assert!(c0.slo_decisions.is_empty(), "undecided before its deadline: {c0:?}");

    // No other event: time alone decides.
    let mut decided: Option<(pb::JobChange, i64)> = None;
    let mut paged = false;
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while !(decided.is_some() && paged) {
        let r = tokio::time::timeout_at(until, live.message())
            .await
            .unwrap_or_else(|_| panic!("no decision/page within 30 s: decided {decided:?}, paged {paged}"))
            .expect("stream")
            .expect("open");
        match r.record {
            Some(Record::Change(c)) => {
                assert!(decided.is_none(), "one change for the deadline: {c:?}");
                let at = r.recorded_at.map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000);
                decided = Some((c, at));
            }
            Some(Record::Alert(a)) => {
                assert_eq!(a.labels.get("alertname").map(String::as_str), Some("StartlineJobStartBreach"));
                assert_eq!(a.status, "firing");
                paged = true;
            }
            Some(Record::Progress(_)) => {}
            other => panic!("unexpected record {other:?}"),
        }
    }
    let (c1, at) = decided.expect("decided");
    assert_eq!((c1.previous_state.as_str(), c1.state.as_str()), ("queued", "queued"), "{c1:?}");
    assert_eq!(c1.slo_decisions.len(), 1, "{c1:?}");
    assert_eq!((c1.slo_decisions[0].slo.as_str(), c1.slo_decisions[0].verdict.as_str()), ("urgent-start", "bad"));
    assert_eq!(c1.slo_decisions[0].time_to_first_step_seconds, None, "it never started");
    assert_eq!(c1.event_seq, 2, "the change follows the job's newest event");
    let deadline = submitted_at + 600_000;
    assert!(at >= deadline, "recorded {at} before the deadline {deadline}");
    assert!(at - deadline < 10_000, "recorded {} ms after the deadline", at - deadline);
}
