//! Alerting settings: the `[alerts]` section as written in the config file ([`AlertsSection`]) and the validated
//! [`AlertConfig`] the alert loop and notifiers run with. The crate's `config` module reads the file and calls
//! [`AlertsSection::validate`] alongside every other section's.

use super::http::HttpUrl;
use crate::settings::duration;
use serde::Deserialize;
use std::time::Duration;

/// `[alerts]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsSection {
    /// Alertmanager base URLs (`http://host:port`); alerts go to `/api/v2/alerts`.
    #[serde(default)]
    pub alertmanager: Vec<String>,
    /// Generic JSON webhook URLs.
    #[serde(default)]
    pub webhook: Vec<String>,
    /// How often burn rates are evaluated. Default 10s.
    pub evaluation_interval: Option<String>,
    /// How often firing alerts are re-posted to Alertmanager (their `endsAt` is 3 intervals ahead). Default 1m.
    pub resend_interval: Option<String>,
    /// Low-volume guard: a burn-rate alert needs at least this many decided jobs in its long window. Default 5.
    pub min_jobs: Option<u64>,
    /// How long resolved alerts stay listed. Default 24h.
    pub resolved_retention: Option<String>,
    /// Per-job pages are sent only for crossings at most this old when first seen (an adapter catching up on
    /// history must not page for jobs that breached days ago). Default 1h.
    pub page_max_age: Option<String>,
}

/// Validated alerting settings.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// Alertmanager base URLs.
    pub alertmanagers: Vec<String>,
    /// Webhook URLs.
    pub webhooks: Vec<String>,
    /// Burn-rate evaluation interval.
    pub evaluation_interval: Duration,
    /// Re-post interval for firing alerts.
    pub resend_interval: Duration,
    /// Low-volume guard.
    pub min_jobs: u64,
    /// Resolved-alert retention.
    pub resolved_retention: Duration,
    /// Oldest crossing that still pages.
    pub page_max_age: Duration,
}

impl AlertsSection {
    /// Checks the section, pushing one message per problem onto `errs`; fields in error take their defaults.
    pub fn validate(&self, errs: &mut Vec<String>) -> AlertConfig {
        let mut urls = |name: &str, list: &[String]| -> Vec<String> {
            for u in list {
                if let Err(e) = HttpUrl::parse(u) {
                    errs.push(format!("{name}: {u:?}: {e}"));
                }
            }
            list.to_vec()
        };
        let alertmanagers = urls("alerts.alertmanager", &self.alertmanager);
        let webhooks = urls("alerts.webhook", &self.webhook);
        AlertConfig {
            alertmanagers,
            webhooks,
            evaluation_interval: duration(
                errs,
                "alerts.evaluation_interval",
                &self.evaluation_interval,
                Duration::from_secs(10),
                Duration::from_millis(100),
            ),
            resend_interval: duration(
                errs,
                "alerts.resend_interval",
                &self.resend_interval,
                Duration::from_secs(60),
                Duration::from_secs(1),
            ),
            min_jobs: self.min_jobs.unwrap_or(5),
            page_max_age: duration(
                errs,
                "alerts.page_max_age",
                &self.page_max_age,
                Duration::from_secs(3600),
                Duration::from_secs(1),
            ),
            resolved_retention: duration(
                errs,
                "alerts.resolved_retention",
                &self.resolved_retention,
                Duration::from_secs(86_400),
                Duration::from_secs(1),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_section_gives_the_defaults() {
        let mut errs = Vec::new();
        let c = AlertsSection::default().validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        assert!(c.alertmanagers.is_empty() && c.webhooks.is_empty());
        assert_eq!(c.evaluation_interval, Duration::from_secs(10));
        assert_eq!(c.resend_interval, Duration::from_secs(60));
        assert_eq!(c.min_jobs, 5);
        assert_eq!(c.page_max_age, Duration::from_secs(3600));
        assert_eq!(c.resolved_retention, Duration::from_secs(86_400));
    }

    #[test]
    fn every_bad_field_is_reported_in_order() {
        let s = AlertsSection {
            alertmanager: vec!["ftp://example".into(), "http://127.0.0.1:9093".into()],
            webhook: vec!["hook".into()],
            evaluation_interval: Some("1ms".into()),
            resend_interval: Some("often".into()),
            min_jobs: Some(1),
            resolved_retention: Some("0s".into()),
            page_max_age: Some("10ms".into()),
        };
        let mut errs = Vec::new();
        let c = s.validate(&mut errs);
        let fields: Vec<&str> = errs.iter().filter_map(|e| e.split(':').next()).collect();
        assert_eq!(
            fields,
            [
                "alerts.alertmanager",
                "alerts.webhook",
                "alerts.evaluation_interval",
                "alerts.resend_interval",
                "alerts.page_max_age",
                "alerts.resolved_retention"
            ],
            "{errs:#?}"
        );
        assert!(errs[0].starts_with("alerts.alertmanager: \"ftp://example\": "), "{}", errs[0]);
        assert_eq!(errs[2], "alerts.evaluation_interval: \"1ms\" is shorter than 100ms");
        assert!(errs[3].starts_with("alerts.resend_interval: \"often\" is not a duration like \"5m\""), "{}", errs[3]);
        assert_eq!(errs[4], "alerts.page_max_age: \"10ms\" is shorter than 1s");
        assert_eq!(errs[5], "alerts.resolved_retention: \"0s\" is shorter than 1s");
        // Bad fields fall back to their defaults; good ones are kept.
        assert_eq!(c.alertmanagers.len(), 2);
        assert_eq!(c.evaluation_interval, Duration::from_secs(10));
        assert_eq!(c.min_jobs, 1);
    }
}
