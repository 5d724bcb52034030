//! Game days: `startline-agent gameday all` runs every scenario against a collector it starts itself (the real
//! binary on a temporary directory, with a simulated fleet beside the scenario jobs) and must find that what was
//! injected is what Startline reports; against a collector whose SLO disagrees with the script it must say so
//! and exit 1.

use startline_tests::{binary, Collector};
use std::process::Command;

fn gameday(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(binary("startline-agent")).args(args).output().expect("startline-agent runs");
    (out.status, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn every_scenario_reports_what_was_injected() {
    let (status, stdout, stderr) = gameday(&["gameday", "all", "--background-jobs", "50", "--json"]);
    assert!(status.success(), "game day failed:\n{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json report");
    assert_eq!(report["passed"], true);
    let scenarios = report["scenarios"].as_array().expect("scenarios");
    let names: Vec<&str> = scenarios.iter().filter_map(|s| s["scenario"].as_str()).collect();
    assert_eq!(
        names,
        [
            "node-stop",
            "disk-full",
            "storage-revoked",
            "gpu-delay",
            "corrupt-checkpoint",
            "collector-restart",
            "uplink-outage"
        ]
    );
    for s in scenarios {
        assert_eq!(s["passed"], true, "{s:#}");
        for j in s["jobs"].as_array().expect("jobs") {
            let checks = j["checks"].as_array().expect("checks");
            assert!(checks.len() >= 3, "every job is checked on several facts: {j:#}");
            assert!(checks.iter().all(|c| c[3] == true), "{j:#}");
            let story = j["explanation"].as_array().expect("explanation");
            assert!(story[0].as_str().is_some_and(|l| l.starts_with("final status: ")), "{j:#}");
        }
    }
    let by_name = |n: &str| scenarios.iter().find(|s| s["scenario"] == n).expect("scenario");
    // The corrupt checkpoint: 1000 steps and 15 minutes lost (the restart resumed from the older copy).
    let cc = &by_name("corrupt-checkpoint")["jobs"][0]["checks"];
    let lost = cc.as_array().and_then(|a| a.iter().find(|c| c[0] == "lost_work_seconds")).expect("lost work checked");
    assert_eq!(lost[2], "900");
    // The restart: the resend was all duplicates, the page raised before the kill was resolved after it.
    let cr = by_name("collector-restart");
    let tl: Vec<&str> = cr["timeline"].as_array().expect("timeline").iter().filter_map(|t| t.as_str()).collect();
    let raised = tl.iter().position(|t| t.starts_with("page StartlineJobStartBreach")).expect("page raised");
    let killed = tl.iter().position(|t| t.starts_with("collector killed")).expect("killed");
    assert!(raised < killed, "{tl:?}");
    assert!(tl.iter().any(|t| t.contains("0 accepted, 7 duplicates")), "{tl:?}");
    let urgent = &cr["jobs"][1]["explanation"];
    assert!(urgent.to_string().contains("StartlineJobStartBreach resolved"), "{urgent}");
}

#[test]
fn a_collector_that_disagrees_with_the_script_fails_the_game_day() {
    // normal-start held to 5 minutes: the disk-full job started after 10, so Startline (correctly, for this
    // config) calls it bad, and the game day, which injected a start within the default 2 h, must say so.
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[[slo]]\nname = \"normal-start\"\nthreshold = \"5m\"\nobjective = 95.0\nwindow = \"28d\"\n[slo.selector]\npriority = [\"normal\"]\n",
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf-8")]);
    let api = format!("http://{}", c.http);
    let (status, stdout, stderr) =
        gameday(&["--collector", &c.endpoint(), "gameday", "disk-full", "--api", &api, "--background-jobs", "0"]);
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("RESULT: MISMATCH"), "{stdout}");
    assert!(stdout.contains("[FAIL] SLO normal-start: expected good, reported bad"), "{stdout}");
    assert!(stdout.contains("[ok] failed_work_seconds: expected 600, reported 600"), "{stdout}");
    assert!(stderr.contains("differs from what was injected in disk-full"), "{stderr}");
    // A scenario that needs a collector of its own is refused clearly against an external one.
    let (status, _, stderr) = gameday(&[
        "--collector",
        &c.endpoint(),
        "gameday",
        "collector-restart",
        "--api",
        &api,
        "--background-jobs",
        "0",
    ]);
    assert!(!status.success());
    assert!(stderr.contains("needs a collector the game day starts itself"), "{stderr}");
    let (status, _, stderr) = gameday(&["gameday", "meteor-strike"]);
    assert!(!status.success());
    assert!(stderr.contains("unknown scenario \"meteor-strike\""), "{stderr}");
}
