//! `startline-collector`: the command line. Parses flags, loads and validates config, initialises logging,
//! runs the collector until SIGINT or SIGTERM, and maps failures to exit codes. `compare` is a client of a
//! running collector's API: reqwest on a small single-threaded runtime, `http://` or `https://` (a CA file or
//! the built-in roots), with a bearer token from a file, a flag or the environment.
//!
//! # Layout
//! - this file: the flags, the subcommands and the exit codes;
//! - [`cli_docs`]: shell completions and man pages made from these flags (hidden `completions` and `man`).

mod cli_docs;

use anyhow::Context;
use clap::{Parser, Subcommand};
use startline_collector::alert::client::{build_http_client, read_pem_certs, read_secret_file, ClientTlsFiles, Secret};
use startline_collector::app::Bound;
use startline_collector::applier::halt::AfterWriteFailure;
use startline_collector::config::{FileConfig, Overrides};
use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
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
    #[arg(long, global = true, env = "STARTLINE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// gRPC ingest listen address (overrides grpc.listen); port 0 picks a free port.
    #[arg(long, global = true, env = "STARTLINE_GRPC_LISTEN")]
    grpc_listen: Option<String>,
    /// HTTP API listen address (overrides http.listen); port 0 picks a free port.
    #[arg(long, global = true, env = "STARTLINE_HTTP_LISTEN")]
    http_listen: Option<String>,
    /// Log filter, e.g. "info" or "startline_collector=debug" (default: RUST_LOG, else info).
    #[arg(long, global = true, env = "STARTLINE_LOG")]
    log: Option<String>,
    /// Log format: text (default; colour on a terminal) or json (one object per line).
    #[arg(long, global = true, env = "STARTLINE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the collector (the default).
    Run,
    /// Validate the configuration and print the effective configuration as TOML (every default filled in,
    /// secret values redacted), without binding anything. Exit 0 when valid, 78 with every problem listed when not.
    CheckConfig,
    /// Compare time to first step between two sets of jobs, through a running collector's API.
    Compare(Box<CompareArgs>),
    /// Make a new bearer token: prints the token (give it to the client) and the hash for [[auth.identity]].
    Token(TokenArgs),
    /// Print Prometheus recording and alerting rules for the configured SLOs (their own windows, objectives and
    /// burn-rate factors; the collector's alert names and labels, so running both pages once).
    Rules,
    /// The configured SLOs in other SLO tools' formats.
    Slo(SloArgs),
    /// Ask a collector's gRPC health service (grpc.health.v1) whether ingest is serving, over TLS when the
    /// endpoint is https: a liveness probe for Kubernetes `exec` (whose own `grpc:` probe cannot speak TLS),
    /// systemd or scripts. Exit 0 when SERVING, 1 when not serving, 69 when unreachable.
    Probe(ProbeArgs),
    /// Print what the store holds, per tree (values, bytes) and on disk, as JSON. Opens the store directory, so
    /// the collector using it must be stopped.
    StoreStats,
    /// Back up a running collector's events (through its admin API) into a directory on its host, without
    /// stopping ingest; waits until it is written, prints its state as JSON. Exit 0 when done, 1 when it failed.
    Backup(BackupArgs),
    /// Check a stopped collector's store (snapshot parts, summaries, every log event, the stream) or, with
    /// --backup, a backup directory; prints a report as JSON. Exit 0 when sound, 1 naming what is not.
    Verify(VerifyArgs),
    /// Make a new store (--data-dir) from a backup: its events in their sequences; the collector's first start on
    /// it rebuilds every job. Exit 0 when restored, 1 when the backup is damaged or the target not empty.
    Restore(RestoreArgs),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (one per command) into a directory.
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct SloArgs {
    #[command(subcommand)]
    action: SloAction,
}

#[derive(Subcommand, Debug)]
enum SloAction {
    /// Print the configured SLOs as OpenSLO v1, Sloth prometheus/v1 or Pyrra ServiceLevelObjective YAML, their SLI
    /// read from startline_slo_decisions_total (what a format has no field for goes into annotations).
    Export {
        /// openslo, sloth or pyrra.
        #[arg(long, env = "STARTLINE_SLO_FORMAT")]
        format: startline_collector::export::slo_spec::SpecFormat,
    },
}

#[derive(clap::Args, Debug)]
struct ProbeArgs {
    /// The collector's gRPC endpoint, `http://` or `https://`.
    #[arg(long, env = "STARTLINE_PROBE_ENDPOINT", default_value = "http://127.0.0.1:50051")]
    endpoint: String,
    /// The service to ask about; "" asks about the server as a whole.
    #[arg(long, env = "STARTLINE_PROBE_SERVICE", default_value = "startline.v1.IngestService")]
    service: String,
    /// PEM CA bundle that signed the collector's certificate (https endpoints).
    #[arg(long, env = "STARTLINE_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Name to verify the certificate against when it differs from the endpoint's host (e.g. probing
    /// 127.0.0.1 inside a pod whose certificate names the Service).
    #[arg(long, env = "STARTLINE_PROBE_SERVER_NAME")]
    server_name: Option<String>,
    /// PEM client certificate, when the collector requires one (`tls.client_certs = "required"`).
    #[arg(long, env = "STARTLINE_PROBE_CERT_FILE", requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// PEM private key of --cert-file.
    #[arg(long, env = "STARTLINE_PROBE_KEY_FILE", requires = "cert_file")]
    key_file: Option<PathBuf>,
    /// Give up after this long.
    #[arg(long, env = "STARTLINE_PROBE_TIMEOUT", default_value = "5s")]
    timeout: humantime::Duration,
}

/// Why a probe did not answer SERVING.
#[derive(Debug)]
enum ProbeFailure {
    /// The collector answered: not serving (or the service is unknown).
    NotServing(String),
    /// No answer: connection, TLS or timeout.
    Unreachable(String),
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeFailure::NotServing(s) => write!(f, "not serving: {s}"),
            ProbeFailure::Unreachable(s) => write!(f, "unreachable: {s}"),
        }
    }
}

impl std::error::Error for ProbeFailure {}

fn run_probe(a: &ProbeArgs) -> anyhow::Result<()> {
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest};
    let unreachable = |e: String| anyhow::Error::new(ProbeFailure::Unreachable(e));
    let mut endpoint = tonic::transport::Endpoint::from_shared(a.endpoint.clone())
        .map_err(|e| anyhow::anyhow!("--endpoint {:?}: {e}", a.endpoint))?
        .connect_timeout(*a.timeout)
        .timeout(*a.timeout);
    if a.endpoint.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new();
        match &a.ca_file {
            Some(p) => {
                let pem = std::fs::read(p).with_context(|| format!("--ca-file {}", p.display()))?;
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            None => anyhow::bail!("--ca-file: needed for an https endpoint"),
        }
        if let Some(n) = &a.server_name {
            tls = tls.domain_name(n.clone());
        }
        if let (Some(c), Some(k)) = (&a.cert_file, &a.key_file) {
            let cert = std::fs::read(c).with_context(|| format!("--cert-file {}", c.display()))?;
            let key = std::fs::read(k).with_context(|| format!("--key-file {}", k.display()))?;
            tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| anyhow::anyhow!("TLS settings: {e}"))?;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start runtime")?;
    let service = a.service.clone();
    let status = rt.block_on(async move {
        let channel = endpoint.connect().await.map_err(|e| unreachable(error_chain(&e)))?;
        let resp = HealthClient::new(channel).check(HealthCheckRequest { service }).await;
        match resp {
            Ok(r) => Ok(r.into_inner().status()),
            Err(s) if s.code() == tonic::Code::NotFound => {
                Err(anyhow::Error::new(ProbeFailure::NotServing(format!("unknown service: {}", s.message()))))
            }
            Err(s) => Err(unreachable(format!("{}: {}", s.code(), s.message()))),
        }
    })?;
    if status == ServingStatus::Serving {
        println!("SERVING");
        Ok(())
    } else {
        Err(anyhow::Error::new(ProbeFailure::NotServing(status.as_str_name().to_string())))
    }
}

/// An error with its sources, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[derive(clap::Args, Debug)]
struct TokenArgs {
    /// Identity name for the printed config snippet.
    #[arg(long, default_value = "my-client")]
    name: String,
    /// Scopes for the printed config snippet (comma-separated: ingest, read, admin).
    #[arg(long, default_value = "read")]
    scopes: String,
    /// Hash an existing token read from standard input instead of making one.
    #[arg(long)]
    hash_stdin: bool,
}

fn run_token(a: &TokenArgs) -> anyhow::Result<()> {
    use startline_collector::auth::{generate_token, Scope, TokenHash};
    let scopes: Vec<&str> = a.scopes.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if let Some(bad) = scopes.iter().find(|s| Scope::parse(s).is_none()) {
        anyhow::bail!("--scopes: {bad:?} is not ingest, read or admin");
    }
    let (token, shown) = if a.hash_stdin {
        let mut t = String::new();
        std::io::stdin().read_line(&mut t).context("cannot read the token from standard input")?;
        (t.trim().to_string(), false)
    } else {
        (generate_token().map_err(anyhow::Error::msg)?, true)
    };
    if token.is_empty() {
        anyhow::bail!("no token on standard input");
    }
    let hash = TokenHash::of(&token).to_config();
    let mut out = std::io::stdout().lock();
    if shown {
        writeln!(out, "token: {token}")?;
        writeln!(
            out,
            "# Give the token to the client (a file readable only by it: --token-file); it is not stored anywhere."
        )?;
    }
    writeln!(out, "hash:  {hash}")?;
    writeln!(out, "\n[[auth.identity]]\nname = {:?}\ntoken_hashes = [{hash:?}]\nscopes = {scopes:?}", a.name)?;
    Ok(())
}

/// How a command reaches a running collector's HTTP API.
#[derive(clap::Args, Debug)]
struct ApiArgs {
    /// The collector's HTTP API, `http://` or `https://`.
    #[arg(long, env = "STARTLINE_API", default_value = "http://127.0.0.1:8080")]
    api: String,
    /// File holding a bearer token (preferred over --token: not visible in `ps`): the `read` scope for `compare`,
    /// `admin` for `backup`.
    #[arg(long, env = "STARTLINE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Bearer token (--token-file wins when both are given).
    #[arg(long, env = "STARTLINE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM CA bundle to trust for an `https://` API instead of the built-in roots.
    #[arg(long, env = "STARTLINE_CA_FILE")]
    ca_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct BackupArgs {
    #[command(flatten)]
    conn: ApiArgs,
    /// The backup's directory on the collector's host: new or empty. A relative path is taken from this
    /// command's working directory (run it on the collector's host, or give the path as the collector sees it).
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
}

#[derive(clap::Args, Debug)]
struct VerifyArgs {
    /// Check a backup directory (its manifest, the events file's SHA-256, every event) instead of the store.
    #[arg(long, value_name = "DIR")]
    backup: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct RestoreArgs {
    /// The backup directory to restore; the new store is the configured one (`--data-dir`), which must not exist
    /// or be empty.
    #[arg(long, value_name = "DIR")]
    from: PathBuf,
}

#[derive(clap::Args, Debug)]
struct CompareArgs {
    #[command(flatten)]
    conn: ApiArgs,
    /// Left set, `attribute=value[,attribute=value]` (pool_kind, provider, pool, priority, gpu_class, region).
    #[arg(long, default_value = "pool_kind=managed")]
    left: String,
    /// Right set.
    #[arg(long, default_value = "pool_kind=dedicated")]
    right: String,
    /// Group by an attribute as well.
    #[arg(long)]
    by: Option<String>,
    /// Jobs submitted within this window.
    #[arg(long, default_value = "30d")]
    window: String,
    /// Output: table or json.
    #[arg(long, default_value = "table")]
    format: String,
    /// Also write the CDF overlay chart to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn pct_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The API client of `compare`: one reqwest client and the token, used on a single-threaded runtime.
struct ApiClient {
    base: reqwest::Url,
    client: reqwest::Client,
    token: Option<Secret>,
    rt: tokio::runtime::Runtime,
}

impl ApiClient {
    fn new(a: &ApiArgs) -> anyhow::Result<ApiClient> {
        let mut base = reqwest::Url::parse(&a.api).with_context(|| format!("--api {:?} is not a URL", a.api))?;
        // A base with a path prefix (a reverse proxy's `/startline`) keeps it: request paths are joined under it.
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        anyhow::ensure!(
            matches!(base.scheme(), "http" | "https") && base.host_str().is_some(),
            "--api {:?} must look like http://host:port or https://host:port",
            a.api
        );
        let token = match (&a.token_file, &a.token) {
            (Some(p), _) => Some(read_secret_file("--token-file", p).map_err(anyhow::Error::msg)?),
            (None, Some(t)) if !t.trim().is_empty() => Some(Secret::new(t.trim())),
            (None, _) => None,
        };
        let mut tls = ClientTlsFiles::default();
        if let Some(p) = &a.ca_file {
            tls.ca = Some((p.clone(), read_pem_certs("--ca-file", p).map_err(anyhow::Error::msg)?));
        }
        let client = build_http_client(&tls, std::time::Duration::from_secs(60)).map_err(anyhow::Error::msg)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start runtime")?;
        Ok(ApiClient { base, client, token, rt })
    }

    /// GETs `path_and_query` under the API's base; Ok with the body when the answer is 200.
    fn get(&self, path_and_query: &str) -> anyhow::Result<String> {
        self.request(reqwest::Method::GET, path_and_query, None)
    }

    /// Sends a request under the API's base (with a JSON body when given); Ok with the body when the answer is
    /// 200 or 202.
    fn request(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
        json: Option<&serde_json::Value>,
    ) -> anyhow::Result<String> {
        let url = self.base.join(path_and_query.trim_start_matches('/')).context("cannot build the request URL")?;
        let mut req = self.client.request(method, url);
        if let Some(body) = json {
            req = req.json(body);
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t.expose());
        }
        self.rt.block_on(async {
            let resp = req.send().await.map_err(|e| {
                let e = e.without_url();
                let mut msg = format!("cannot reach {}: {e}", self.base);
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg += &format!(": {s}");
                    src = s.source();
                }
                anyhow::anyhow!(msg)
            })?;
            let status = resp.status();
            let body = resp.text().await.context("cannot read the collector's answer")?;
            match status.as_u16() {
                200 | 202 => Ok(body),
                401 if self.token.is_none() => anyhow::bail!(
                    "the collector requires a token (401 Unauthorized): pass --token-file, --token or STARTLINE_TOKEN"
                ),
                401 => anyhow::bail!("the collector refused the token (401 Unauthorized): it is unknown or expired"),
                403 if path_and_query.trim_start_matches('/').starts_with("api/v1/admin/") => {
                    anyhow::bail!("the token is not permitted (403 Forbidden): it needs the admin scope")
                }
                403 => anyhow::bail!("the token is not permitted to read (403 Forbidden): it needs the read scope"),
                s => anyhow::bail!("collector answered {s}: {body}"),
            }
        })
    }
}

fn run_compare(a: &CompareArgs) -> anyhow::Result<()> {
    let mut q = format!("left={}&right={}&window={}", pct_encode(&a.left), pct_encode(&a.right), pct_encode(&a.window));
    if let Some(b) = &a.by {
        q += &format!("&by={}", pct_encode(b));
    }
    let api = ApiClient::new(&a.conn)?;
    let body = api.get(&format!("/api/v1/compare?{q}"))?;
    let v: serde_json::Value = serde_json::from_str(&body).context("collector answered invalid json")?;
    if let Some(path) = &a.svg {
        let svg = api.get(&format!("/api/v1/compare.svg?{q}")).context("the chart")?;
        std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    }
    match a.format.as_str() {
        "json" => println!("{}", serde_json::to_string_pretty(&v)?),
        "table" => print!("{}", compare_table(&v)),
        other => anyhow::bail!("--format {other:?} is not table or json"),
    }
    Ok(())
}

fn compare_table(v: &serde_json::Value) -> String {
    let f = |x: &serde_json::Value| x.as_f64().map_or("-".to_string(), human_secs);
    let mut out = format!(
        "left:  {}\nright: {}\nwindow: {} s\n",
        v["left"].as_str().unwrap_or(""),
        v["right"].as_str().unwrap_or(""),
        v["window_seconds"]
    );
    for g in v["groups"].as_array().into_iter().flatten() {
        let (l, r) = (&g["left"], &g["right"]);
        out += &format!("\n[{}]\n{:<28} {:>22} {:>22}\n", g["group"].as_str().unwrap_or(""), "", "left", "right");
        let row = |name: &str, a: String, b: String| format!("{name:<28} {a:>22} {b:>22}\n");
        out += &row("jobs", l["jobs"].to_string(), r["jobs"].to_string());
        out += &row("started", l["started"].to_string(), r["started"].to_string());
        out += &row("still waiting", l["still_waiting"].to_string(), r["still_waiting"].to_string());
        out += &row("ended before start", l["ended_before_start"].to_string(), r["ended_before_start"].to_string());
        for p in ["p50", "p90", "p99"] {
            let cell = |s: &serde_json::Value| {
                let ci = &s["ttfs_seconds"][p]["ci95"];
                format!("{} [{}-{}]", f(&s["ttfs_seconds"][p]["value"]), f(&ci[0]), f(&ci[1]))
            };
            out += &row(&format!("ttfs {p} [95% ci]"), cell(l), cell(r));
        }
        let mean = |s: &serde_json::Value| f(&s["ttfs_seconds"]["mean"]["value"]);
        out += &row("ttfs mean", mean(l), mean(r));
        for (key, name) in [
            ("training_process", "first step: training process"),
            ("container_start", "first step: container start"),
            ("scheduler_start", "first step: scheduler start"),
            ("unspecified", "first step: unspecified"),
        ] {
            let n = |s: &serde_json::Value| s["first_step_sources"][key].as_u64().unwrap_or(0);
            if n(l) + n(r) > 0 {
                out += &row(name, n(l).to_string(), n(r).to_string());
            }
        }
        for (i, s) in l["slo"].as_array().into_iter().flatten().enumerate() {
            let rc = &r["slo"][i];
            let c =
                |x: &serde_json::Value| x["compliance"].as_f64().map_or("-".into(), |c| format!("{:.1}%", c * 100.0));
            out += &row(&format!("slo {}", s["slo"].as_str().unwrap_or("")), c(s), c(rc));
        }
        let d = &g["difference"];
        out += &format!(
            "difference: p = {} ({}), faster: {}\n",
            d["mann_whitney"]["p_value"].as_f64().map_or("-".into(), |p| format!("{p:.3e}")),
            if d["significant"].as_bool() == Some(true) { "significant at 0.05" } else { "not significant" },
            d["faster"].as_str().unwrap_or("neither")
        );
        if d["first_step_sources_differ"].as_bool() == Some(true) {
            out += "warning: the sides' first steps come from different sources (container or scheduler starts \
                    are earlier than the training process's first step): their times measure different things\n";
        }
    }
    out
}

fn human_secs(s: f64) -> String {
    if s >= 3600.0 {
        format!("{:.1}h", s / 3600.0)
    } else if s >= 60.0 {
        format!("{:.1}m", s / 60.0)
    } else {
        format!("{s:.0}s")
    }
}

fn run_store_stats(config: &startline_collector::config::Config) -> anyhow::Result<()> {
    use startline_collector::store::{Store, StoreOptions};
    let store = Store::open_with(
        &config.store_path,
        StoreOptions { cache_bytes: config.cache_bytes, segment_bytes: config.log_segment_bytes },
    )
    .with_context(|| format!("cannot open the store at {}", config.store_path.display()))?;
    let trees = store.tree_stats().context("cannot read the store")?;
    let on_disk = store.size_on_disk().context("cannot size the store")?;
    let allocated = store.allocated_bytes().context("cannot size the store's directory")?;
    // Live bytes: what the trees hold (keys and values) and the log's blocks; the rest of what the directory
    // takes is sled's framing, page table and space not yet reclaimed.
    let held: u64 = trees.iter().map(|t| t.bytes).sum();
    let largest_sled_value = trees.iter().filter(|t| t.tree != "log files").map(|t| t.largest_value).max();
    let amplification = if held == 0 { 0.0 } else { allocated as f64 / held as f64 };
    let v = serde_json::json!({
        "path": config.store_path,
        "size_on_disk": on_disk,
        "allocated_bytes": allocated,
        "keys_and_values": held,
        "space_amplification": (amplification * 100.0).round() / 100.0,
        "largest_sled_value": largest_sled_value.unwrap_or(0),
        "trees": trees,
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

fn run_backup(a: &BackupArgs) -> anyhow::Result<()> {
    let to = if a.to.is_absolute() { a.to.clone() } else { std::env::current_dir()?.join(&a.to) };
    let api = ApiClient::new(&a.conn)?;
    let to_text = to.to_str().context("--to must be UTF-8")?;
    let started =
        api.request(reqwest::Method::POST, "/api/v1/admin/backup", Some(&serde_json::json!({ "to": to_text })))?;
    let mut status: serde_json::Value = serde_json::from_str(&started).context("the collector's answer")?;
    eprintln!("backup into {} started at sequence {}", to.display(), status["through_seq"]);
    while status["state"] == "running" {
        std::thread::sleep(std::time::Duration::from_millis(200));
        status = serde_json::from_str(&api.get("/api/v1/admin/backup")?).context("the collector's answer")?;
    }
    println!("{}", serde_json::to_string_pretty(&status)?);
    anyhow::ensure!(status["state"] == "done", "the backup failed: {}", status["error"]);
    Ok(())
}

fn run_verify(a: &VerifyArgs, config: &startline_collector::config::Config) -> anyhow::Result<()> {
    use startline_collector::store::backup;
    if let Some(dir) = &a.backup {
        let m = backup::read(dir, |_, _| Ok(())).map_err(|e| anyhow::anyhow!("backup {}: {e}", dir.display()))?;
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "backup": dir, "sound": true, "manifest": m }))?
        );
        return Ok(());
    }
    use startline_collector::store::{Store, StoreOptions};
    let store = Store::open_with(
        &config.store_path,
        StoreOptions { cache_bytes: config.cache_bytes, segment_bytes: config.log_segment_bytes },
    )
    .with_context(|| format!("cannot open the store at {}", config.store_path.display()))?;
    let report = backup::verify_store(&store);
    let sound = report.problems.is_empty();
    println!(
        "{}",
        serde_json::to_string_pretty(
            &serde_json::json!({ "store": config.store_path, "sound": sound, "report": report })
        )?
    );
    anyhow::ensure!(sound, "the store at {} is not sound: {}", config.store_path.display(), report.problems.join("; "));
    Ok(())
}

fn run_restore(a: &RestoreArgs, config: &startline_collector::config::Config) -> anyhow::Result<()> {
    let m = startline_collector::store::backup::restore(&a.from, &config.store_path).map_err(|e| {
        anyhow::anyhow!("cannot restore {} into {}: {e}", a.from.display(), config.store_path.display())
    })?;
    println!(
        "{}",
        serde_json::to_string_pretty(
            &serde_json::json!({ "restored": config.store_path, "from": a.from, "manifest": m })
        )?
    );
    Ok(())
}

fn load(cli: &Cli) -> anyhow::Result<startline_collector::config::Config> {
    let mut file = match &cli.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let overrides = Overrides {
        data_dir: cli.data_dir.clone(),
        grpc_listen: cli.grpc_listen.clone(),
        http_listen: cli.http_listen.clone(),
    };
    overrides.apply(&mut file);
    let mut config = file.validate()?;
    config.source = cli.config.clone();
    config.overrides = overrides;
    Ok(config)
}

/// Log output formats.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Exit codes (sysexits.h): usage errors are 2 (clap), a bad config 78, a store or port that cannot be used 69,
/// anything else 1.
const EXIT_CONFIG: u8 = 78;
const EXIT_UNAVAILABLE: u8 = 69;

fn exit_code(e: &anyhow::Error) -> u8 {
    use startline_collector::app::AppError;
    use startline_collector::config::{ConfigErrors, LoadError};
    if e.downcast_ref::<ConfigErrors>().is_some() || e.downcast_ref::<LoadError>().is_some() {
        return EXIT_CONFIG;
    }
    match e.downcast_ref::<ProbeFailure>() {
        Some(ProbeFailure::Unreachable(_)) => return EXIT_UNAVAILABLE,
        Some(ProbeFailure::NotServing(_)) => return 1,
        None => {}
    }
    match e.downcast_ref::<AppError>() {
        Some(AppError::Tls(_)) => EXIT_CONFIG,
        Some(AppError::Store { .. } | AppError::Bind { .. }) => EXIT_UNAVAILABLE,
        _ => 1,
    }
}

/// Runs the collector again in place (`exec`: same process id, arguments and environment) with
/// `MIMALLOC_ALLOW_THP=0`, unless that variable is set (to any value: the operator's choice stands). mimalloc
/// backs its arenas with transparent huge pages by default, and the kernel then zeroes a whole 2 MiB page at
/// the first touch of any byte in it: a restart that builds a million small rows spent 46-70% of its CPU in
/// that zeroing (`perf`), 8-13 s to ready at 1M jobs against ~4 s without (BENCHMARKS.md). The
/// variable must be set before mimalloc initializes, which is before `main`; hence the `exec`. If it fails
/// (the binary replaced on disk), the collector runs as it is.
fn without_transparent_huge_pages() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    // Returns only on failure.
    let _ = cmd.args(args).env("MIMALLOC_ALLOW_THP", "0").exec();
}

fn main() -> std::process::ExitCode {
    without_transparent_huge_pages();
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("startline-collector: {e:#}");
            std::process::ExitCode::from(exit_code(&e))
        }
    }
}

/// Logging to stderr: the filter from --log (or STARTLINE_LOG), else RUST_LOG, else info; text or JSON.
fn init_logging(log: Option<&str>, format: LogFormat) -> anyhow::Result<()> {
    let filter = match log {
        Some(f) => tracing_subscriber::EnvFilter::try_new(f).context("invalid --log filter")?,
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .or_else(|_| tracing_subscriber::EnvFilter::try_new("info"))
            .context("invalid RUST_LOG filter")?,
    };
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => fmt.json().with_current_span(true).init(),
        LogFormat::Text => fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
    Ok(())
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::Completions { shell }) = &cli.command {
        return Ok(cli_docs::completions(<Cli as clap::CommandFactory>::command(), *shell, &mut std::io::stdout())?);
    }
    if let Some(Command::Man { out }) = &cli.command {
        return cli_docs::man_pages(<Cli as clap::CommandFactory>::command(), out)
            .with_context(|| format!("cannot write man pages into {}", out.display()));
    }
    if let Some(Command::Compare(a)) = &cli.command {
        return run_compare(a);
    }
    if let Some(Command::Token(a)) = &cli.command {
        return run_token(a);
    }
    if let Some(Command::Probe(a)) = &cli.command {
        return run_probe(a);
    }
    let config = load(&cli)?;
    if matches!(cli.command, Some(Command::Rules)) {
        print!(
            "{}",
            startline_collector::export::rules::prometheus_rules(
                &config.slos,
                config.alerts.min_jobs,
                &config.alerts.labels,
                config.alerts.runbook_base_url.as_deref(),
            )
        );
        return Ok(());
    }
    if let Some(Command::Slo(SloArgs { action: SloAction::Export { format } })) = &cli.command {
        print!("{}", startline_collector::export::slo_spec::export(&config.slos, *format, &config.alerts.labels));
        return Ok(());
    }
    if matches!(cli.command, Some(Command::StoreStats)) {
        return run_store_stats(&config);
    }
    match &cli.command {
        Some(Command::Backup(a)) => return run_backup(a),
        Some(Command::Verify(a)) => return run_verify(a, &config),
        Some(Command::Restore(a)) => return run_restore(a, &config),
        _ => {}
    }
    if matches!(cli.command, Some(Command::CheckConfig)) {
        print!("{}", config.effective_toml().map_err(|e| anyhow::anyhow!("cannot print the configuration: {e}"))?);
        return Ok(());
    }
    init_logging(cli.log.as_deref(), cli.log_format)?;
    // systemd's readiness protocol (Type=notify): the socket is read once here, at the edge.
    let notify = sd_notify::Notifier::from_env();
    let stopping = notify.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start runtime")?;
    let stop_deadline = startline_collector::app::stop_deadline(&config);
    let after = config.after_write_failure;
    let asked = (config.grpc_listen, config.http_listen);
    let on_writable: startline_collector::app::OnWritable =
        Box::new(move |bound, cause| restart_after_halt(after, asked, bound, cause));
    let result = rt.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            stopping.send("STOPPING=1");
            exit_if_not_stopped_within(stop_deadline);
            signals.cancel();
        });
        startline_collector::app::run(
            config,
            shutdown,
            |b| {
                notify.send(&format!("READY=1\nSTATUS=grpc={} http={}", b.grpc, b.http));
                // One machine-readable line on stdout: tests and scripts read the bound ports from it.
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "startline-collector ready grpc={} http={}", b.grpc, b.http);
                let _ = writeln!(out, "  API:       http://{}/api/v1/jobs", b.http);
                let _ = writeln!(out, "  Ingest:    grpc://{} (startline.v1.IngestService)", b.grpc);
                let _ = out.flush();
            },
            on_writable,
        )
        .await
    });
    // Blocking tasks still in a store call (after a store failure) are not waited for: the process ends.
    rt.shutdown_timeout(Duration::from_secs(1));
    result?;
    Ok(())
}

/// Exit code when a stop does not finish within [`startline_collector::app::stop_deadline`].
const EXIT_STOP_TIMEOUT: i32 = 1;

/// A stop must end the process within `deadline`, whatever it waits for (a store call that never returns after
/// an I/O failure): past it the process exits with [`EXIT_STOP_TIMEOUT`]. Nothing acknowledged is lost: it is in
/// the log's synced files.
fn exit_if_not_stopped_within(deadline: Duration) {
    let spawned = std::thread::Builder::new().name("startline-stop-deadline".into()).spawn(move || {
        std::thread::sleep(deadline);
        eprintln!("startline-collector: the stop did not finish within {deadline:?}; exiting");
        std::process::exit(EXIT_STOP_TIMEOUT);
    });
    if let Err(e) = spawned {
        eprintln!("startline-collector: cannot start the stop deadline's thread: {e}");
    }
}

/// Once the store is writable again after store writes halted (see `startline_collector::applier::halt`): runs
/// the collector again in place (`store.after_write_failure = "restart"`), or exits with
/// [`EXIT_RESTART`](startline_collector::applier::halt::EXIT_RESTART) for the supervisor, also when the
/// `exec` fails.
fn restart_after_halt(after: AfterWriteFailure, asked: (SocketAddr, SocketAddr), bound: Bound, cause: &str) {
    use startline_collector::applier::halt::EXIT_RESTART;
    if after == AfterWriteFailure::Restart {
        let e = exec_again(asked, bound);
        eprintln!("startline-collector: cannot run again in place after {cause} ({e}); exiting for a restart");
    } else {
        eprintln!("startline-collector: store writable again after {cause}; exiting for a restart");
    }
    std::process::exit(EXIT_RESTART);
}

/// Runs this binary again in place: same process id, arguments and environment; returns only on failure. Every
/// thread of this process ends and every file and socket it opened closes (they are all close-on-exec), sled's
/// lock with them. A listener asked for port 0 keeps the port it got (its address goes in the environment
/// variable that overrides the configuration, and its flag is left out), so clients find the collector where
/// it was.
fn exec_again(asked: (SocketAddr, SocketAddr), bound: Bound) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    // The running binary even if a package upgrade replaced the file.
    let exe = match Path::new("/proc/self/exe") {
        p if p.exists() => p.to_path_buf(),
        _ => match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => return e,
        },
    };
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    let mut rest: Vec<OsString> = args.collect();
    for (asked, bound, flag, var) in [
        (asked.0, bound.grpc, "--grpc-listen", "STARTLINE_GRPC_LISTEN"),
        (asked.1, bound.http, "--http-listen", "STARTLINE_HTTP_LISTEN"),
    ] {
        if asked.port() == 0 {
            rest = without_flag(rest, flag);
            cmd.env(var, bound.to_string());
        }
    }
    cmd.args(rest).exec()
}

/// `args` without `flag VALUE` and `flag=VALUE`.
fn without_flag(args: Vec<OsString>, flag: &str) -> Vec<OsString> {
    let with_value = format!("{flag}=");
    let mut out = Vec::with_capacity(args.len());
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.to_str() {
            Some(s) if s == flag => {
                args.next();
            }
            Some(s) if s.starts_with(&with_value) => {}
            _ => out.push(a),
        }
    }
    out
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

/// systemd's `sd_notify` protocol without libsystemd: one datagram of `KEY=VALUE` lines to the unix socket named
/// by `NOTIFY_SOCKET` (a path, or an abstract name written with a leading '@'). Best effort: a collector not
/// started by systemd has no socket and sends nothing; a failed send is logged, never fatal.
mod sd_notify {
    use std::ffi::OsString;
    use std::os::unix::net::UnixDatagram;

    /// Where readiness and stopping are announced, if anywhere.
    #[derive(Clone, Debug, Default)]
    pub struct Notifier {
        /// The value of `NOTIFY_SOCKET`; `None` when the collector was not started by systemd (Type=notify).
        socket: Option<OsString>,
    }

    impl Notifier {
        pub fn from_env() -> Notifier {
            Notifier::to(std::env::var_os("NOTIFY_SOCKET"))
        }

        pub fn to(socket: Option<OsString>) -> Notifier {
            Notifier { socket: socket.filter(|s| !s.is_empty()) }
        }

        /// Sends `state` (e.g. `READY=1`); logs instead of failing.
        pub fn send(&self, state: &str) {
            if let Some(socket) = &self.socket {
                if let Err(e) = send_to(socket, state) {
                    tracing::warn!(socket = ?socket, "cannot notify systemd ({state:?}): {e}");
                }
            }
        }
    }

    /// One datagram with `state` to `socket`: a filesystem path, or `@name` for the abstract namespace.
    pub fn send_to(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let sock = UnixDatagram::unbound()?;
        let bytes = socket.as_bytes();
        match bytes.strip_prefix(b"@") {
            #[cfg(target_os = "linux")]
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr)?;
            }
            #[cfg(not(target_os = "linux"))]
            Some(_) => return Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "abstract sockets need Linux")),
            None => {
                sock.send_to(state.as_bytes(), socket)?;
            }
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::time::Duration;

        fn recv(listener: &UnixDatagram) -> String {
            listener.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            let mut buf = [0u8; 512];
            let n = listener.recv(&mut buf).expect("a datagram within 5 s");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        }

        #[test]
        fn sends_ready_to_a_path_socket() {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("notify.sock");
            let listener = UnixDatagram::bind(&path).expect("bind");
            let n = Notifier::to(Some(path.clone().into_os_string()));
            n.send("READY=1\nSTATUS=grpc=127.0.0.1:1 http=127.0.0.1:2");
            assert_eq!(recv(&listener), "READY=1\nSTATUS=grpc=127.0.0.1:1 http=127.0.0.1:2");
            n.send("STOPPING=1");
            assert_eq!(recv(&listener), "STOPPING=1");
        }

        #[cfg(target_os = "linux")]
        #[test]
        fn sends_to_an_abstract_socket_named_with_at() {
            use std::os::linux::net::SocketAddrExt;
            let name = format!("startline-notify-test-{}", std::process::id());
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
            let listener = UnixDatagram::bind_addr(&addr).expect("bind abstract");
            Notifier::to(Some(format!("@{name}").into())).send("READY=1");
            assert_eq!(recv(&listener), "READY=1");
        }

        #[test]
        fn without_a_socket_nothing_is_sent_and_nothing_fails() {
            assert!(Notifier::to(None).socket.is_none());
            assert!(Notifier::to(Some(OsString::new())).socket.is_none());
            let dir = tempfile::tempdir().expect("tempdir");
            let err = send_to(dir.path().join("absent.sock").as_os_str(), "READY=1").expect_err("no listener");
            assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
            // The best-effort sender only logs this.
            Notifier::to(Some(dir.path().join("absent.sock").into_os_string())).send("READY=1");
        }
    }
}

#[cfg(test)]
mod restart_tests {
    use super::*;

    #[test]
    fn a_listen_flag_is_left_out_in_both_forms_and_nothing_else_is() {
        let args: Vec<OsString> =
            ["--data-dir", "/d", "--grpc-listen", "127.0.0.1:0", "--http-listen=127.0.0.1:0", "--log", "info"]
                .iter()
                .map(OsString::from)
                .collect();
        let grpc_gone = without_flag(args, "--grpc-listen");
        let both_gone = without_flag(grpc_gone.clone(), "--http-listen");
        let s = |v: &[OsString]| v.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        assert_eq!(s(&grpc_gone), "--data-dir /d --http-listen=127.0.0.1:0 --log info");
        assert_eq!(s(&both_gone), "--data-dir /d --log info");
    }
}
