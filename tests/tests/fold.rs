//! Folding ended jobs out of memory changes nothing a user can see. Two real collectors get the same events:
//! one keeps every job in memory (`store.fold_after = "0s"`), the other folds ended jobs after 50 ms. Every
//! answer that does not depend on the current time (job details with their raw events, listings, SLO counts
//! and percentiles, comparisons, the overview's job counts) must be identical: after the folds, after a
//! restart, after late events and duplicates reach folded jobs (they unfold, then fold again), and after a
//! second restart.

use serde_json::Value;
use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{ago, event, http_get_text, submitted, wait_until, Collector};
use std::path::Path;
use std::time::Duration;

const JOBS: usize = 40;

fn config(dir: &Path, name: &str, fold: bool) -> String {
    let path = dir.join(format!("{name}.toml"));
    let fold = if fold { "fold_after = \"50ms\"\nfold_interval = \"50ms\"\n" } else { "fold_after = \"0s\"\n" };
    std::fs::write(&path, format!("[store]\ncheckpoint_interval = \"100ms\"\n{fold}")).expect("config");
    path.to_str().expect("utf8").to_string()
}

/// A varied fleet: managed and dedicated, urgent and normal, waiting, running, ended (succeeded, failed,
/// cancelled before starting), preempted and requeued with lost work, checkpoints.
fn fleet() -> Vec<pb::LifecycleEvent> {
    let mut out = Vec::new();
    for i in 0..JOBS {
        let job = format!("fleet/{i:03}");
        let kind = if i % 2 == 0 { pb::PoolKind::Managed } else { pb::PoolKind::Dedicated };
        let prio = if i % 3 == 0 { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal };
        let t0 = 3 * 86_400 - (i as i64) * 1800;
        let at = |m: i64| ago(t0 - m * 60);
        out.push(event(&job, "s", at(0), submitted(kind, prio, 8)));
        out.push(event(
            &job,
            "q",
            at(1),
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: "Resources".into(),
                message: String::new(),
                estimated_start: None,
                queue_position: None,
            }),
        ));
        if i % 7 == 6 {
            continue; // still waiting
        }
        out.push(event(&job, "n", at(3 + (i as i64 % 5) * 4), Kind::NodeAssigned(Default::default())));
        if i % 11 == 10 {
            out.push(event(
                &job,
                "d",
                at(30),
                Kind::Done(pb::Done { outcome: pb::Outcome::Cancelled as i32, ..Default::default() }),
            ));
            continue; // ended before starting
        }
        out.push(event(
            &job,
            "f",
            at(5 + (i as i64 % 5) * 4),
            Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
        ));
        out.push(event(&job, "c", at(40), Kind::Checkpoint(pb::Checkpoint { step: 100, ..Default::default() })));
        if i % 4 == 1 {
            out.push(event(&job, "p", at(55), Kind::Preempted(Default::default())));
            out.push(event(&job, "r", at(70), Kind::Requeued(pb::Requeued { resume_step: 100 })));
            out.push(event(&job, "f2", at(90), Kind::FirstStep(pb::FirstStep { step: 101, ..Default::default() })));
        }
        if i % 5 == 4 {
            continue; // still running
        }
        let outcome = if i % 9 == 8 { pb::Outcome::Failed } else { pb::Outcome::Succeeded };
        out.push(event(&job, "d", at(120), Kind::Done(pb::Done { outcome: outcome as i32, ..Default::default() })));
    }
    out
}

/// Removes what depends on the moment of the request.
fn stable(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for k in ["as_of", "waiting_seconds"] {
                    m.remove(k);
                }
                // A waiting job's open segment counts up to the moment of the request.
                if matches!(m.get("state").and_then(Value::as_str), Some("queued" | "assigned" | "preparing")) {
                    m.remove("timeline");
                }
                // An open job's time by category counts up to the moment of the request too.
                if matches!(m.get("state").and_then(Value::as_str), Some("running")) {
                    if let Some(Value::Object(t)) = m.get_mut("timeline") {
                        t.remove("time_by_category_seconds");
                    }
                }
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// Everything compared, by request path.
fn answers(c: &Collector) -> Vec<(String, Value)> {
    let mut paths: Vec<String> = (0..JOBS).map(|i| format!("/api/v1/jobs/fleet%2F{i:03}")).collect();
    paths.push("/api/v1/jobs?state=done&limit=1000".into());
    paths.push("/api/v1/jobs?limit=7".into());
    paths.push("/api/v1/jobs?pool_kind=dedicated&limit=1000".into());
    paths.push("/api/v1/slos/urgent-start?window=28d".into());
    paths.push("/api/v1/slos/normal-start?window=28d".into());
    paths.push("/api/v1/compare?window=30d".into());
    paths.push("/api/v1/compare?window=30d&by=priority".into());
    let mut out: Vec<(String, Value)> = paths
        .into_iter()
        .map(|p| {
            let (code, body) = c.get(&p);
            assert_eq!(code, 200, "{p}: {body}");
            (p, stable(body))
        })
        .collect();
    let (code, overview) = c.get("/api/v1/overview");
    assert_eq!(code, 200);
    out.push(("/api/v1/overview states".into(), overview["jobs_by_state"].clone()));
    out
}

fn folded_jobs(c: &Collector) -> u64 {
    let (_, text) = http_get_text(c.http, "/metrics");
    text.lines()
        .find(|l| l.starts_with("startline_collector_jobs{") && l.contains("residence=\"folded\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `v` with the clock taken out of every `expected_start`: its times and `waited_seconds` are computed from the
/// moment of the request, which differs between two collectors asked one after the other. Whether there is an
/// estimate, its basis, group and number of comparable jobs must still agree.
fn without_clock(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .map(|(k, x)| match (k.as_str(), x) {
                    ("expected_start", serde_json::Value::Object(e)) => {
                        let mut e = e.clone();
                        for t in ["at", "low", "high", "waited_seconds"] {
                            e.remove(t);
                        }
                        (k.clone(), serde_json::Value::Object(e))
                    }
                    _ => (k.clone(), without_clock(x)),
                })
                .collect(),
        ),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(without_clock).collect()),
        other => other.clone(),
    }
}

fn assert_same(plain: &Collector, folding: &Collector, when: &str) {
    let (a, b) = (answers(plain), answers(folding));
    let a: Vec<_> = a.into_iter().map(|(p, v)| (p, without_clock(&v))).collect();
    let b: Vec<_> = b.into_iter().map(|(p, v)| (p, without_clock(&v))).collect();
    for ((path, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(x, y, "{when}: {path} differs between the in-memory and the folding collector");
    }
}

async fn send(c: &Collector, events: Vec<pb::LifecycleEvent>) {
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(events).await.expect("send");
    up.flush().await.expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folded_jobs_answer_exactly_as_jobs_kept_in_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plain_cfg, fold_cfg) = (config(dir.path(), "plain", false), config(dir.path(), "fold", true));
    let (plain_db, fold_db) = (dir.path().join("plain"), dir.path().join("fold"));
    let plain = Collector::start(&plain_db, &["--config", &plain_cfg]);
    let mut folding = Collector::start(&fold_db, &["--config", &fold_cfg]);
    let events = fleet();
    let ended: u64 = {
        let mut ids: Vec<&str> =
            events.iter().filter(|e| matches!(e.kind, Some(Kind::Done(_)))).map(|e| e.job_id.as_str()).collect();
        ids.dedup();
        ids.len() as u64
    };
    send(&plain, events.clone()).await;
    send(&folding, events.clone()).await;
    wait_until("every ended job folded", Duration::from_secs(30), || folded_jobs(&folding) == ended);
    assert_eq!(folded_jobs(&plain), 0);
    assert_same(&plain, &folding, "after folding");

    // A restart after a clean stop restores folded jobs from the shutdown image the stop wrote.
    folding.signal_and_wait("TERM");
    assert!(fold_db.join("shutdown.img").exists(), "the stop wrote a shutdown image");
    folding = Collector::start(&fold_db, &["--config", &fold_cfg]);
    let from_image = |c: &Collector, yes: bool| {
        let log = std::fs::read_to_string(&c.log).unwrap_or_default();
        let line = log.lines().rfind(|l| l.contains("store restored")).unwrap_or_default().to_string();
        assert!(line.contains(&format!("from_shutdown_image={yes}")), "restored from the image: {yes}: {line}");
    };
    from_image(&folding, true);
    assert!(!fold_db.join("shutdown.img").exists(), "an image is used once");
    assert_eq!(folded_jobs(&folding), ended);
    assert_same(&plain, &folding, "after a restart");

    // Every event again (duplicates, several reaching folded jobs), plus late events for two folded jobs: a
    // checkpoint stamped before the end (changes the timeline) and one stamped after it (ignored but stored).
    let (_, before) = folding.get("/api/v1/jobs/fleet%2F000");
    let late = vec![
        event(
            "fleet/000",
            "late-c",
            ago(3 * 86_400 - 50 * 60),
            Kind::Checkpoint(pb::Checkpoint { step: 150, ..Default::default() }),
        ),
        event("fleet/002", "late-after", ago(3 * 86_400 - 3600 - 200 * 60), Kind::NodeLost(Default::default())),
    ];
    let mut again = events.clone();
    again.extend(late.clone());
    send(&plain, again.clone()).await;
    send(&folding, again).await;
    let (_, after) = folding.get("/api/v1/jobs/fleet%2F000");
    assert_eq!(after["events"].as_array().map(Vec::len), before["events"].as_array().map(|e| e.len() + 1));
    assert_same(&plain, &folding, "after duplicates and late events");
    wait_until("the unfolded jobs fold again", Duration::from_secs(30), || folded_jobs(&folding) == ended);
    assert_same(&plain, &folding, "after folding again");

    // And once more across a restart, this one from the summaries (the image gone, as after a crash).
    folding.signal_and_wait("TERM");
    std::fs::remove_file(fold_db.join("shutdown.img")).expect("the stop wrote a shutdown image");
    folding = Collector::start(&fold_db, &["--config", &fold_cfg]);
    from_image(&folding, false);
    assert_same(&plain, &folding, "after a second restart");
    // Duplicates of folded jobs' events are answered as duplicates, not stored again.
    let mut up = Publisher::new(UplinkSettings::new(folding.endpoint())).expect("publisher");
    up.send(late).await.expect("send");
    up.flush().await.expect("flush");
    let (_, after2) = folding.get("/api/v1/jobs/fleet%2F000");
    assert_eq!(after2["events"], after["events"]);
}

/// The value of the series of `name` that has the label `label` (`key="value"`).
fn metric(c: &Collector, name: &str, label: &str) -> Option<f64> {
    let (_, text) = http_get_text(c.http, "/metrics");
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `store.hot_budget_mib`: with `fold_after` an hour away, ended jobs stay hot while hot jobs fit the budget, and
/// fold at once when they do not; open jobs stay hot either way, and every answer is the same as before the fold.
/// The budget is exported beside the estimate it bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_hot_budget_ended_jobs_fold_without_waiting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("budget.toml");
    std::fs::write(
        &cfg,
        "[store]\ncheckpoint_interval = \"100ms\"\nfold_after = \"1h\"\nfold_interval = \"50ms\"\nhot_budget_mib = 1\n",
    )
    .expect("config");
    let cfg = cfg.to_str().expect("utf8").to_string();
    let c = Collector::start(&dir.path().join("db"), &["--config", &cfg]);
    assert_eq!(metric(&c, "startline_collector_memory_budget_bytes", "part=\"hot_jobs\""), Some(1048576.0));
    let job = |i: usize| format!("budget/{i:04}");
    let batch = |range: std::ops::Range<usize>, end: bool| -> Vec<pb::LifecycleEvent> {
        let mut out = Vec::new();
        for i in range {
            out.push(event(&job(i), "s", ago(7200), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)));
            out.push(event(&job(i), "f", ago(7000), Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })));
            if end {
                let done = pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() };
                out.push(event(&job(i), "d", ago(3600), Kind::Done(done)));
            }
        }
        out
    };
    // 300 ended jobs fit in 1 MiB (~3 KB each by the estimate): they wait for fold_after.
    send(&c, batch(0..300, true)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(folded_jobs(&c), 0, "within the budget nothing folds before fold_after");
    let (_, before) = c.get("/api/v1/jobs/budget%2F0007");
    // 1000 more, of which 200 still running (~600 KB): hot jobs go over 1 MiB, and a pass that sees it folds every ended
    // job there is (the first 300 included) until they are within it again. (Ended jobs that arrive after the
    // last such pass may stay hot within the budget: how many depends on timing, so only bounds are checked.)
    let mut rest = batch(1100..1300, false);
    rest.extend(batch(300..1100, true));
    send(&c, rest).await;
    let hot_bytes = || metric(&c, "startline_collector_memory_bytes", "part=\"hot_jobs\"").unwrap_or(f64::MAX);
    wait_until("ended jobs folded over the budget", Duration::from_secs(30), || {
        folded_jobs(&c) >= 300 && hot_bytes() <= 1048576.0
    });
    // Two scrapes: a pass may fold between them, so the sum is read until both come from one state.
    let hot = || metric(&c, "startline_collector_jobs", "residence=\"hot\"").expect("hot jobs");
    wait_until("hot and folded jobs add up to every job", Duration::from_secs(10), || {
        hot() + folded_jobs(&c) as f64 == 1300.0
    });
    let hot = hot();
    assert!(hot >= 200.0, "the running jobs stay hot: {hot}");
    let (_, after) = c.get("/api/v1/jobs/budget%2F0007");
    assert_eq!(stable(before), stable(after), "a job folded early answers as it did hot");
    let (code, running) = c.get("/api/v1/jobs?state=running&limit=1000");
    assert_eq!(code, 200);
    assert_eq!(running["jobs"].as_array().map(Vec::len), Some(200));
}

/// `store.folded_budget_mib`: once folded rows outgrow it, the real collector deletes the folded jobs that ended
/// longest ago (and only those) until the rows are within it, counts them by reason, exports the budget and the
/// end time the deletions reached, and the deleted jobs stay deleted after a restart, which keeps that time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_folded_budget_the_oldest_folded_jobs_are_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("folded.toml");
    std::fs::write(
        &cfg,
        "[store]\ncheckpoint_interval = \"100ms\"\nfold_after = \"50ms\"\nfold_interval = \"50ms\"\nfolded_budget_mib = 1\n",
    )
    .expect("config");
    let cfg = cfg.to_str().expect("utf8").to_string();
    let db = dir.path().join("db");
    let mut c = Collector::start(&db, &["--config", &cfg]);
    assert_eq!(metric(&c, "startline_collector_memory_budget_bytes", "part=\"folded_jobs\""), Some(1048576.0));
    // 12000 jobs, job i ending 10 s after job i - 1 (sent in that order).
    const N: usize = 12000;
    let job = |i: usize| format!("old/{i:05}");
    let done_ms: Vec<i64> = (0..N).map(|i| ago(200_000 - 10 * i as i64) / 1000 * 1000).collect();
    for chunk in (0..N).collect::<Vec<_>>().chunks(3000) {
        let mut evs = Vec::new();
        for &i in chunk {
            let at = done_ms[i] - 3_600_000;
            let mut s = submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8);
            // Every fourth job has an attribute set of its own (a label): a dictionary entry its row alone names.
            if let (Kind::Submitted(sub), 0) = (&mut s, i % 4) {
                sub.labels.insert("run".into(), format!("run-{i}"));
            }
            evs.push(event(&job(i), "s", at, s));
            evs.push(event(
                &job(i),
                "f",
                at + 60_000,
                Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
            ));
            let done = pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() };
            evs.push(event(&job(i), "d", done_ms[i], Kind::Done(done)));
        }
        send(&c, evs).await;
    }
    let deleted = |c: &Collector| metric(c, "startline_collector_jobs_deleted_total", "reason=\"memory_budget\"");
    let hot = |c: &Collector| metric(c, "startline_collector_jobs", "residence=\"hot\"");
    let part = |c: &Collector, p: &str| metric(c, "startline_collector_memory_bytes", &format!("part=\"{p}\""));
    let folded_bytes = |c: &Collector| Some(part(c, "folded_jobs")? + part(c, "dictionary")?);
    wait_until("every job folded and the rows within the budget", Duration::from_secs(60), || {
        hot(&c) == Some(0.0)
            && folded_bytes(&c).is_some_and(|b| b <= 1048576.0)
            && deleted(&c).is_some_and(|d| d > 0.0)
            && deleted(&c).unwrap_or(0.0) + folded_jobs(&c) as f64 == N as f64
    });
    let gone = deleted(&c).expect("counted") as usize;
    // The dictionary holds the shared set and the kept jobs' own ones: the deleted jobs' entries went with them.
    let dict = part(&c, "dictionary").expect("dictionary part");
    let own = (gone..N).filter(|i| i % 4 == 0).count() as f64;
    let all = (0..N).filter(|i| i % 4 == 0).count() as f64;
    assert!(own < all / 2.0, "{own} of {all} jobs with their own set kept");
    // ~300-500 bytes an entry by the estimate: the entries of the kept jobs' own sets, not of all of them.
    let per_entry = dict / (own + 1.0);
    assert!((200.0..1000.0).contains(&per_entry), "{dict} bytes for {own} kept own sets and the shared one");
    // Rows of ~140 bytes and, every fourth job, an entry of ~400: ~2.6 MiB for 12000 jobs by the estimate, so
    // about two thirds go to reach 95% of 1 MiB.
    assert!(gone > N / 3 && gone < 3 * N / 4, "{gone} deleted");
    assert_eq!(metric(&c, "startline_collector_jobs_deleted_total", "reason=\"retention\""), Some(0.0));
    // Exactly the earliest-ending ones: the last deleted and the first kept are neighbours.
    let exists = |c: &Collector, i: usize| c.get(&format!("/api/v1/jobs/old%2F{i:05}")).0 == 200;
    assert!(!exists(&c, 0) && !exists(&c, gone - 1), "the {gone} earliest-ending jobs are gone");
    assert!(exists(&c, gone) && exists(&c, N - 1), "job {gone} onwards are kept");
    let through = metric(&c, "startline_collector_history_deleted_through_seconds", "");
    assert_eq!(through, Some(done_ms[gone - 1] as f64 / 1000.0), "the end time the deletions reached");
    // The overview and the comparison say so (the dashboard shows it above both).
    let (_, overview) = c.get("/api/v1/overview");
    let (_, compare) = c.get("/api/v1/compare?window=30d");
    let when = overview["history_deleted_through"].as_str().map(str::to_string);
    let parsed = when.as_deref().and_then(|w| humantime::parse_rfc3339(w).ok());
    let want = std::time::UNIX_EPOCH + Duration::from_millis(done_ms[gone - 1] as u64);
    assert_eq!(parsed, Some(want), "{when:?}");
    assert_eq!(compare["history_deleted_through"].as_str(), when.as_deref());
    for view in ["queue", "compare"] {
        let dom = crate::dashboard::rendered_dom(&c, view, dir.path());
        let note = dom.find("id=\"history-deleted\"").map(|at| &dom[at..dom.len().min(at + 300)]);
        let when = when.as_deref().unwrap_or("?");
        assert!(note.is_some_and(|n| n.contains(when)), "the {view} view shows the deletion: {note:?}");
    }
    let (code, page) = c.get("/api/v1/jobs?state=done&order=job_id&limit=1");
    assert_eq!(code, 200);
    assert_eq!(page["jobs"][0]["job_id"], job(gone), "listings start at the first job kept");
    // A restart: the deleted stay deleted.
    c.signal_and_wait("TERM");
    c = Collector::start(&db, &["--config", &cfg]);
    assert_eq!(folded_jobs(&c), (N - gone) as u64);
    let again = metric(&c, "startline_collector_history_deleted_through_seconds", "");
    assert_eq!(again, through, "the end time the deletions reached is kept across the restart");
    assert!(!exists(&c, gone - 1) && exists(&c, gone));
}
