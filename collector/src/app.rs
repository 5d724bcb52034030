//! Builds the collector's tasks and channels and owns the startup and shutdown order. `run_with_clock` reads
//! as the lists in docs/ARCHITECTURE.md ("Startup order", "Shutdown order"), one function a stage.
//!
//! Start:
//! 1. `open_and_restore`: open the store, restore the job index and the stored alert state;
//! 2. `load_identities_and_tls`: identities and TLS files (a bad key or CA file stops the start);
//! 3. `load_node_health`: the stored GPU health readings;
//! 4. `start_telemetry`: the metrics provider;
//! 5. `bind_listeners`: gRPC, then HTTP (so a bad address fails before anything is served);
//! 6. `spawn_log_export`: the accepted-event feed and the OTLP logs exporter, before the committer;
//! 7. `spawn_applier`: the stream out and the committer thread;
//! 8. `serve_grpc`: the ingest edge and the gRPC services;
//! 9. `spawn_reloader`: the reload task;
//! 10. `serve_http`: the API, the dashboard, `/metrics` and the HTTP ingest edge;
//! 11. `spawn_alert_loop`: the notifiers and the alert loop;
//! 12. `spawn_history_export`: with `[history.export]`, the uploader of sealed history files;
//! 13. `spawn_halt_watch`: the restart once the store is writable again after writes halted;
//! 14. `report_ready`: readiness.
//!
//! Shutdown (`shutdown_in_order`), once the token is cancelled:
//! 1. `stop_accepting`: readiness false, gRPC health NOT_SERVING; gRPC stops accepting (GOAWAY on every
//!    connection);
//! 2. `drain_grpc`: batches already read are committed and acknowledged until `grpc.drain_timeout`; then every
//!    gRPC connection still open is closed, whatever it is doing, and ingest's intake closes, so no connection
//!    can keep the committer's channel open;
//! 3. `stop_applier`: the committer sees its channel close, writes a final checkpoint and flushes; then
//!    `stop_log_export`: the OTLP logs exporter sends what it holds; then `stop_history_export`: the history
//!    uploader stops (an upload under way is dropped and made again by the next start);
//! 4. `stop_alerting`: the alert loop and notifiers stop (alert state is already stored), a last metrics export;
//! 5. `stop_http`: HTTP stops last, so health and the API answer until the store is closed.

use crate::alert::notify;
use crate::alert::{AlertBoard, AlertLoop};
use crate::api::{self, ApiState};
use crate::applier::{self, CommitterSettings};
use crate::auth::tls::TlsState;
use crate::auth::Scope;
use crate::config::Config;
use crate::export::{Sources, Telemetry};
use crate::health::IngestStats;
use crate::index::cold::{ColdJobs, Dictionary, Folded};
use crate::index::labels::LabelLimiter;
use crate::index::{JobIndex, SharedIndex};
use crate::ingest::conn::{self, ConnectionLimits};
use crate::ingest::guard::Guarded;
use crate::ingest::service::{EdgeSettings, Ingest, IngestServer};
use crate::slo::SloEngine;
use crate::store::{Restored, Store, StoreError, StoreOptions};
use crate::time::Clock;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// After the drain deadline closes every gRPC connection, how long the server and the streams get to notice.
const FORCED_CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Failures that stop the collector.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The store could not be opened or restored.
    #[error("store at {path}: {error}{hint}")]
    Store {
        /// The store path.
        path: String,
        /// The cause (shown in the message, not chained, so it is printed once).
        error: StoreError,
        /// What an operator can do about it.
        hint: &'static str,
    },
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// gRPC reflection could not be built from the descriptor set.
    #[error("grpc reflection: {0}")]
    Reflection(String),
    /// A TLS file could not be loaded.
    #[error("{0}")]
    Tls(String),
    /// A server or thread failed.
    #[error("{0}")]
    Runtime(String),
}

/// The addresses actually bound (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// gRPC ingest.
    pub grpc: SocketAddr,
    /// HTTP API.
    pub http: SocketAddr,
}

/// What the process does once its store is writable again after writes halted (see `applier::halt`), with the
/// addresses the listeners are bound to and the halt's cause: run again in place or exit. It does not return.
pub type OnWritable = Box<dyn FnOnce(Bound, &'static str) + Send>;

/// Runs the collector until `shutdown` is cancelled. `on_ready` is called once both listeners are bound and the
/// store is restored; `on_writable` after store writes halted, once the store is writable again.
pub async fn run(
    config: Config,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(Bound),
    on_writable: OnWritable,
) -> Result<(), AppError> {
    run_with_clock(config, Clock::system(), shutdown, on_ready, on_writable).await
}

/// The longest a stop may take before the process exits anyway (a store call that never returns, a task that
/// never ends): the gRPC drain, the forced close's grace, and [`STOP_GRACE`] for the final checkpoint and the
/// rest. Everything acknowledged is in the log's synced files whatever the stop leaves undone.
pub fn stop_deadline(config: &Config) -> Duration {
    config.grpc_connections.drain_timeout + FORCED_CLOSE_GRACE + STOP_GRACE
}

/// See [`stop_deadline`].
const STOP_GRACE: Duration = Duration::from_secs(30);

/// [`run`] with a given clock (tests pause tokio's time and advance it). Reads as the startup order of
/// docs/ARCHITECTURE.md, one stage a call, then waits for `shutdown` and runs `shutdown_in_order`.
pub async fn run_with_clock(
    config: Config,
    clock: Clock,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(Bound),
    on_writable: OnWritable,
) -> Result<(), AppError> {
    let core = open_and_restore(&config, clock).await?;
    let ids = load_identities_and_tls(&config)?;
    let nodes = load_node_health(&core);
    let telemetry = start_telemetry(&config, &core, &ids, &nodes)?;
    let Listeners { grpc: grpc_listener, http: http_listener, bound, budget } = bind_listeners(&config).await?;
    let started = Started { config: &config, core: &core, ids: &ids, nodes: &nodes, telemetry: &telemetry };
    let logs = spawn_log_export(&started)?;
    let (applier, commits) = spawn_applier(&started, &logs.feed)?;
    let (grpc, http_ingest) = serve_grpc(&started, &applier, commits, grpc_listener, &budget, &shutdown).await?;
    let reloads = spawn_reloader(&started, &applier, &shutdown);
    let http = serve_http(&started, reloads.reload.clone(), http_ingest, http_listener, budget);
    let alerting = spawn_alert_loop(&started, &applier, reloads.alert_settings, bound);
    let history_export = spawn_history_export(&started)?;
    let _halt_watch = spawn_halt_watch(&core, &shutdown, bound, on_writable)?;
    report_ready(&core, bound, on_ready);

    shutdown.cancelled().await;
    shutdown_in_order(Running {
        core,
        drain_timeout: config.grpc_connections.drain_timeout,
        grpc,
        committer: applier.committer,
        logs,
        history_export,
        alerting,
        telemetry,
        http,
        reloader: reloads.task,
    })
    .await;
    Ok(())
}

/// What [`open_and_restore`] builds and every later stage shares.
struct Core {
    clock: Clock,
    store: Store,
    index: SharedIndex,
    /// Alert state, as stored.
    board: AlertBoard,
    /// Wakes the alert loop: the committer after each change, a reload after an SLO change.
    wake: Arc<Notify>,
    health: Arc<crate::health::Health>,
    /// Readiness (`/readyz`): true from [`report_ready`] until the shutdown begins.
    ready: Arc<AtomicBool>,
    stats: Arc<IngestStats>,
    http_stats: Arc<api::serve::HttpStats>,
}

/// Startup 1. Opens the store and restores the job index (snapshots, log tail, summaries or the shutdown image;
/// SLO state and gauges derived from the jobs) and the stored alert state, on a blocking thread.
async fn open_and_restore(config: &Config, clock: Clock) -> Result<Core, AppError> {
    let path = config.store_path.clone();
    let shown = path.display().to_string();
    let store_err = |error: StoreError| {
        let hint = if error.is_damage() {
            " (the store is damaged and was not opened, so nothing in it is served wrongly: move the directory \
             aside and restore it from a backup, or start with an empty one)"
        } else {
            ""
        };
        AppError::Store { path: shown, error, hint }
    };
    let started = tokio::time::Instant::now();
    let slo_defs = config.slos.clone();
    let now = clock.now_ms();
    let limiter = LabelLimiter::new(&config.metrics.labels);
    let cache_bytes = config.cache_bytes;
    let segment_bytes = config.log_segment_bytes;
    let hot_budget = usize::try_from(config.hot_budget_bytes).unwrap_or(usize::MAX);
    let folded_budget = match config.folded_budget_bytes {
        0 => usize::MAX,
        b => usize::try_from(b).unwrap_or(usize::MAX),
    };
    let (store, restored, index, alerts) = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let t0 = std::time::Instant::now();
        let store = Store::open_with(&path, StoreOptions { cache_bytes, segment_bytes })?;
        let opened = t0.elapsed();
        let (mut restored, cold) = restore_index(&store)?;
        let read = t0.elapsed();
        // SLO state and metric gauges are derived from the jobs: rebuilding them after a restore finds every
        // deadline crossed while the collector was down, and stored alert state keeps those pages from repeating.
        let jobs = std::mem::take(&mut restored.jobs);
        let dirty = std::mem::take(&mut restored.dirty);
        let stale = std::mem::take(&mut restored.stale_summaries);
        let through = std::mem::take(&mut restored.snapshot_through);
        let mut index = JobIndex::new_at(jobs, cold, restored.last_seq, SloEngine::new(slo_defs), limiter, now)
            .with_dirty(dirty)
            .with_snapshot_through(through)
            .with_stale_summaries(stale)
            .with_hot_budget(hot_budget)
            .with_folded_budget(folded_budget);
        index.deleted.over_budget_through_ms = store.history_deleted_through()?;
        // Decisions are counted from here on: the restored history was assessed silently.
        index.slo.start_counting();
        tracing::debug!(
            open_ms = opened.as_millis() as u64,
            read_ms = (read - opened).as_millis() as u64,
            derive_ms = (t0.elapsed() - read).as_millis() as u64,
            "restore phases: sled open, store read (snapshots, log tail, summaries), index derivation (SLOs, gauges)"
        );
        let alerts = store.load_alerts()?;
        Ok((store, restored, index, alerts))
    })
    .await
    .map_err(|e| AppError::Runtime(format!("restore task: {e}")))?
    .map_err(store_err)?;
    tracing::info!(
        jobs = index.len(),
        hot = index.jobs.len(),
        folded = restored.folded,
        unfolded = restored.unfolded,
        snapshots = restored.snapshots,
        replayed = restored.replayed,
        rebuilt_from_log = restored.rebuilt.as_deref().unwrap_or("no"),
        from_shutdown_image = restored.from_image,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "store restored"
    );
    let index = SharedIndex::new(index);
    let board = AlertBoard::default();
    for a in alerts {
        board.insert(a);
    }
    Ok(Core {
        clock,
        wake: Arc::new(Notify::new()),
        health: Arc::new(crate::health::Health::watching(store.write_halt())),
        ready: Arc::new(AtomicBool::new(false)),
        stats: Arc::new(IngestStats::default()),
        http_stats: Arc::new(api::serve::HttpStats::default()),
        store,
        index,
        board,
    })
}

/// Who may call, and the listeners' TLS.
struct Identities {
    auth: Arc<crate::auth::Auth>,
    tls: Option<Arc<TlsState>>,
    /// Whether a listener is reachable beyond loopback.
    exposed: bool,
}

/// Startup 2. Loads the identities and the TLS certificates and keys before any port is bound, so a bad key or CA
/// file stops the start; warns when a listener beyond loopback has no authentication or no TLS.
fn load_identities_and_tls(config: &Config) -> Result<Identities, AppError> {
    let exposed = !config.grpc_listen.ip().is_loopback() || !config.http_listen.ip().is_loopback();
    let insecure = exposed && !config.auth.enabled();
    if insecure {
        tracing::warn!(
            grpc = %config.grpc_listen,
            http = %config.http_listen,
            "auth.insecure = true: listening beyond loopback with NO authentication; anyone who can reach these \
             ports can write events and read every job (startline_collector_auth_insecure = 1)"
        );
    } else if exposed && config.tls.is_none() {
        tracing::warn!("listening beyond loopback without [tls]: bearer tokens cross the network in clear text");
    }
    let auth = Arc::new(crate::auth::Auth::new(config.auth.keyring(), insecure, config.auth.metrics_protected));
    let tls = match &config.tls {
        None => None,
        Some(files) => Some(Arc::new(TlsState::load(files.clone()).map_err(|e| AppError::Tls(e.to_string()))?)),
    };
    Ok(Identities { auth, tls, exposed })
}

/// The node health book and the boards the alert loop's scans publish.
struct Nodes {
    /// GPU health readings by node (`index::nodes::HealthBook`).
    book: crate::index::nodes::HealthBook,
    /// Adds reported readings to the book and the store.
    writer: crate::applier::health::HealthWriter,
    /// Suspect nodes, as the alert loop last found them.
    board: crate::index::nodes::NodeBoard,
    /// Chain SLO verdicts, as the alert loop last found them.
    chain_board: crate::index::chains::ChainSloBoard,
}

/// Startup 3. Loads the stored GPU health readings into the node health book (a reading that cannot be read is
/// counted and logged; the start goes on).
fn load_node_health(core: &Core) -> Nodes {
    let book = crate::index::nodes::HealthBook::default();
    let writer = crate::applier::health::HealthWriter { store: core.store.clone(), book: book.clone() };
    match writer.load(core.clock.now_ms()) {
        Ok(0) => {}
        Ok(n) => tracing::warn!(damaged = n, "some node health readings could not be read"),
        Err(e) => tracing::error!(error = %e, "cannot read node health readings"),
    }
    Nodes {
        book,
        writer,
        board: crate::index::nodes::NodeBoard::default(),
        chain_board: crate::index::chains::ChainSloBoard::default(),
    }
}

/// Startup 4. Starts the metrics provider (Prometheus `/metrics`, and OTLP push when configured) over the
/// index, the ingest and HTTP counters, the alert board, the store and health.
fn start_telemetry(config: &Config, core: &Core, ids: &Identities, nodes: &Nodes) -> Result<Arc<Telemetry>, AppError> {
    let telemetry = Telemetry::new(
        Sources {
            nodes: nodes.board.clone(),
            chain_slos: nodes.chain_board.clone(),
            auth: ids.auth.clone(),
            index: core.index.clone(),
            stats: core.stats.clone(),
            http: core.http_stats.clone(),
            board: core.board.clone(),
            store: core.store.clone(),
            health: core.health.clone(),
            clock: core.clock,
        },
        config.metrics.otlp.clone(),
        config.metrics.max_series_per_metric,
    )
    .map_err(|e| AppError::Runtime(e.to_string()))?;
    Ok(Arc::new(telemetry))
}

/// Both listeners, bound.
struct Listeners {
    grpc: TcpListener,
    http: TcpListener,
    bound: Bound,
    /// The descriptor budget both listeners' connections share (`conn_limit`).
    budget: Arc<crate::conn_limit::DescriptorBudget>,
}

/// Startup 5. Binds the gRPC listener, then the HTTP one (so a bad or taken address fails before anything is
/// served), and sizes the descriptor budget their connections share under the open-file limit.
async fn bind_listeners(config: &Config) -> Result<Listeners, AppError> {
    let grpc = TcpListener::bind(config.grpc_listen)
        .await
        .map_err(|source| AppError::Bind { addr: config.grpc_listen, source })?;
    let http = TcpListener::bind(config.http_listen)
        .await
        .map_err(|source| AppError::Bind { addr: config.http_listen, source })?;
    let bound = Bound {
        grpc: grpc.local_addr().map_err(|e| AppError::Runtime(e.to_string()))?,
        http: http.local_addr().map_err(|e| AppError::Runtime(e.to_string()))?,
    };
    let budget = Arc::new(crate::conn_limit::DescriptorBudget::of_process());
    let caps = config.http_connections.max_connections + config.grpc_connections.max_connections;
    if caps > budget.limit() {
        tracing::info!(
            descriptor_budget = budget.limit(),
            http_max_connections = config.http_connections.max_connections,
            grpc_max_connections = config.grpc_connections.max_connections,
            "the open-file limit caps connections below http.max_connections + grpc.max_connections: over the \
             budget, connections are refused (reason descriptor_budget)"
        );
    }
    Ok(Listeners { grpc, http, bound, budget })
}

/// What the first stages built, as the later ones read it.
#[derive(Clone, Copy)]
struct Started<'a> {
    config: &'a Config,
    core: &'a Core,
    ids: &'a Identities,
    nodes: &'a Nodes,
    telemetry: &'a Arc<Telemetry>,
}

/// The accepted-event feed and its OTLP logs exporter.
struct LogExport {
    feed: Arc<crate::feed::Feed>,
    /// The exporter's task, when `[logs]` is configured.
    task: Option<tokio::task::JoinHandle<()>>,
    /// Asks the exporter to send what it holds and stop.
    stop: CancellationToken,
}

/// Startup 6. Creates the accepted-event feed and, with `[logs]`, starts the OTLP logs exporter on it: subscribed
/// before the committer starts, so nothing accepted is missed.
fn spawn_log_export(started: &Started<'_>) -> Result<LogExport, AppError> {
    let Started { config, telemetry, .. } = *started;
    let feed = crate::feed::Feed::new();
    let stop = CancellationToken::new();
    let task = match config.logs.clone() {
        Some(settings) => {
            let (task, stats) = crate::export::logs::spawn(&feed, settings, stop.clone())
                .map_err(|e| AppError::Runtime(format!("cannot start the OTLP logs exporter: {e}")))?;
            telemetry.observe_log_export(stats);
            Some(task)
        }
        None => None,
    };
    Ok(LogExport { feed, task, stop })
}

/// The applier as the edges and the alert loop reach it.
struct Applier {
    /// The committer thread: it ends once every sender of its channel is gone.
    committer: std::thread::JoinHandle<()>,
    /// The stream out: written by the committer, read by `StreamService` subscribers.
    stream: Arc<crate::stream::Stream>,
    /// Requests to the committer (the index's one writer): passed deadlines, new SLO definitions.
    deadlines: Arc<crate::index::deadlines::DeadlineRequests>,
}

/// Startup 7. Creates the stream out and starts the committer thread (group commit and acks, with the
/// maintenance and stream flush threads it starts) on a bounded channel of `ingest.queue_capacity` batches, whose
/// one sender is returned for the ingest edge (the committer ends once it is dropped).
fn spawn_applier(
    started: &Started<'_>,
    feed: &Arc<crate::feed::Feed>,
) -> Result<(Applier, tokio::sync::mpsc::Sender<applier::CommitRequest>), AppError> {
    let Started { config, core, telemetry, .. } = *started;
    let stream = crate::stream::Stream::new(config.stream);
    telemetry.observe_stream(stream.clone());
    let seal_stats = Arc::new(crate::store::history::SealStats::default());
    telemetry.observe_history(seal_stats.clone());
    // The alert loop's deadline timer asks the committer (the index's one writer) to apply passed deadlines.
    let deadlines = Arc::new(crate::index::deadlines::DeadlineRequests::default());
    let (tx, rx) = tokio::sync::mpsc::channel(config.queue_capacity);
    let committer = applier::spawn(
        core.store.clone(),
        core.index.clone(),
        rx,
        CommitterSettings {
            group_max_events: config.group_commit_max_events,
            checkpoint_interval: config.checkpoint_interval,
            clock: core.clock,
            wake: core.wake.clone(),
            telemetry: Some(telemetry.clone()),
            retention: config.retention,
            retention_interval: config.retention_interval,
            max_events_per_job: config.max_events_per_job,
            fold_after: config.fold_after,
            fold_interval: config.fold_interval,
            feed: feed.clone(),
            stream: config.stream.enabled.then(|| stream.clone()),
            deadlines: deadlines.clone(),
            history: config.history,
            seal_stats,
        },
        core.stats.clone(),
        core.health.clone(),
    )
    .map_err(|e| AppError::Runtime(format!("cannot start committer: {e}")))?;
    Ok((Applier { committer, stream, deadlines }, tx))
}

/// The gRPC server and what its shutdown needs.
struct Grpc {
    /// The server's task.
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    /// gRPC health: NOT_SERVING once the shutdown begins.
    health: tonic_health::server::HealthReporter,
    /// Every running `Publish` and `Subscribe` call.
    streams: TaskTracker,
    /// Closes every gRPC connection still open at the end of the drain.
    close_connections: CancellationToken,
    /// The ingest edge's hold on the committer's channel, closed after the drain.
    intake: crate::ingest::service::Intake,
}

/// Startup 8. Builds the ingest edge on the committer's channel and the gRPC services (health, reflection, and,
/// each behind the guard, ingest, node health and the stream out), then serves them on the gRPC listener:
/// connection caps, handshake deadline, keepalives, TLS. Also returns the HTTP JSON ingest edge
/// (`POST /api/v1/events`): the same service, checks, committer and intake.
async fn serve_grpc(
    started: &Started<'_>,
    applier: &Applier,
    commits: tokio::sync::mpsc::Sender<applier::CommitRequest>,
    listener: TcpListener,
    budget: &Arc<crate::conn_limit::DescriptorBudget>,
    shutdown: &CancellationToken,
) -> Result<(Grpc, crate::ingest::http::HttpIngest), AppError> {
    let Started { config, core, ids, nodes, .. } = *started;
    let clock = core.clock;
    let auth = &ids.auth;
    let streams = TaskTracker::new();
    let ingest = Ingest::new(
        commits,
        EdgeSettings {
            max_batch_events: config.max_batch_events,
            max_inflight_batches: config.max_inflight_batches,
            when_full: config.when_full,
            limits: config.limits.clone(),
            max_message_bytes: config.max_message_bytes,
            auth: auth.clone(),
            halt: core.store.write_halt(),
        },
        core.stats.clone(),
        shutdown.clone(),
        streams.clone(),
    );
    let intake = ingest.intake();

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<IngestServer>().await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(startline_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| AppError::Reflection(e.to_string()))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(startline_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| AppError::Reflection(e.to_string()))?;
    // Message size and batch cap are enforced before decoding (see ingest::codec).
    // The HTTP JSON edge shares the service (same checks, same committer, same intake).
    let http_ingest = crate::ingest::http::HttpIngest {
        ingest: ingest.clone(),
        auth: auth.clone(),
        max_body_bytes: config.max_message_bytes,
    };
    let ingest_server = Guarded::new(IngestServer::new(ingest), auth.clone(), Some(Scope::Ingest));
    // Health reports and subscriptions are counted before decoding too (readings, filter values).
    let node_health_server = Guarded::new(
        crate::ingest::node_health::NodeHealthServer::new(
            crate::ingest::node_health::NodeHealthIngest {
                writer: nodes.writer.clone(),
                clock,
                max_future_skew_ms: config.limits.max_future_skew_ms,
                auth: auth.clone(),
            },
            config.max_message_bytes,
        ),
        auth.clone(),
        Some(Scope::Ingest),
    );
    let stream_server = Guarded::new(
        crate::ingest::subscribe::SubscribeServer::new(
            crate::export::stream::StreamService {
                store: core.store.clone(),
                stream: applier.stream.clone(),
                shutdown: shutdown.clone(),
                clock,
            },
            config.max_message_bytes,
        ),
        auth.clone(),
        Some(Scope::Read),
    );
    let reflection_v1 = Guarded::new(reflection_v1, auth.clone(), None);
    let reflection_v1alpha = Guarded::new(reflection_v1alpha, auth.clone(), None);

    // Connections: at most grpc.max_connections, each with a handshake deadline; HTTP/2 keepalive pings find
    // silent and half-open peers; `close_connections` closes every one at the end of the shutdown drain.
    let conns = config.grpc_connections;
    let close_connections = CancellationToken::new();
    let incoming = conn::accept(
        // Small acks must not wait for Nagle: set TCP_NODELAY on every accepted socket. TCP keepalive finds dead
        // peers even when HTTP/2 pings cannot be sent.
        tonic::transport::server::TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(Duration::from_secs(60)))
            .with_keepalive_interval(Some(Duration::from_secs(10)))
            .with_keepalive_retries(Some(3)),
        ConnectionLimits {
            max_connections: conns.max_connections,
            max_connections_per_ip: conns.max_connections_per_ip,
            handshake_timeout: conns.handshake_timeout,
        },
        budget.clone(),
        close_connections.clone(),
        core.stats.clone(),
        ids.tls.clone(),
    );
    let stop = shutdown.clone();
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            .max_concurrent_streams(config.max_concurrent_streams)
            .http2_keepalive_interval(Some(conns.keepalive_interval))
            .http2_keepalive_timeout(Some(conns.keepalive_timeout))
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(ingest_server)
            .add_service(node_health_server)
            .add_service(stream_server)
            .serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await }),
    );
    Ok((Grpc { task, health, streams, close_connections, intake }, http_ingest))
}

/// The reload task and what the HTTP API and the alert loop take from it.
struct Reloads {
    /// Runs a reload (the admin route's), when the collector was started from a config file.
    reload: Option<api::Reload>,
    /// The `[alerts]` section each reload sends to the alert loop.
    alert_settings: tokio::sync::watch::Receiver<crate::alert::AlertConfig>,
    /// The task that reloads on SIGHUP and on changed files.
    task: tokio::task::JoinHandle<()>,
}

/// Startup 9. Starts the reload task ([`Reloader`]: `[auth]`, `[tls]`, `[[slo]]`, `[alerts]`): on SIGHUP, a
/// changed config, certificate or key file, or the admin route.
fn spawn_reloader(started: &Started<'_>, applier: &Applier, shutdown: &CancellationToken) -> Reloads {
    let Started { config, core, ids, .. } = *started;
    let (alert_settings, alert_settings_rx) = tokio::sync::watch::channel(config.alerts.clone());
    let reload: Option<api::Reload> = config.source.clone().map(|path| {
        let r = Reloader {
            path,
            running: std::sync::Mutex::new(config.clone()),
            auth: ids.auth.clone(),
            tls: ids.tls.clone(),
            exposed: ids.exposed,
            applier: applier.deadlines.clone(),
            alerts: alert_settings,
            wake: core.wake.clone(),
            clock: core.clock,
        };
        Arc::new(move || r.reload()) as api::Reload
    });
    let task = tokio::spawn(watch_reloads(reload.clone(), config.source.clone(), ids.tls.clone(), shutdown.clone()));
    Reloads { reload, alert_settings: alert_settings_rx, task }
}

/// The HTTP server.
struct Http {
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Stops it (the last step of the shutdown).
    stop: CancellationToken,
}

/// Startup 10. Serves the HTTP API, the dashboard, `/metrics` and `POST /api/v1/events` on the HTTP listener:
/// connection caps (in the descriptor budget shared with gRPC), header-read, body-read, request and idle
/// timeouts, TLS.
fn serve_http(
    started: &Started<'_>,
    reload: Option<api::Reload>,
    http_ingest: crate::ingest::http::HttpIngest,
    listener: TcpListener,
    budget: Arc<crate::conn_limit::DescriptorBudget>,
) -> Http {
    let Started { config, core, ids, nodes, telemetry } = *started;
    let stop = CancellationToken::new();
    let api_state = ApiState {
        index: core.index.clone(),
        store: core.store.clone(),
        ready: core.ready.clone(),
        health: core.health.clone(),
        max_page_size: config.max_page_size,
        reads: crate::api::reads::ReadGate::new(config.max_concurrent_reads),
        backups: Default::default(),
        clock: core.clock,
        board: core.board.clone(),
        telemetry: Some(telemetry.clone()),
        auth: ids.auth.clone(),
        sessions: Arc::new(crate::api::auth::Sessions::new(config.login.clone())),
        reload,
        cost: Arc::new(config.cost.clone()),
        final_stages: Arc::new(config.final_stages.clone()),
        nodes: config.nodes,
        node_health: nodes.book.clone(),
        chain_slos: Arc::new(config.chain_slos.clone()),
    };
    let stop_wait = stop.clone();
    // Connection caps, header-read, body-read, request and idle timeouts; at shutdown, connections still open
    // after the drain deadline are closed.
    let h = config.http_connections;
    let limits = api::serve::Limits {
        timeouts: api::serve::Timeouts {
            header_read: h.header_read_timeout,
            body_read: h.body_read_timeout,
            request: h.request_timeout,
            idle: h.idle_timeout,
            drain: api::serve::DRAIN_DEADLINE,
        },
        caps: crate::conn_limit::ConnLimiter::new(h.max_connections, h.max_connections_per_ip, budget),
        stats: core.http_stats.clone(),
    };
    // The API's routes read; `POST /api/v1/events` is the ingest edge's, behind the same cross-origin check.
    let router = api::router(api_state.clone()).merge(
        crate::ingest::http::router(http_ingest)
            .layer(axum::middleware::from_fn_with_state(api_state, api::auth::same_origin)),
    );
    let task = tokio::spawn(api::serve::serve(listener, router, limits, ids.tls.clone(), async move {
        stop_wait.cancelled().await
    }));
    Http { task, stop }
}

/// The alert loop and the notifier tasks.
struct Alerting {
    /// Stops the loop and the notifiers.
    stop: CancellationToken,
    /// The loop's and the notifiers' tasks.
    tasks: TaskTracker,
}

/// Startup 11. Starts the notifier tasks (Alertmanager, webhooks) and the alert loop (SLO pages, burn rates,
/// node and chain scans); stopped after the committer, so late commits still wake it.
fn spawn_alert_loop(
    started: &Started<'_>,
    applier: &Applier,
    settings: tokio::sync::watch::Receiver<crate::alert::AlertConfig>,
    bound: Bound,
) -> Alerting {
    let Started { config, core, ids, nodes, telemetry } = *started;
    let clock = core.clock;
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let base_url = listener_url(bound.http, ids.tls.is_some());
    let alert_stats = Arc::new(crate::alert::AlertStats::default());
    let notifiers = notify::spawn_all(&config.alerts, clock, &base_url, &tasks, &stop, &alert_stats);
    telemetry.observe_notifiers(alert_stats.clone());
    let alert_loop = AlertLoop {
        index: core.index.clone(),
        store: core.store.clone(),
        clock,
        config: config.alerts.clone(),
        board: core.board.clone(),
        wake: core.wake.clone(),
        notifiers,
        stats: alert_stats,
        base_url,
        reconfigure: Some(crate::alert::Reconfigure { settings, tasks: tasks.clone(), shutdown: stop.clone() }),
        deferred: Default::default(),
        stream: config.stream.enabled.then(|| applier.stream.clone()),
        deadlines: applier.deadlines.clone(),
        scans: crate::alert::ScanAlerts {
            nodes: config.nodes,
            node_health: nodes.book.clone(),
            node_board: nodes.board.clone(),
            chain_slos: Arc::new(config.chain_slos.clone()),
            final_stages: Arc::new(config.final_stages.clone()),
            chain_interval_ms: config.chain_interval_ms,
            chain_board: nodes.chain_board.clone(),
            prediction: config.prediction,
        },
    };
    tasks.spawn(alert_loop.run(stop.clone()));
    Alerting { stop, tasks }
}

/// The history uploader, when `[history.export]` is configured.
struct HistoryExport {
    task: Option<tokio::task::JoinHandle<()>>,
    /// Stops it.
    stop: CancellationToken,
}

/// Startup 12. With `[history.export]`, starts the uploader of sealed history files to object storage
/// (`export::history`): a task on the runtime that reads the files the seal pass renamed into place, never on
/// the ingest or commit path. A destination the client cannot be built for stops the start.
fn spawn_history_export(started: &Started<'_>) -> Result<HistoryExport, AppError> {
    let Started { config, core, telemetry, .. } = *started;
    let stop = CancellationToken::new();
    let task = match config.history_export.clone() {
        Some(settings) => {
            let stats = Arc::new(crate::export::history::ExportStats::default());
            telemetry.observe_history_export(stats.clone());
            let url = settings.url();
            let collector_id = settings.collector_id.clone();
            let task = crate::export::history::spawn(core.store.path(), settings, stats, stop.clone())
                .map_err(|e| AppError::Runtime(format!("cannot start the history export: {e}")))?;
            tracing::info!(%url, %collector_id, "history files are copied to object storage");
            Some(task)
        }
        None => None,
    };
    Ok(HistoryExport { task, stop })
}

/// Startup 13. Starts the halt watch (`applier::halt`): after a store write fails, writes halt; once the store is
/// writable again it calls `on_writable` (restart in place, or exit), unless a stop began first.
fn spawn_halt_watch(
    core: &Core,
    shutdown: &CancellationToken,
    bound: Bound,
    on_writable: OnWritable,
) -> Result<std::thread::JoinHandle<()>, AppError> {
    applier::halt::spawn(
        core.store.clone(),
        applier::halt::Watch::default(),
        shutdown.clone(),
        Box::new(move |cause| on_writable(bound, cause)),
    )
    .map_err(|e| AppError::Runtime(format!("cannot start the store's halt watch: {e}")))
}

/// Startup 14. Reports readiness: `/readyz` answers 200, the ready line is logged, and `on_ready` is called
/// (`main` sends systemd's `READY=1`).
fn report_ready(core: &Core, bound: Bound, on_ready: impl FnOnce(Bound)) {
    core.ready.store(true, Ordering::Relaxed);
    tracing::info!(grpc = %bound.grpc, http = %bound.http, "collector ready");
    on_ready(bound);
}

/// Everything the shutdown stops, in its order.
struct Running {
    core: Core,
    /// `grpc.drain_timeout`.
    drain_timeout: Duration,
    grpc: Grpc,
    committer: std::thread::JoinHandle<()>,
    logs: LogExport,
    history_export: HistoryExport,
    alerting: Alerting,
    telemetry: Arc<Telemetry>,
    http: Http,
    reloader: tokio::task::JoinHandle<()>,
}

/// Runs the shutdown order of docs/ARCHITECTURE.md once the shutdown token is cancelled: each step a call.
async fn shutdown_in_order(running: Running) {
    let Running { core, drain_timeout, mut grpc, committer, logs, history_export, alerting, telemetry, http, reloader } =
        running;
    stop_accepting(&core, &grpc).await;
    drain_grpc(&mut grpc, drain_timeout).await;
    stop_applier(committer, &core.store).await;
    stop_log_export(logs).await;
    stop_history_export(history_export).await;
    stop_alerting(alerting, &telemetry).await;
    stop_http(http, reloader).await;
    tracing::info!("collector stopped");
}

/// Shutdown 1. Readiness goes false and gRPC health reports NOT_SERVING (the gRPC server itself stops accepting,
/// with GOAWAY on each connection, as the shutdown token it serves under is cancelled).
async fn stop_accepting(core: &Core, grpc: &Grpc) {
    tracing::info!("shutting down: no new streams or batches");
    core.ready.store(false, Ordering::Relaxed);
    grpc.health.set_not_serving::<IngestServer>().await;
}

/// Shutdown 2. Open streams stop reading and acknowledge what they read; at `grpc.drain_timeout` every gRPC
/// connection still open is closed, whatever it is doing (a silent or half-open peer, a handshake never finished,
/// a client that does not read its acks). Then ingest's intake drops the committer's sender.
async fn drain_grpc(grpc: &mut Grpc, drain_timeout: Duration) {
    grpc.streams.close();
    let deadline = tokio::time::Instant::now() + drain_timeout;
    let mut served = tokio::time::timeout_at(deadline, &mut grpc.task).await;
    let mut streams_done = served.is_ok() && tokio::time::timeout_at(deadline, grpc.streams.wait()).await.is_ok();
    if !streams_done {
        tracing::warn!(
            ?drain_timeout,
            "grpc drain deadline passed: closing every grpc connection; clients redeliver what was not acknowledged"
        );
        grpc.close_connections.cancel();
        let grace = tokio::time::Instant::now() + FORCED_CLOSE_GRACE;
        if served.is_err() {
            served = tokio::time::timeout_at(grace, &mut grpc.task).await;
        }
        streams_done = tokio::time::timeout_at(grace, grpc.streams.wait()).await.is_ok();
    }
    match served {
        Ok(Ok(Ok(()))) => tracing::info!("grpc stopped"),
        Ok(Ok(Err(e))) => tracing::error!(error = %e, "grpc server error"),
        Ok(Err(e)) => tracing::error!(error = %e, "grpc task failed"),
        Err(_) => {
            grpc.task.abort();
            tracing::error!("grpc server still running after its connections were closed; aborted");
        }
    }
    if !streams_done {
        tracing::warn!("grpc streams still open after their connections were closed");
    }
    // Whatever became of connections and streams, the committer's channel now keeps no sender but those of sends
    // already under way, which complete as the committer drains.
    grpc.intake.close();
}

/// Shutdown 3. Waits for the committer: once every sender is gone it drains its channel, joins the maintenance
/// and stream flush threads, writes the last checkpoint, flushes and writes the shutdown image.
async fn stop_applier(committer: std::thread::JoinHandle<()>, store: &Store) {
    let joined = tokio::task::spawn_blocking(move || committer.join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        tracing::error!("committer thread panicked");
    }
    tracing::info!(size_on_disk = store.size_on_disk().unwrap_or(0), "store flushed");
}

/// Shutdown 3, end. The committer has published its last group: the OTLP logs exporter sends what it holds, then
/// stops, within 5 s.
async fn stop_log_export(logs: LogExport) {
    if let Some(task) = logs.task {
        logs.stop.cancel();
        if tokio::time::timeout(Duration::from_secs(5), task).await.is_err() {
            tracing::warn!("OTLP logs exporter did not finish in time; its last records are not sent");
        }
    }
}

/// Shutdown 3, end. The history uploader stops within 5 s: an upload under way is dropped (an object is written
/// whole or not at all) and, not recorded as done, is made again by the next start.
async fn stop_history_export(export: HistoryExport) {
    if let Some(task) = export.task {
        export.stop.cancel();
        if tokio::time::timeout(Duration::from_secs(5), task).await.is_err() {
            tracing::warn!("history export did not stop in time");
        }
    }
}

/// Shutdown 4. Stops the alert loop and the notifiers (their state is already stored), then shuts the metrics
/// provider down (a last OTLP export, if configured).
async fn stop_alerting(alerting: Alerting, telemetry: &Telemetry) {
    alerting.stop.cancel();
    alerting.tasks.close();
    if tokio::time::timeout(Duration::from_secs(5), alerting.tasks.wait()).await.is_err() {
        tracing::warn!("alert tasks did not stop in time");
    }
    telemetry.shutdown();
}

/// Shutdown 5. HTTP stops last, so health and the API answer until the store is closed: no new connections,
/// in-flight requests finish, and connections still open after the drain deadline are closed. The reload task
/// ends with it.
async fn stop_http(http: Http, reloader: tokio::task::JoinHandle<()>) {
    http.stop.cancel();
    match http.task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "http server error"),
        Err(e) => tracing::error!(error = %e, "http task failed"),
    }
    reloader.abort();
}

/// Applies a changed config file to the running collector. Reloadable: `[auth]`, `[tls]` (certificates and keys),
/// `[[slo]]` and `[alerts]`. Other sections need a restart: a reload that changes them names them and leaves them as
/// they are. The whole file is validated first (notifier files read); if anything is wrong nothing changes.
pub struct Reloader {
    /// The config file.
    pub path: std::path::PathBuf,
    /// The configuration in force (reloadable sections updated by each reload).
    pub running: std::sync::Mutex<Config>,
    /// Identities.
    pub auth: Arc<crate::auth::Auth>,
    /// TLS of both listeners, when on.
    pub tls: Option<Arc<TlsState>>,
    /// Whether a listener is reachable beyond loopback.
    pub exposed: bool,
    /// Requests to the applier (the index's one writer), which installs new `[[slo]]` definitions.
    pub applier: Arc<crate::index::deadlines::DeadlineRequests>,
    /// The alert loop's settings.
    pub alerts: tokio::sync::watch::Sender<crate::alert::AlertConfig>,
    /// Wakes the alert loop after an SLO change.
    pub wake: Arc<Notify>,
    /// The clock.
    pub clock: Clock,
}

/// The HTTP listener as a URL for links in alerts: the host's name in place of an unspecified address (0.0.0.0
/// or ::), which no one can open; `alerts.external_url` overrides it.
fn listener_url(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "localhost".to_string());
        format!("{scheme}://{host}:{}", addr.port())
    } else {
        format!("{scheme}://{addr}")
    }
}

/// Sections a running collector cannot take without a restart.
const RESTART_SECTIONS: [&str; 10] =
    ["store", "history", "grpc", "http", "ingest", "metrics", "logs", "cost", "chains", "nodes"];

/// Longest a reload waits for the applier to install new SLO definitions (they assess every job: seconds at
/// millions of jobs).
const SLO_SWAP_TIMEOUT: Duration = Duration::from_secs(300);

impl Reloader {
    /// Re-reads the file and applies what it can; the answer lists what changed and what needs a restart.
    pub fn reload(&self) -> Result<api::types::Reloaded, String> {
        let refused = |errs: Vec<String>| format!("reload refused, nothing changed:\n  - {}", errs.join("\n  - "));
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut file = crate::config::FileConfig::load(&self.path).map_err(|e| refused(vec![e.to_string()]))?;
        running.overrides.apply(&mut file);
        let new = file.validate().map_err(|e| refused(e.0))?;
        let mut errs = Vec::new();
        if self.exposed && !new.auth.enabled() && !new.auth.insecure {
            errs.push("auth: no [[auth.identity]] is left while a listener is reachable beyond loopback".into());
        }
        if self.tls.is_some() != new.tls.is_some() {
            errs.push("tls: turning [tls] on or off needs a restart".into());
        }
        // The running store keeps its retention until a restart: it must still cover every new SLO window.
        if let Some(r) = running.retention {
            for d in &new.slos {
                if (r.as_millis() as i64) < d.window_ms {
                    errs.push(format!("slo {:?}: its window is longer than the running store.retention", d.name));
                }
            }
        }
        if !errs.is_empty() {
            return Err(refused(errs));
        }
        if let (Some(state), Some(files)) = (&self.tls, &new.tls) {
            state.reload(files.clone()).map_err(|e| refused(vec![e.to_string()]))?;
        }
        let changed = crate::config::changed_sections(&running.effective(), &new.effective());
        let restart_needed: Vec<String> =
            changed.iter().filter(|s| RESTART_SECTIONS.contains(s)).map(|s| s.to_string()).collect();
        self.auth.reload(new.auth.keyring(), self.exposed && !new.auth.enabled(), new.auth.metrics_protected);
        let slos_changed = changed.contains(&"slo");
        if slos_changed {
            // The applier installs them between two group commits (it is the index's one writer); waiting here
            // keeps the answer true: when it says the SLOs changed, every job was assessed again.
            let done = self.applier.request_slos(new.slos.clone());
            match done.recv_timeout(SLO_SWAP_TIMEOUT) {
                Ok(took) => tracing::info!(
                    slos = new.slos.len(),
                    elapsed_ms = took.as_millis() as u64,
                    "SLOs replaced by the applier; every job assessed again"
                ),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tracing::warn!(
                    waited_s = SLO_SWAP_TIMEOUT.as_secs(),
                    "the applier has not installed the new SLOs yet; they stay queued and take effect when it does"
                ),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => tracing::warn!(
                    "the new SLOs were not installed: the collector is stopping, or a newer reload replaced them"
                ),
            }
            self.wake.notify_one();
        }
        // Always sent: notifier credential files were re-read even when the section's text is unchanged.
        self.alerts.send_replace(new.alerts.clone());
        if !restart_needed.is_empty() {
            tracing::warn!(sections = ?restart_needed, "changed sections need a restart to take effect; kept as they were");
        }
        running.slos = new.slos.clone();
        running.alerts = new.alerts.clone();
        running.auth = new.auth.clone();
        running.tls = new.tls.clone();
        running.written.slo = new.written.slo.clone();
        running.written.alerts = new.written.alerts.clone();
        running.written.auth = new.written.auth.clone();
        running.written.tls = new.written.tls.clone();
        let identities = new.auth.identities.len();
        tracing::info!(identities, tls = self.tls.is_some(), changed = ?changed, "configuration reloaded");
        Ok(api::types::Reloaded {
            identities,
            tls: self.tls.is_some(),
            slos: new.slos.iter().map(|d| d.name.clone()).collect(),
            notifiers: new.alerts.alertmanagers.len() + new.alerts.webhooks.len(),
            changed: changed.iter().map(|s| s.to_string()).collect(),
            restart_needed,
        })
    }
}

/// How often the config, certificate and key files are checked for changes.
const RELOAD_POLL: Duration = Duration::from_secs(2);

/// Runs `reload` on SIGHUP and when the config file or a TLS file changes.
async fn watch_reloads(
    reload: Option<api::Reload>,
    source: Option<std::path::PathBuf>,
    tls: Option<Arc<TlsState>>,
    shutdown: CancellationToken,
) {
    let Some(reload) = reload else { return };
    let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen = source.as_deref().and_then(mtime);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let hup_recv = async {
            match hup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hup_recv = std::future::pending::<Option<()>>();
        let why = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = hup_recv => "SIGHUP",
            _ = tokio::time::sleep(RELOAD_POLL) => {
                let now = source.as_deref().and_then(mtime);
                if now != seen {
                    "config file changed"
                } else if tls.as_ref().is_some_and(|t| t.files_changed()) {
                    "tls file changed"
                } else {
                    continue;
                }
            }
        };
        seen = source.as_deref().and_then(mtime);
        let r = reload.clone();
        match tokio::task::spawn_blocking(move || r()).await {
            Ok(Ok(_)) => tracing::info!(trigger = why, "reload done"),
            Ok(Err(e)) => {
                tracing::error!(trigger = why, error = %e, "reload failed; the configuration in force stays")
            }
            Err(e) => tracing::error!(error = %e, "reload task failed"),
        }
    }
}

/// Restores the store with its folded jobs decoded into rows: the dictionary first, then every summary.
pub fn restore_index(store: &Store) -> Result<(Restored, ColdJobs), StoreError> {
    let dictionary = || {
        Dictionary::load_with_next(store.load_dictionary()?, store.dictionary_next()?)
            .map_err(|reason| StoreError::Corrupt { what: "dictionary", key: String::new(), reason })
    };
    let mut cold = ColdJobs::with_dictionary(dictionary()?);
    // After a clean stop the rows come from the shutdown image, and no summary is read; if the image or what it
    // needs from the store cannot be used, everything is read as after a crash.
    let imaged = store.take_shutdown_image(|r| ColdJobs::read_image(r)).and_then(|image| {
        let rows = image.rows();
        let result = cold
            .load_image(image)
            .and_then(|stale| store.restore_known(&|id| cold.rows.contains_key(id), &stale).map_err(|e| e.to_string()));
        match result {
            Ok(mut restored) => {
                tracing::info!(folded = rows, "folded jobs restored from the shutdown image");
                restored.folded = rows;
                Some(restored)
            }
            Err(reason) => {
                tracing::warn!(%reason, "shutdown image unusable; the summaries are read instead");
                None
            }
        }
    });
    let (restored, mut superseded) = match imaged {
        Some(restored) => (restored, Vec::new()),
        None => {
            if cold.bytes() > 0 {
                // An image was loaded, then could not be used.
                cold = ColdJobs::with_dictionary(dictionary()?);
            }
            // The store lists summaries in fold order: the rows are packed as they are read, collected, then
            // sorted by job id and loaded in one pass (full B-tree nodes; while the map is built, the collected
            // rows are held too: a transient peak of one 72-byte entry per folded job).
            let mut rows = Vec::new();
            let restored = store.restore_with(|job_id, summary, body| {
                let row = Folded::decode(body)?.with_summary(summary);
                if cold.dict.get(row.attrs).is_none() {
                    return Err(format!("attribute set {} is not in the dictionary", row.attrs));
                }
                rows.push((Box::<str>::from(job_id), cold.pack(&row)));
                Ok(())
            })?;
            // Summaries no job needs: older ones of a job with two, and the stale ones of a job that restored
            // folded.
            let superseded = cold.load(rows);
            (restored, superseded)
        }
    };
    // A job with two summaries whose newer one was refused is rebuilt hot from that one's events (every event):
    // an older summary read for it must not bring it back folded as well.
    for job_id in restored.stale_summaries.keys() {
        if restored.jobs.contains_key(job_id) {
            if let Some(row) = cold.remove(job_id) {
                superseded.push((job_id.clone(), row.summary()));
            }
        }
    }
    // Dictionary entries no folded job names (freed before a crash, or named only by stale summaries, whose jobs
    // restore rebuilds from their events when they are needed).
    if cold.dict.free_unreferenced() > 0 {
        let freed = cold.dict.take_freed();
        tracing::info!(entries = freed.len(), "deleting dictionary entries no folded job names");
        store.delete_dictionary(&freed)?;
    }
    for (job_id, numbers) in &restored.stale_summaries {
        if !restored.jobs.contains_key(job_id) {
            let current = cold.rows.get(job_id.as_str()).map(|r| r.summary());
            superseded.extend(numbers.iter().filter(|n| Some(**n) != current).map(|n| (job_id.clone(), *n)));
        }
    }
    if !superseded.is_empty() {
        tracing::warn!(summaries = superseded.len(), "deleting superseded summaries (left by failed folds)");
        store.delete_summaries(&superseded)?;
    }
    Ok((restored, cold))
}
