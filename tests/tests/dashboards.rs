//! Grafana dashboards and Prometheus rules, checked for real: structure (unique ids, the `${datasource}`
//! variable, units), every panel query run against a real Prometheus (Debian `prometheus`, started here) that
//! scraped a real collector fed by the simulator, and `promtool test rules` on the shipped rules. No Grafana
//! can be installed here; its only job would be to send these same queries.

use startline_tests::{binary, free_port, http_get, query_escape, workspace_root, ChildGuard, Collector};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DASHBOARDS: [&str; 3] = ["queue-latency.json", "slos.json", "managed-vs-dedicated.json"];

fn load(name: &str) -> serde_json::Value {
    let p = workspace_root().join("dashboards").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("dashboard file")).expect("dashboard json")
}

#[test]
fn dashboards_are_well_formed() {
    for name in DASHBOARDS {
        let d = load(name);
        assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 39), "{name}: schemaVersion");
        assert!(d["uid"].as_str().is_some_and(|u| u.starts_with("startline-")), "{name}: uid");
        let vars = d["templating"]["list"].as_array().expect("templating");
        assert!(
            vars.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
            "{name}: datasource variable"
        );
        // Every dashboard filters by cluster and instance, links to the others and to the built-in job timeline.
        for var in ["cluster", "instance", "startline_url"] {
            assert!(vars.iter().any(|v| v["name"] == var), "{name}: variable {var}");
        }
        let links = d["links"].as_array().expect("links");
        assert!(links.iter().any(|l| l["type"] == "dashboards" && l["tags"][0] == "startline"), "{name}: links");
        assert!(
            links.iter().any(|l| l["url"].as_str().is_some_and(|u| u.starts_with("${startline_url}/#job"))),
            "{name}: link to the built-in job timeline"
        );
        let panels = d["panels"].as_array().expect("panels");
        let mut ids = std::collections::BTreeSet::new();
        for p in panels {
            assert!(ids.insert(p["id"].as_u64().expect("id")), "{name}: duplicate panel id {}", p["id"]);
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: panel {} datasource", p["title"]);
            assert!(
                p["fieldConfig"]["defaults"]["unit"].as_str().is_some_and(|u| !u.is_empty()),
                "{name}: panel {} unit",
                p["title"]
            );
            for t in p["targets"].as_array().expect("targets") {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}: target datasource");
                let expr = t["expr"].as_str().expect("expr");
                assert!(!expr.contains("job_id"), "{name}: never a job id");
                // Raw series are scoped to the chosen cluster and instance (recording rules are global).
                assert!(
                    expr.contains("startline:") || expr.contains("instance=~\"$instance\""),
                    "{name} / {}: {expr} is not filtered by $instance",
                    p["title"]
                );
            }
        }
    }
}

#[test]
fn shipped_rules_pass_promtool_check_and_unit_tests() {
    let dir = workspace_root().join("deploy/prometheus");
    // The shipped file is the generator's output for the default configuration.
    let generated = Command::new(startline_tests::binary("startline-collector"))
        .arg("rules")
        .env_remove("STARTLINE_CONFIG")
        .output()
        .expect("startline-collector rules");
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    let shipped = std::fs::read_to_string(dir.join("startline-rules.yml")).expect("shipped rules");
    assert!(
        String::from_utf8_lossy(&generated.stdout) == shipped,
        "deploy/prometheus/startline-rules.yml differs from `startline-collector rules`: regenerate it (and run \
         scripts/sync-kubernetes.sh)"
    );
    let check = Command::new("promtool")
        .args(["check", "rules", "startline-rules.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool");
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let test = Command::new("promtool")
        .args(["test", "rules", "startline-rules.test.yml"])
        .current_dir(dir.join("tests"))
        .output()
        .expect("promtool");
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    let cfg = Command::new("promtool")
        .args(["check", "config", "prometheus.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool");
    assert!(cfg.status.success(), "{}", String::from_utf8_lossy(&cfg.stderr));
}

#[test]
fn every_panel_query_returns_data_from_a_real_prometheus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let port = free_port();
    let cfg = dir.path().join("prometheus.yml");
    // The shipped rules, evaluated every second here, so panels on recording rules have data.
    let rules = std::fs::read_to_string(workspace_root().join("deploy/prometheus/startline-rules.yml"))
        .expect("rules")
        .replace("interval: 30s", "interval: 1s");
    std::fs::write(dir.path().join("rules.yml"), rules).expect("rules copy");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - rules.yml\nscrape_configs:\n  - job_name: startline\n    static_configs:\n      - targets: ['{}']\n",
            c.http
        ),
    )
    .expect("config");
    let _prom = ChildGuard(
        Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prom.log")).expect("log"))
            .spawn()
            .expect("prometheus runs (scripts/test.sh installs Debian's prometheus)"),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::panic::catch_unwind(|| http_get(addr, "/-/ready").0).unwrap_or(0) != 200 {
        assert!(Instant::now() < deadline, "prometheus not ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A day of fleet history over ~5 s, so counters move between scrapes.
    let sim = Command::new(binary("startline-agent"))
        .args([
            "--collector",
            &c.endpoint(),
            "simulate",
            "--history",
            "1d",
            "--speedup",
            "17280",
            "--seed",
            "5",
            "--jobs-per-hour",
            "120",
        ])
        .output()
        .expect("simulator");
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    std::thread::sleep(Duration::from_secs(3));

    let mut checked = 0;
    for name in DASHBOARDS {
        let d = load(name);
        for p in d["panels"].as_array().expect("panels") {
            for t in p["targets"].as_array().expect("targets") {
                let expr = t["expr"]
                    .as_str()
                    .expect("expr")
                    .replace("$__rate_interval", "1m")
                    .replace("$pool_kind", ".*")
                    .replace("$priority", ".*")
                    .replace("$slo", ".*")
                    .replace("$cluster", ".*")
                    .replace("$instance", ".*")
                    .replace("$team", ".*");
                let (status, body) = http_get(addr, &format!("/api/v1/query?query={}", query_escape(&expr)));
                assert_eq!(status, 200, "{name} / {}: {expr}: {body}", p["title"]);
                let n = body["data"]["result"].as_array().map_or(0, Vec::len);
                assert!(n > 0, "{name} / {}: no data for {expr}", p["title"]);
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} queries checked");
}
