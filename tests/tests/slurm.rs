//! The Slurm adapter on a real single-node Slurm (Debian slurm-wlm 22.05 with munge, slurmdbd and MariaDB;
//! installed by scripts/test.sh, started here by scripts/slurm-up.sh with two fake GPUs): jobs that run, wait
//! on Resources, Priority, Dependency and a user hold, get cancelled, fail, and are requeued. The timelines
//! the collector builds must match Slurm's own submit, start and end times (from `sacct --json`).

use startline_collector::time::parse_time;
use startline_tests::{binary, wait_until, workspace_root, ChildGuard, Collector};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

struct Slurm {
    base: std::path::PathBuf,
    conf: String,
}

impl Slurm {
    fn up(base: &std::path::Path) -> Slurm {
        let out = Command::new(workspace_root().join("scripts/slurm-up.sh")).arg(base).output().expect("slurm-up.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "slurm-up failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let conf = stdout.lines().find_map(|l| l.strip_prefix("SLURM_CONF=")).expect("SLURM_CONF line").to_string();
        Slurm { base: base.to_path_buf(), conf }
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

    fn state(&self, id: &str) -> String {
        self.cmd("squeue", &["-h", "-j", id, "-o", "%T"])
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

#[test]
fn timelines_from_a_real_slurm_match_slurms_own_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slurm = Slurm::up(&dir.path().join("slurm"));
    let c = Collector::start(&dir.path().join("db"), &[]);
    let _adapter = ChildGuard(
        Command::new(binary("startline-agent"))
            .args([
                "--collector",
                &c.endpoint(),
                "slurm",
                "--interval",
                "1s",
                "--urgent-partition",
                "urgent",
                "--first-step-on-start",
                "--site",
                "test-site",
            ])
            .arg("--spool")
            .arg(dir.path().join("spool"))
            .args(["--lookback", "1h", "--vanished-grace", "10m"])
            .env("SLURM_CONF", &slurm.conf)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("adapter.log")).expect("log"))
            .spawn()
            .expect("adapter"),
    );

    // Two GPUs: a and b run; c waits on Resources, d on Priority; e depends on a; f fails; g is held then
    // cancelled; h is urgent; r runs, is requeued, runs again and is cancelled.
    let r = slurm.sbatch(&["--wrap", "sleep 60"]);
    wait_until("r to run", Duration::from_secs(30), || slurm.state(&r) == "RUNNING");
    let a = slurm.sbatch(&["--gres=gpu:1", "--wrap", "sleep 6"]);
    let b = slurm.sbatch(&["--gres=gpu:1", "--wrap", "sleep 6"]);
    let cc = slurm.sbatch(&["--gres=gpu:1", "--wrap", "sleep 2"]);
    let d = slurm.sbatch(&["--gres=gpu:1", "--wrap", "sleep 1"]);
    let e = slurm.sbatch(&[&format!("--dependency=afterok:{a}"), "--wrap", "true"]);
    let f = slurm.sbatch(&["--wrap", "exit 3"]);
    let g = slurm.sbatch(&["--hold", "--wrap", "true"]);
    let h = slurm.sbatch(&["-p", "urgent", "--gres=gpu:1", "--wrap", "sleep 1"]);
    // A job array pending as one squeue record (its tasks need the busy GPUs), and a job that becomes eligible
    // 5 s after submit and then waits for both GPUs: its resource wait is dated at Slurm's eligible_time.
    let arr = slurm.sbatch(&["--array=0-2", "--gres=gpu:1", "--wrap", "sleep 1"]);
    let bj = slurm.sbatch(&["--begin=now+5", "--gres=gpu:2", "--wrap", "true"]);
    let tasks: Vec<String> = (0..3).map(|t| format!("{arr}_{t}")).collect();
    std::thread::sleep(Duration::from_secs(3));
    slurm.cmd("scontrol", &["requeue", &r]);
    slurm.cmd("scancel", &[&g]);
    // Slurm holds a requeued job for two minutes (reason BeginTime); release it now.
    std::thread::sleep(Duration::from_secs(2));
    slurm.cmd("scontrol", &["update", &format!("jobid={r}"), "StartTime=now"]);
    wait_until("r to run again", Duration::from_secs(60), || slurm.state(&r) == "RUNNING");
    std::thread::sleep(Duration::from_secs(2));
    slurm.cmd("scancel", &[&r]);
    let all = [&r, &a, &b, &cc, &d, &e, &f, &g, &h, &bj, &tasks[0], &tasks[1], &tasks[2]];
    let job_key = |id: &str| format!("/api/v1/jobs/slurm/startline/{id}");
    wait_until("every job to be done in the collector", Duration::from_secs(120), || {
        all.iter().all(|id| c.get(&job_key(id)).1["state"] == "done")
    });

    // Slurm's own record.
    let ids = all.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",");
    let acct: serde_json::Value =
        serde_json::from_str(&slurm.cmd("sacct", &["--json", "--allusers", "-j", &ids])).expect("sacct json");
    let mut by_id: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for j in acct["jobs"].as_array().expect("jobs") {
        // Array tasks by `<array job>_<task>`, as the adapter names them.
        let key = match (j["array"]["job_id"].as_i64(), j["array"]["task_id"].as_i64()) {
            (Some(a), Some(t)) if a > 0 => format!("{a}_{t}"),
            _ => j["job_id"].to_string(),
        };
        by_id.insert(key, j.clone());
    }
    let outcome = |id: &str| c.get(&job_key(id)).1["outcome"].as_str().unwrap_or("").to_string();
    for id in all {
        let (_, job) = c.get(&job_key(id));
        let s = by_id.get(id.as_str()).unwrap_or_else(|| panic!("sacct has no job {id}: {:?}", by_id.keys()));
        let t = &s["time"];
        let m = &job["timeline"]["milestones"];
        if **id == r {
            // Slurm's accounting re-dates a requeued job's submission to the requeue; Startline keeps the user's
            // original submit (time to first step counts from it).
            assert!(ms(&m["submitted"]) < t["submission"].as_i64().map(|x| x * 1000), "job {id}: original submit");
        } else {
            assert_eq!(ms(&m["submitted"]), t["submission"].as_i64().map(|x| x * 1000), "job {id}: submit");
        }
        assert_eq!(ms(&m["done"]), t["end"].as_i64().map(|x| x * 1000), "job {id}: end");
        if **id != r && **id != g {
            // Never requeued: the one start is Slurm's start.
            assert_eq!(ms(&m["node_assigned"]), t["start"].as_i64().map(|x| x * 1000), "job {id}: start");
            assert_eq!(ms(&m["first_step"]), t["start"].as_i64().map(|x| x * 1000), "job {id}: first step at start");
        }
    }
    for (id, want) in [
        (&a, "succeeded"),
        (&b, "succeeded"),
        (&cc, "succeeded"),
        (&e, "succeeded"),
        (&f, "failed"),
        (&g, "cancelled"),
        (&h, "succeeded"),
        (&r, "cancelled"),
        (&bj, "succeeded"),
        (&tasks[0], "succeeded"),
        (&tasks[1], "succeeded"),
        (&tasks[2], "succeeded"),
    ] {
        assert_eq!(outcome(id), want, "job {id}");
    }
    // Exit code of the failed job, from squeue's wait status.
    assert_eq!(c.get(&job_key(&f)).1["timeline"]["exit_code"], 3);
    // Wait reasons, mapped and raw.
    let segs =
        |id: &str| c.get(&job_key(id)).1["timeline"]["initial_wait_seconds"].as_object().cloned().unwrap_or_default();
    assert!(segs(&cc).contains_key("queued:capacity"), "c waited on Resources: {:?}", segs(&cc));
    assert!(segs(&d).keys().any(|k| k == "queued:priority" || k == "queued:capacity"), "d: {:?}", segs(&d));
    assert!(segs(&e).contains_key("queued:dependency_or_hold"), "e waited on its dependency: {:?}", segs(&e));
    assert!(segs(&g).contains_key("queued:dependency_or_hold"), "g was held: {:?}", segs(&g));
    // The pending array record is no job of its own: only its tasks are.
    assert_eq!(c.get(&job_key(&arr)).0, 404, "no job for the array record {arr}");
    for t in &tasks {
        assert!(segs(t).keys().any(|k| k.starts_with("queued:")), "task {t} waited: {:?}", segs(t));
    }
    // The begin-time job: dependency_or_hold from submit, then its resource wait from eligible_time exactly.
    let bjob = c.get(&job_key(&bj)).1;
    let eligible = by_id[bj.as_str()]["time"]["eligible"].as_i64().map(|x| x * 1000);
    let queued: Vec<(String, Option<i64>)> = bjob["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "queued")
        .map(|e| (e["detail"]["reason"].as_str().unwrap_or("").to_string(), ms(&e["occurred_at"])))
        .collect();
    assert_eq!(queued.first().map(|q| q.0.as_str()), Some("dependency_or_hold"), "{bjob}");
    let after: Vec<&(String, Option<i64>)> = queued.iter().filter(|q| q.0 != "dependency_or_hold").collect();
    assert!(!after.is_empty(), "bj waited for resources after its begin time: {bjob}");
    assert_eq!(after[0].1, eligible, "dated at eligible_time: {bjob}");
    // The urgent partition maps to urgent; the requeue is a second attempt.
    assert_eq!(c.get(&job_key(&h)).1["priority"], "urgent");
    assert_eq!(c.get(&job_key(&a)).1["priority"], "normal");
    let rj = c.get(&job_key(&r)).1;
    assert_eq!(rj["timeline"]["attempts"], 2, "{rj}");
    assert_eq!(rj["region"], "test-site");
    // Every raw event once: no duplicate transitions across the adapter's polls.
    for id in all {
        let (_, job) = c.get(&job_key(id));
        let ids: Vec<&str> =
            job["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
        let unique: std::collections::BTreeSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "job {id}: {ids:?}");
    }
}
