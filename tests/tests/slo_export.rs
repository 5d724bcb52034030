//! `startline-collector slo export --format openslo|sloth|pyrra`: the configured SLOs (the defaults plus one with
//! a time-of-day window in a time zone and static alert labels) written in each format validate against that
//! format's schema (tests/fixtures/slo-export: Pyrra's CRD schema; Sloth's and OpenSLO's published schemas where
//! they exist and schemas derived from their Go validators otherwise, see SOURCES.md), and every PromQL query they
//! carry passes `promtool check rules` (Debian `prometheus`). A broken document fails the same validation.

use serde_json::Value;
use startline_tests::{binary, workspace_root};
use std::io::Write;
use std::process::{Command, Stdio};

const CONFIG: &str = r#"
[alerts]
labels = { cluster = "eu-1" }

[[slo]]
name = "urgent-start"
threshold = "10m"
objective = 99
window = "28d"
page_on_breach = true
[slo.selector]
priority = ["urgent"]

[[slo]]
name = "office-hours-a100"
description = "Interactive-sized jobs on the A100 pool during office hours"
threshold = "15m"
objective = 99.5
window = "7d"
[slo.selector]
pool = ["a100"]
gpu_count_max = 8
hours = "09:00-18:00"
timezone = "Europe/Moscow"
"#;

fn export(config: &std::path::Path, format: &str) -> String {
    let out = Command::new(binary("startline-collector"))
        .args(["slo", "export", "--format", format, "--config"])
        .arg(config)
        .output()
        .expect("startline-collector slo export");
    assert!(out.status.success(), "{format}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn validate(format: &str, yaml: &str) -> Value {
    let mut child = Command::new("python3")
        .arg(workspace_root().join("tests/python/validate_slo_spec.py"))
        .arg(format)
        .arg(workspace_root().join("tests/fixtures/slo-export"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with jsonschema and PyYAML (scripts/test.sh installs them)");
    child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("validator");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

#[test]
fn exported_slos_validate_against_each_formats_schema_and_their_queries_parse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("c.toml");
    std::fs::write(&config, CONFIG).expect("config");
    let mut queries = Vec::new();
    for (format, docs) in [("pyrra", 2), ("sloth", 1), ("openslo", 3)] {
        let yaml = export(&config, format);
        let v = validate(format, &yaml);
        assert_eq!(v["errors"], Value::Array(vec![]), "{format}:\n{yaml}");
        assert_eq!(v["docs"], docs, "{format}: documents");
        // What the format has no field for travels along: the threshold, the office hours and their zone.
        if format != "sloth" {
            assert!(yaml.contains("startline.dev/time-zone: \"Europe/Moscow\""), "{format}:\n{yaml}");
            assert!(yaml.contains("startline.dev/hours: \"09:00-18:00\""), "{format}:\n{yaml}");
            assert!(yaml.contains("startline.dev/threshold: \"15m\""), "{format}:\n{yaml}");
        } else {
            assert!(yaml.contains("09:00-18:00 Europe/Moscow"), "{yaml}");
            assert!(yaml.contains("objective: 99.5\n") && yaml.contains("cluster: \"eu-1\""), "{yaml}");
        }
        let qs = v["queries"].as_array().expect("queries");
        assert_eq!(qs.len(), 4, "{format}: an error and a total query per SLO");
        queries.extend(qs.iter().map(|q| q.as_str().expect("query").to_string()));
    }
    // Every query is valid PromQL over the SLI counter.
    let mut rules = String::from("groups:\n  - name: exported\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        assert!(q.contains("startline_slo_decisions_total{slo=\""), "{q}");
        rules.push_str(&format!("      - record: startline_test:q{i}\n        expr: {}\n", Value::from(q.as_str())));
    }
    let file = dir.path().join("rules.yml");
    std::fs::write(&file, rules).expect("rules");
    let out = Command::new("promtool").args(["check", "rules"]).arg(&file).output().expect("promtool");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));

    // The guard: the validators reject what the tools would (a numeric Pyrra target; an unknown Sloth key).
    let pyrra = export(&config, "pyrra").replace("target: \"99\"", "target: 99");
    assert!(!validate("pyrra", &pyrra)["errors"].as_array().expect("errors").is_empty());
    let sloth = export(&config, "sloth").replace("error_query:", "errorQuery:");
    assert!(!validate("sloth", &sloth)["errors"].as_array().expect("errors").is_empty());
    let openslo = export(&config, "openslo").replace("duration: \"28d\"", "duration: \"28d12h\"");
    assert!(!validate("openslo", &openslo)["errors"].as_array().expect("errors").is_empty());

    // A wrong format is a usage error naming the choices.
    let out = Command::new(binary("startline-collector"))
        .args(["slo", "export", "--format", "prometheus"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("openslo, sloth, pyrra"));
}
