//! The fuzz harness's short budget: every target (protobuf ingest decoding and validation, the
//! collector's HTTP API, the node agent's JSON endpoint, the Slurm, SageMaker and Vertex AI parsers, the
//! credential parsers, `NodeHealthService.Report` and `StreamService.Subscribe` requests) runs
//! 15,000 generated and mutated inputs with no panic, no hang, no broken property and bounded memory, and
//! reaches both accepted and rejected outcomes, so the mutations get past each parser's first check. The long
//! run is `startline-fuzz` in release (RELIABILITY.md, "Fuzzing"). The budget is checked as CPU time (under 60 s),
//! which a loaded machine does not inflate.

use startline_tests::fuzz::{run, FuzzConfig, TARGETS};
use std::time::{Duration, Instant};

#[test]
fn every_target_survives_a_short_fuzz_budget() {
    let out = tempfile::tempdir().expect("temp dir");
    let cfg = FuzzConfig {
        inputs_per_target: 15_000,
        seed: 8,
        out_dir: out.path().to_path_buf(),
        // Debug builds are slower: one input may take longer, but not 10 s.
        hang_limit: Duration::from_secs(10),
        abort_after: Duration::from_secs(60),
        ..FuzzConfig::default()
    };
    let started = Instant::now();
    // Two threads, half of the targets each (each run has its own watchdog; peaks are then process-wide).
    let halves: Vec<Vec<String>> =
        TARGETS.chunks(TARGETS.len().div_ceil(2)).map(|c| c.iter().map(|t| t.to_string()).collect()).collect();
    let reports: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = halves
            .into_iter()
            .map(|targets| {
                let cfg = FuzzConfig { targets, ..cfg.clone() };
                s.spawn(move || run(&cfg).expect("fuzz run"))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("fuzz thread")).collect()
    });
    let took = started.elapsed();
    let mut report = startline_tests::fuzz::Report::default();
    for r in reports {
        report.targets.extend(r.targets);
        report.findings.extend(r.findings);
        report.peak_rss_kib = report.peak_rss_kib.max(r.peak_rss_kib);
    }
    print!("{}", report.render());
    assert!(report.clean(), "findings:\n{}", report.render());
    assert_eq!(report.targets.len(), TARGETS.len());
    for t in &report.targets {
        assert_eq!(t.inputs, 15_000, "{}", t.name);
        assert!(t.accepted > 0, "{}: no input was accepted\n{}", t.name, report.render_classes());
        assert!(t.rejected > 0, "{}: no input was rejected\n{}", t.name, report.render_classes());
        assert!(t.classes.len() >= 3, "{}: only {:?}", t.name, t.classes);
    }
    assert!(report.peak_rss_kib * 1024 < cfg.rss_limit_bytes, "peak RSS {} KiB", report.peak_rss_kib);
    // The budget is CPU time, so a loaded machine does not fail the test: under 60 s in a debug build.
    let cpu = cpu_time().expect("process CPU time");
    println!("wall {took:?}, CPU {cpu:?}");
    assert!(cpu < Duration::from_secs(60), "the short budget took {cpu:?} of CPU");
}

/// This process's user + system CPU time so far (`/proc/self/stat`, in clock ticks of 10 ms).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) (utime, stime) are the 12th and 13th after the command name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}
