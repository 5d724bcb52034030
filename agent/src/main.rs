//! `startline-agent`: the command line for every agent mode. Today: `simulate`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use startline_agent::simulate::{self, tokio_util_free::stop_pair, SimSettings};
use startline_agent::uplink::{Publisher, UplinkSettings};
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "startline-agent", version, about = "Startline agent: sends job lifecycle events to the collector")]
struct Cli {
    /// Collector gRPC endpoint.
    #[arg(long, global = true, env = "STARTLINE_COLLECTOR", default_value = "http://127.0.0.1:50051")]
    collector: String,
    /// Log filter (RUST_LOG also works).
    #[arg(long, global = true, default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate a fleet of managed and dedicated pools and publish its events.
    Simulate(SimulateArgs),
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like \"7d\": {e}"))
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    /// Seed; the same seed gives the same fleet.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Simulated history to backfill, ending now.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    history: Duration,
    /// Jobs submitted over the history (default: from --jobs-per-hour).
    #[arg(long)]
    jobs: Option<u64>,
    /// Average job arrivals per hour.
    #[arg(long, default_value_t = 60.0)]
    jobs_per_hour: f64,
    /// Simulated seconds per wall second during the backfill; 0 = as fast as the collector acknowledges.
    #[arg(long, default_value_t = 0.0)]
    speedup: f64,
    /// Most events per second sent; 0 = unlimited.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Keep simulating in real time after the backfill, until Ctrl-C.
    #[arg(long)]
    follow: bool,
    /// Probability that an event is delivered late (out of order).
    #[arg(long, default_value_t = 0.0)]
    disorder: f64,
    /// Probability that an event is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    duplicates: f64,
    /// Events per batch.
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// Give up if the collector stays unreachable this long.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    give_up_after: Duration,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("startline-agent: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log))
        .context("invalid --log filter")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start runtime")?;
    rt.block_on(async move {
        match cli.command {
            Command::Simulate(a) => {
                for (name, p) in [("--disorder", a.disorder), ("--duplicates", a.duplicates)] {
                    anyhow::ensure!((0.0..=1.0).contains(&p), "{name} must be a probability in 0..=1");
                }
                anyhow::ensure!(a.batch_size >= 1, "--batch-size must be at least 1");
                let mut up_settings = UplinkSettings::new(cli.collector.clone());
                up_settings.give_up_after = Some(a.give_up_after);
                let mut up = Publisher::new(up_settings)?;
                let (handle, stop) = stop_pair();
                tokio::spawn(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    handle.stop();
                });
                let started = std::time::Instant::now();
                let settings = SimSettings {
                    seed: a.seed,
                    history: a.history,
                    jobs: a.jobs,
                    jobs_per_hour: a.jobs_per_hour,
                    speedup: a.speedup,
                    rate: a.rate,
                    follow: a.follow,
                    disorder: a.disorder,
                    duplicates: a.duplicates,
                    batch_size: a.batch_size,
                    end_ms: None,
                };
                let report = simulate::run(settings, &mut up, stop).await?;
                let secs = started.elapsed().as_secs_f64();
                println!(
                    "simulated {} jobs: {} events sent in {:.1}s ({:.0}/s); accepted {}, duplicates {}, rejected {}",
                    report.jobs,
                    report.events_sent,
                    secs,
                    report.events_sent as f64 / secs.max(1e-9),
                    report.totals.accepted,
                    report.totals.duplicates,
                    report.totals.rejected
                );
                for r in report.totals.rejections.iter().take(5) {
                    println!("  rejected {}: {}: {}", r.event_id, r.field, r.reason);
                }
                Ok(())
            }
        }
    })
}
