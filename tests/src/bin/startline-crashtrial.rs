//! `startline-crashtrial`: the crash-trial harness as a command (see `startline_tests::crashtrial`).
//!
//! ```sh
//! cargo build --release --workspace --bins
//! target/release/startline-crashtrial --trials 100 --seed 1 [--verbose]
//! ```
//! Exits 1 if any acknowledged event was lost or any other check failed.

use startline_tests::crashtrial::{run, TrialConfig};

fn main() -> anyhow::Result<()> {
    let mut cfg = TrialConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| anyhow::anyhow!("{name} needs a value"));
        match a.as_str() {
            "--trials" => cfg.trials = value("--trials")?.parse()?,
            "--seed" => cfg.seed = value("--seed")?.parse()?,
            "--max-phase-ms" => cfg.max_phase_ms = value("--max-phase-ms")?.parse()?,
            "--cycles" => {
                let v = value("--cycles")?;
                let (lo, hi) = v.split_once("..").ok_or_else(|| anyhow::anyhow!("--cycles takes LO..HI"))?;
                cfg.cycles = (lo.parse()?, hi.parse()?);
            }
            "--verbose" | "-v" => cfg.verbose = true,
            "--help" | "-h" => {
                println!(
                    "startline-crashtrial [--trials N] [--seed S] [--cycles LO..HI] [--max-phase-ms MS] [--verbose]"
                );
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?} (try --help)"),
        }
    }
    let started = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let report = rt.block_on(run(&cfg));
    print!("{}", report.summary());
    println!("elapsed {:.1} s", started.elapsed().as_secs_f64());
    if !report.ok() {
        std::process::exit(1);
    }
    Ok(())
}
