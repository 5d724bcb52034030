//! Prometheus rules generated from the configured SLOs (`startline-collector rules`): the recording rules of
//! the dashboards, one multi-window burn-rate alert per SLO with **its own** window, objective and factors, named
//! and labelled exactly as the collector's own alert (`StartlineSLOBurnRate{slo, severity}` plus `alerts.labels`),
//! so running both pages once (Alertmanager deduplicates identical label sets), and the meta-alerts on Startline
//! itself. Per-job pages (`StartlineJobStartBreach`, with the job id) come only from the collector: no metric
//! carries a job id. `deploy/prometheus/startline-rules.yml` is this output for the default configuration.

use crate::alert::burn::RULES;
use crate::slo::SloDef;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The recording rules (SLO-independent): percentiles, waiting jobs, global SLO figures across collectors.
const RECORDING: &str = r#"  - name: startline-recording
    interval: 30s
    rules:
      # Time to first step percentiles over the last hour, by pool and priority (all collectors).
      - record: startline:ttfs_seconds:p50_1h
        expr: histogram_quantile(0.5, sum by (le, pool_kind, provider, pool, priority) (rate(startline_jobs_time_to_first_step_seconds_bucket[1h])))
      - record: startline:ttfs_seconds:p90_1h
        expr: histogram_quantile(0.9, sum by (le, pool_kind, provider, pool, priority) (rate(startline_jobs_time_to_first_step_seconds_bucket[1h])))
      - record: startline:ttfs_seconds:p99_1h
        expr: histogram_quantile(0.99, sum by (le, pool_kind, provider, pool, priority) (rate(startline_jobs_time_to_first_step_seconds_bucket[1h])))
      # Jobs waiting now by segment, GPUs waiting by pool, and the oldest wait per pool and priority.
      - record: startline:jobs_waiting:sum_by_segment
        expr: sum by (segment) (startline_jobs_waiting)
      - record: startline:jobs_waiting_gpus:sum
        expr: sum by (pool_kind, provider, pool, priority, gpu_class) (startline_jobs_waiting_gpus)
      - record: startline:oldest_wait_seconds:max
        expr: max by (pool_kind, provider, pool, priority) (startline_jobs_oldest_wait_seconds)
      # Global SLO figures across collectors.
      - record: startline:slo_compliance:global
        expr: |
          sum by (slo) (startline_slo_jobs{result="good"})
            / sum by (slo) (startline_slo_jobs{result=~"good|bad"})
      - record: startline:slo_burn_rate:global
        expr: |
          (
            sum by (slo, window) (startline_slo_window_jobs{result="bad"})
              / sum by (slo, window) (startline_slo_window_jobs)
          )
          / on (slo) group_left () (1 - max by (slo) (startline_slo_objective_ratio))
      - record: startline:slo_window_jobs:sum
        expr: sum by (slo, window) (startline_slo_window_jobs)

"#;

/// The meta-alerts on Startline itself.
const META: &str = r#"  # Alerts on Startline itself: without them "no breaches" cannot be told from "Startline is broken".
  - name: startline-meta
    rules:
      # Scrape jobs are named as the Prometheus Operator names them for the shipped monitors: the collector's
      # ServiceMonitor gives its targets job="startline-collector" (the Service's name); the PodMonitors give the
      # node agents and adapters their pod's app.kubernetes.io/name (jobLabel). deploy/prometheus/prometheus.yml
      # uses the same names.
      - alert: StartlineCollectorDown
        expr: up{job="startline-collector"} == 0
        for: 5m
        labels:
          severity: page
        annotations:
          summary: "Startline collector {{ $labels.instance }} is down: start SLOs are not measured and nothing pages"
      - alert: StartlineCollectorMissing
        expr: absent(up{job="startline-collector"})
        for: 15m
        labels:
          severity: page
        annotations:
          summary: "No Startline collector is scraped (no target of job startline-collector): the scrape job is named otherwise or Prometheus does not select the ServiceMonitor, so StartlineCollectorDown cannot fire"
      - alert: StartlineStorageFailing
        expr: startline_collector_store_healthy == 0
        for: 2m
        labels:
          severity: page
        annotations:
          summary: "Startline collector {{ $labels.instance }} cannot write its store: events are refused (see /healthz)"
      - alert: StartlineNotifierFailing
        expr: increase(startline_alerts_notifications_total{result=~"abandoned|dropped"}[15m]) > 0
        labels:
          severity: page
        annotations:
          summary: "Startline notifier {{ $labels.target }} on {{ $labels.instance }} lost notifications ({{ $labels.result }})"
      - alert: StartlineNotifierRetrying
        expr: increase(startline_alerts_notifications_total{result="failed"}[15m]) > 0
        for: 15m
        labels:
          severity: ticket
        annotations:
          summary: "Startline notifier {{ $labels.target }} on {{ $labels.instance }} keeps failing and retrying"
      - alert: StartlineAuthRefusals
        expr: sum by (instance, reason) (increase(startline_collector_auth_refusals_total{reason=~"unknown|scope|not_permitted"}[15m])) > 10
        labels:
          severity: ticket
        annotations:
          summary: "{{ $value }} requests or events refused on {{ $labels.instance }} ({{ $labels.reason }}): a revoked token, a misconfigured client or an attack"
      # Agents and adapters (scraped with --metrics-listen, or the node agent's own /metrics).
      - alert: StartlineAgentDown
        expr: up{job=~"startline-node-agent|startline-.+-adapter"} == 0
        for: 10m
        labels:
          severity: ticket
        annotations:
          summary: "Startline {{ $labels.job }} on {{ $labels.instance }} cannot be scraped: it may be down, and its jobs' events are then not reported"
      - alert: StartlineAdapterStale
        expr: time() - startline_agent_last_successful_poll_timestamp_seconds > 600
        labels:
          severity: ticket
        annotations:
          summary: "The {{ $labels.provider }} adapter on {{ $labels.instance }} has not polled successfully for {{ $value | humanizeDuration }}: its jobs' transitions are not reported"
      - alert: StartlineSpoolFilling
        expr: startline_agent_spool_events / startline_agent_spool_capacity_events > 0.5
        for: 5m
        labels:
          severity: ticket
        annotations:
          summary: "The agent spool on {{ $labels.instance }} is {{ $value | humanizePercentage }} full: when it is full, new events are refused"
      - alert: StartlineDeliveryStuck
        expr: startline_agent_spool_oldest_event_age_seconds > 900
        labels:
          severity: page
        annotations:
          summary: "The agent on {{ $labels.instance }} has held an event for {{ $value | humanizeDuration }}: the collector does not acknowledge it, so start SLOs and pages lag"
"#;

/// A factor as YAML, without float noise (13.44, 5.6, 0.933333).
fn num(x: f64) -> String {
    let s = format!("{x:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The whole rules file for these SLOs; `min_jobs` is the low-volume guard, `labels` the static alert labels,
/// `runbook_base` the runbooks page (`alerts.runbook_base_url`): with it every alert carries a `runbook_url` to
/// its own section.
pub fn prometheus_rules(
    slos: &[SloDef],
    min_jobs: u64,
    labels: &BTreeMap<String, String>,
    runbook_base: Option<&str>,
) -> String {
    let mut out = String::from(
        "# Generated by `startline-collector rules` from the collector's configuration (this copy: the default\n\
         # configuration). Regenerate after changing [[slo]] or [alerts]: startline-collector rules --config FILE.\n\
         # Recording and alerting rules over Startline's metrics (docs/METRICS.md), for users who alert from their own\n\
         # Prometheus or run several collectors sharded by job: every SLO rule sums across collectors first.\n\
         # Unit-tested by `promtool test rules tests/startline-rules.test.yml` (run by the test suite).\n\
         groups:\n",
    );
    out.push_str(RECORDING);
    out.push_str("  - name: startline-alerts\n    rules:\n");
    for d in slos {
        let name = &d.name;
        let days = d.window_ms as f64 / 86_400_000.0;
        for severity in ["page", "ticket"] {
            let rules: Vec<_> = RULES.iter().filter(|r| r.severity == severity).collect();
            let _ = writeln!(
                out,
                "      # SLO {name} ({} % over {} d), {severity}: {}.",
                num(d.objective * 100.0),
                num(days),
                rules
                    .iter()
                    .map(|r| format!("{} burning over {}x", r.windows, num(r.factor(d.window_ms))))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            out.push_str("      - alert: StartlineSLOBurnRate\n        expr: |\n");
            for (i, r) in rules.iter().enumerate() {
                let (long, short) = r.windows.split_once('/').unwrap_or((r.windows, r.windows));
                let f = num(r.factor(d.window_ms));
                if i > 0 {
                    out.push_str("          or\n");
                }
                let _ = write!(
                    out,
                    "          max by (slo) (\n            \
                     startline:slo_burn_rate:global{{slo=\"{name}\",window=\"{long}\"}} > {f}\n              \
                     and on (slo) startline:slo_burn_rate:global{{slo=\"{name}\",window=\"{short}\"}} > {f}\n              \
                     and on (slo) startline:slo_window_jobs:sum{{slo=\"{name}\",window=\"{long}\"}} >= {min_jobs}\n          \
                     )\n"
                );
            }
            // `slo` is also set from the expression; stated here it keeps each SLO's rule distinct (promtool lint).
            let _ = write!(
                out,
                "        labels:\n          severity: {severity}\n          slo: {}\n",
                serde_json::Value::from(name.as_str())
            );
            for (k, v) in labels {
                let _ = writeln!(out, "          {k}: {}", serde_json::Value::from(v.as_str()));
            }
            let _ = write!(
                out,
                "        annotations:\n          summary: \"SLO {{{{ $labels.slo }}}} is burning its error budget ({})\"\n",
                rules.iter().map(|r| r.windows).collect::<Vec<_>>().join(", ")
            );
        }
    }
    out.push_str(META);
    match runbook_base {
        Some(base) => with_runbook_links(&out, base),
        None => out,
    }
}

/// `rules` with a `runbook_url` annotation first under every alert's `annotations:`.
fn with_runbook_links(rules: &str, base: &str) -> String {
    let mut out = String::with_capacity(rules.len() + 4096);
    let mut alert: Option<&str> = None;
    for line in rules.lines() {
        out.push_str(line);
        out.push('\n');
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert: ") {
            alert = Some(name.trim());
        } else if trimmed.starts_with("- record: ") {
            alert = None;
        } else if trimmed == "annotations:" {
            if let Some(name) = alert {
                let indent = &line[..line.len() - trimmed.len()];
                let link = crate::alert::config::runbook_link(base, name);
                let _ = writeln!(out, "{indent}  runbook_url: {}", serde_json::Value::from(link));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slo_gets_its_own_factors_and_the_collectors_alert_name_and_labels() {
        let mut week = SloDef::defaults().remove(1);
        week.name = "weekly".into();
        week.window_ms = 7 * 86_400_000;
        let labels: BTreeMap<String, String> = [("cluster".to_string(), "eu-1".to_string())].into();
        let y = prometheus_rules(&[SloDef::defaults().remove(0), week], 5, &labels, None);
        // 28 days: 13.44, 5.6, 2.8, 0.933333; 7 days: 3.36, 1.4, 0.7, 0.233333.
        for f in ["> 13.44", "> 5.6", "> 2.8", "> 0.933333", "> 3.36", "> 1.4", "> 0.7", "> 0.233333"] {
            assert!(y.contains(f), "{f} missing");
        }
        assert_eq!(y.matches("- alert: StartlineSLOBurnRate\n").count(), 4, "page and ticket per SLO");
        assert!(!y.contains("StartlineSLOBurnRatePage") && !y.contains("StartlineJobsWaitingPastThreshold"));
        assert_eq!(y.matches("          cluster: \"eu-1\"").count(), 4);
        assert!(y.contains("startline:slo_window_jobs:sum{slo=\"weekly\",window=\"3d\"} >= 5"));
        assert!(y.contains("- alert: StartlineCollectorDown"), "meta-alerts kept");
        assert!(!y.contains("runbook_url"), "no runbook links without a base");
    }

    #[test]
    fn a_runbook_base_links_every_alert_to_its_section() {
        let base = "https://docs.example.com/startline/runbooks.html";
        let y = prometheus_rules(&SloDef::defaults(), 5, &BTreeMap::new(), Some(base));
        let alerts: Vec<&str> = y.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
        let links: Vec<&str> = y.lines().filter_map(|l| l.trim().strip_prefix("runbook_url: ")).collect();
        assert_eq!(alerts.len(), links.len(), "one link per alert:\n{y}");
        for (a, l) in alerts.iter().zip(&links) {
            assert_eq!(*l, format!("\"{base}#{}\"", a.to_ascii_lowercase()), "{a}");
        }
        assert!(links.contains(&"\"https://docs.example.com/startline/runbooks.html#startlinecollectordown\""));
        // Still one YAML document with the same groups.
        assert_eq!(
            y.matches("  - name: ").count(),
            prometheus_rules(&SloDef::defaults(), 5, &BTreeMap::new(), None).matches("  - name: ").count()
        );
    }
}
