//! A foreign client: Python grpcio (stubs generated from our .proto at test time by grpcio-tools) publishes a
//! batch to a real collector, and the timeline is read back over HTTP. The test script installs grpcio,
//! grpcio-tools and grpcio-health-checking from PyPI.

use startline_tests::{workspace_root, Collector};
use std::process::Command;

#[test]
fn python_grpcio_client_publishes_and_timeline_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let root = workspace_root();
    let gen = dir.path().join("gen");
    std::fs::create_dir_all(&gen).expect("gen dir");
    let out = Command::new("python3")
        .arg(root.join("tests/python/foreign_client.py"))
        .arg(c.grpc.to_string())
        .arg(root.join("proto/proto"))
        .arg(&gen)
        .arg("vertex/proj/123")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python client failed (is grpcio installed? the test script installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(report["health"], "SERVING");
    assert_eq!(report["unary"]["batch_seq"], 1);
    assert_eq!(report["unary"]["accepted"], 5);
    assert_eq!(report["unary"]["rejections"][0]["index"], 5);
    assert_eq!(report["unary"]["rejections"][0]["field"], "done.outcome");
    assert_eq!(report["stream"][0]["batch_seq"], 2);
    assert_eq!(report["stream"][0]["duplicates"], 5);

    let (status, job) = c.get("/api/v1/jobs/vertex/proj/123");
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["state"], "done");
    assert_eq!(job["outcome"], "succeeded");
    assert_eq!(job["pool_kind"], "managed");
    assert_eq!(job["attributes"]["labels"]["owner"], "python");
    let ttfs = job["time_to_first_step_seconds"].as_f64().expect("ttfs");
    assert!((ttfs - 600.0).abs() < 0.002, "{ttfs}");
    let w = &job["timeline"]["initial_wait_seconds"];
    let sum: f64 = w.as_object().expect("segments").values().filter_map(|v| v.as_f64()).sum();
    assert!((sum - ttfs).abs() < 0.003, "segments {w} do not add up to {ttfs}");
}
