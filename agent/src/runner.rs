//! The one runner every agent mode uses: it opens the durable spool, makes the mode's metrics (watching the
//! spool), serves them on `--metrics-listen`, starts delivery to the collectors, runs the mode's own tasks
//! (an adapter's poll loop, the node agent's HTTP servers, the simulator) and stops all of them on one
//! [`CancellationToken`] when SIGTERM or Ctrl-C arrives: the mode's tasks first, then the metrics server, then
//! delivery, so every event a task spooled before it stopped stays on disk for the next start.
//!
//! ```no_run
//! # async fn f(publishers: Vec<(String, startline_agent::uplink::Publisher)>) -> Result<(), startline_agent::runner::RunnerError> {
//! use startline_agent::runner::Runner;
//! let mut r = Runner::open("sagemaker", "./spool".as_ref(), Default::default()).await?;
//! r.serve_metrics(Some("127.0.0.1:9464")).await?;
//! r.deliver(publishers, None);
//! let stop = r.stop_token();
//! r.spawn("poller", async move { stop.cancelled().await });
//! println!("ready{}", r.ready_note());
//! r.run_until(startline_agent::runner::shutdown_signal()).await;
//! # Ok(()) }
//! ```

use crate::metrics::Metrics;
use crate::spool::{Spool, SpoolLimits};
use crate::uplink::{Publisher, UplinkError};
use std::future::Future;
use std::path::{Path, PathBuf};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why a mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The spool cannot be opened.
    #[error("cannot open spool {path}: {reason}")]
    Spool {
        /// The spool directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The metrics registry cannot be built.
    #[error("metrics: {0}")]
    Metrics(String),
    /// `--metrics-listen` cannot be bound.
    #[error("cannot listen on --metrics-listen {addr}: {source}")]
    MetricsListen {
        /// The address given.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// A running mode: its spool (if it has one), metrics, stop token and tasks.
pub struct Runner {
    spool: Option<Spool>,
    spool_path: Option<PathBuf>,
    metrics: Metrics,
    stop: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    metrics_server: Option<(std::net::SocketAddr, JoinHandle<std::io::Result<()>>)>,
    delivery: Option<JoinHandle<Result<(), UplinkError>>>,
}

impl Runner {
    /// A runner for `mode` (the metrics' `mode` label) over the spool at `path`, opened off the async threads.
    pub async fn open(mode: &'static str, path: &Path, limits: SpoolLimits) -> Result<Runner, RunnerError> {
        let owned = path.to_path_buf();
        let spool = tokio::task::spawn_blocking(move || Spool::open(&owned, limits))
            .await
            .map_err(|e| RunnerError::Spool { path: path.to_path_buf(), reason: e.to_string() })?
            .map_err(|e| RunnerError::Spool { path: path.to_path_buf(), reason: e.to_string() })?;
        let mut r = Runner::without_spool(mode)?;
        r.metrics.watch_spool(spool.clone());
        r.spool = Some(spool);
        r.spool_path = Some(path.to_path_buf());
        Ok(r)
    }

    /// A runner without a spool (the simulator publishes straight through its uplink).
    pub fn without_spool(mode: &'static str) -> Result<Runner, RunnerError> {
        Ok(Runner {
            spool: None,
            spool_path: None,
            metrics: Metrics::new(mode).map_err(|e| RunnerError::Metrics(e.to_string()))?,
            stop: CancellationToken::new(),
            tasks: Vec::new(),
            metrics_server: None,
            delivery: None,
        })
    }

    /// The spool (None for a runner made [`Runner::without_spool`]).
    pub fn spool(&self) -> Option<&Spool> {
        self.spool.as_ref()
    }

    /// The mode's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The token every task of the mode stops on.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Serves the metrics (Prometheus text) at `http://ADDR/metrics` when an address is given.
    pub async fn serve_metrics(&mut self, listen: Option<&str>) -> Result<(), RunnerError> {
        let Some(addr) = listen else { return Ok(()) };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RunnerError::MetricsListen { addr: addr.to_string(), source })?;
        let bound =
            listener.local_addr().map_err(|source| RunnerError::MetricsListen { addr: addr.to_string(), source })?;
        if !bound.ip().is_loopback() {
            tracing::info!(%bound, "metrics served beyond loopback (--metrics-listen)");
        }
        let app = crate::metrics::router(self.metrics.clone());
        let stop = self.stop.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await }).await
        });
        self.metrics_server = Some((bound, task));
        Ok(())
    }

    /// Starts delivering the spool to each collector in `publishers` (named by endpoint: the spool's cursor
    /// keys), each publisher reporting into the mode's metrics. Without a spool there is nothing to deliver.
    pub fn deliver(&mut self, publishers: Vec<(String, Publisher)>, give_up: Option<std::time::Duration>) {
        let Some(spool) = &self.spool else { return };
        let publishers = publishers
            .into_iter()
            .map(|(name, mut p)| {
                p.set_metrics(self.metrics.clone());
                (name, p)
            })
            .collect();
        self.delivery = Some(tokio::spawn(crate::uplink::delivery::deliver(
            spool.clone(),
            publishers,
            1000,
            self.stop.clone(),
            give_up,
        )));
    }

    /// Runs one of the mode's tasks; it must end when [`Runner::stop_token`] is cancelled.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push((name, tokio::spawn(task)));
    }

    /// What the mode's ready line adds: ` spool=<dir> held=<events>` and ` metrics=<bound address>`.
    pub fn ready_note(&self) -> String {
        let mut note = String::new();
        if let (Some(path), Some(spool)) = (&self.spool_path, &self.spool) {
            note.push_str(&format!(" spool={} held={}", path.display(), spool.len()));
        }
        if let Some((bound, _)) = &self.metrics_server {
            note.push_str(&format!(" metrics={bound}"));
        }
        note
    }

    /// Waits for `signal` (or for every task of the mode to end on its own), then stops everything.
    pub async fn run_until(self, signal: impl Future<Output = ()>) {
        let stop = self.stop.clone();
        tokio::select! {
            _ = signal => {}
            _ = stop.cancelled() => {}
        }
        self.shutdown().await;
    }

    /// Stops the mode: cancels the token, waits for its tasks, the metrics server and delivery, in that order.
    pub async fn shutdown(self) {
        if let Some(spool) = &self.spool {
            tracing::info!(held = spool.len(), "stopping; spooled events stay on disk for the next start");
        }
        self.stop.cancel();
        for (name, task) in self.tasks {
            if let Err(e) = task.await {
                tracing::warn!(task = name, error = %e, "task failed");
            }
        }
        if let Some((_, server)) = self.metrics_server {
            let _ = server.await;
        }
        if let Some(d) = self.delivery {
            match d.await {
                Ok(Err(e)) => tracing::warn!(error = %e, "delivery stopped"),
                Err(e) => tracing::warn!(error = %e, "delivery task failed"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A mode's task that spooled events before stop: the runner stops it on the token, its events stay in the
    /// reopened spool, and the metrics server (bound to port 0) answered while it ran and is closed after.
    #[tokio::test]
    async fn stop_ends_every_task_and_what_was_spooled_stays() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = Runner::open("test", dir.path(), SpoolLimits::default()).await.expect("open");
        r.serve_metrics(Some("127.0.0.1:0")).await.expect("metrics");
        let note = r.ready_note();
        let addr = note.split(" metrics=").nth(1).expect("bound address").to_string();
        assert!(note.contains(" held=0"), "{note}");
        let spool = r.spool().expect("spool").clone();
        let stop = r.stop_token();
        let (spooled_tx, spooled_rx) = tokio::sync::oneshot::channel();
        r.spawn("writer", async move {
            let ev = startline_proto::pb::LifecycleEvent {
                event_id: "e1".into(),
                job_id: "j".into(),
                source: "t".into(),
                ..Default::default()
            };
            spool.append(&[ev]).expect("append");
            let _ = spooled_tx.send(());
            stop.cancelled().await;
        });
        spooled_rx.await.expect("spooled");
        let body = reqwest::get(format!("http://{addr}/metrics")).await.expect("scrape").text().await.expect("body");
        assert!(body.contains("startline_agent_spool_events 1"), "{body}");
        r.run_until(async {}).await;
        assert!(reqwest::get(format!("http://{addr}/metrics")).await.is_err(), "the metrics server is closed");
        let reopened = Spool::open(dir.path(), SpoolLimits::default()).expect("reopen");
        assert_eq!(reopened.len(), 1, "the spooled event is kept");
    }

    /// The agent's modules form no import cycle: the crate paths each top-level module's code (tests and doc
    /// comments left out) names, followed transitively, never lead back to it.
    #[test]
    fn the_agents_modules_import_each_other_without_a_cycle() {
        use std::collections::{BTreeMap, BTreeSet};
        fn walk(dir: &std::path::Path, root: &std::path::Path, graph: &mut BTreeMap<String, BTreeSet<String>>) {
            for entry in std::fs::read_dir(dir).expect("src").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, root, graph);
                    continue;
                }
                let rel = path.strip_prefix(root).expect("under src").to_string_lossy().into_owned();
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if !rel.ends_with(".rs") || rel == "lib.rs" || rel == "main.rs" || name.ends_with("tests.rs") {
                    continue;
                }
                let top = rel.split('/').next().unwrap_or("").trim_end_matches(".rs").to_string();
                let text = std::fs::read_to_string(&path).expect("read");
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                let deps = graph.entry(top.clone()).or_default();
                for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                    for (i, _) in line.match_indices("crate::") {
                        let m: String =
                            line[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                        if !m.is_empty() && m != top {
                            deps.insert(m);
                        }
                    }
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut graph = BTreeMap::new();
        walk(&root, &root, &mut graph);
        assert!(graph.len() > 10, "modules found: {:?}", graph.keys());
        assert!(graph["runner"].contains("uplink") && graph["uplink"].contains("spool"), "{graph:?}");
        for start in graph.keys() {
            let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
            let mut seen = BTreeSet::new();
            while let Some((m, path)) = stack.pop() {
                for d in graph.get(&m).into_iter().flatten() {
                    assert!(d != start, "import cycle: {} -> {d}", path.join(" -> "));
                    if seen.insert(d.clone()) {
                        let mut p = path.clone();
                        p.push(d.clone());
                        stack.push((d.clone(), p));
                    }
                }
            }
        }
    }
}
