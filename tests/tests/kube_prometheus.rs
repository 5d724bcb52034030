//! The Kubernetes monitoring wiring for kube-prometheus-stack, against a real Prometheus (Debian's
//! `prometheus`). No Kubernetes API server or Prometheus Operator can run here, so the test does the Operator's
//! part itself, from its documented rules (prometheus-operator `Documentation/api-reference/api.md`, `jobLabel`;
//! `pkg/prometheus/promcfg.go`): a ServiceMonitor's targets get job = the selected Service's name (or the value of
//! the Service label `jobLabel` names), a PodMonitor's get job = "<namespace>/<PodMonitor name>" (or the value of
//! the pod label `jobLabel` names). The overlay `kube-prometheus-stack` is rendered with `kubectl kustomize`, its
//! monitors are turned into scrape jobs that way, and Prometheus scrapes a collector (the ConfigMap's config, TLS
//! with a certificate for the ServiceMonitor's serverName), a node agent and two Vertex adapters running here
//! (a local server answers the adapters' CustomJob lists). It loads `deploy/prometheus/startline-rules.yml`
//! unchanged; an adapter whose clock is 15 minutes behind (libfaketime: its last successful poll reads 15
//! minutes old, as for one whose provider stopped answering then) must raise StartlineAdapterStale, and a
//! killed collector StartlineCollectorDown: pending under the shipped rules (`for: 5m`), firing under a second
//! copy of the same rules whose `for:` durations are cut to 2s (the only change; named `*-short-for`).

use serde_json::Value;
use startline_tests::{
    bin_dir, free_port, http_get, pki::TestCa, query_escape, serve_http, wait_until, workspace_root, ChildGuard,
    Collector, NodeAgent,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

const RELEASE: &str = "kube-prometheus-stack";

/// `kubectl kustomize DIR` as JSON objects.
fn render(dir: &std::path::Path) -> Vec<Value> {
    let out = Command::new("kubectl").arg("kustomize").arg(dir).output().expect("kubectl (kubernetes-client)");
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    let mut py = Command::new("python3")
        .args(["-c", "import json,sys,yaml; json.dump([o for o in yaml.safe_load_all(sys.stdin) if o], sys.stdout)"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with PyYAML");
    std::io::Write::write_all(&mut py.stdin.take().expect("stdin"), &out.stdout).expect("write");
    let json = py.wait_with_output().expect("python3");
    serde_json::from_slice(&json.stdout).expect("objects as json")
}

fn overlay() -> Vec<Value> {
    render(&workspace_root().join("deploy/kubernetes/overlays/kube-prometheus-stack"))
}

fn selects(match_labels: &Value, labels: &Value) -> bool {
    match_labels.as_object().is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
}

fn workloads(objects: &[Value]) -> impl Iterator<Item = &Value> {
    objects.iter().filter(|o| matches!(o["kind"].as_str(), Some("StatefulSet" | "Deployment" | "DaemonSet")))
}

/// One scrape job the Operator would generate for a monitor endpoint, and the workload whose pods it scrapes.
#[derive(Debug, Clone)]
struct Scrape {
    monitor: String,
    job: String,
    workload: String,
    /// The container port's name and number the endpoint resolves to.
    port: (String, u64),
    path: String,
    scheme: String,
    server_name: Option<String>,
}

/// The container port named `name` in a workload's pod template.
fn container_port(workload: &Value, name: &str) -> Option<u64> {
    let containers = workload["spec"]["template"]["spec"]["containers"].as_array()?;
    containers
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
}

/// The scrape jobs of every ServiceMonitor and PodMonitor, named as the Prometheus Operator names them.
fn operator_scrapes(objects: &[Value]) -> Vec<Scrape> {
    let mut out = Vec::new();
    let ns = |o: &Value| o["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
    for m in objects.iter().filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1") {
        let name = m["metadata"]["name"].as_str().expect("name").to_string();
        let job_label = m["spec"]["jobLabel"].as_str();
        let selector = &m["spec"]["selector"]["matchLabels"];
        // Without a namespaceSelector a monitor selects in its own namespace.
        let same_ns = |o: &&Value| ns(o) == ns(m);
        match m["kind"].as_str() {
            Some("ServiceMonitor") => {
                for svc in objects.iter().filter(|o| o["kind"] == "Service").filter(same_ns) {
                    if !selects(selector, &svc["metadata"]["labels"]) {
                        continue;
                    }
                    let svc_name = svc["metadata"]["name"].as_str().expect("svc name");
                    let job =
                        job_label.and_then(|l| svc["metadata"]["labels"][l].as_str()).unwrap_or(svc_name).to_string();
                    for ep in m["spec"]["endpoints"].as_array().expect("endpoints") {
                        let port = ep["port"].as_str().expect("endpoint port name");
                        let sp = svc["spec"]["ports"].as_array().expect("ports").iter().find(|p| p["name"] == port);
                        let target = sp.map(|p| p["targetPort"].clone()).expect("Service port of the endpoint");
                        for w in workloads(objects).filter(same_ns) {
                            if !selects(&svc["spec"]["selector"], &w["spec"]["template"]["metadata"]["labels"]) {
                                continue;
                            }
                            let number = match &target {
                                Value::String(n) => container_port(w, n).expect("named targetPort"),
                                v => v.as_u64().expect("targetPort"),
                            };
                            out.push(Scrape {
                                monitor: format!("ServiceMonitor/{name}"),
                                job: job.clone(),
                                workload: format!("{}/{}", w["kind"].as_str().unwrap_or(""), w["metadata"]["name"]),
                                port: (port.to_string(), number),
                                path: ep["path"].as_str().unwrap_or("/metrics").to_string(),
                                scheme: ep["scheme"].as_str().unwrap_or("http").to_string(),
                                server_name: ep["tlsConfig"]["serverName"].as_str().map(str::to_string),
                            });
                        }
                    }
                }
            }
            Some("PodMonitor") => {
                for w in workloads(objects).filter(same_ns) {
                    let labels = &w["spec"]["template"]["metadata"]["labels"];
                    if !selects(selector, labels) {
                        continue;
                    }
                    let job = job_label
                        .and_then(|l| labels[l].as_str())
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("{}/{name}", ns(m)));
                    for ep in m["spec"]["podMetricsEndpoints"].as_array().expect("podMetricsEndpoints") {
                        let port = ep["port"].as_str().expect("endpoint port name");
                        out.push(Scrape {
                            monitor: format!("PodMonitor/{name}"),
                            job: job.clone(),
                            workload: format!("{}/{}", w["kind"].as_str().unwrap_or(""), w["metadata"]["name"]),
                            port: (port.to_string(), container_port(w, port).expect("the pod's named port")),
                            path: ep["path"].as_str().unwrap_or("/metrics").to_string(),
                            scheme: ep["scheme"].as_str().unwrap_or("http").to_string(),
                            server_name: None,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The environment value a workload's first container sets for `name`.
fn env_of(workload: &Value, name: &str) -> Option<String> {
    let env = workload["spec"]["template"]["spec"]["containers"][0]["env"].as_array()?;
    env.iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str()).map(str::to_string)
}

/// Every `up{...}` selector in the shipped rules (the meta-alerts on scrape health).
fn up_selectors(rules: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = rules;
    while let Some(i) = rest.find("up{") {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail.find('}').expect("closing brace");
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..=end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

#[test]
fn kube_prometheus_stack_selects_every_monitoring_object_and_scrapes_every_agent() {
    let objects = overlay();
    for o in &objects {
        let release = o["metadata"]["labels"]["release"].as_str();
        if o["apiVersion"].as_str().is_some_and(|a| a.starts_with("monitoring.coreos.com/")) {
            assert_eq!(
                release,
                Some(RELEASE),
                "{} {}: kube-prometheus-stack's selector label",
                o["kind"],
                o["metadata"]["name"]
            );
        } else {
            assert_eq!(release, None, "{} {}: only monitoring objects get the label", o["kind"], o["metadata"]["name"]);
        }
    }
    let kinds: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1")
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert_eq!(kinds, BTreeSet::from(["PodMonitor", "PrometheusRule", "ServiceMonitor"]));

    // Every Startline workload is scraped once, under the job the rules select.
    let scrapes = operator_scrapes(&objects);
    let by_workload: BTreeMap<String, Vec<&Scrape>> = scrapes.iter().fold(BTreeMap::new(), |mut m, s| {
        m.entry(s.workload.clone()).or_default().push(s);
        m
    });
    let want: BTreeMap<&str, &str> = BTreeMap::from([
        ("StatefulSet/\"startline-collector\"", "startline-collector"),
        ("DaemonSet/\"startline-node-agent\"", "startline-node-agent"),
        ("Deployment/\"startline-slurm-adapter\"", "startline-slurm-adapter"),
        ("Deployment/\"startline-sagemaker-adapter\"", "startline-sagemaker-adapter"),
        ("Deployment/\"startline-vertex-adapter\"", "startline-vertex-adapter"),
        ("Deployment/\"startline-kueue-adapter\"", "startline-kueue-adapter"),
    ]);
    let got: BTreeMap<&str, &str> = by_workload
        .iter()
        .map(|(w, s)| {
            assert_eq!(s.len(), 1, "{w} is scraped once: {s:?}");
            (w.as_str(), s[0].job.as_str())
        })
        .collect();
    assert_eq!(got, want, "workload -> job label");
    // The agents serve their metrics where the PodMonitors look: STARTLINE_METRICS_LISTEN on the named port.
    for s in scrapes.iter().filter(|s| s.monitor.starts_with("PodMonitor/")) {
        let w = workloads(&objects)
            .find(|w| format!("{}/{}", w["kind"].as_str().unwrap_or(""), w["metadata"]["name"]) == s.workload)
            .expect("workload");
        let listen = env_of(w, "STARTLINE_METRICS_LISTEN")
            .unwrap_or_else(|| panic!("{}: no STARTLINE_METRICS_LISTEN", s.workload));
        assert_eq!(
            listen,
            format!("0.0.0.0:{}", s.port.1),
            "{}: metrics on the pod's address, port {}",
            s.workload,
            s.port.0
        );
    }

    // Another release name: the patch the component documents, applied after it in an overlay.
    let dir = tempfile::tempdir().expect("tempdir");
    let base = workspace_root().join("deploy/kubernetes");
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n\
             patches:\n  - target: {{group: monitoring.coreos.com}}\n    patch: |-\n      - op: replace\n        \
             path: /metadata/labels/release\n        value: my-prometheus\n",
            relative(dir.path(), &base.join("overlays/single")),
            relative(dir.path(), &base.join("components/kube-prometheus-stack"))
        ),
    )
    .expect("write overlay");
    let renamed = render(dir.path());
    let monitors: Vec<&Value> = renamed.iter().filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1").collect();
    assert_eq!(monitors.len(), 4);
    for m in monitors {
        assert_eq!(m["metadata"]["labels"]["release"], "my-prometheus", "{}", m["metadata"]["name"]);
    }
}

/// `to` relative to the directory `from` (kustomize refuses absolute resource paths).
fn relative(from: &std::path::Path, to: &std::path::Path) -> String {
    let ups = from.components().count() - 1;
    format!("{}{}", "../".repeat(ups), to.strip_prefix("/").expect("absolute path").display())
}

fn prom_get(prom: SocketAddr, path: &str) -> Value {
    let (status, v) = http_get(prom, path);
    assert_eq!(status, 200, "GET {path}: {v}");
    assert_eq!(v["status"], "success", "GET {path}: {v}");
    v["data"].clone()
}

/// The alerts Prometheus holds now (`/api/v1/alerts`).
fn alerts(prom: SocketAddr) -> Vec<Value> {
    prom_get(prom, "/api/v1/alerts")["alerts"].as_array().cloned().unwrap_or_default()
}

fn vertex_adapter(
    collector: &str,
    ca: &std::path::Path,
    api: SocketAddr,
    spool: &std::path::Path,
    metrics: SocketAddr,
    clock: Option<&str>,
) -> ChildGuard {
    let agent = bin_dir().join("startline-agent");
    let mut cmd = match clock {
        Some(offset) => {
            let mut c = Command::new("faketime");
            c.args(["-f", offset]).arg(agent);
            c
        }
        None => Command::new(agent),
    };
    cmd.args(["--collector", collector, "--ca-file"])
        .arg(ca)
        .args(["vertex", "--project", "ml-prod", "--location", "europe-west4", "--interval", "1s"])
        .args(["--endpoint", &format!("http://{api}"), "--metrics-listen", &metrics.to_string()])
        .arg("--spool")
        .arg(spool)
        .env("VERTEX_ACCESS_TOKEN", "ya29.test-token")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    ChildGuard(cmd.spawn().expect("startline-agent vertex (faketime from Debian's faketime for the stale one)"))
}

#[test]
fn a_real_prometheus_scraping_the_operator_jobs_raises_the_meta_alerts() {
    let objects = overlay();
    let scrapes = operator_scrapes(&objects);
    let scrape_of = |workload: &str| {
        scrapes.iter().find(|s| s.workload == workload).cloned().unwrap_or_else(|| panic!("no scrape of {workload}"))
    };
    let collector_scrape = scrape_of("StatefulSet/\"startline-collector\"");
    let agent_scrape = scrape_of("DaemonSet/\"startline-node-agent\"");
    let adapter_scrape = scrape_of("Deployment/\"startline-vertex-adapter\"");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();

    // The collector with the ConfigMap's config, its certificate issued for the ServiceMonitor's serverName.
    let server_name = collector_scrape.server_name.clone().expect("the ServiceMonitor verifies a server name");
    assert_eq!(collector_scrape.scheme, "https");
    let ca = TestCa::new(d, "cluster");
    let server = ca.server_for("collector", &[&server_name]);
    let toml = std::fs::read_to_string(workspace_root().join("deploy/kubernetes/base/collector.toml")).expect("toml");
    let local = toml
        .replace("/etc/startline/tls/tls.crt", &server.cert_file.to_string_lossy())
        .replace("/etc/startline/tls/tls.key", &server.key_file.to_string_lossy())
        .replace("/var/lib/startline", &d.join("data").to_string_lossy());
    std::fs::write(d.join("collector.toml"), local).expect("write config");
    let collector = Collector::start(&d.join("data"), &["--config", &d.join("collector.toml").to_string_lossy()]);
    let grpc = format!("https://localhost:{}", collector.grpc.port());

    // A node agent and two Vertex adapters serving metrics where --metrics-listen (STARTLINE_METRICS_LISTEN) says.
    let agent_metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let _agent = NodeAgent::start_with(
        &[&grpc],
        &d.join("agent-spool"),
        &["--metrics-listen", &agent_metrics.to_string(), "--ca-file", &ca.ca_file.to_string_lossy()],
    );
    let api = serve_http(|_| (200, "application/json", r#"{"customJobs": []}"#.to_string()));
    let fresh: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let stale: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let _fresh = vertex_adapter(&grpc, &ca.ca_file, api, &d.join("fresh-spool"), fresh, None);
    let _stale = vertex_adapter(&grpc, &ca.ca_file, api, &d.join("stale-spool"), stale, Some("-15m"));

    // The scrape configuration the Operator would generate for these monitors (targets: the processes above).
    let mut jobs: BTreeMap<String, (Scrape, Vec<String>)> = BTreeMap::new();
    for (s, target) in [
        (&collector_scrape, collector.http.to_string()),
        (&agent_scrape, agent_metrics.to_string()),
        (&adapter_scrape, fresh.to_string()),
        (&adapter_scrape, stale.to_string()),
    ] {
        jobs.entry(s.job.clone()).or_insert_with(|| (s.clone(), Vec::new())).1.push(target);
    }
    let mut config = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - startline-rules.yml\n  - startline-rules-short-for.yml\nscrape_configs:\n",
    );
    for (job, (s, targets)) in &jobs {
        config += &format!(
            "  - job_name: {}\n    metrics_path: {}\n    scheme: {}\n",
            serde_json::json!(job),
            s.path,
            s.scheme
        );
        if let Some(name) = &s.server_name {
            config += &format!("    tls_config:\n      ca_file: {}\n      server_name: {name}\n", ca.ca_file.display());
        }
        config += &format!("    static_configs:\n      - targets: {}\n", serde_json::json!(targets));
    }
    std::fs::write(d.join("prometheus.yml"), &config).expect("write prometheus.yml");
    let rules = std::fs::read_to_string(workspace_root().join("deploy/prometheus/startline-rules.yml")).expect("rules");
    std::fs::write(d.join("startline-rules.yml"), &rules).expect("write rules");
    let short: String = rules
        .lines()
        .map(|l| {
            if let Some(name) = l.strip_prefix("  - name: ") {
                format!("  - name: {name}-short-for")
            } else if l.trim_start().starts_with("for: ") {
                format!("{}for: 2s", &l[..l.len() - l.trim_start().len()])
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(d.join("startline-rules-short-for.yml"), short + "\n").expect("write short rules");

    let port = free_port();
    let prom_addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let _prom = ChildGuard(
        Command::new("prometheus")
            .arg(format!("--config.file={}", d.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", d.join("tsdb").display()))
            .arg(format!("--web.listen-address={prom_addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("prometheus.log")).expect("log"))
            .spawn()
            .expect("prometheus (Debian's prometheus; scripts/test.sh installs it)"),
    );
    let prom_log = || std::fs::read_to_string(d.join("prometheus.log")).unwrap_or_default();
    wait_until("Prometheus listens", Duration::from_secs(30), || std::net::TcpStream::connect(prom_addr).is_ok());
    wait_until("every target is scraped and up", Duration::from_secs(60), || {
        let (status, v) = http_get(prom_addr, "/api/v1/targets");
        let active = v["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
        status == 200 && active.len() == 4 && active.iter().all(|t| t["health"] == "up")
    });
    let rules_loaded = prom_get(prom_addr, "/api/v1/rules")["groups"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(rules_loaded, 6, "both rule files loaded, three groups each: {}", prom_log());

    // Every up{...} selector of the shipped meta-alerts matches some scraped job, and every scraped job is
    // matched by one: with the Operator's job labels, none of them is inert.
    let mut matched = BTreeSet::new();
    for sel in up_selectors(&rules) {
        let data = prom_get(prom_addr, &format!("/api/v1/query?query={}", query_escape(&sel)));
        let found: BTreeSet<String> = data["result"]
            .as_array()
            .expect("result")
            .iter()
            .filter_map(|r| r["metric"]["job"].as_str().map(str::to_string))
            .collect();
        assert!(!found.is_empty(), "the rules' selector {sel} matches no scraped job ({:?})", jobs.keys());
        matched.extend(found);
    }
    let scraped: BTreeSet<String> = jobs.keys().cloned().collect();
    assert_eq!(matched, scraped, "every scraped job is watched by a meta-alert");

    // The adapter whose last success is 15 minutes old raises StartlineAdapterStale; the fresh one does not.
    let stale_alert = |a: &Value| a["labels"]["alertname"] == "StartlineAdapterStale";
    wait_until("StartlineAdapterStale fires for the stale adapter", Duration::from_secs(30), || {
        alerts(prom_addr)
            .iter()
            .any(|a| stale_alert(a) && a["state"] == "firing" && a["labels"]["instance"] == stale.to_string().as_str())
    });
    let now = alerts(prom_addr);
    let stale_ones: Vec<&Value> = now.iter().filter(|a| stale_alert(a)).collect();
    for a in &stale_ones {
        assert_eq!(a["labels"]["job"], adapter_scrape.job.as_str());
        assert_eq!(a["labels"]["provider"], "vertex");
        assert_ne!(a["labels"]["instance"], fresh.to_string().as_str(), "the fresh adapter is not stale: {a}");
    }
    assert!(
        !now.iter().any(|a| a["labels"]["alertname"] == "StartlineCollectorDown"
            || a["labels"]["alertname"] == "StartlineAgentDown"),
        "nothing is down yet: {now:?}"
    );

    // Stop the collector: its target goes down and StartlineCollectorDown is raised with its job and instance.
    let collector_http = collector.http.to_string();
    let _ = collector.signal_and_wait("KILL");
    let down = |a: &Value, state: &str| {
        a["labels"]["alertname"] == "StartlineCollectorDown"
            && a["state"] == state
            && a["labels"]["job"] == collector_scrape.job.as_str()
            && a["labels"]["instance"] == collector_http.as_str()
    };
    wait_until("StartlineCollectorDown fires (rules with for: 2s)", Duration::from_secs(30), || {
        alerts(prom_addr).iter().any(|a| down(a, "firing"))
    });
    assert!(alerts(prom_addr).iter().any(|a| down(a, "pending")), "pending under the shipped for: 5m");
    // Which rule group holds which state: the shipped group's rule is pending, the copy's is firing.
    let groups = prom_get(prom_addr, "/api/v1/rules")["groups"].as_array().cloned().expect("groups");
    let state_in = |group: &str| {
        groups
            .iter()
            .find(|g| g["name"] == group)
            .and_then(|g| g["rules"].as_array().cloned())
            .and_then(|rs| rs.into_iter().find(|r| r["name"] == "StartlineCollectorDown"))
            .map(|r| r["state"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(state_in("startline-meta").as_deref(), Some("pending"), "shipped rule, for: 5m");
    assert_eq!(state_in("startline-meta-short-for").as_deref(), Some("firing"));
}
