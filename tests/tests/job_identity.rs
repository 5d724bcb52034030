//! One job identity everywhere: the table `tests/fixtures/job_identity/cases.json` (also read by the Python
//! package's tests, `clients/python/tests/test_identity.py`) against the Rust side. For every case the node agent
//! reads (`node_agent: true`), `node::job_from_env` on the case's environment gives its job id; for every case with
//! an `adapter`, that adapter's own id derivation on the job as the provider describes it gives the same id, and
//! the Slurm adapter's events carry the case's attempt.

use serde_json::Value;
use startline_agent::provider::{azureml, kueue, sagemaker, slurm, vertex, JobMemory};
use startline_tests::workspace_root;
use std::collections::{BTreeMap, HashMap};

fn cases() -> Vec<Value> {
    let path = workspace_root().join("tests/fixtures/job_identity/cases.json");
    let text = std::fs::read_to_string(&path).expect("the identity table");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    v["cases"].as_array().expect("cases").clone()
}

fn text(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_else(|| panic!("{k} in {v}")).to_string()
}

/// The id (and attempt, where the adapter numbers attempts) the case's adapter gives the job.
fn adapter_id(a: &Value) -> (String, Option<u32>) {
    match a["kind"].as_str().expect("kind") {
        "slurm" => {
            let m = slurm::Mapping { cluster: text(a, "cluster"), ..Default::default() };
            let restarts = a["restarts"].as_u64().expect("restarts") as u32;
            let job = slurm::SlurmJob {
                id: text(a, "job"),
                cluster: String::new(),
                state: "RUNNING".into(),
                submit: 1_767_225_600,
                start: Some(1_767_225_700),
                nodes: vec!["gpu-1".into()],
                restarts,
                ..Default::default()
            };
            let (events, _) = slurm::diff(&m, &job, &JobMemory::default(), 1_767_225_800_000);
            let last = events.last().expect("a running job has events");
            assert!(events.iter().all(|e| e.job_id == last.job_id), "{events:?}");
            (last.job_id.clone(), last.attempt)
        }
        "kueue" => {
            let labels: BTreeMap<String, String> = a["labels"]
                .as_object()
                .expect("labels")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("label").to_string()))
                .collect();
            let name = kueue::pod_job_name(&labels).expect("a job label");
            let m = kueue::Mapping { cluster: text(a, "cluster"), ..Default::default() };
            (kueue::startline_id(&m, &text(a, "namespace"), &name), None)
        }
        "sagemaker" => {
            let m = sagemaker::Mapping { namespace: text(a, "namespace"), ..Default::default() };
            let j = sagemaker::TrainingJob { name: text(a, "job_name"), ..Default::default() };
            (sagemaker::startline_id(&m, &j), None)
        }
        "vertex" => {
            let m = vertex::Mapping { project: text(a, "project"), ..Default::default() };
            let j = vertex::CustomJob { name: text(a, "resource_name"), ..Default::default() };
            (vertex::startline_id(&m, &j), None)
        }
        "azureml" => {
            let m = azureml::Mapping {
                resource_group: text(a, "resource_group"),
                workspace: text(a, "workspace"),
                ..Default::default()
            };
            let j = azureml::AzureJob { name: text(a, "job_name"), ..Default::default() };
            (azureml::startline_id(&m, &j), None)
        }
        other => panic!("unknown adapter {other}"),
    }
}

#[test]
fn the_adapters_and_the_node_agent_derive_the_ids_of_the_shared_table() {
    let cases = cases();
    assert!(cases.len() >= 15, "the table has its cases");
    let (mut by_agent, mut by_adapter) = (0, 0);
    for case in &cases {
        let name = text(case, "name");
        let want = case["job_id"].as_str().map(str::to_string);
        if case["node_agent"].as_bool() == Some(true) {
            let env: HashMap<String, String> = case["env"]
                .as_object()
                .expect("env")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("env value").to_string()))
                .collect();
            assert_eq!(startline_agent::node::job_from_env(&env), want, "node agent: {name}");
            by_agent += 1;
        }
        if !case["adapter"].is_null() {
            let (id, attempt) = adapter_id(&case["adapter"]);
            assert_eq!(Some(id), want, "adapter: {name}");
            if case["adapter"]["kind"] == "slurm" {
                // The adapter numbers attempts from 1; the table's null is a job never requeued (attempt 1).
                let want_attempt = case["attempt"].as_u64().map_or(1, |a| a as u32);
                assert_eq!(attempt, Some(want_attempt), "attempt: {name}");
            }
            by_adapter += 1;
        }
    }
    assert!(by_agent >= 8 && by_adapter >= 12, "{by_agent} node-agent cases, {by_adapter} adapter cases");
}
