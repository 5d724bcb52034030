//! `deploy/kubernetes/`: each overlay rendered with `kubectl kustomize` (Debian's kubernetes-client) and every
//! object validated offline: built-in kinds against the Kubernetes OpenAPI schemas bundled by PyPI's
//! kubernetes-validate (strict: unknown fields fail; versions 1.30 and 1.37), ServiceMonitor, PodMonitor and
//! PrometheusRule against the Prometheus Operator CRDs in `tests/fixtures/prometheus-operator-crd/` (python
//! jsonschema). Then what the manifests promise: hardened pods, probes, the drain, Services, the collector's config
//! (it starts the real check-config with generated certificates), the node agent's socket, the adapters' arguments,
//! the rules and dashboards identical to the repository's, and the HA pair's replicas and disruption budget.

use serde_json::Value;
use startline_tests::{bin_dir, pki::TestCa, workspace_root};
use std::io::Write;
use std::process::{Command, Stdio};

const K8S_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

fn crds() -> Vec<String> {
    ["servicemonitors", "podmonitors", "prometheusrules"]
        .iter()
        .map(|c| {
            let p =
                workspace_root().join(format!("tests/fixtures/prometheus-operator-crd/monitoring.coreos.com_{c}.yaml"));
            p.to_string_lossy().into_owned()
        })
        .collect()
}

/// Runs the validator on a YAML stream; returns (objects, results).
fn validate(yaml: &str) -> (Vec<Value>, Vec<Value>) {
    let mut cmd = Command::new("python3");
    cmd.arg(workspace_root().join("tests/python/validate_k8s.py"));
    for v in K8S_VERSIONS {
        cmd.args(["--k8s", v]);
    }
    for c in crds() {
        cmd.args(["--crd", &c]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with kubernetes-validate, jsonschema and PyYAML (scripts/test.sh installs them)");
    child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("validator");
    assert!(
        out.status.success(),
        "validate_k8s.py failed (pip install kubernetes-validate jsonschema pyyaml): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("validator json");
    (v["objects"].as_array().expect("objects").clone(), v["results"].as_array().expect("results").clone())
}

fn render(overlay: &str) -> String {
    // The overlays use kustomize v5 fields (labels, replicas, patches); older kubectl builds ignore or refuse them.
    let v = Command::new("kubectl").args(["version", "--client"]).output().expect("kubectl must be installed");
    let said = String::from_utf8_lossy(&v.stdout).into_owned();
    let kustomize = said.lines().find_map(|l| l.strip_prefix("Kustomize Version: v")).unwrap_or("0");
    let major: u32 = kustomize.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    assert!(major >= 5, "kubectl's kustomize is {kustomize:?}; the overlays need v5 or newer (kubectl 1.27+):\n{said}");
    let dir = workspace_root().join("deploy/kubernetes/overlays").join(overlay);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl (Debian's kubernetes-client) must be installed");
    assert!(out.status.success(), "kubectl kustomize {overlay}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Renders and validates an overlay; every object must pass every check it gets.
fn rendered_and_valid(overlay: &str) -> Vec<Value> {
    let (objects, results) = validate(&render(overlay));
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r["errors"].as_array().expect("errors").is_empty())
        .map(|r| format!("{} {} ({}): {}", r["kind"], r["name"], r["version"], r["errors"]))
        .collect();
    assert!(failed.is_empty(), "{overlay}: invalid objects:\n{}", failed.join("\n"));
    for o in &objects {
        let checked = results.iter().filter(|r| r["kind"] == o["kind"] && r["name"] == o["metadata"]["name"]).count();
        assert!(checked >= 1, "{overlay}: {} {} was not validated", o["kind"], o["metadata"]["name"]);
    }
    objects
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn find_prefix<'a>(objects: &'a [Value], kind: &str, prefix: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no {kind} {prefix}*"))
}

fn workloads(objects: &[Value]) -> Vec<&Value> {
    objects.iter().filter(|o| matches!(o["kind"].as_str(), Some("StatefulSet" | "Deployment" | "DaemonSet"))).collect()
}

fn python_yaml_to_json(path: &std::path::Path) -> Value {
    let out = Command::new("python3")
        .args(["-c", "import json,sys,yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)"])
        .arg(path)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

#[test]
fn overlays_render_and_every_object_validates() {
    let mut kinds = std::collections::BTreeSet::new();
    for overlay in ["single", "ha-pair", "kube-prometheus-stack"] {
        for o in rendered_and_valid(overlay) {
            kinds.insert(o["kind"].as_str().expect("kind").to_string());
        }
    }
    for k in [
        "Namespace",
        "StatefulSet",
        "Service",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "PersistentVolumeClaim",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(k), "no {k} in the overlays: {kinds:?}");
    }
}

#[test]
fn validation_rejects_broken_objects() {
    // The guard on the test above: strict schemas reject an unknown field and a wrong type, and the CRD
    // schema rejects a malformed rule.
    let broken = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  replica: 1
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: c, image: x, ports: [{containerPort: "http"}]}]
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: broken}
spec:
  groups: [{name: g, rules: [{alert: A}]}]
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: broken}
spec:
  selector: {}
  endpoints: [{port: http, scheme: gopher}]
"#;
    let (_, results) = validate(broken);
    for kind in ["Deployment", "PrometheusRule", "ServiceMonitor"] {
        let r: Vec<&Value> = results.iter().filter(|r| r["kind"] == kind).collect();
        assert!(!r.is_empty(), "{kind} not checked");
        for x in r {
            assert!(!x["errors"].as_array().expect("errors").is_empty(), "{kind} ({}) passed: {x}", x["version"]);
        }
    }
}

#[test]
fn pods_are_hardened_and_sized() {
    let objects = rendered_and_valid("single");
    for w in workloads(&objects) {
        let name = w["metadata"]["name"].as_str().expect("name");
        let pod = &w["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}: runAsNonRoot");
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{name}: seccomp");
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}: no API token");
        let containers = pod["containers"].as_array().expect("containers");
        let inits = pod["initContainers"].as_array().cloned().unwrap_or_default();
        for c in containers.iter().chain(inits.iter()) {
            let cname = format!("{name}/{}", c["name"]);
            let sc = &c["securityContext"];
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{cname}");
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{cname}");
            assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{cname}");
            assert!(c["resources"]["requests"]["cpu"].is_string(), "{cname}: cpu request");
            assert!(c["resources"]["limits"]["memory"].is_string(), "{cname}: memory limit");
        }
        for c in containers {
            assert!(c["securityContext"]["capabilities"]["add"].is_null(), "{name}: no capability added");
        }
        // The one init container that adds anything (the node agent's chown of its hostPath dirs) adds CHOWN.
        for c in &inits {
            assert_eq!(c["securityContext"]["capabilities"]["add"], serde_json::json!(["CHOWN"]), "{name}");
        }
        // Startline's own image: the kustomize image name, pinned by tag.
        for c in containers {
            let image = c["image"].as_str().expect("image");
            assert!(image.starts_with("startline") && image.ends_with(":0.1.0"), "{name}: image {image}");
        }
    }
}

#[test]
fn collector_statefulset_probes_drain_and_services() {
    let objects = rendered_and_valid("single");
    let sts = find(&objects, "StatefulSet", "startline-collector");
    assert_eq!(sts["spec"]["replicas"], 1);
    let claim = &sts["spec"]["volumeClaimTemplates"][0];
    assert_eq!(claim["metadata"]["name"], "data");
    let pod = &sts["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mounts = c["volumeMounts"].as_array().expect("mounts");
    assert!(mounts.iter().any(|m| m["name"] == "data" && m["mountPath"] == "/var/lib/startline"), "store on the PVC");
    let ports: Vec<(&str, u64)> = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| (p["name"].as_str().expect("name"), p["containerPort"].as_u64().expect("port")))
        .collect();
    assert_eq!(ports, [("grpc", 50051), ("http", 8080)]);
    let ready = &c["readinessProbe"]["httpGet"];
    assert_eq!(
        (&ready["path"], &ready["port"], &ready["scheme"]),
        (&"/readyz".into(), &"http".into(), &"HTTPS".into())
    );
    let live: Vec<String> = c["livenessProbe"]["exec"]["command"]
        .as_array()
        .expect("liveness is an exec probe")
        .iter()
        .map(|a| a.as_str().expect("string").to_string())
        .collect();
    assert_eq!(live[..2], ["/usr/bin/startline-collector".to_string(), "probe".to_string()]);
    assert!(c["startupProbe"]["failureThreshold"].as_u64().is_some_and(|f| f >= 60), "restore may take minutes");

    // The config the pod reads: the ConfigMap, secured, and accepted by the real collector.
    let cm = find_prefix(&objects, "ConfigMap", "startline-collector-config-");
    let toml = cm["data"]["collector.toml"].as_str().expect("collector.toml");
    assert!(c["args"].as_array().expect("args").iter().any(|a| a == "/etc/startline/config/collector.toml"));
    assert!(toml.contains("[tls]") && toml.contains("[[auth.identity]]"), "the secure setup");
    let drain = toml
        .lines()
        .find_map(|l| l.strip_prefix("drain_timeout = \"").and_then(|v| v.strip_suffix("s\"")))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("grpc.drain_timeout in seconds");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("grace");
    assert!(grace >= drain + 5 + 15, "grace {grace}s must cover drain {drain}s + HTTP 5s + flush");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "k8s");
    // Issued for the Service name, as the adapters reach it and the liveness probe verifies it.
    let server = ca.server_for("collector", &["startline-collector.startline.svc", "startline-collector"]);
    let local = toml
        .replace("/etc/startline/tls/tls.crt", &server.cert_file.to_string_lossy())
        .replace("/etc/startline/tls/tls.key", &server.key_file.to_string_lossy())
        .replace("/var/lib/startline", &dir.path().join("data").to_string_lossy());
    std::fs::write(dir.path().join("collector.toml"), local).expect("write");
    let check = Command::new(bin_dir().join("startline-collector"))
        .args(["check-config", "--config"])
        .arg(dir.path().join("collector.toml"))
        .output()
        .expect("startline-collector (cargo build --workspace --bins)");
    assert!(check.status.success(), "the ConfigMap's config: {}", String::from_utf8_lossy(&check.stderr));

    // The liveness command, exactly as the pod runs it (paths and port mapped to this machine), against a
    // collector started with the ConfigMap's config: SERVING over TLS; and "unavailable" once it is gone.
    let collector = startline_tests::Collector::start(
        &dir.path().join("data"),
        &["--config", &dir.path().join("collector.toml").to_string_lossy()],
    );
    let probe = |port: u16| {
        let args: Vec<String> = live[1..]
            .iter()
            .map(|a| {
                a.replace("/etc/startline/tls/ca.crt", &ca.ca_file.to_string_lossy())
                    .replace("127.0.0.1:50051", &format!("127.0.0.1:{port}"))
            })
            .collect();
        Command::new(bin_dir().join("startline-collector")).args(&args).output().expect("probe")
    };
    let port = collector.grpc.port();
    let out = probe(port);
    assert!(out.status.success(), "liveness probe: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "SERVING");
    drop(collector);
    let out = probe(port);
    assert_eq!(out.status.code(), Some(69), "a collector that is gone: {}", String::from_utf8_lossy(&out.stderr));

    for svc in ["startline-collector", "startline-collector-headless"] {
        let s = find(&objects, "Service", svc);
        let ports = s["spec"]["ports"].as_array().expect("ports");
        let grpc = ports.iter().find(|p| p["name"] == "grpc").expect("grpc port");
        assert_eq!((&grpc["port"], &grpc["appProtocol"]), (&50051.into(), &"grpc".into()), "{svc}");
        assert!(ports.iter().any(|p| p["name"] == "http" && p["port"] == 8080), "{svc}: http port");
        assert_eq!(s["spec"]["selector"], sts["spec"]["selector"]["matchLabels"], "{svc} selects the collector");
    }
    assert_eq!(sts["spec"]["serviceName"], "startline-collector-headless");
    assert_eq!(find(&objects, "Service", "startline-collector-headless")["spec"]["clusterIP"], "None");
}

#[test]
fn node_agent_and_adapters_run_startline_agent_with_valid_arguments() {
    let objects = rendered_and_valid("single");
    let agent = bin_dir().join("startline-agent");
    let args_parse = |name: &str, args: &[Value]| {
        let args: Vec<&str> = args.iter().map(|a| a.as_str().expect("arg")).collect();
        let out = Command::new(&agent).args(&args).arg("--help").output().expect("startline-agent");
        assert!(out.status.success(), "{name}: {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let ds = find(&objects, "DaemonSet", "startline-node-agent");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["command"], serde_json::json!(["/usr/bin/startline-agent"]));
    let args = args_parse("node agent", c["args"].as_array().expect("args"));
    assert_eq!(args[0], "node");
    // The node's name from the downward API (in the pod, /etc/hostname holds the pod's name).
    let node_name = c["env"].as_array().expect("env").iter().find(|e| e["name"] == "NODE_NAME").expect("NODE_NAME");
    assert_eq!(node_name["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert!(args.contains(&"--socket=/run/startline/agent.sock".to_string()), "{args:?}");
    let host_dirs: Vec<&str> =
        pod["volumes"].as_array().expect("volumes").iter().filter_map(|v| v["hostPath"]["path"].as_str()).collect();
    assert_eq!(host_dirs, ["/run/startline", "/var/lib/startline-agent"], "socket and spool on the node");
    for (deploy, sub) in [
        ("startline-slurm-adapter", "slurm"),
        ("startline-sagemaker-adapter", "sagemaker"),
        ("startline-vertex-adapter", "vertex"),
        ("startline-kueue-adapter", "kueue"),
    ] {
        let d = find(&objects, "Deployment", deploy);
        assert_eq!(d["spec"]["replicas"], 1, "{deploy}: one poller per provider");
        assert_eq!(d["spec"]["strategy"]["type"], "Recreate", "{deploy}: the spool is not shared");
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        let args = args_parse(deploy, c["args"].as_array().expect("args"));
        assert_eq!(args[0], sub);
        let env: Vec<&str> =
            c["env"].as_array().expect("env").iter().map(|e| e["name"].as_str().expect("name")).collect();
        assert!(env.contains(&"STARTLINE_TOKEN_FILE") && env.contains(&"STARTLINE_CA_FILE"), "{deploy}: {env:?}");
        let claim = d["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"].as_str();
        find(&objects, "PersistentVolumeClaim", claim.expect("spool claim"));
    }
    // The cloud adapters take their identity from the platform (EKS IRSA, GKE Workload Identity) through a
    // ServiceAccount of their own, annotated as those platforms read it; no keys are stored in the manifests.
    for (deploy, annotation) in [
        ("startline-sagemaker-adapter", "eks.amazonaws.com/role-arn"),
        ("startline-vertex-adapter", "iam.gke.io/gcp-service-account"),
    ] {
        let pod = &find(&objects, "Deployment", deploy)["spec"]["template"]["spec"];
        let sa = pod["serviceAccountName"].as_str().unwrap_or_else(|| panic!("{deploy}: serviceAccountName"));
        let sa_obj = find(&objects, "ServiceAccount", sa);
        assert!(sa_obj["metadata"]["annotations"][annotation].is_string(), "{deploy}: {annotation} on {sa}");
        let secrets: Vec<&Value> = pod["containers"][0]["envFrom"].as_array().into_iter().flatten().collect();
        assert!(secrets.iter().all(|s| s["secretRef"]["optional"] == true), "{deploy}: stored keys stay optional");
    }
    // The Kueue adapter reads the API with its own ServiceAccount, bound to a read-only ClusterRole.
    let d = find(&objects, "Deployment", "startline-kueue-adapter");
    let sa = d["spec"]["template"]["spec"]["serviceAccountName"].as_str().expect("serviceAccountName");
    let sa_obj = find(&objects, "ServiceAccount", sa);
    let binding = find(&objects, "ClusterRoleBinding", "startline-kueue-adapter");
    assert_eq!(binding["subjects"][0]["name"], sa);
    assert_eq!(binding["subjects"][0]["namespace"], sa_obj["metadata"]["namespace"]);
    let role = find(&objects, "ClusterRole", binding["roleRef"]["name"].as_str().expect("role"));
    let mut granted = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        for r in rule["resources"].as_array().expect("resources") {
            for v in rule["verbs"].as_array().expect("verbs") {
                granted.insert(format!("{}/{}", r.as_str().expect("r"), v.as_str().expect("v")));
            }
        }
        assert!(
            rule["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .all(|v| ["get", "list", "watch"].contains(&v.as_str().expect("v"))),
            "read only"
        );
    }
    for r in ["workloads", "localqueues", "clusterqueues", "resourceflavors", "pods", "events"] {
        for v in ["get", "list", "watch"] {
            assert!(granted.contains(&format!("{r}/{v}")), "{r}/{v}: {granted:?}");
        }
    }
}

#[test]
fn monitoring_objects_match_the_repository_rules_and_dashboards() {
    let objects = rendered_and_valid("single");
    let sm = find(&objects, "ServiceMonitor", "startline-collector");
    let svc = find(&objects, "Service", "startline-collector");
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels") {
        assert_eq!(&svc["metadata"]["labels"][k], v, "the ServiceMonitor selects the client Service");
        assert_ne!(
            &find(&objects, "Service", "startline-collector-headless")["metadata"]["labels"][k],
            v,
            "the headless Service is not scraped twice"
        );
    }
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");

    let rule = find(&objects, "PrometheusRule", "startline");
    let rules = python_yaml_to_json(&workspace_root().join("deploy/prometheus/startline-rules.yml"));
    assert_eq!(
        rule["spec"]["groups"], rules["groups"],
        "deploy/kubernetes/base/prometheusrule.yaml differs from deploy/prometheus/startline-rules.yml: run scripts/sync-kubernetes.sh"
    );

    let cm = find(&objects, "ConfigMap", "startline-grafana-dashboards");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1", "the Grafana sidecar's label");
    let data = cm["data"].as_object().expect("data");
    let mut shipped: Vec<String> = std::fs::read_dir(workspace_root().join("dashboards"))
        .expect("dashboards")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    shipped.sort();
    let mut keys: Vec<String> = data.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, shipped, "every dashboard in dashboards/ is in the ConfigMap");
    for (k, v) in data {
        let repo = std::fs::read_to_string(workspace_root().join("dashboards").join(k)).expect("dashboard");
        assert_eq!(v.as_str(), Some(repo.as_str()), "{k} differs from dashboards/{k}: run scripts/sync-kubernetes.sh");
    }
}

#[test]
fn ha_pair_runs_two_collectors_on_different_nodes() {
    let objects = rendered_and_valid("ha-pair");
    let sts = find(&objects, "StatefulSet", "startline-collector");
    assert_eq!(sts["spec"]["replicas"], 2);
    let anti = &sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(anti["labelSelector"]["matchLabels"], sts["spec"]["selector"]["matchLabels"]);
    let pdb = find(&objects, "PodDisruptionBudget", "startline-collector");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], sts["spec"]["selector"]["matchLabels"]);
}

#[test]
fn examples_validate() {
    let dir = workspace_root().join("deploy/kubernetes/examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("examples") {
        let p = e.expect("entry").path();
        let (objects, results) = validate(&std::fs::read_to_string(&p).expect("example"));
        assert!(!objects.is_empty(), "{}: no objects", p.display());
        for r in results {
            assert!(r["errors"].as_array().expect("errors").is_empty(), "{}: {r}", p.display());
        }
        n += 1;
    }
    assert!(n >= 2, "the sidecar and node-socket examples");
}
