//! The Slurm adapter in slurmrestd mode against Debian's real slurmrestd 22.05 (started by
//! scripts/slurm-up.sh with auth/jwt): the adapter reads jobs only over REST (its squeue and sacct commands
//! point nowhere), with a JWT from a token file. The collector's timelines must match Slurm's own submit, start
//! and end times; a token rotated mid-run keeps polls succeeding; a wrong token fails polls as `http_status`
//! and loses nothing once a good token is back.

use startline_collector::time::parse_time;
use startline_tests::{binary, wait_until, workspace_root, ChildGuard, Collector};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

struct Slurm {
    base: std::path::PathBuf,
    conf: String,
    rest: String,
}

impl Slurm {
    fn up(base: &std::path::Path) -> Slurm {
        let out = Command::new(workspace_root().join("scripts/slurm-up.sh")).arg(base).output().expect("slurm-up.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "slurm-up failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let line = |k: &str| stdout.lines().find_map(|l| l.strip_prefix(k)).map(str::to_string);
        Slurm {
            base: base.to_path_buf(),
            conf: line("SLURM_CONF=").expect("SLURM_CONF line"),
            rest: line("SLURMRESTD=").expect("SLURMRESTD line"),
        }
    }

    fn cmd(&self, prog: &str, args: &[&str]) -> String {
        let out =
            Command::new(prog).args(args).env("SLURM_CONF", &self.conf).current_dir(&self.base).output().expect(prog);
        assert!(out.status.success(), "{prog} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn sbatch(&self, args: &[&str]) -> String {
        let mut a = vec!["--parsable", "-o", "/dev/null"];
        a.extend_from_slice(args);
        self.cmd("sbatch", &a).split(';').next().unwrap_or("").to_string()
    }

    /// `scontrol token` output as is (`SLURM_JWT=...`), which the adapter accepts in its token file.
    fn token(&self) -> String {
        let t = self.cmd("scontrol", &["token", "username=root", "lifespan=3600"]);
        assert!(t.starts_with("SLURM_JWT=eyJ"), "scontrol token: {t}");
        t
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = Command::new(workspace_root().join("scripts/slurm-down.sh")).arg(&self.base).status();
    }
}

fn ms(v: &serde_json::Value) -> Option<i64> {
    v.as_str().and_then(|s| parse_time(s).ok())
}

/// Replaces the token file atomically (as a rotating job would).
fn write_token(path: &std::path::Path, token: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, format!("{token}\n")).expect("token");
    std::fs::rename(&tmp, path).expect("rename token");
}

#[test]
fn rest_mode_timelines_match_slurm_and_survive_token_rotation_and_a_wrong_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slurm = Slurm::up(&dir.path().join("slurm"));
    let c = Collector::start(&dir.path().join("db"), &[]);
    let token_file = dir.path().join("jwt");
    write_token(&token_file, &slurm.token());
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], startline_tests::free_port()));
    let _adapter = ChildGuard(
        Command::new(binary("startline-agent"))
            .args(["--collector", &c.endpoint(), "slurm", "--interval", "1s", "--first-step-on-start"])
            .args(["--rest", &slurm.rest, "--rest-token-file"])
            .arg(&token_file)
            .args(["--metrics-listen", &metrics.to_string(), "--lookback", "1h", "--vanished-grace", "10m"])
            // REST only: the commands would fail if run.
            .args(["--squeue", "/nonexistent/squeue --json", "--sacct", "/nonexistent/sacct --json"])
            .arg("--spool")
            .arg(dir.path().join("spool"))
            .env_remove("SLURM_JWT")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("adapter.log")).expect("log"))
            .spawn()
            .expect("adapter"),
    );
    let scrape = || startline_tests::http_get_text(metrics, "/metrics").1;
    let errors = |kind: &str| {
        startline_agent::metrics::sample(
            &scrape(),
            "startline_agent_poll_errors_total",
            &[("provider", "slurm"), ("kind", kind)],
        )
        .unwrap_or(0.0)
    };
    let last_ok = || {
        startline_agent::metrics::sample(
            &scrape(),
            "startline_agent_last_successful_poll_timestamp_seconds",
            &[("provider", "slurm")],
        )
        .unwrap_or(0.0)
    };
    let now_s = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let job_key = |id: &str| format!("/api/v1/jobs/slurm/startline/{id}");

    // a takes both GPUs; b waits on Resources, then runs and completes; f fails; an array waits as one record.
    let a = slurm.sbatch(&["--gres=gpu:2", "--wrap", "sleep 8"]);
    let b = slurm.sbatch(&["--gres=gpu:1", "--wrap", "sleep 1"]);
    let f = slurm.sbatch(&["--wrap", "exit 3"]);
    let arr = slurm.sbatch(&["--array=0-1", "--gres=gpu:1", "--wrap", "sleep 1"]);
    let tasks: Vec<String> = (0..2).map(|t| format!("{arr}_{t}")).collect();
    wait_until("b in the collector", Duration::from_secs(60), || c.get(&job_key(&b)).0 == 200);
    assert_eq!(errors("http_status") + errors("transport") + errors("parse"), 0.0, "{}", scrape());

    // Rotate the token mid-run: polls keep succeeding with the new one.
    write_token(&token_file, &slurm.token());
    let rotated = now_s();
    wait_until("a poll with the rotated token", Duration::from_secs(30), || last_ok() > rotated + 1.0);
    assert_eq!(errors("http_status"), 0.0, "{}", scrape());

    // A wrong token (well-formed, bad signature): polls fail as http_status. A job submitted and finished
    // meanwhile is not lost.
    let good = std::fs::read_to_string(&token_file).expect("token");
    let bad = format!("{}AAAAAAAA", good.trim().trim_end_matches(|ch: char| ch != '.'));
    write_token(&token_file, &bad);
    std::thread::sleep(Duration::from_secs(2));
    let w = slurm.sbatch(&["--wrap", "true"]);
    wait_until("an http_status poll error", Duration::from_secs(60), || errors("http_status") >= 1.0);
    wait_until("w to finish", Duration::from_secs(60), || {
        slurm.cmd("sacct", &["-n", "-X", "-P", "-o", "State", "-j", &w]) == "COMPLETED"
    });
    assert_eq!(c.get(&job_key(&w)).0, 404, "w unseen while the token is wrong");
    write_token(&token_file, &slurm.token());

    let all = [&a, &b, &f, &w, &tasks[0], &tasks[1]];
    wait_until("every job to be done in the collector", Duration::from_secs(120), || {
        all.iter().all(|id| c.get(&job_key(id)).1["state"] == "done")
    });

    // Slurm's own record. The live view may report a task done before slurmdbd has its accounting record:
    // read sacct until every job is there (with its end time).
    let ids = all.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",");
    let mut by_id: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    wait_until("every job in Slurm's accounting", Duration::from_secs(60), || {
        let acct: serde_json::Value =
            serde_json::from_str(&slurm.cmd("sacct", &["--json", "--allusers", "-j", &ids])).unwrap_or_default();
        by_id.clear();
        for j in acct["jobs"].as_array().into_iter().flatten() {
            let key = match (j["array"]["job_id"].as_i64(), j["array"]["task_id"].as_i64()) {
                (Some(a), Some(t)) if a > 0 => format!("{a}_{t}"),
                _ => j["job_id"].to_string(),
            };
            by_id.insert(key, j.clone());
        }
        all.iter().all(|id| by_id.get(id.as_str()).is_some_and(|j| j["time"]["end"].as_i64().is_some_and(|e| e > 0)))
    });
    for id in all {
        let (_, job) = c.get(&job_key(id));
        let s = by_id.get(id.as_str()).unwrap_or_else(|| panic!("sacct has no job {id}: {:?}", by_id.keys()));
        let t = &s["time"];
        let m = &job["timeline"]["milestones"];
        assert_eq!(ms(&m["submitted"]), t["submission"].as_i64().map(|x| x * 1000), "job {id}: submit");
        assert_eq!(ms(&m["node_assigned"]), t["start"].as_i64().map(|x| x * 1000), "job {id}: start");
        assert_eq!(ms(&m["first_step"]), t["start"].as_i64().map(|x| x * 1000), "job {id}: first step");
        assert_eq!(ms(&m["done"]), t["end"].as_i64().map(|x| x * 1000), "job {id}: end");
    }
    let outcome = |id: &str| c.get(&job_key(id)).1["outcome"].as_str().unwrap_or("").to_string();
    for (id, want) in [
        (&a, "succeeded"),
        (&b, "succeeded"),
        (&f, "failed"),
        (&w, "succeeded"),
        (&tasks[0], "succeeded"),
        (&tasks[1], "succeeded"),
    ] {
        assert_eq!(outcome(id), want, "job {id}");
    }
    assert_eq!(c.get(&job_key(&f)).1["timeline"]["exit_code"], 3);
    let segs =
        |id: &str| c.get(&job_key(id)).1["timeline"]["initial_wait_seconds"].as_object().cloned().unwrap_or_default();
    assert!(
        segs(&b).keys().any(|k| k == "queued:capacity" || k == "queued:priority"),
        "b waited for a's GPUs: {:?}",
        segs(&b)
    );
    assert_eq!(c.get(&job_key(&arr)).0, 404, "no job for the array record {arr}");
    // Every raw event once.
    for id in all {
        let (_, job) = c.get(&job_key(id));
        let ids: Vec<&str> =
            job["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
        let unique: std::collections::BTreeSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "job {id}: {ids:?}");
    }
    // The wrong token cost polls, never a parse error or a command.
    assert_eq!(errors("parse") + errors("command_failed"), 0.0, "{}", scrape());
}
