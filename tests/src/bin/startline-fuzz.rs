//! `startline-fuzz`: the hostile-input fuzz harness as a command (see `startline_tests::fuzz`).
//!
//! ```sh
//! cargo build --release -p startline-tests --bin startline-fuzz
//! nice -n 10 target/release/startline-fuzz --inputs 1700000 --seed 1 --target all
//! target/release/startline-fuzz --replay target/fuzz-findings/slurm-panic-1.bin --target slurm
//! ```
//! `--inputs` counts per target. Prints, per target, the inputs run, inputs/s, accepted and rejected inputs,
//! distinct outcome classes and the peak resident set; exits 1 on any finding (panic, hang, broken property,
//! memory over the bound), whose inputs are saved under `--out` (default `target/fuzz-findings`).

use startline_tests::fuzz::{replay, run, FuzzConfig, TARGETS};

const USAGE: &str = "startline-fuzz [--inputs N (per target)] [--seed S] [--target NAME|all] [--out DIR] \
[--rss-limit-mib M] [--progress N] [--verbose] | --replay FILE --target NAME";

fn main() -> anyhow::Result<()> {
    let mut cfg = FuzzConfig::default();
    let mut replay_file = None;
    let mut verbose = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| anyhow::anyhow!("{name} needs a value"));
        match a.as_str() {
            "--inputs" => cfg.inputs_per_target = value("--inputs")?.parse()?,
            "--seed" => cfg.seed = value("--seed")?.parse()?,
            "--target" => {
                let t = value("--target")?;
                cfg.targets = if t == "all" { TARGETS.iter().map(|t| t.to_string()).collect() } else { vec![t] };
            }
            "--out" => cfg.out_dir = value("--out")?.into(),
            "--rss-limit-mib" => cfg.rss_limit_bytes = value("--rss-limit-mib")?.parse::<u64>()? << 20,
            "--progress" => cfg.progress_every = value("--progress")?.parse()?,
            "--replay" => replay_file = Some(value("--replay")?),
            "--verbose" | "-v" => verbose = true,
            "--help" | "-h" => {
                println!("{USAGE}\ntargets: {}", TARGETS.join(", "));
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if let Some(file) = replay_file {
        let input = std::fs::read(&file)?;
        let [target] = cfg.targets.as_slice() else { anyhow::bail!("--replay needs one --target") };
        match replay(target, &input) {
            Ok(outcome) => println!("{target}: {outcome}"),
            Err(finding) => {
                println!("{target}: {finding}");
                std::process::exit(1);
            }
        }
        return Ok(());
    }
    let started = std::time::Instant::now();
    let report = run(&cfg).map_err(|e| anyhow::anyhow!(e))?;
    print!("{}", report.render());
    if verbose {
        print!("{}", report.render_classes());
    }
    println!(
        "seed {}, {} inputs per target, elapsed {:.1} s, RSS bound {} MiB",
        cfg.seed,
        cfg.inputs_per_target,
        started.elapsed().as_secs_f64(),
        cfg.rss_limit_bytes >> 20
    );
    if !report.clean() {
        std::process::exit(1);
    }
    Ok(())
}
