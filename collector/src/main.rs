//! `startline-collector`: the command line. Parses flags, loads and validates config, initialises logging,
//! runs the collector until SIGINT or SIGTERM, and maps failures to exit codes.

use anyhow::Context;
use clap::{Parser, Subcommand};
use startline_collector::config::FileConfig;
use std::io::Write;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

// Events are allocated on the gRPC workers and freed on the committer thread; mimalloc handles that
// cross-thread pattern with far less lock traffic than glibc malloc (measured in BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "startline-collector",
    version,
    about = "Startline collector: durable job lifecycle ingest, timelines and the JSON API"
)]
struct Cli {
    /// TOML config file; without one, defaults apply (sled under ./startline-data, loopback ports).
    #[arg(long, short, global = true, env = "STARTLINE_CONFIG")]
    config: Option<PathBuf>,
    /// sled directory (overrides store.path).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// gRPC ingest listen address (overrides grpc.listen); port 0 picks a free port.
    #[arg(long, global = true)]
    grpc_listen: Option<String>,
    /// HTTP API listen address (overrides http.listen); port 0 picks a free port.
    #[arg(long, global = true)]
    http_listen: Option<String>,
    /// Log filter, e.g. "info" or "startline_collector=debug" (RUST_LOG also works).
    #[arg(long, global = true, default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the collector (the default).
    Run,
    /// Validate the configuration and print it, without binding anything.
    CheckConfig,
}

fn load(cli: &Cli) -> anyhow::Result<startline_collector::config::Config> {
    let mut file = match &cli.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    if let Some(d) = &cli.data_dir {
        file.store.path = Some(d.clone());
    }
    if let Some(a) = &cli.grpc_listen {
        file.grpc.listen = Some(a.clone());
    }
    if let Some(a) = &cli.http_listen {
        file.http.listen = Some(a.clone());
    }
    Ok(file.validate()?)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("startline-collector: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let config = load(&cli)?;
    if matches!(cli.command, Some(Command::CheckConfig)) {
        println!("{config:#?}");
        return Ok(());
    }
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
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            signals.cancel();
        });
        startline_collector::app::run(config, shutdown, |b| {
            // One machine-readable line on stdout: tests and scripts read the bound ports from it.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "startline-collector ready grpc={} http={}", b.grpc, b.http);
            let _ = writeln!(out, "  API:       http://{}/api/v1/jobs", b.http);
            let _ = writeln!(out, "  Ingest:    grpc://{} (startline.v1.IngestService)", b.grpc);
            let _ = out.flush();
        })
        .await
    })?;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
