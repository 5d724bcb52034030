//! The crash-trial harness, short version (the long run is `startline-crashtrial --trials 100`, figures in
//! RELIABILITY.md): randomized streaming on several connections, kill -9 / SIGTERM / kill -9 during shutdown,
//! restarts, and after each restart every acknowledged event present and a duplicate, no event never sent,
//! job states and urgent-start SLO counts equal to the model's.

use startline_tests::crashtrial::{run, TrialConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_randomized_crash_trials_lose_no_acknowledged_event() {
    let seed = std::env::var("STARTLINE_CRASHTRIAL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261130);
    let cfg = TrialConfig { trials: 10, seed, cycles: (2, 4), max_phase_ms: 1500, verbose: true };
    let report = run(&cfg).await;
    println!("{}", report.summary());
    assert_eq!(report.trials, 10, "{}", report.summary());
    assert!(report.restarts >= 20, "{}", report.summary());
    assert!(report.acked_events > 1000, "the trials must acknowledge real traffic: {}", report.summary());
    assert!(report.ok(), "{}", report.summary());
}
