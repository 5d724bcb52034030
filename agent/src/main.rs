//! `startline-agent`: the command line for every agent mode: `node` (local endpoint + spool + delivery),
//! `emit` (one event to the node agent, for scripts), the adapters `slurm`, `kueue`, `sagemaker`, `vertex` and
//! `azureml` (each a poll or watch loop over `startline_agent::provider`), `tail` (the collector's stream out),
//! `eta` (a waiting job's expected start, from the collector's HTTP API),
//! `gameday` (failure rehearsals) and `simulate` (a fleet simulator).
//!
//! Every mode that talks to the collector takes the global credentials and TLS options (`--token-file` or
//! `--token`, `--ca-file`, `--client-cert`/`--client-key`); an `https://` collector URL means TLS. `emit` talks
//! to the node agent instead (`--agent` URL or `--socket`, `--node-token-file`/`--node-token`).
//!
//! Every mode but `emit` can serve its own metrics on `--metrics-listen ADDR` (off by default); the node agent
//! also serves them at `/metrics` on `--listen`.
//!
//! # Layout
//! - this file: the flags of every mode and how each mode is started;
//! - [`cli_docs`]: shell completions and man pages made from these flags (hidden `completions` and `man`).

mod cli_docs;

use anyhow::Context;
use clap::{Parser, Subcommand};
use startline_agent::auth::{check_token, read_token_file, Secret, TokenSource};
use startline_agent::runner::{shutdown_signal, Runner};
use startline_agent::simulate::{self, SimSettings};
use startline_agent::uplink::{Publisher, TlsFiles, UplinkSettings};
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(name = "startline-agent", version, about = "Startline agent: sends job lifecycle events to the collector")]
struct Cli {
    /// Collector gRPC endpoint; repeat it (or give a comma-separated list) to deliver every event to each
    /// collector of an HA pair, each from its own spool cursor.
    #[arg(
        long,
        global = true,
        env = "STARTLINE_COLLECTOR",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:50051"
    )]
    collector: Vec<String>,
    /// With several collectors: one that acknowledged nothing for this long while events wait stops holding
    /// events in the spool (it gets what is left when it answers again).
    #[arg(long, global = true, env = "STARTLINE_COLLECTOR_GIVE_UP", default_value = "6h", value_parser = humantime::parse_duration)]
    collector_give_up: Duration,
    /// Log filter, e.g. "info" or "startline_agent=debug" (default: RUST_LOG, else info).
    #[arg(long, env = "STARTLINE_LOG", global = true)]
    log: Option<String>,
    /// Log format: text (default; colour on a terminal) or json (one object per line).
    #[arg(long, global = true, env = "STARTLINE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// File holding the bearer token for the collector (content trimmed; read again at each reconnect).
    #[arg(long, global = true, env = "STARTLINE_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Bearer token for the collector. Less safe than --token-file: it shows in `ps` and the environment.
    #[arg(long, global = true, env = "STARTLINE_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    token: Option<String>,
    /// PEM bundle of CAs that verify an https:// collector (default: the webpki roots).
    #[arg(long, global = true, env = "STARTLINE_CA_FILE", value_name = "PATH")]
    ca_file: Option<PathBuf>,
    /// PEM client certificate chain for mutual TLS (with --client-key).
    #[arg(long, global = true, env = "STARTLINE_CLIENT_CERT", value_name = "PATH", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, global = true, env = "STARTLINE_CLIENT_KEY", value_name = "PATH", requires = "client_cert")]
    client_key: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// How the uplink reaches the collector: endpoint, credentials, TLS.
struct Connection {
    collector: Vec<String>,
    give_up: Duration,
    token: Option<TokenSource>,
    tls: TlsFiles,
}

impl Connection {
    /// Uplink settings that retry forever (the spooled modes); a missing or empty token file fails here.
    fn settings(&self) -> anyhow::Result<UplinkSettings> {
        match self.collector.as_slice() {
            [one] => self.settings_for(one),
            _ => anyhow::bail!("this mode publishes to one collector; give --collector once"),
        }
    }

    /// One publisher per collector, named by its endpoint (the spool's cursor key).
    fn publishers(&self) -> anyhow::Result<Vec<(String, Publisher)>> {
        let mut seen = std::collections::HashSet::new();
        let mut up = Vec::new();
        for c in &self.collector {
            let c = c.trim();
            anyhow::ensure!(!c.is_empty(), "--collector: an empty endpoint in the list");
            anyhow::ensure!(seen.insert(c.to_string()), "--collector: {c} is listed twice");
            up.push((c.to_string(), Publisher::new(self.settings_for(c)?)?));
        }
        Ok(up)
    }

    /// Starts the runner's delivery of its spool to every collector.
    fn deliver(&self, runner: &mut Runner) -> anyhow::Result<()> {
        runner.deliver(self.publishers()?, self.give_up());
        Ok(())
    }

    /// How the spool treats a silent collector: only with several collectors does one stop holding events.
    fn give_up(&self) -> Option<Duration> {
        (self.collector.len() > 1).then_some(self.give_up)
    }

    fn settings_for(&self, collector: &str) -> anyhow::Result<UplinkSettings> {
        if let Some(t) = &self.token {
            t.load().context("the collector token cannot be used")?;
        }
        let mut s = UplinkSettings::new(collector.to_string());
        s.give_up_after = None;
        s.token = self.token.clone();
        s.tls = self.tls.clone();
        Ok(s)
    }
}

/// Log output formats.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate a fleet of managed and dedicated pools and publish its events.
    Simulate(SimulateArgs),
    /// Run the node agent: a local HTTP endpoint for training loops and scripts, a durable spool, delivery.
    Node(NodeArgs),
    /// Send one event to the local node agent (for Slurm prolog/epilog scripts and entry points).
    Emit(EmitArgs),
    /// Poll Slurm (squeue --json and sacct --json, or slurmrestd with --rest) and report job transitions.
    Slurm(SlurmArgs),
    /// Poll SageMaker (ListTrainingJobs, DescribeTrainingJob; SigV4 with credentials from the AWS SDK's chain:
    /// environment, profiles, web identity, container credentials, EC2 instance metadata).
    Sagemaker(SagemakerArgs),
    /// Poll Vertex AI CustomJobs (v1 REST; OAuth2 tokens from --token-command, VERTEX_ACCESS_TOKEN or Google's
    /// Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's file, the metadata server).
    Vertex(VertexArgs),
    /// Poll Azure Machine Learning jobs of a workspace (ARM REST, Microsoft Entra ID tokens; run history for times).
    Azureml(AzuremlArgs),
    /// Follow Kubernetes jobs through Kueue Workloads, Pods and Pod events (list + watch with persisted
    /// resourceVersions).
    Kueue(KueueArgs),
    /// Follow the collector's stream out (accepted events, job changes, alerts) and print one line per record;
    /// resumes after the last cursor printed whenever the call ends, so nothing is missed or repeated.
    Tail(TailArgs),
    /// When a waiting job is expected to start (the collector's estimate from comparable jobs and the
    /// scheduler), in one line; a job that is not waiting says when it started or ended. Exits 3 when the
    /// collector does not know the job.
    Eta(EtaArgs),
    /// Rehearse a failure against a collector (one the game day starts, or --api/--collector) with a simulated
    /// fleet beside it, then explain every affected job from what Startline reports and check it against what
    /// was injected; exits 1 when a check does not hold. SCENARIO: node-stop, disk-full, storage-revoked,
    /// gpu-delay, corrupt-checkpoint, collector-restart, uplink-outage, or all.
    Gameday(GamedayArgs),
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
struct GamedayArgs {
    /// The scenario (or `all`).
    scenario: String,
    /// The collector's HTTP API (with the global --collector for gRPC); without it the game day starts its own
    /// collector on a temporary data directory (needed for collector-restart).
    #[arg(long, value_name = "URL")]
    api: Option<String>,
    /// The collector binary to start (default: startline-collector next to this binary, else on PATH).
    #[arg(long, value_name = "PATH")]
    collector_bin: Option<PathBuf>,
    /// Background jobs of the simulated fleet sent first (0: none).
    #[arg(long, default_value_t = 200)]
    background_jobs: u64,
    /// Seed of the background fleet.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

async fn run_gameday(a: GamedayArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::gameday::{self, plan::Scenario};
    let scenarios: Vec<Scenario> = if a.scenario == "all" {
        Scenario::ALL.to_vec()
    } else {
        match Scenario::parse(&a.scenario) {
            Some(s) => vec![s],
            None => anyhow::bail!(
                "unknown scenario {:?}: one of {}, or all",
                a.scenario,
                Scenario::ALL.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
            ),
        }
    };
    let mut uplink = conn.settings()?;
    let token = match &conn.token {
        Some(t) => Some(t.load().context("the collector token cannot be used")?.expose().to_string()),
        None => None,
    };
    let mut tmp = None;
    let (spawned, grpc, api) = match &a.api {
        Some(api) => (None, uplink.endpoint.clone(), api.trim_end_matches('/').to_string()),
        None => {
            let bin = match &a.collector_bin {
                Some(p) => p.clone(),
                None => {
                    let next = std::env::current_exe()?.with_file_name("startline-collector");
                    if next.exists() {
                        next
                    } else {
                        PathBuf::from("startline-collector")
                    }
                }
            };
            let dir = tempfile_dir()?;
            let s = gameday::Spawned::start(bin, dir.0.join("data"))?;
            tmp = Some(dir);
            let (g, h) = (format!("http://{}", s.grpc), format!("http://{}", s.http));
            (Some(s), g, h)
        }
    };
    uplink.endpoint = grpc.clone();
    let mut target = gameday::Target { grpc, api, token, uplink, spawned };
    let mut reports = Vec::new();
    for s in scenarios {
        let r = gameday::run(s, &mut target, a.background_jobs, a.seed).await?;
        if !a.json {
            println!("{}", r.text());
        }
        reports.push(r);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&gameday::to_json(&reports))?);
    }
    let failed: Vec<&str> = reports.iter().filter(|r| !r.passed).map(|r| r.scenario.as_str()).collect();
    if let Some(t) = tmp.as_mut().filter(|_| !failed.is_empty()) {
        // Kept for a look at what the collector stored and logged.
        t.1 = true;
        eprintln!("the game day's collector data and log are kept in {}", t.0.display());
    }
    drop(target);
    anyhow::ensure!(
        failed.is_empty(),
        "game day: what Startline reports differs from what was injected in {}",
        failed.join(", ")
    );
    Ok(())
}

/// The game day's own directory (its collector's data and log): removed when dropped unless `.1` says keep.
struct GameDayDir(PathBuf, bool);

impl Drop for GameDayDir {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh directory under the system temp dir for the game day's collector.
fn tempfile_dir() -> anyhow::Result<GameDayDir> {
    let dir = std::env::temp_dir().join(format!(
        "startline-gameday-{}-{}",
        std::process::id(),
        startline_proto::time::now_ms()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(GameDayDir(dir, false))
}

#[derive(clap::Args, Debug)]
struct EtaArgs {
    /// The job's id, e.g. slurm/cluster-a/123.
    job_id: String,
    /// The collector's HTTP API (https:// uses the global TLS options; the global token is sent as bearer).
    #[arg(long, env = "STARTLINE_API", value_name = "URL", default_value = "http://127.0.0.1:8080")]
    api: String,
    /// Print the API's `expected_start` field as JSON (`null` when the job is not waiting or has no estimate).
    #[arg(long)]
    json: bool,
}

async fn run_eta(a: EtaArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::eta;
    let token = match &conn.token {
        Some(t) => Some(t.load().context("the collector token cannot be used")?),
        None => None,
    };
    let http = eta::client(&conn.tls)?;
    let job = eta::fetch(&http, &a.api, token.as_ref(), &a.job_id).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&job["expected_start"])?);
    } else {
        println!("{}", eta::line(&job, startline_proto::time::now_ms())?);
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
struct TailArgs {
    /// Resume after this cursor (default: records from now on).
    #[arg(long, value_name = "CURSOR")]
    after: Option<u64>,
    /// Start at the oldest record the collector retains.
    #[arg(long, conflicts_with = "after")]
    from_oldest: bool,
    /// Only jobs of this pool (repeatable).
    #[arg(long = "pool", value_name = "POOL")]
    pools: Vec<String>,
    /// Only jobs of this priority class: normal or urgent (repeatable).
    #[arg(long = "priority", value_name = "CLASS")]
    priorities: Vec<String>,
    /// Only jobs of this team (repeatable).
    #[arg(long = "team", value_name = "TEAM")]
    teams: Vec<String>,
    /// Only jobs whose id starts with this.
    #[arg(long, value_name = "PREFIX", default_value = "")]
    job_prefix: String,
    /// Only these kinds of record: event, change, alert (repeatable; default all).
    #[arg(long = "kind", value_name = "KIND")]
    kinds: Vec<String>,
    /// Print one JSON object per line (progress records included) instead of text.
    #[arg(long)]
    json: bool,
    /// Stop after this many records.
    #[arg(long)]
    limit: Option<u64>,
    /// Keep the last printed cursor in this file and resume from it at start.
    #[arg(long, value_name = "PATH")]
    cursor_file: Option<PathBuf>,
    /// Exit when the call ends instead of resuming.
    #[arg(long)]
    no_resume: bool,
}

async fn run_tail(a: TailArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_proto::labels::Label;
    let mut priorities = Vec::new();
    for p in &a.priorities {
        match startline_proto::pb::PriorityClass::from_label(p) {
            Some(c) if c != startline_proto::pb::PriorityClass::Unspecified => priorities.push(c as i32),
            _ => anyhow::bail!("--priority: {p:?} is not normal or urgent"),
        }
    }
    let mut settings = conn.settings()?;
    settings.retry_auth_failures = false;
    let mut up = Publisher::new(settings)?;
    let opts = startline_agent::tail::TailOptions {
        request: startline_proto::pb::SubscribeRequest {
            after_cursor: a.after,
            from_oldest: a.from_oldest,
            pools: a.pools,
            priorities,
            teams: a.teams,
            job_id_prefix: a.job_prefix,
            kinds: a.kinds,
        },
        json: a.json,
        limit: a.limit,
        cursor_file: a.cursor_file,
        no_resume: a.no_resume,
    };
    let mut out = std::io::stdout();
    tokio::select! {
        r = startline_agent::tail::run(&mut up, opts, &mut out) => { r?; }
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
struct KueueArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Spool directory (sled; also holds the adapter's per-job memory and resourceVersions).
    #[arg(long, env = "STARTLINE_SPOOL", default_value = "./startline-kueue-spool")]
    spool: std::path::PathBuf,
    /// The cluster's name in job ids (`k8s/<cluster>/<namespace>/<job>`); the node agents' STARTLINE_CLUSTER.
    #[arg(long, env = "STARTLINE_CLUSTER")]
    cluster: String,
    /// The API server, e.g. https://10.0.0.1:6443 (default: KUBECONFIG, ~/.kube/config or the pod's service
    /// account).
    #[arg(long, env = "STARTLINE_API_SERVER", value_name = "URL")]
    api_server: Option<String>,
    /// File holding a bearer token for --api-server.
    #[arg(long, env = "STARTLINE_API_TOKEN_FILE", value_name = "PATH", requires = "api_server")]
    api_token_file: Option<PathBuf>,
    /// Follow only this namespace (default: all).
    #[arg(long, env = "STARTLINE_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Kueue's Workload API version: v1beta1 (served by every Kueue since 0.3) or v1beta2 (Kueue 0.15+).
    #[arg(long, env = "STARTLINE_KUEUE_API_VERSION", default_value = "v1beta1", value_parser = ["v1beta1", "v1beta2"])]
    kueue_api_version: String,
    /// LocalQueue -> ClusterQueue, `LQ=CQ` or `NAMESPACE/LQ=CQ` (repeatable; default: read the LocalQueue).
    #[arg(long = "queue", env = "STARTLINE_QUEUES", value_delimiter = ',', value_name = "LQ=CQ")]
    queues: Vec<String>,
    /// Priority classes whose jobs are urgent (repeatable; the Workload's, else the pod template's).
    #[arg(long = "urgent-priority-class", env = "STARTLINE_URGENT_PRIORITY_CLASSES", value_delimiter = ',')]
    urgent_priority_classes: Vec<String>,
    /// Label (on the Workload or its pod template) holding the team (default: the namespace).
    #[arg(long, env = "STARTLINE_TEAM_LABEL")]
    team_label: Option<String>,
    /// Region reported for every job.
    #[arg(long, env = "STARTLINE_REGION", default_value = "")]
    region: String,
    /// Also follow Jobs/JobSets without Kueue, on pod signals alone.
    #[arg(long, env = "STARTLINE_PLAIN_JOBS")]
    plain_jobs: bool,
    /// Report pods ready (Kueue's PodsReady) as the first step, for jobs without a node agent.
    #[arg(long, env = "STARTLINE_FIRST_STEP_ON_START")]
    first_step_on_start: bool,
    /// Do not ask Kueue's visibility API for queue positions.
    #[arg(long, env = "STARTLINE_NO_VISIBILITY")]
    no_visibility: bool,
    /// How often the queue positions of Workloads waiting for quota are read again (a move sends a new queued).
    #[arg(long, env = "STARTLINE_POSITION_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    position_interval: Duration,
    /// Wait after a failed list or watch.
    #[arg(long, env = "STARTLINE_RETRY", default_value = "5s", value_parser = parse_duration)]
    retry: Duration,
}

#[derive(clap::Args, Debug)]
struct AzuremlArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Spool directory (sled; also holds the adapter's per-job memory).
    #[arg(long, env = "STARTLINE_SPOOL", default_value = "./startline-azureml-spool")]
    spool: std::path::PathBuf,
    /// Subscription id of the workspace.
    #[arg(long, env = "AZURE_SUBSCRIPTION_ID")]
    subscription: String,
    /// Resource group of the workspace.
    #[arg(long, env = "STARTLINE_RESOURCE_GROUP")]
    resource_group: String,
    /// Workspace name.
    #[arg(long, env = "STARTLINE_WORKSPACE")]
    workspace: String,
    /// The workspace's region (the jobs' region attribute and the run-history host), e.g. westeurope.
    #[arg(long, env = "STARTLINE_REGION")]
    region: String,
    /// ARM endpoint.
    #[arg(long, env = "STARTLINE_ENDPOINT", default_value = "https://management.azure.com")]
    endpoint: String,
    /// Run-history endpoint for exact start/end times and failure messages (default
    /// https://<region>.api.azureml.ms; "none": date transitions at polls).
    #[arg(long, env = "STARTLINE_HISTORY_ENDPOINT")]
    history_endpoint: Option<String>,
    /// Microsoft Entra tenant (service principal or workload identity).
    #[arg(long, env = "AZURE_TENANT_ID")]
    tenant: Option<String>,
    /// Application (client) id: of the service principal, the workload identity, or a user-assigned managed
    /// identity.
    #[arg(long, env = "AZURE_CLIENT_ID")]
    client_id: Option<String>,
    /// File holding the service principal's client secret (or AZURE_CLIENT_SECRET).
    #[arg(long, env = "STARTLINE_CLIENT_SECRET_FILE")]
    client_secret_file: Option<std::path::PathBuf>,
    /// Federated token file of a workload identity (AKS sets AZURE_FEDERATED_TOKEN_FILE).
    #[arg(long, env = "AZURE_FEDERATED_TOKEN_FILE")]
    federated_token_file: Option<std::path::PathBuf>,
    /// Microsoft Entra authority host.
    #[arg(long, env = "AZURE_AUTHORITY_HOST", default_value = "https://login.microsoftonline.com")]
    authority_host: String,
    /// Instance metadata service for a managed identity (used when no other credential is given).
    #[arg(long, env = "STARTLINE_IMDS_ENDPOINT", default_value = "http://169.254.169.254")]
    imds_endpoint: String,
    /// Display-name prefixes that mark urgent jobs (repeatable; the tag startline-priority=urgent also does).
    #[arg(long = "urgent-prefix", env = "STARTLINE_URGENT_PREFIXES", value_delimiter = ',')]
    urgent_prefixes: Vec<String>,
    /// Poll interval.
    #[arg(long, env = "STARTLINE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    interval: Duration,
    /// Jobs created within this window are listed (older unfinished jobs already followed are fetched by name).
    #[arg(long, env = "STARTLINE_LOOKBACK", default_value = "2d", value_parser = parse_duration)]
    lookback: Duration,
    /// A VM size the built-in table lacks, `SIZE=COUNT:CLASS` (repeatable), e.g. `Standard_ND96isr_B300_v7=8:b300`.
    #[arg(long = "instance-type", env = "STARTLINE_INSTANCE_TYPES", value_delimiter = ',')]
    instance_types: Vec<String>,
}

/// Where the agent's own metrics are served.
#[derive(clap::Args, Debug, Clone)]
struct MetricsArgs {
    /// Serve the agent's metrics (Prometheus text) at http://ADDR/metrics, e.g. 127.0.0.1:9464 (default: not
    /// served; the node agent also serves /metrics on --listen). A non-loopback address exposes them to the
    /// network: the operator's choice.
    #[arg(long, env = "STARTLINE_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,
}

#[derive(clap::Args, Debug)]
struct VertexArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Spool directory (sled; also holds the adapter's per-job memory).
    #[arg(long, env = "STARTLINE_SPOOL", default_value = "./startline-vertex-spool")]
    spool: std::path::PathBuf,
    /// Google Cloud project.
    #[arg(long, env = "STARTLINE_PROJECT")]
    project: String,
    /// Location (region), e.g. europe-west4.
    #[arg(long, env = "STARTLINE_LOCATION")]
    location: String,
    /// API base (default https://<location>-aiplatform.googleapis.com).
    #[arg(long, env = "STARTLINE_ENDPOINT")]
    endpoint: Option<String>,
    /// Command printing an access token, run before each poll (default: VERTEX_ACCESS_TOKEN from the environment,
    /// else Application Default Credentials).
    #[arg(long, env = "STARTLINE_TOKEN_COMMAND")]
    token_command: Option<String>,
    /// Display-name prefixes that mark urgent jobs (repeatable).
    #[arg(long = "urgent-prefix", env = "STARTLINE_URGENT_PREFIXES", value_delimiter = ',')]
    urgent_prefixes: Vec<String>,
    /// Poll interval.
    #[arg(long, env = "STARTLINE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    interval: Duration,
    /// Jobs created within this window are followed on the first poll; later polls ask only for jobs updated since
    /// the last successful poll.
    #[arg(long, env = "STARTLINE_LOOKBACK", default_value = "2d", value_parser = parse_duration)]
    lookback: Duration,
    /// An accelerator type the built-in table lacks, `TYPE=CLASS` (repeatable), e.g. `NVIDIA_X1000=x1000`.
    #[arg(long = "instance-type", env = "STARTLINE_INSTANCE_TYPES", value_delimiter = ',')]
    instance_types: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct SagemakerArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Spool directory (sled; also holds the adapter's per-job memory).
    #[arg(long, env = "STARTLINE_SPOOL", default_value = "./startline-sagemaker-spool")]
    spool: std::path::PathBuf,
    /// AWS region.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    region: String,
    /// API endpoint (default https://api.sagemaker.<region>.amazonaws.com).
    #[arg(long, env = "STARTLINE_ENDPOINT")]
    endpoint: Option<String>,
    /// Namespace in job ids (`sagemaker/<namespace>/<job name>`), e.g. the AWS account id.
    #[arg(long, env = "STARTLINE_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Job-name prefixes that mark urgent jobs (repeatable).
    #[arg(long = "urgent-prefix", env = "STARTLINE_URGENT_PREFIXES", value_delimiter = ',')]
    urgent_prefixes: Vec<String>,
    /// Poll interval.
    #[arg(long, env = "STARTLINE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    interval: Duration,
    /// Jobs created within this window are followed.
    #[arg(long, env = "STARTLINE_LOOKBACK", default_value = "2d", value_parser = parse_duration)]
    lookback: Duration,
    /// An instance type the built-in table lacks, `TYPE=COUNT:CLASS` (repeatable), e.g. `ml.p7.48xlarge=8:b300`.
    #[arg(long = "instance-type", env = "STARTLINE_INSTANCE_TYPES", value_delimiter = ',')]
    instance_types: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct SlurmArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Spool directory (sled; also holds the adapter's per-job memory).
    #[arg(long, env = "STARTLINE_SPOOL", default_value = "./startline-slurm-spool")]
    spool: std::path::PathBuf,
    /// Poll interval.
    #[arg(long, env = "STARTLINE_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    interval: Duration,
    /// The live-view command (whitespace-separated).
    #[arg(long, env = "STARTLINE_SQUEUE", default_value = "squeue --json")]
    squeue: String,
    /// The accounting command (whitespace-separated). The adapter adds `--starttime` (from the last successful
    /// poll) or `-j <ids>` (re-querying vanished jobs); a `--starttime`/`-S` given here is dropped.
    #[arg(long, env = "STARTLINE_SACCT", default_value = "sacct --json --allusers")]
    sacct: String,
    /// How far back the first accounting window reaches (later windows start at the last successful poll).
    #[arg(long, env = "STARTLINE_LOOKBACK", default_value = "2d", value_parser = parse_duration)]
    lookback: Duration,
    /// How long a followed job may be missing from squeue and from accounting (re-queried by id) before it is
    /// ended with outcome unknown (reported as cancelled).
    #[arg(long, env = "STARTLINE_VANISHED_GRACE", default_value = "10m", value_parser = parse_duration)]
    vanished_grace: Duration,
    /// Partitions whose jobs are urgent (repeatable).
    #[arg(long = "urgent-partition", env = "STARTLINE_URGENT_PARTITIONS", value_delimiter = ',')]
    urgent_partitions: Vec<String>,
    /// QOS names whose jobs are urgent (repeatable).
    #[arg(long = "urgent-qos", env = "STARTLINE_URGENT_QOS", value_delimiter = ',')]
    urgent_qos: Vec<String>,
    /// Region or site reported for every job.
    #[arg(long, env = "STARTLINE_SITE", default_value = "")]
    site: String,
    /// GPU class reported for every job.
    #[arg(long, env = "STARTLINE_GPU_CLASS", default_value = "")]
    gpu_class: String,
    /// Cluster name when Slurm's payload has none.
    #[arg(long, env = "STARTLINE_CLUSTER", default_value = "default")]
    cluster: String,
    /// Report the job's start as its first step (for jobs without a node agent reporting real first steps).
    #[arg(long, env = "STARTLINE_FIRST_STEP_ON_START")]
    first_step_on_start: bool,
    /// slurmrestd mode: read jobs from this slurmrestd (e.g. http://127.0.0.1:6820) instead of running squeue
    /// and sacct; authenticated with a JWT (--rest-token-file, else SLURM_JWT).
    #[arg(long, env = "STARTLINE_SLURM_REST", value_name = "URL")]
    rest: Option<String>,
    /// File holding the JWT (`scontrol token` output is accepted), re-read at every request so a rotated token
    /// is picked up. Without it the token comes from SLURM_JWT.
    #[arg(long, env = "STARTLINE_SLURM_TOKEN_FILE", value_name = "FILE", requires = "rest")]
    rest_token_file: Option<PathBuf>,
    /// User sent as X-SLURM-USER-NAME (default: the user the token was issued for, its `sun` claim).
    #[arg(long, env = "STARTLINE_SLURM_USER", value_name = "NAME", requires = "rest")]
    rest_user: Option<String>,
    /// slurmrestd data-parser version, e.g. v0.0.38 (default: the newest the server lists, from /openapi/v3).
    #[arg(long, env = "STARTLINE_SLURM_REST_VERSION", value_name = "VERSION", requires = "rest")]
    rest_version: Option<String>,
}

#[derive(clap::Args, Debug)]
struct NodeArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Local endpoint address.
    #[arg(long, env = "STARTLINE_LISTEN", default_value = "127.0.0.1:7465")]
    listen: String,
    /// Spool directory (sled).
    #[arg(long, env = "STARTLINE_SPOOL", default_value = "./startline-spool")]
    spool: std::path::PathBuf,
    /// Most events the spool holds before refusing new ones.
    #[arg(long, env = "STARTLINE_SPOOL_MAX_EVENTS", default_value_t = 1_000_000)]
    spool_max_events: u64,
    /// Most bytes the spool holds before refusing new ones.
    #[arg(long, env = "STARTLINE_SPOOL_MAX_BYTES", default_value_t = 512 << 20)]
    spool_max_bytes: u64,
    /// Source name stamped on every event (default: node-agent/<node name>); clients cannot set their own.
    #[arg(long, env = "STARTLINE_SOURCE")]
    source: Option<String>,
    /// Also serve the endpoint on this unix socket (mode 0660; a stale socket file is removed at start).
    #[arg(long, env = "STARTLINE_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Group of the socket (a name in /etc/group, or a gid); its members may post.
    #[arg(long, env = "STARTLINE_SOCKET_GROUP", value_name = "NAME", requires = "socket")]
    socket_group: Option<String>,
    /// File holding a local token: POSTs must carry `Authorization: Bearer <it>` (else 401).
    #[arg(long, env = "STARTLINE_NODE_LOCAL_TOKEN_FILE", value_name = "PATH")]
    local_token_file: Option<PathBuf>,
    /// Accept events only for this job id (repeatable); with --allow-jobs-file or this, only the listed jobs and
    /// the agent's own job (from its environment) may be reported.
    #[arg(long = "allow-job-id", env = "STARTLINE_ALLOW_JOB_IDS", value_name = "ID")]
    allow_job_ids: Vec<String>,
    /// File of allowed job ids, one per line, re-read when it changes (e.g. written by a Slurm prolog).
    #[arg(long, env = "STARTLINE_ALLOW_JOBS_FILE", value_name = "PATH")]
    allow_jobs_file: Option<PathBuf>,
    /// Most events one client (a socket peer's uid, or all of loopback TCP) may hold in the spool (default: a
    /// quarter of --spool-max-events).
    #[arg(long, env = "STARTLINE_CLIENT_QUOTA")]
    client_quota: Option<u64>,
    /// Most bytes one client may hold in the spool (default: a quarter of --spool-max-bytes).
    #[arg(long, env = "STARTLINE_CLIENT_QUOTA_BYTES")]
    client_quota_bytes: Option<u64>,
    /// Report GPU health (ECC counters, temperature from `nvidia-smi --query-gpu`) every this often; off unless
    /// given (e.g. `60s`).
    #[arg(long, env = "STARTLINE_GPU_HEALTH_INTERVAL", value_parser = humantime::parse_duration)]
    gpu_health_interval: Option<Duration>,
    /// The nvidia-smi to run.
    #[arg(long, env = "STARTLINE_NVIDIA_SMI", default_value = "nvidia-smi")]
    nvidia_smi: PathBuf,
    /// This node's name in health reports and the default source, as the scheduler names it in node_assigned
    /// (default: NODE_NAME, which a DaemonSet sets from the downward API's spec.nodeName, else /etc/hostname).
    #[arg(long, env = "STARTLINE_NODE_NAME")]
    node_name: Option<String>,
}

#[derive(clap::Args, Debug)]
struct EmitArgs {
    /// Event kind: submitted, queued, node_assigned, preparing, first_step, checkpoint, preempted, requeued,
    /// restarted, node_lost, done.
    kind: String,
    /// The node agent's endpoint.
    #[arg(long, default_value = "http://127.0.0.1:7465", env = "STARTLINE_AGENT")]
    agent: String,
    /// Post over the node agent's unix socket instead of --agent.
    #[arg(long, env = "STARTLINE_NODE_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// File holding the node agent's local token (content trimmed).
    #[arg(long, env = "STARTLINE_NODE_TOKEN_FILE", value_name = "PATH")]
    node_token_file: Option<PathBuf>,
    /// The node agent's local token. Less safe than --node-token-file: it shows in `ps` and the environment.
    #[arg(long, env = "STARTLINE_NODE_TOKEN", hide_env_values = true, conflicts_with = "node_token_file")]
    node_token: Option<String>,
    /// Job id (default: from STARTLINE_JOB_ID, SLURM_JOB_ID/SLURM_CLUSTER_NAME, or POD_NAMESPACE/POD_NAME).
    #[arg(long, env = "STARTLINE_JOB")]
    job: Option<String>,
    /// Extra fields as key=value (e.g. step=100 phase=image_pull outcome=succeeded exit_code=0 nodes=gpu1,gpu2
    /// labels.team=vision), sent as the type the field has: integers for step, resume_step, gpu_count,
    /// node_count, attempt, exit_code; true/false for checkpoint_saved; lists for nodes and gpu_ids; text for
    /// the rest (so nodes=1001 or pool=42 stay text).
    #[arg(long = "field", env = "STARTLINE_FIELDS", short = 'f', value_name = "KEY=VALUE")]
    fields: Vec<String>,
    /// The event's id. Default: derived from the event and its occurred_at, stamped once per invocation, so
    /// retries inside one invocation are duplicates. A script that may run the whole command again for the
    /// same event passes a stable id (e.g. "epilog-done-$SLURM_JOB_ID") so the re-run is a duplicate too.
    #[arg(long, env = "STARTLINE_EVENT_ID")]
    event_id: Option<String>,
    /// Keep retrying (node agent unreachable, 5xx, timeouts) this long, with the same event id and occurred_at.
    #[arg(long, env = "STARTLINE_RETRY_FOR", default_value = "60s", value_parser = parse_duration)]
    retry_for: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like \"7d\": {e}"))
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Seed; the same seed gives the same fleet.
    #[arg(long, env = "STARTLINE_SEED", default_value_t = 42)]
    seed: u64,
    /// Simulated history to backfill, ending now.
    #[arg(long, env = "STARTLINE_HISTORY", default_value = "7d", value_parser = parse_duration)]
    history: Duration,
    /// Jobs submitted over the history (default: from --jobs-per-hour).
    #[arg(long, env = "STARTLINE_JOBS")]
    jobs: Option<u64>,
    /// Average job arrivals per hour.
    #[arg(long, env = "STARTLINE_JOBS_PER_HOUR", default_value_t = 60.0)]
    jobs_per_hour: f64,
    /// Simulated seconds per wall second during the backfill; 0 = as fast as the collector acknowledges.
    #[arg(long, env = "STARTLINE_SPEEDUP", default_value_t = 0.0)]
    speedup: f64,
    /// Most events per second sent; 0 = unlimited.
    #[arg(long, env = "STARTLINE_RATE", default_value_t = 0.0)]
    rate: f64,
    /// Keep simulating in real time after the backfill, until Ctrl-C.
    #[arg(long, env = "STARTLINE_FOLLOW")]
    follow: bool,
    /// Probability that an event is delivered late (out of order).
    #[arg(long, env = "STARTLINE_DISORDER", default_value_t = 0.0)]
    disorder: f64,
    /// Probability that an event is delivered twice.
    #[arg(long, env = "STARTLINE_DUPLICATES", default_value_t = 0.0)]
    duplicates: f64,
    /// Events per batch.
    #[arg(long, env = "STARTLINE_BATCH_SIZE", default_value_t = 1000)]
    batch_size: usize,
    /// Pools in the simulated fleet, built from the five default shapes in turn (0: the default five).
    #[arg(long, env = "STARTLINE_SIM_POOLS", default_value_t = 0)]
    pools: usize,
    /// GPU classes spread over the pools, up to 8 (0: each default pool's own).
    #[arg(long, env = "STARTLINE_SIM_GPU_CLASSES", default_value_t = 0, value_parser = parse_gpu_classes)]
    gpu_classes: usize,
    /// Share of arrivals that start a chain (train -> evaluate -> merge -> quantize, each stage submitted after the
    /// previous one ends, a failed stage retried once), 0 to 1.
    #[arg(long, env = "STARTLINE_SIM_CHAINS", default_value_t = 0.0, value_parser = parse_share)]
    chains: f64,
    /// Script H100 capacity crunches: nothing of the H100 pools starts, urgent jobs included, in the hour three
    /// days before the end of the history and from 30 minutes before its end to 30 minutes after (live, with
    /// --follow): the urgent-start SLO breaks and pages.
    #[arg(long, env = "STARTLINE_SIM_CRUNCH")]
    crunch: bool,
    /// Give up if the collector stays unreachable this long.
    #[arg(long, env = "STARTLINE_GIVE_UP_AFTER", default_value = "60s", value_parser = parse_duration)]
    give_up_after: Duration,
}

/// A share between 0 and 1.
fn parse_share(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| (0.0..=1.0).contains(v))
        .ok_or_else(|| format!("{s:?} is not a number between 0 and 1"))
}

/// `--gpu-classes`: 0 to the number of classes the simulator knows.
fn parse_gpu_classes(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("{s:?} is not a whole number"))?;
    let most = startline_agent::simulate::model::GPU_CLASSES.len();
    if n > most {
        return Err(format!("at most {most} GPU classes can be simulated"));
    }
    Ok(n)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("startline-agent: {e:#}");
            match e.downcast_ref::<startline_agent::eta::EtaError>() {
                Some(startline_agent::eta::EtaError::UnknownJob(_)) => {
                    std::process::ExitCode::from(startline_agent::eta::EXIT_UNKNOWN_JOB)
                }
                _ => std::process::ExitCode::from(1),
            }
        }
    }
}

fn emit(a: EmitArgs) -> anyhow::Result<()> {
    use startline_agent::emit::{post_with_retry, Client, Target};
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let job = match a.job {
        Some(j) => j,
        None => startline_agent::node::job_from_env(&env)
            .context("no --job given and none found in STARTLINE_JOB_ID, SLURM_JOB_ID or POD_NAMESPACE/POD_NAME")?,
    };
    let token: Option<Secret> = match (&a.node_token_file, &a.node_token) {
        (Some(p), _) => Some(read_token_file(p)?),
        (None, Some(t)) => Some(check_token(t, "--node-token")?),
        (None, None) => None,
    };
    // Stamped once: every retry below sends these exact bytes (same event id, same occurred_at).
    let body = startline_agent::node::emit_body(
        &a.kind,
        &job,
        &a.fields,
        a.event_id.as_deref(),
        startline_proto::time::now_ms(),
    )?;
    let payload = body.to_string();
    let target = match a.socket {
        Some(p) => Target::Socket(p),
        None => Target::Url(a.agent),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start runtime")?;
    rt.block_on(async move {
        let client = Client::new(target, token)?;
        post_with_retry(&client, &payload, a.retry_for, |failure, wait| {
            eprintln!("startline-agent: {failure}; retrying in {} ms", wait.as_millis());
        })
        .await?;
        Ok(())
    })
}

async fn run_node(a: NodeArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::spool::SpoolLimits;
    let limits = SpoolLimits { max_events: a.spool_max_events, max_bytes: a.spool_max_bytes };
    let mut runner = Runner::open("node", &a.spool, limits).await?;
    let spool = runner.spool().context("the node agent has a spool")?.clone();
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let hostname = std::fs::read_to_string("/etc/hostname").ok();
    let host = startline_agent::node::node_name(a.node_name.as_deref(), &env, hostname.as_deref());
    let source = a.source.unwrap_or_else(|| format!("node-agent/{host}"));
    let mut access = startline_agent::access::Access::open(limits);
    if let Some(q) = a.client_quota {
        access.client_quota.max_events = q;
    }
    if let Some(q) = a.client_quota_bytes {
        access.client_quota.max_bytes = q;
    }
    if let Some(p) = &a.local_token_file {
        access.local_token = Some(startline_agent::access::LocalToken::file(p.clone()).context("--local-token-file")?);
    }
    if !a.allow_job_ids.is_empty() || a.allow_jobs_file.is_some() {
        let own = startline_agent::node::job_from_env(&env);
        access.jobs = Some(startline_agent::access::JobAllowList::new(
            a.allow_job_ids.iter().cloned().chain(own),
            a.allow_jobs_file.clone(),
        ));
    }
    let gid = a.socket_group.as_deref().map(startline_agent::access::group_id).transpose()?;
    let listener =
        tokio::net::TcpListener::bind(&a.listen).await.with_context(|| format!("cannot listen on {}", a.listen))?;
    let bound = listener.local_addr()?;
    access.listen_hosts = vec![a.listen.to_ascii_lowercase(), bound.to_string()];
    let unix = match &a.socket {
        Some(p) => Some(startline_agent::access::bind_socket(p, gid).context("cannot serve the node agent socket")?),
        None => None,
    };
    conn.deliver(&mut runner)?;
    if let Some(every) = a.gpu_health_interval {
        let publisher = Publisher::new(conn.settings()?)?;
        let health = report_gpu_health(
            publisher,
            a.nvidia_smi.clone(),
            host.clone(),
            source.clone(),
            every,
            runner.stop_token(),
        );
        runner.spawn("gpu-health", health);
    }
    let app = startline_agent::node::router(startline_agent::node::NodeState {
        clock: startline_agent::node::MonotonicWall::start(),
        spool: spool.clone(),
        source,
        limits: startline_proto::Limits::default(),
        access: std::sync::Arc::new(access),
        metrics: runner.metrics().clone(),
    });
    runner.serve_metrics(a.metrics.metrics_listen.as_deref()).await?;
    let socket_note = a.socket.as_ref().map(|p| format!(" socket={}", p.display())).unwrap_or_default();
    println!("startline-agent node ready listen={bound}{socket_note}{}", runner.ready_note());
    if let Some(u) = unix {
        let app = app.clone().into_make_service_with_connect_info::<startline_agent::access::PeerCred>();
        let stop = runner.stop_token();
        runner.spawn("socket", async move {
            if let Err(e) = axum::serve(u, app).with_graceful_shutdown(async move { stop.cancelled().await }).await {
                tracing::warn!(error = %e, "the node agent socket stopped");
            }
        });
    }
    let stop = runner.stop_token();
    runner.spawn("http", async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await }).await {
            tracing::warn!(error = %e, "the node agent endpoint stopped");
        }
    });
    runner.run_until(shutdown_signal()).await;
    if let Some(p) = &a.socket {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Reads GPU health every `every` and reports it; a failed read or report is logged and tried again next time.
async fn report_gpu_health(
    mut publisher: Publisher,
    nvidia_smi: PathBuf,
    node: String,
    source: String,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let gpus = match startline_agent::gpu::read(&nvidia_smi).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read GPU health");
                continue;
            }
        };
        let req = startline_proto::pb::ReportHealthRequest {
            reports: vec![startline_proto::pb::NodeHealth {
                node: node.clone(),
                observed_at: Some(startline_proto::time::ms_to_timestamp(startline_proto::time::now_ms())),
                source: source.clone(),
                gpus,
            }],
        };
        match publisher.report_health(req).await {
            Ok(r) => tracing::debug!(stored = r.stored, "GPU health reported"),
            Err(e) => tracing::warn!(error = %e, "cannot report GPU health"),
        }
    }
}

async fn run_slurm(a: SlurmArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::provider::{slurm, MemoryStore};
    let mut runner = Runner::open("slurm", &a.spool, Default::default()).await?;
    let spool = runner.spool().context("the adapter has a spool")?.clone();
    let memory = MemoryStore::open(&spool, "slurm").context("cannot open the adapter's memory")?;
    let split = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let mapping = slurm::Mapping {
        urgent_partitions: a.urgent_partitions,
        urgent_qos: a.urgent_qos,
        site: a.site,
        gpu_class: a.gpu_class,
        first_step_on_start: a.first_step_on_start,
        cluster: a.cluster,
    };
    let mut shell = slurm::ShellSettings {
        squeue: split(&a.squeue),
        sacct: split(&a.sacct),
        interval: a.interval,
        lookback: a.lookback,
        vanished_grace: a.vanished_grace,
        rest: None,
    };
    let metrics = runner.metrics().clone();
    if let Some(url) = &a.rest {
        let token = match (&a.rest_token_file, std::env::var("SLURM_JWT")) {
            (Some(f), _) => slurm::rest::TokenSource::File(f.clone()),
            (None, Ok(t)) if !t.trim().is_empty() => slurm::rest::TokenSource::Static(t),
            (None, _) => {
                anyhow::bail!("--rest needs a token: --rest-token-file (STARTLINE_SLURM_TOKEN_FILE) or SLURM_JWT")
            }
        };
        let client = slurm::rest::Client::new(url, token, a.rest_user.clone(), a.rest_version.clone())
            .context("cannot build the slurmrestd client")?
            .with_metrics(metrics.clone());
        shell.rest = Some(std::sync::Arc::new(client));
    }
    runner.serve_metrics(a.metrics.metrics_listen.as_deref()).await?;
    conn.deliver(&mut runner)?;
    runner.spawn("poller", slurm::run(mapping, shell, spool, memory, metrics, runner.stop_token()));
    println!("startline-agent slurm ready{}", runner.ready_note());
    runner.run_until(shutdown_signal()).await;
    Ok(())
}

async fn run_sagemaker(a: SagemakerArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::provider::{aws_credentials::AwsCredentials, sagemaker, MemoryStore};
    // The AWS SDK's credentials chain; nothing is resolved yet: the first poll asks, and a failure is a failed
    // poll (logged, counted, asked again at the next one), not a failed start.
    let creds = AwsCredentials::default_chain(&a.region).await.map_err(anyhow::Error::msg)?;
    let endpoint = a.endpoint.clone().unwrap_or_else(|| format!("https://api.sagemaker.{}.amazonaws.com", a.region));
    let gpus = startline_agent::provider::gpus::GpuTable::parse(&a.instance_types).map_err(anyhow::Error::msg)?;
    let client = sagemaker::Client::new(&endpoint, &a.region, creds).map_err(anyhow::Error::msg)?;
    let mut runner = Runner::open("sagemaker", &a.spool, Default::default()).await?;
    let spool = runner.spool().context("the adapter has a spool")?.clone();
    let memory = MemoryStore::open(&spool, "sagemaker").context("cannot open the adapter's memory")?;
    let mapping = sagemaker::Mapping {
        region: a.region.clone(),
        urgent_prefixes: a.urgent_prefixes,
        namespace: a.namespace,
        gpus,
    };
    let metrics = runner.metrics().clone();
    let client = client.with_metrics(metrics.clone());
    runner.serve_metrics(a.metrics.metrics_listen.as_deref()).await?;
    conn.deliver(&mut runner)?;
    let poller = sagemaker::run(
        mapping,
        client,
        sagemaker::Schedule { lookback: a.lookback, interval: a.interval },
        spool,
        memory,
        metrics,
        runner.stop_token(),
    );
    runner.spawn("poller", poller);
    println!("startline-agent sagemaker ready endpoint={endpoint}{}", runner.ready_note());
    runner.run_until(shutdown_signal()).await;
    Ok(())
}

async fn run_vertex(a: VertexArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::provider::google_credentials::{GoogleCredentials, Source};
    use startline_agent::provider::{vertex, MemoryStore};
    // A token command or VERTEX_ACCESS_TOKEN when given, else Application Default Credentials.
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let source = match (&a.token_command, std::env::var("VERTEX_ACCESS_TOKEN").ok().filter(|t| !t.trim().is_empty())) {
        (Some(c), _) => Source::Command(c.split_whitespace().map(str::to_string).collect()),
        (None, Some(t)) => Source::Static(Secret::new(t.trim())),
        (None, None) => Source::application_default(&env).map_err(anyhow::Error::msg)?,
    };
    tracing::info!(source = source.name(), "Google credentials");
    let token = GoogleCredentials::new(source).map_err(anyhow::Error::msg)?;
    let endpoint = a.endpoint.clone().unwrap_or_else(|| format!("https://{}-aiplatform.googleapis.com", a.location));
    let gpus = startline_agent::provider::gpus::GpuTable::parse(&a.instance_types).map_err(anyhow::Error::msg)?;
    let client = vertex::Client::new(&endpoint, &a.project, &a.location, token).map_err(anyhow::Error::msg)?;
    let mut runner = Runner::open("vertex", &a.spool, Default::default()).await?;
    let spool = runner.spool().context("the adapter has a spool")?.clone();
    let memory = MemoryStore::open(&spool, "vertex").context("cannot open the adapter's memory")?;
    let metrics = runner.metrics().clone();
    runner.serve_metrics(a.metrics.metrics_listen.as_deref()).await?;
    conn.deliver(&mut runner)?;
    let mapping = vertex::Mapping { project: a.project.clone(), urgent_prefixes: a.urgent_prefixes, gpus };
    let client = client.with_metrics(metrics.clone());
    let poller = vertex::run(mapping, client, a.interval, a.lookback, spool, memory, metrics, runner.stop_token());
    runner.spawn("poller", poller);
    println!("startline-agent vertex ready endpoint={endpoint}{}", runner.ready_note());
    runner.run_until(shutdown_signal()).await;
    Ok(())
}

async fn run_azureml(a: AzuremlArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::auth::Secret;
    use startline_agent::provider::{azureml, MemoryStore};
    // Credentials, in the order Azure's SDKs try them: a token, a client secret, workload identity, managed identity.
    let secret = match (&a.client_secret_file, std::env::var("AZURE_CLIENT_SECRET").ok().filter(|s| !s.is_empty())) {
        (Some(p), _) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("--client-secret-file {}", p.display()))?
                .trim()
                .to_string(),
        ),
        (None, env) => env,
    };
    let need = |what: &str, v: &Option<String>| -> anyhow::Result<String> {
        v.clone().with_context(|| format!("{what} needs --tenant and --client-id (AZURE_TENANT_ID, AZURE_CLIENT_ID)"))
    };
    let credential = if let Some(t) = std::env::var("AZURE_ACCESS_TOKEN").ok().filter(|t| !t.is_empty()) {
        azureml::Credential::Static(Secret::new(t))
    } else if let Some(secret) = secret {
        azureml::Credential::ClientSecret {
            authority: a.authority_host.clone(),
            tenant: need("a client secret", &a.tenant)?,
            client_id: need("a client secret", &a.client_id)?,
            secret: Secret::new(secret),
        }
    } else if let Some(file) = &a.federated_token_file {
        azureml::Credential::WorkloadIdentity {
            authority: a.authority_host.clone(),
            tenant: need("a workload identity", &a.tenant)?,
            client_id: need("a workload identity", &a.client_id)?,
            token_file: file.clone(),
        }
    } else {
        azureml::Credential::ManagedIdentity { endpoint: a.imds_endpoint.clone(), client_id: a.client_id.clone() }
    };
    let history = match a.history_endpoint.as_deref() {
        Some("none") => None,
        Some(h) => Some(h.to_string()),
        None => Some(format!("https://{}.api.azureml.ms", a.region)),
    };
    let gpus = startline_agent::provider::gpus::GpuTable::parse(&a.instance_types).map_err(anyhow::Error::msg)?;
    let ws = azureml::Workspace {
        subscription: a.subscription.clone(),
        resource_group: a.resource_group.clone(),
        workspace: a.workspace.clone(),
    };
    let client = azureml::Client::new(&a.endpoint, history.as_deref(), &ws, credential).map_err(anyhow::Error::msg)?;
    let mut runner = Runner::open("azureml", &a.spool, Default::default()).await?;
    let spool = runner.spool().context("the adapter has a spool")?.clone();
    let memory = MemoryStore::open(&spool, "azureml").context("cannot open the adapter's memory")?;
    let metrics = runner.metrics().clone();
    let client = client.with_metrics(metrics.clone());
    runner.serve_metrics(a.metrics.metrics_listen.as_deref()).await?;
    conn.deliver(&mut runner)?;
    let mapping = azureml::Mapping {
        resource_group: a.resource_group,
        workspace: a.workspace,
        region: a.region,
        urgent_prefixes: a.urgent_prefixes,
        gpus,
    };
    let poller = azureml::run(
        mapping,
        client,
        azureml::Schedule { lookback: a.lookback, interval: a.interval },
        spool,
        memory,
        metrics,
        runner.stop_token(),
    );
    runner.spawn("poller", poller);
    println!("startline-agent azureml ready endpoint={}{}", a.endpoint, runner.ready_note());
    runner.run_until(shutdown_signal()).await;
    Ok(())
}

async fn run_kueue(a: KueueArgs, conn: Connection) -> anyhow::Result<()> {
    use startline_agent::provider::{kueue, MemoryStore};
    let mut queues = std::collections::HashMap::new();
    for q in &a.queues {
        let (lq, cq) = q.split_once('=').with_context(|| format!("--queue {q}: expected LQ=CQ"))?;
        anyhow::ensure!(!lq.is_empty() && !cq.is_empty(), "--queue {q}: expected LQ=CQ");
        queues.insert(lq.to_string(), cq.to_string());
    }
    let token = match &a.api_token_file {
        Some(p) => Some(read_token_file(p)?.expose().to_string()),
        None => None,
    };
    let client = kueue::watch::client(a.api_server.as_deref(), token).await.map_err(anyhow::Error::msg)?;
    let mut runner = Runner::open("kueue", &a.spool, Default::default()).await?;
    let spool = runner.spool().context("the adapter has a spool")?.clone();
    let memory = MemoryStore::open(&spool, "kueue").context("cannot open the adapter's memory")?;
    let metrics = runner.metrics().clone();
    runner.serve_metrics(a.metrics.metrics_listen.as_deref()).await?;
    conn.deliver(&mut runner)?;
    let mapping = kueue::Mapping {
        cluster: a.cluster.clone(),
        region: a.region,
        queues,
        urgent_priority_classes: a.urgent_priority_classes,
        team_label: a.team_label,
        first_step_on_start: a.first_step_on_start,
    };
    let settings = kueue::watch::Settings {
        api_version: a.kueue_api_version,
        namespace: a.namespace,
        plain_jobs: a.plain_jobs,
        visibility: !a.no_visibility,
        position_interval: a.position_interval,
        retry: a.retry,
    };
    runner.spawn("watcher", kueue::watch::run(mapping, settings, client, spool, memory, metrics, runner.stop_token()));
    println!("startline-agent kueue ready cluster={}{}", a.cluster, runner.ready_note());
    runner.run_until(shutdown_signal()).await;
    Ok(())
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let Cli {
        collector,
        collector_give_up,
        log,
        log_format,
        token_file,
        token,
        ca_file,
        client_cert,
        client_key,
        command,
    } = cli;
    let command = match command {
        Command::Emit(a) => return emit(a),
        Command::Completions { shell } => {
            return Ok(cli_docs::completions(<Cli as clap::CommandFactory>::command(), shell, &mut std::io::stdout())?)
        }
        Command::Man { out } => {
            return cli_docs::man_pages(<Cli as clap::CommandFactory>::command(), &out)
                .with_context(|| format!("cannot write man pages into {}", out.display()))
        }
        other => other,
    };
    let token = match (token_file, token) {
        (Some(p), _) => Some(TokenSource::File(p)),
        (None, Some(t)) => Some(TokenSource::Static(check_token(&t, "--token")?)),
        (None, None) => None,
    };
    let conn =
        Connection { collector, give_up: collector_give_up, token, tls: TlsFiles { ca_file, client_cert, client_key } };
    let filter = match &log {
        Some(f) => tracing_subscriber::EnvFilter::try_new(f).context("invalid --log filter")?,
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .or_else(|_| tracing_subscriber::EnvFilter::try_new("info"))
            .context("invalid RUST_LOG filter")?,
    };
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match log_format {
        LogFormat::Json => fmt.json().with_current_span(true).init(),
        LogFormat::Text => fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start runtime")?;
    rt.block_on(async move {
        match command {
            Command::Node(a) => run_node(a, conn).await,
            Command::Slurm(a) => run_slurm(a, conn).await,
            Command::Sagemaker(a) => run_sagemaker(a, conn).await,
            Command::Vertex(a) => run_vertex(a, conn).await,
            Command::Azureml(a) => run_azureml(a, conn).await,
            Command::Kueue(a) => run_kueue(a, conn).await,
            Command::Tail(a) => run_tail(a, conn).await,
            Command::Eta(a) => run_eta(a, conn).await,
            Command::Gameday(a) => run_gameday(a, conn).await,
            Command::Emit(a) => emit(a),
            // Answered before the runtime starts (above).
            Command::Completions { .. } | Command::Man { .. } => Ok(()),
            Command::Simulate(a) => {
                for (name, p) in [("--disorder", a.disorder), ("--duplicates", a.duplicates)] {
                    anyhow::ensure!((0.0..=1.0).contains(&p), "{name} must be a probability in 0..=1");
                }
                anyhow::ensure!(a.batch_size >= 1, "--batch-size must be at least 1");
                let mut up_settings = conn.settings()?;
                up_settings.give_up_after = Some(a.give_up_after);
                // Not spooled: a refused token ends the run at once instead of retrying.
                up_settings.retry_auth_failures = false;
                let mut up = Publisher::new(up_settings)?;
                let mut runner = Runner::without_spool("simulate")?;
                up.set_metrics(runner.metrics().clone());
                runner.serve_metrics(a.metrics.metrics_listen.as_deref()).await?;
                let note = runner.ready_note();
                if !note.is_empty() {
                    println!("startline-agent simulate ready{note}");
                }
                // A signal stops the simulation (the backfill or --follow); the metrics are served until it ends.
                let stop = runner.stop_token();
                let on_signal = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = shutdown_signal() => on_signal.cancel(),
                        _ = on_signal.cancelled() => {}
                    }
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
                    pools: a.pools,
                    gpu_classes: a.gpu_classes,
                    chains: a.chains,
                    crunch: a.crunch,
                    backfill: true,
                };
                let report = simulate::run(settings, &mut up, stop).await;
                runner.shutdown().await;
                let report = report?;
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
