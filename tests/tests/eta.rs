//! `startline-agent eta` against a real collector (auth on, the reader's token from a file): a waiting job's
//! line says what `GET /api/v1/jobs/{job_id}` says of its `expected_start` (checked with a formatter written
//! here from the clock arithmetic), `--json` prints that field, a job that started or ended says when, an unknown
//! job exits 3 with its id named, and no token is a refusal (exit 1). The stream carries the waiting job's
//! expected start as a change of its own, equal to the API's, again when a new scheduler estimate moves it,
//! and no more once the job started.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::rfc3339::parse_ms;
use startline_proto::time::ms_to_timestamp;
use startline_tests::{binary, event, path_escape, wait_until, Collector};
use std::process::{Command, Output};
use std::time::Duration;

const MIN: i64 = 60_000;

fn sub() -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Dedicated as i32,
        provider: "slurm".into(),
        pool: "gpu".into(),
        priority: pb::PriorityClass::Normal as i32,
        gpu_class: "h100".into(),
        gpu_count: 8,
        ..Default::default()
    })
}

fn first_step() -> Kind {
    Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })
}

/// `HH:MM` of `ms` (UTC, truncated), with `YYYY-MM-DD ` first when it is not on the day of `now`.
fn hm(ms: i64, now: i64) -> String {
    let minutes = ms.div_euclid(MIN);
    let of_day = minutes.rem_euclid(24 * 60);
    let t = format!("{:02}:{:02}", of_day / 60, of_day % 60);
    if ms.div_euclid(1440 * MIN) == now.div_euclid(1440 * MIN) {
        t
    } else {
        format!("{} {t}", &startline_proto::rfc3339::format_ms(ms)[..10])
    }
}

/// The line expected for a waiting job's API answer `j` at `now`.
fn expected_line(j: &serde_json::Value, now: i64) -> String {
    let e = &j["expected_start"];
    let ms = |k: &str| parse_ms(e[k].as_str().expect("time")).expect("rfc3339");
    let waited = e["waited_seconds"].as_f64().expect("waited") as i64;
    assert!(waited < 3600, "the test's job waits minutes");
    let jobs = e["comparable_jobs"].as_u64().expect("count");
    assert!(jobs < 1000);
    format!(
        "{}: expected start {} UTC (80%: {}-{}), waited {}m, basis {} ({jobs} comparable jobs)",
        j["job_id"].as_str().expect("id"),
        hm(ms("at"), now),
        hm(ms("low"), now),
        hm(ms("high"), now),
        waited / 60,
        e["basis"].as_str().expect("basis")
    )
}

fn eta(c: &Collector, token_file: Option<&std::path::Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(binary("startline-agent"));
    cmd.arg("eta").args(args).args(["--api", &format!("http://{}", c.http)]).env_remove("STARTLINE_TOKEN");
    if let Some(f) = token_file {
        cmd.arg("--token-file").arg(f);
    }
    cmd.output().expect("run eta")
}

fn get(c: &Collector, token: &str, job: &str) -> serde_json::Value {
    let (status, _, body) = startline_tests::http_request(
        c.http,
        "GET",
        &format!("/api/v1/jobs/{}?events_limit=0", path_escape(job)),
        &[("authorization", &format!("Bearer {token}"))],
        "",
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eta_prints_what_the_api_says_of_a_waiting_job_and_the_state_of_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ingest, reader) = (
        startline_collector::auth::generate_token().expect("token"),
        startline_collector::auth::generate_token().expect("token"),
    );
    let hash = |t: &str| startline_collector::auth::TokenHash::of(t).to_config();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[auth.identity]]\nname = \"adapters\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\n\
             [[auth.identity]]\nname = \"people\"\ntoken_hashes = [\"{}\"]\nscopes = [\"read\"]\n\
             [stream]\nexpected_start_interval = \"1s\"\n",
            hash(&ingest),
            hash(&reader)
        ),
    )
    .expect("config");
    let token_file = dir.path().join("reader.token");
    std::fs::write(&token_file, format!("{reader}\n")).expect("token file");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);

    let now = startline_tests::ago(0);
    let mut evs = Vec::new();
    // History: 12 jobs of the pool yesterday, started after 20 to 42 minutes.
    for i in 0..12 {
        let t = now - 86_400_000 + i * 30 * MIN;
        let id = format!("slurm/c/old-{i}");
        evs.push(event(&id, "s", t, sub()));
        evs.push(event(&id, "f", t + (20 + 2 * i) * MIN, first_step()));
    }
    // Waiting 7 minutes, with the scheduler's estimate 15 minutes from now.
    evs.push(event("slurm/c/123", "s", now - 7 * MIN, sub()));
    evs.push(event(
        "slurm/c/123",
        "q",
        now - 7 * MIN + 1000,
        Kind::Queued(pb::Queued {
            reason: pb::WaitReason::Capacity as i32,
            raw_reason: "Resources".into(),
            estimated_start: Some(ms_to_timestamp(now + 15 * MIN)),
            ..Default::default()
        }),
    ));
    // Started 10 minutes ago after a 25-minute wait.
    evs.push(event("slurm/c/run", "s", now - 35 * MIN, sub()));
    evs.push(event("slurm/c/run", "f", now - 10 * MIN, first_step()));
    // Ended (failed) 2 minutes ago, never started.
    evs.push(event("slurm/c/gone", "s", now - 30 * MIN, sub()));
    evs.push(event(
        "slurm/c/gone",
        "d",
        now - 2 * MIN,
        Kind::Done(pb::Done { outcome: pb::Outcome::Failed as i32, ..Default::default() }),
    ));
    let mut settings = UplinkSettings::new(c.endpoint());
    settings.token = Some(startline_agent::auth::TokenSource::Static(
        startline_agent::auth::check_token(&ingest, "token").expect("token"),
    ));
    let mut up = Publisher::new(settings).expect("publisher");
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");
    wait_until("the jobs are indexed", Duration::from_secs(20), || {
        !get(&c, &reader, "slurm/c/123")["expected_start"].is_null()
            && get(&c, &reader, "slurm/c/gone")["state"] == "done"
    });

    // The waiting job: the line is the API's answer read just before or just after (the wait grows meanwhile).
    let before = get(&c, &reader, "slurm/c/123");
    let out = eta(&c, Some(&token_file), &["slurm/c/123"]);
    let after = get(&c, &reader, "slurm/c/123");
    let now_after = startline_tests::ago(0);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
    let allowed = [expected_line(&before, now), expected_line(&after, now_after)];
    assert!(allowed.contains(&printed), "{printed:?} is neither of {allowed:?}");
    let e = &after["expected_start"];
    assert_eq!(e["basis"], "history+scheduler", "{e}");
    assert!(e["comparable_jobs"].as_u64() >= Some(12), "{e}");
    assert!(printed.starts_with("slurm/c/123: expected start "), "{printed}");
    assert!(printed.contains(", waited 7m, ") || printed.contains(", waited 8m, "), "{printed}");

    // --json: the field itself; the wait in it lies between the two reads.
    let out = eta(&c, Some(&token_file), &["slurm/c/123", "--json"]);
    let after_json = get(&c, &reader, "slurm/c/123");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let w = |v: &serde_json::Value| v["waited_seconds"].as_f64().expect("waited");
    assert!(w(&after["expected_start"]) <= w(&shown) && w(&shown) <= w(&after_json["expected_start"]), "{shown}");
    let obj = shown.as_object().expect("object");
    assert_eq!(obj.len(), 10, "{shown}");
    for k in ["at", "low", "high", "interval", "basis", "comparable_jobs", "group", "jobs_ahead", "gpus_ahead"] {
        let (a, b) = (&after["expected_start"][k], &after_json["expected_start"][k]);
        assert!(&shown[k] == a || &shown[k] == b, "{k}: {} vs {a} / {b}", shown[k]);
    }

    // Not waiting: when it started, or how it ended.
    let out = eta(&c, Some(&token_file), &["slurm/c/run"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let started = parse_ms(get(&c, &reader, "slurm/c/run")["first_step_at"].as_str().expect("start")).expect("time");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("slurm/c/run: running, started at {} UTC after waiting 25m", hm(started, now_after))
    );
    let out = eta(&c, Some(&token_file), &["slurm/c/gone"]);
    let ended = parse_ms(get(&c, &reader, "slurm/c/gone")["done_at"].as_str().expect("end")).expect("time");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("slurm/c/gone: ended at {} UTC (failed), never started", hm(ended, now_after))
    );
    let out = eta(&c, Some(&token_file), &["slurm/c/gone", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), "null");

    // Unknown job: exit 3, its id named on stderr, nothing on stdout.
    let out = eta(&c, Some(&token_file), &["slurm/c/nope"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job \"slurm/c/nope\" is not known to the collector"), "{err}");

    // Without the token the collector refuses: exit 1 with its status.
    let out = eta(&c, None, &["slurm/c/123"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("answered 401"), "{err}");

    // The stream: the waiting job's expected start (swept every second here) as a change of its own, the API's.
    let mut stream = subscribe(&c, &reader).await;
    let (first, change) = settled_estimate(&mut stream, |_| true).await;
    assert_eq!((change.previous_state.as_str(), change.state.as_str()), ("queued", "queued"));
    assert_eq!((change.previous_segment.as_str(), change.segment.as_str()), ("queued:capacity", "queued:capacity"));
    assert_same_estimate(&first, &get(&c, &reader, "slurm/c/123")["expected_start"]);

    // The scheduler now expects it in 4 hours: the central estimate moves by far more than a tenth of the wait
    // left (and 5 minutes), so a new estimate follows, again the API's.
    let now = startline_tests::ago(0);
    up.send(vec![event(
        "slurm/c/123",
        "q2",
        now,
        Kind::Queued(pb::Queued {
            reason: pb::WaitReason::Capacity as i32,
            raw_reason: "Resources".into(),
            estimated_start: Some(ms_to_timestamp(now + 240 * MIN)),
            ..Default::default()
        }),
    )])
    .await
    .expect("send");
    up.flush().await.expect("flush");
    let moved_from = ts_ms(&first.at);
    let (second, _) = settled_estimate(&mut stream, |e| ts_ms(&e.at) > moved_from + 60 * MIN).await;
    assert_same_estimate(&second, &get(&c, &reader, "slurm/c/123")["expected_start"]);

    // It starts: the change out of waiting, then no more estimates for it (three sweeps later).
    up.send(vec![event("slurm/c/123", "f", startline_tests::ago(0), first_step())]).await.expect("send");
    up.flush().await.expect("flush");
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut started = false;
    while let Ok(Ok(Some(r))) = tokio::time::timeout_at(until, stream.message()).await {
        let Some(pb::stream_record::Record::Change(ch)) = r.record else { continue };
        if ch.state == "running" {
            assert!(ch.expected_start.is_none(), "{ch:?}");
            started = true;
        } else {
            assert!(!started, "an estimate after the start: {ch:?}");
        }
    }
    assert!(started, "the change to running was streamed");
}

async fn subscribe(c: &Collector, token: &str) -> tonic::Streaming<pb::StreamRecord> {
    let mut client = pb::stream_service_client::StreamServiceClient::connect(c.endpoint()).await.expect("connect");
    let mut req = tonic::Request::new(pb::SubscribeRequest {
        from_oldest: true,
        kinds: vec!["change".into()],
        // The pool filter too: an estimate's record carries the job's pool.
        pools: vec!["gpu".into()],
        job_id_prefix: "slurm/c/123".into(),
        ..Default::default()
    });
    req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("metadata"));
    client.subscribe(req).await.expect("subscribe").into_inner()
}

/// The first streamed expected start that satisfies `wanted` (within 20 s), or the last one after it within the
/// next 2.5 s (two sweeps: the first sweep may have seen part of the history).
async fn settled_estimate(
    s: &mut tonic::Streaming<pb::StreamRecord>,
    wanted: impl Fn(&pb::ExpectedStart) -> bool,
) -> (pb::ExpectedStart, pb::JobChange) {
    let mut until = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut found = None;
    loop {
        let r = match tokio::time::timeout_at(until, s.message()).await {
            Ok(r) => r.expect("stream").expect("open"),
            Err(_) => return found.expect("an expected start within 20 s"),
        };
        let Some(pb::stream_record::Record::Change(ch)) = r.record else { continue };
        let Some(e) = ch.expected_start.clone() else { continue };
        assert_eq!(r.job_id, "slurm/c/123");
        if found.is_none() && !wanted(&e) {
            continue;
        }
        if found.is_none() {
            until = tokio::time::Instant::now() + Duration::from_millis(2500);
        }
        found = Some((e, ch));
    }
}

fn ts_ms(t: &Option<prost_types::Timestamp>) -> i64 {
    startline_proto::time::timestamp_to_ms(t.as_ref().expect("timestamp"))
}

/// The stream's estimate is the API's: the same times, basis and group size.
fn assert_same_estimate(streamed: &pb::ExpectedStart, api: &serde_json::Value) {
    let ms = |k: &str| parse_ms(api[k].as_str().expect("time")).expect("rfc3339");
    assert_eq!(
        (ts_ms(&streamed.at), ts_ms(&streamed.low), ts_ms(&streamed.high)),
        (ms("at"), ms("low"), ms("high")),
        "{streamed:?} vs {api}"
    );
    assert_eq!(streamed.basis, api["basis"].as_str().expect("basis"));
    assert_eq!(Some(streamed.comparable_jobs), api["comparable_jobs"].as_u64());
}
