//! The Python package `startline` (clients/python) end to end: built as a wheel and an sdist (PyPI's `build`,
//! installed by scripts/test.sh), installed into fresh virtual environments, its own tests run against the
//! installed wheel, and its reports followed through a real node agent (unix socket with the local token, and
//! loopback HTTP) and a real collector (`POST /api/v1/events` with an ingest token limited to the job's own
//! prefix) to the job's timeline. Failure drills: the node agent down for the whole run, the collector refusing
//! with 401 and answering 503 (a fault-injecting proxy in front of the real collector), and a 100,000-step loop
//! calling `checkpoint` every step against a receiver that never answers. The framework callbacks run real
//! PyTorch Lightning and Hugging Face Transformers (PyPI wheels, CPU, a tiny model) from the cached environment
//! scripts/test.sh makes under target/.

use startline_tests::{free_port, http_request, wait_until, workspace_root, Collector, NodeAgent};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Builds the wheel and the sdist from a copy of clients/python (the source tree stays clean).
fn build_dist(dir: &Path) -> (PathBuf, PathBuf) {
    let src = dir.join("src-copy");
    let status =
        Command::new("cp").arg("-r").arg(workspace_root().join("clients/python")).arg(&src).status().expect("cp");
    assert!(status.success());
    let out = dir.join("dist");
    let o = Command::new("python3")
        .args(["-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("python3 -m build");
    assert!(
        o.status.success(),
        "build failed (scripts/test.sh installs PyPI's build):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let find = |ext: &str| {
        std::fs::read_dir(&out)
            .expect("dist")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(ext))
            .unwrap_or_else(|| panic!("no {ext} in dist"))
    };
    (find(".whl"), find(".tar.gz"))
}

/// A fresh virtual environment with `pip install <what>`; returns its python.
fn venv_with(dir: &Path, what: &Path, extra: &[&str]) -> PathBuf {
    let o = Command::new("python3").args(["-m", "venv"]).arg(dir).output().expect("venv");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let python = dir.join("bin/python");
    let o = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(extra)
        .arg(what)
        .output()
        .expect("pip");
    assert!(o.status.success(), "pip install {}: {}", what.display(), String::from_utf8_lossy(&o.stderr));
    python
}

/// A venv with the freshly built wheel installed.
fn installed(dir: &Path) -> PathBuf {
    let (wheel, _) = build_dist(dir);
    venv_with(&dir.join("venv"), &wheel, &["--no-index"])
}

fn tests_dir() -> PathBuf {
    workspace_root().join("clients/python/tests")
}

/// Runs a script of clients/python/tests with the venv's python, from a directory without the sources (so
/// `import startline` is the installed wheel); returns stdout, asserting success.
fn run(python: &Path, script: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let mut cmd = Command::new(python);
    cmd.arg(tests_dir().join(script)).args(args).current_dir(std::env::temp_dir());
    for k in ["STARTLINE_AGENT", "STARTLINE_NODE_SOCKET", "STARTLINE_COLLECTOR_HTTP", "STARTLINE_JOB_ID"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("python");
    assert!(
        o.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn last_json(out: &str) -> serde_json::Value {
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON in {out}"));
    serde_json::from_str(line).expect("json")
}

/// GET of the collector's API, with a read token when it has `[auth]`.
fn get(c: &Collector, token: Option<&str>, path: &str) -> (u16, serde_json::Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("Authorization", b.as_str())).collect();
    let (status, _, body) = http_request(c.http, "GET", path, &headers, "");
    (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

/// Submits `job` as its scheduler's adapter would (the training process reports from its first step on), over
/// the collector's JSON route.
fn submit(c: &Collector, token: Option<&str>, job: &str) {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() - 120;
    let body = serde_json::json!({"kind": "submitted", "job_id": job, "source": "adapter/test", "occurred_at": at,
        "pool_kind": "managed", "provider": "test", "pool": "p", "priority": "normal", "gpu_count": 1})
    .to_string();
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend(bearer.iter().map(|b| ("Authorization", b.as_str())));
    let (status, _, answer) = http_request(c.http, "POST", "/api/v1/events", &headers, &body);
    assert_eq!(status, 200, "{answer}");
}

/// The job's events of `kind` once the collector has `n` of them.
fn events(c: &Collector, token: Option<&str>, job: &str, kind: &str, n: usize) -> Vec<serde_json::Value> {
    let mut found = Vec::new();
    wait_until(&format!("{n} {kind} events of {job}"), Duration::from_secs(30), || {
        let (status, v) = get(c, token, &format!("/api/v1/jobs/{job}"));
        found = if status == 200 {
            v["events"].as_array().cloned().unwrap_or_default().into_iter().filter(|e| e["kind"] == kind).collect()
        } else {
            Vec::new()
        };
        found.len() >= n
    });
    found
}

/// The first step came from the training process, and the checkpoints carry the saves' durations.
fn check_reported(c: &Collector, token: Option<&str>, job: &str, checkpoints: usize, min_save: f64) {
    let first = events(c, token, job, "first_step", 1);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["detail"]["origin"], "training_process", "{first:?}");
    let (_, j) = get(c, token, &format!("/api/v1/jobs/{job}"));
    assert_eq!(j["first_step_origin"], "training_process", "{j}");
    let cps = events(c, token, job, "checkpoint", checkpoints);
    assert_eq!(cps.len(), checkpoints, "{cps:?}");
    let mut saved_ms = 0.0;
    for cp in &cps {
        let secs = cp["detail"]["save_seconds"].as_f64().unwrap_or_else(|| panic!("save_seconds in {cp}"));
        assert!(secs >= min_save && secs < 30.0, "{cp}");
        saved_ms += (secs * 1000.0).round();
    }
    // The timeline's time spent saving is the saves' sum (each kept to the millisecond).
    let (_, j) = get(c, token, &format!("/api/v1/jobs/{job}"));
    let timeline = j["timeline"]["checkpoint_save_seconds"].as_f64().expect("checkpoint_save_seconds");
    assert!((timeline - saved_ms / 1000.0).abs() < 1e-6, "{timeline} vs {saved_ms} ms");
    assert_eq!(events(c, token, job, "done", 1)[0]["detail"]["outcome"], "succeeded");
}

#[test]
fn the_wheel_and_sdist_install_into_fresh_environments_and_the_package_tests_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (wheel, sdist) = build_dist(dir.path());
    // The wheel carries the typing marker and no tests.
    let o = Command::new("python3")
        .args(["-c", "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))"])
        .arg(&wheel)
        .output()
        .expect("zip");
    let names = String::from_utf8_lossy(&o.stdout).into_owned();
    for want in ["startline/__init__.py", "startline/py.typed", "startline/integrations/lightning.py"] {
        assert!(names.lines().any(|l| l == want), "{want} missing from the wheel: {names}");
    }
    let venv = dir.path().join("venv");
    let python = venv_with(&venv, &wheel, &["--no-index"]);
    let o = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(tests_dir())
        .args(["-p", "test_*.py"])
        .current_dir(dir.path())
        .env("STARTLINE_EXPECT_INSTALLED", &venv)
        .env("STARTLINE_IDENTITY_TABLE", workspace_root().join("tests/fixtures/job_identity/cases.json"))
        .output()
        .expect("unittest");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "package tests failed:\n{err}");
    assert!(err.contains("test_the_package_is_the_installed_wheel") && err.contains("OK"), "{err}");
    // `pip install clients/python` (a copy: pip builds in place) works in a fresh environment.
    let python = venv_with(&dir.path().join("venv-dir"), &dir.path().join("src-copy"), &[]);
    let o =
        Command::new(&python).args(["-c", "import startline; print(startline.__version__)"]).output().expect("python");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0.1.0", "{}", String::from_utf8_lossy(&o.stderr));
    // The sdist builds and installs too (pip builds it with setuptools, isolated, from PyPI).
    let python = venv_with(&dir.path().join("venv-sdist"), &sdist, &[]);
    let o = Command::new(&python)
        .args(["-c", "import startline, os; print(os.path.exists(os.path.join(os.path.dirname(startline.__file__), 'py.typed')))"])
        .current_dir(dir.path())
        .output()
        .expect("python");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "True", "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_package_reports_over_the_socket_loopback_http_and_straight_to_the_collector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let python = installed(dir.path());
    // A collector with an ingest token limited to one job's prefix: a training job's least-privilege token.
    let token = startline_collector::auth::generate_token().expect("token");
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[auth.identity]]\nname = \"job-llama\"\ntoken_hashes = [\"{}\"]\n\
             scopes = [\"ingest\"]\njob_id_prefixes = [\"sagemaker/acct/llama-ft/\", \"sagemaker/acct/llama-ft\"]\n\
             [[auth.identity]]\nname = \"agents\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\", \"read\"]\n",
            startline_collector::auth::TokenHash::of(&token).to_config(),
            startline_collector::auth::TokenHash::of("agents-token-0123456789abcdef0123456789").to_config(),
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", &cfg.display().to_string()]);
    let local = dir.path().join("local-token");
    std::fs::write(&local, "node-local-token-for-training-pods\n").expect("token file");
    let sock = dir.path().join("agent.sock");
    let agent = NodeAgent::start_with(
        &[&c.endpoint()],
        &dir.path().join("spool"),
        &[
            "--token",
            "agents-token-0123456789abcdef0123456789",
            "--socket",
            &sock.display().to_string(),
            "--local-token-file",
            &local.display().to_string(),
        ],
    );
    let read = Some("agents-token-0123456789abcdef0123456789");
    let common = |job: &str| {
        vec![("STARTLINE_JOB_ID", job.to_string()), ("STARTLINE_NODE_TOKEN_FILE", local.display().to_string())]
    };

    for job in ["slurm/c1/901", "slurm/c1/902", "sagemaker/acct/llama-ft"] {
        submit(&c, read, job);
    }
    let mut env = common("slurm/c1/901");
    env.push(("STARTLINE_NODE_SOCKET", sock.display().to_string()));
    let out = last_json(&run(&python, "e2e_report.py", &["50", "10"], &env));
    assert_eq!(
        (out["flushed"].clone(), out["sent"].clone(), out["refused"].clone()),
        (true.into(), 8.into(), 0.into()),
        "{out}"
    );
    check_reported(&c, read, "slurm/c1/901", 5, 0.02);

    let mut env = common("slurm/c1/902");
    env.push(("STARTLINE_AGENT", format!("http://{}", agent.addr)));
    let out = last_json(&run(&python, "e2e_report.py", &["30", "10"], &env));
    assert_eq!(out["sent"], 6, "{out}");
    check_reported(&c, read, "slurm/c1/902", 3, 0.02);

    // Without the local token the node agent refuses (401): counted, logged, nothing raised.
    let env =
        vec![("STARTLINE_JOB_ID", "slurm/c1/903".to_string()), ("STARTLINE_NODE_SOCKET", sock.display().to_string())];
    let out = last_json(&run(&python, "e2e_report.py", &["10", "10"], &env));
    assert_eq!((out["refused"].clone(), out["sent"].clone()), (4.into(), 0.into()), "{out}");

    // Straight to the collector, as on a managed endpoint: the SageMaker job's own id, its own token.
    let token_file = dir.path().join("ingest-token");
    std::fs::write(&token_file, &token).expect("token");
    let managed = |job: &str| {
        vec![
            ("TRAINING_JOB_NAME", job.to_string()),
            ("STARTLINE_NAMESPACE", "acct".to_string()),
            ("STARTLINE_COLLECTOR_HTTP", format!("http://{}", c.http)),
            ("STARTLINE_TOKEN_FILE", token_file.display().to_string()),
        ]
    };
    let out = last_json(&run(&python, "e2e_report.py", &["20", "10"], &managed("llama-ft")));
    assert_eq!((out["sent"].clone(), out["refused"].clone()), (5.into(), 0.into()), "{out}");
    check_reported(&c, read, "sagemaker/acct/llama-ft", 2, 0.02);
    let (_, j) = get(&c, read, "/api/v1/jobs/sagemaker/acct/llama-ft");
    let sources: Vec<&str> = j["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] != "submitted")
        .filter_map(|e| e["source"].as_str())
        .collect();
    assert!(sources.iter().all(|s| s.starts_with("training-process/")), "{sources:?}");
    // The same token for another job is refused (403 naming events[0].job_id): least privilege holds.
    let bearer = format!("Bearer {token}");
    let other =
        r#"{"kind": "first_step", "job_id": "sagemaker/acct/someone-else", "source": "training-process/h", "step": 1}"#;
    let (status, _, body) = http_request(
        c.http,
        "POST",
        "/api/v1/events",
        &[("Content-Type", "application/json"), ("Authorization", bearer.as_str())],
        other,
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(r#""field":"events[0].job_id""#), "{body}");
    let out = last_json(&run(&python, "e2e_report.py", &["10", "10"], &managed("someone-else")));
    assert_eq!((out["refused"].clone(), out["sent"].clone()), (4.into(), 0.into()), "{out}");
    assert_eq!(get(&c, read, "/api/v1/jobs/sagemaker/acct/someone-else").0, 404);
}

#[test]
fn drill_the_node_agent_is_down_for_the_whole_run_and_events_arrive_when_it_comes_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let python = installed(dir.path());
    let c = Collector::start(&dir.path().join("db"), &[]);
    submit(&c, None, "slurm/c1/950");
    let port = free_port();
    let mut child = Command::new(&python)
        .arg(tests_dir().join("e2e_agent_down.py"))
        .args(["1000", "100"])
        .current_dir(dir.path())
        .env("STARTLINE_JOB_ID", "slurm/c1/950")
        .env("STARTLINE_AGENT", format!("http://127.0.0.1:{port}"))
        .env_remove("STARTLINE_NODE_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let trained: serde_json::Value =
        serde_json::from_str(&lines.next().expect("a line").expect("read")).expect("trained json");
    assert_eq!(trained["raised"], serde_json::Value::Null, "{trained}");
    assert_eq!((trained["sent"].clone(), trained["queued"].clone()), (0.into(), 12.into()), "{trained}");
    assert!(trained["loop_seconds"].as_f64().expect("seconds") < 2.0, "the loop never waited for the agent: {trained}");
    // The run is still alive: the node agent comes up on the address the package was told.
    let mut agent = Command::new(startline_tests::binary("startline-agent"))
        .args(["--collector", &c.endpoint(), "node", "--listen", &format!("127.0.0.1:{port}"), "--spool"])
        .arg(dir.path().join("spool"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("node agent");
    writeln!(child.stdin.as_mut().expect("stdin")).expect("write");
    let flushed: serde_json::Value =
        serde_json::from_str(&lines.next().expect("a line").expect("read")).expect("flushed json");
    assert_eq!((flushed["flushed"].clone(), flushed["sent"].clone()), (true.into(), 12.into()), "{flushed}");
    let status = child.wait().expect("exit");
    assert!(status.success());
    let cps = events(&c, None, "slurm/c1/950", "checkpoint", 10);
    assert_eq!(cps.len(), 10);
    assert_eq!(events(&c, None, "slurm/c1/950", "first_step", 1).len(), 1);
    let _ = agent.kill();
    let _ = agent.wait();
}

#[test]
fn drill_the_collector_refuses_with_401_and_answers_503_then_takes_the_same_events_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let python = installed(dir.path());
    let token = startline_collector::auth::generate_token().expect("token");
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[auth.identity]]\nname = \"job\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\", \"read\"]\n",
            startline_collector::auth::TokenHash::of(&token).to_config()
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", &cfg.display().to_string()]);
    let read = Some(token.as_str());
    let env = |job: &str, t: &str| {
        vec![
            ("STARTLINE_JOB_ID", job.to_string()),
            ("STARTLINE_COLLECTOR_HTTP", format!("http://{}", c.http)),
            ("STARTLINE_TOKEN", t.to_string()),
        ]
    };
    // 401: a wrong token. Training finishes, every event is refused and counted, nothing is stored.
    let out = last_json(&run(
        &python,
        "e2e_report.py",
        &["20", "10"],
        &env("vertex/p/l/401", "wrong-token-0123456789abcdef"),
    ));
    assert_eq!((out["refused"].clone(), out["sent"].clone()), (5.into(), 0.into()), "{out}");
    assert_eq!(get(&c, read, "/api/v1/jobs/vertex/p/l/401").0, 404);
    submit(&c, read, "vertex/p/l/503");
    // 503: a proxy answers 503 to the first three requests, then passes them to the real collector.
    let out = run(&python, "e2e_collector_503.py", &[&format!("http://{}", c.http), &token, "vertex/p/l/503"], &[]);
    let v = last_json(&out);
    assert_eq!(v["statuses"].as_array().map(|a| a[..3].to_vec()), Some(vec![503.into(); 3]), "{v}");
    assert_eq!(v["retries"], 3, "{v}");
    let ids = v["ids_per_request"].as_array().expect("ids");
    assert!(ids.windows(2).take(3).all(|w| w[0] == w[1]), "every retry carried the same event ids: {v}");
    let cps = events(&c, read, "vertex/p/l/503", "checkpoint", 2);
    assert_eq!(cps.len(), 2, "each event stored once");
    assert_eq!(events(&c, read, "vertex/p/l/503", "first_step", 1).len(), 1);
}

#[test]
fn drill_a_hundred_thousand_checkpoints_with_nothing_answering_stay_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let python = installed(dir.path());
    let port = free_port();
    let env = vec![
        ("STARTLINE_JOB_ID", "slurm/c1/100k".to_string()),
        ("STARTLINE_AGENT", format!("http://127.0.0.1:{port}")),
    ];
    let v = last_json(&run(&python, "e2e_hundred_k.py", &[], &env));
    assert_eq!(v["raised"], serde_json::Value::Null, "{v}");
    assert_eq!(v["calls"], 100_000);
    let (pending, dropped, size) = (
        v["pending"].as_u64().expect("pending"),
        v["dropped"].as_u64().expect("dropped"),
        v["queue_size"].as_u64().expect("size"),
    );
    assert!(pending <= size, "{v}");
    assert_eq!(pending + dropped, 100_000, "every call is queued or counted as dropped: {v}");
    // 100,000 queued events would take ~60 MiB; the bounded queue and the list of timings take ~10.
    assert!(v["peak_bytes"].as_u64().expect("peak") < 24 << 20, "{v}");
}

/// The cached framework environment scripts/test.sh makes (torch CPU-capable wheels, Lightning, Transformers).
fn frameworks_python() -> PathBuf {
    let p = workspace_root().join("target/python-frameworks/bin/python");
    assert!(p.exists(), "{} missing: scripts/test.sh installs torch, lightning and transformers there", p.display());
    p
}

#[test]
fn lightning_and_transformers_callbacks_report_a_real_training_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (wheel, _) = build_dist(dir.path());
    // The wheel installed into a directory of its own on top of the cached framework environment.
    let site = dir.path().join("site");
    let o = Command::new(frameworks_python())
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-index", "--target"])
        .arg(&site)
        .arg(&wheel)
        .output()
        .expect("pip");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = Collector::start(&dir.path().join("db"), &[]);
    let sock = dir.path().join("agent.sock");
    let _agent =
        NodeAgent::start_with(&[&c.endpoint()], &dir.path().join("spool"), &["--socket", &sock.display().to_string()]);
    for (script, job, saves) in [
        ("e2e_lightning.py", "k8s/c1/ml/lightning-tiny", 3),
        ("e2e_transformers.py", "k8s/c1/ml/transformers-tiny", 3),
        ("../examples/pytorch_loop.py", "k8s/c1/ml/pytorch-tiny", 3),
    ] {
        submit(&c, None, job);
        let work = dir.path().join(job.replace('/', "_"));
        std::fs::create_dir_all(&work).expect("workdir");
        let o = Command::new(frameworks_python())
            .arg(tests_dir().join(script))
            .arg(&work)
            .current_dir(&work)
            .env("PYTHONPATH", &site)
            .env("STARTLINE_JOB_ID", job)
            .env("STARTLINE_NODE_SOCKET", &sock)
            .env_remove("STARTLINE_AGENT")
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .output()
            .expect("python");
        assert!(
            o.status.success(),
            "{script}:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        check_reported(&c, None, job, saves, 0.0);
        let cps = events(&c, None, job, "checkpoint", saves);
        assert!(cps.iter().all(|e| e["detail"]["save_seconds"].as_f64().is_some_and(|s| s > 0.0)), "{cps:?}");
        assert!(
            cps.iter().all(|e| e["detail"]["uri"].as_str().is_some_and(|u| u.starts_with("file://"))),
            "{script}: {cps:?}"
        );
    }
    // Training that raises: the Lightning callback reports the failure (the exception still reaches the caller).
    let job = "k8s/c1/ml/lightning-fails";
    submit(&c, None, job);
    let work = dir.path().join("fails");
    std::fs::create_dir_all(&work).expect("workdir");
    let o = Command::new(frameworks_python())
        .arg(tests_dir().join("e2e_lightning.py"))
        .arg(&work)
        .arg("FAIL")
        .current_dir(&work)
        .env("PYTHONPATH", &site)
        .env("STARTLINE_JOB_ID", job)
        .env("STARTLINE_NODE_SOCKET", &sock)
        .env_remove("STARTLINE_AGENT")
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(events(&c, None, job, "first_step", 1).len(), 1);
    let done = events(&c, None, job, "done", 1);
    assert_eq!(done[0]["detail"]["outcome"], "failed", "{done:?}");
    assert!(done[0]["detail"]["message"].as_str().is_some_and(|m| m.contains("RuntimeError: loss is nan")), "{done:?}");
}

#[test]
fn the_package_sends_to_a_collector_over_tls_verified_by_its_ca_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let python = installed(dir.path());
    let ca = startline_tests::pki::TestCa::new(dir.path(), "startline");
    let server = ca.server("collector");
    let token = startline_collector::auth::generate_token().expect("token");
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        format!(
            "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n[[auth.identity]]\nname = \"job\"\ntoken_hashes = [\"{}\"]\n\
             scopes = [\"ingest\", \"read\"]\njob_id_prefixes = [\"azureml/rg/ws/\"]\n",
            server.cert_file.display(),
            server.key_file.display(),
            startline_collector::auth::TokenHash::of(&token).to_config()
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", &cfg.display().to_string()]);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).expect("token");
    let env = vec![
        ("AZUREML_RUN_ID", "quiet_lamp_x1".to_string()),
        ("AZUREML_ARM_RESOURCEGROUP", "rg".to_string()),
        ("AZUREML_ARM_WORKSPACE_NAME", "ws".to_string()),
        ("STARTLINE_COLLECTOR_HTTP", format!("https://localhost:{}", c.http.port())),
        ("STARTLINE_TOKEN_FILE", token_file.display().to_string()),
        ("STARTLINE_CA_FILE", ca.ca_file.display().to_string()),
    ];
    let out = last_json(&run(&python, "e2e_report.py", &["20", "10"], &env));
    assert_eq!(
        (out["sent"].clone(), out["refused"].clone(), out["retries"].clone()),
        (5.into(), 0.into(), 0.into()),
        "{out}"
    );
    // Read back over the same TLS listener.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let job: serde_json::Value = rt.block_on(async {
        let pem = std::fs::read(&ca.ca_file).expect("ca");
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
            .build()
            .expect("client");
        http.get(format!("https://localhost:{}/api/v1/jobs/azureml/rg/ws/quiet_lamp_x1", c.http.port()))
            .bearer_auth(&token)
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json")
    });
    let kinds: Vec<&str> =
        job["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds, ["preparing", "first_step", "checkpoint", "checkpoint", "done"], "{job}");
}

/// A SageMaker training job as `DescribeTrainingJob` answers it (SageMaker's documented shape), its container
/// started at `created + 900` s.
fn sagemaker_in_training(name: &str, created: i64) -> serde_json::Value {
    let at = |s: i64| serde_json::json!(created + s);
    serde_json::json!({
        "TrainingJobName": name,
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Training",
        "CreationTime": at(0),
        "TrainingStartTime": at(900),
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1, "VolumeSizeInGB": 500},
        "SecondaryStatusTransitions": [
            {"Status": "Starting", "StartTime": at(0), "StatusMessage": "Launching requested ML instances"},
            {"Status": "Downloading", "StartTime": at(600), "StatusMessage": "Downloading input data"},
            {"Status": "Training", "StartTime": at(900), "StatusMessage": "Training image download completed. Training in progress."}
        ]
    })
}

/// The managed-endpoint path end to end: the SageMaker adapter (its real client, against a local server replaying
/// SageMaker's documented answers) follows a job whose container started 45 minutes ago; the package, running
/// "inside" the job with SageMaker's `TRAINING_JOB_NAME` and the adapter's namespace, reports the real first step
/// straight to the collector. The job's first step is then the package's (TTFS from it, not from the container
/// start, which becomes the start of `preparing:environment`), and there is one run, not two.
#[test]
fn on_sagemaker_the_packages_first_step_replaces_the_container_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let python = installed(dir.path());
    let c = Collector::start(&dir.path().join("db"), &[]);
    let t0 = startline_proto::time::now_ms() / 1000 - 3600;
    let job = sagemaker_in_training("llama-ft-managed", t0);
    let addr = startline_tests::serve_http(move |r| {
        let answer = match r.header("x-amz-target").unwrap_or("") {
            "SageMaker.ListTrainingJobs" => serde_json::json!({"TrainingJobSummaries": [{"TrainingJobName":
                job["TrainingJobName"], "TrainingJobStatus": "InProgress", "CreationTime": job["CreationTime"]}]}),
            "SageMaker.DescribeTrainingJob" => job.clone(),
            _ => serde_json::json!({"__type": "UnknownOperationException"}),
        };
        (200, "application/x-amz-json-1.1", answer.to_string())
    });
    let _adapter = startline_tests::ChildGuard(
        Command::new(startline_tests::binary("startline-agent"))
            .args(["--collector", &c.endpoint(), "sagemaker", "--interval", "1s", "--namespace", "123456789012"])
            .args(["--endpoint", &format!("http://{addr}"), "--region", "us-east-1", "--spool"])
            .arg(dir.path().join("spool"))
            .env("AWS_ACCESS_KEY_ID", "AKIDTEST")
            .env("AWS_SECRET_ACCESS_KEY", "secret")
            .env_remove("AWS_SESSION_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("adapter"),
    );
    let api = "/api/v1/jobs/sagemaker/123456789012/llama-ft-managed";
    wait_until("the adapter's container start", Duration::from_secs(30), || {
        get(&c, None, api).1["first_step_origin"] == "container_start"
    });
    assert_eq!(get(&c, None, api).1["time_to_first_step_seconds"].as_f64(), Some(900.0));
    let env = vec![
        ("TRAINING_JOB_NAME", "llama-ft-managed".to_string()),
        ("STARTLINE_NAMESPACE", "123456789012".to_string()),
        ("STARTLINE_COLLECTOR_HTTP", format!("http://{}", c.http)),
    ];
    let before = startline_proto::time::now_ms() as f64 / 1000.0;
    let out = last_json(&run(&python, "e2e_report.py", &["1", "1000", "NO_PREPARING"], &env));
    let after = startline_proto::time::now_ms() as f64 / 1000.0;
    assert_eq!((out["sent"].clone(), out["refused"].clone()), (2.into(), 0.into()), "{out}");
    wait_until("the package's first step", Duration::from_secs(30), || {
        get(&c, None, api).1["first_step_origin"] == "training_process"
    });
    let (_, j) = get(&c, None, api);
    let ttfs = j["time_to_first_step_seconds"].as_f64().expect("ttfs");
    // From creation (t0) to the package's step, which ran between `before` and `after`.
    assert!(
        ttfs >= before - t0 as f64 - 0.01 && ttfs <= after - t0 as f64 + 0.01,
        "{ttfs} vs [{before}, {after}] - {t0}"
    );
    assert_eq!(j["timeline"]["runs"].as_u64(), Some(1), "one run, no second first step: {j}");
    let w = &j["timeline"]["initial_wait_seconds"];
    let env_wait = w["preparing:environment"].as_f64().expect("preparing:environment");
    assert!((env_wait - (ttfs - 900.0)).abs() < 0.01, "the container start opens preparing:environment: {w}");
    let sum: f64 = w.as_object().expect("segments").values().filter_map(|v| v.as_f64()).sum();
    assert!((sum - ttfs).abs() < 0.01, "segments {w} add up to {ttfs}");
    let firsts: Vec<&str> = j["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "first_step")
        .filter_map(|e| e["detail"]["origin"].as_str())
        .collect();
    assert_eq!(firsts, ["container_start", "training_process"], "both kept, in time order");
}
