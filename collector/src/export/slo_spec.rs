//! `startline-collector slo export --format openslo|sloth|pyrra`: the configured SLOs written in the formats of
//! the SLO tools teams already run, so they can compute their own windows and alerts from Startline's SLI
//! counters (`startline_slo_decisions_total{slo,result}`, docs/METRICS.md) instead of the collector's gauges.
//!
//! The SLI of SLO `s`: errors = `result=~"bad|restated_bad"`, total = `result=~"good|bad"` of
//! `startline_slo_decisions_total{slo="s"}`, summed across collectors. A late restatement bad -> good
//! (`restated_good`) is not subtracted, because these formats take one counter selector per side; the exported
//! SLI can therefore only over-count errors, never hide one (the collector's own figures are exact). Sloth takes
//! full queries, so its error query subtracts restatements and is exact.
//!
//! What a format has no field for (the time-to-first-step threshold, which jobs are covered, a time-of-day window
//! and its zone, the collector's per-job pages) goes into annotations (`startline.dev/...`) or the description.
//! Output is YAML (block style; strings JSON-quoted, which YAML reads as double-quoted scalars).

use crate::settings::format_duration;
use crate::slo::SloDef;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// The formats `slo export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecFormat {
    /// OpenSLO v1: a `Service` and one `SLO` per Startline SLO (ratioMetric over Prometheus counters).
    OpenSlo,
    /// Sloth `prometheus/v1`: one spec with every SLO (errorQuery / totalQuery).
    Sloth,
    /// Pyrra `pyrra.dev/v1alpha1` `ServiceLevelObjective` objects (ratio indicator).
    Pyrra,
}

impl std::str::FromStr for SpecFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "openslo" => Ok(SpecFormat::OpenSlo),
            "sloth" => Ok(SpecFormat::Sloth),
            "pyrra" => Ok(SpecFormat::Pyrra),
            other => Err(format!("{other:?} is not one of openslo, sloth, pyrra")),
        }
    }
}

/// The service every exported SLO belongs to.
pub const SERVICE: &str = "startline";

const METRIC: &str = "startline_slo_decisions_total";

fn selector(slo: &str, results: &str) -> String {
    format!("{METRIC}{{slo=\"{slo}\",result=~\"{results}\"}}")
}

fn dur(ms: i64) -> String {
    format_duration(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// `99.5` for 0.995, without float noise.
fn percent(objective: f64) -> f64 {
    (objective * 100_000.0).round() / 1000.0
}

/// A duration in one unit, as OpenSLO's duration shorthand wants (`28d`, `36h`, `90m`; at least a minute).
fn single_unit(ms: i64) -> String {
    let min = (ms / 60_000).max(1);
    if min % 1440 == 0 {
        format!("{}d", min / 1440)
    } else if min % 60 == 0 {
        format!("{}h", min / 60)
    } else {
        format!("{min}m")
    }
}

/// A display name of at most 63 characters: `urgent-start: 99% within 10m`.
fn short_name(d: &SloDef) -> String {
    let full = format!("{}: {}% within {}", d.name, percent(d.objective), dur(d.threshold_ms));
    if full.len() <= 63 {
        full
    } else {
        d.name.chars().take(63).collect()
    }
}

/// What the formats cannot say, as `startline.dev/...` annotations.
fn annotations(d: &SloDef) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    a.insert("startline.dev/threshold".to_string(), dur(d.threshold_ms));
    a.insert("startline.dev/selector".to_string(), d.selector.to_json().to_string());
    if let Some(h) = &d.selector.hours {
        a.insert(
            "startline.dev/hours".to_string(),
            format!("{:02}:{:02}-{:02}:{:02}", h.from_min / 60, h.from_min % 60, h.to_min / 60, h.to_min % 60),
        );
        a.insert("startline.dev/time-zone".to_string(), h.tz_name.clone());
    }
    a.insert("startline.dev/page-on-breach".to_string(), d.page_on_breach.to_string());
    a.insert(
        "startline.dev/sli".to_string(),
        "errors: bad and restated_bad decisions; total: good and bad decisions (late bad->good restatements are \
         not subtracted: errors may be over-counted, never hidden)"
            .to_string(),
    );
    a
}

fn description(d: &SloDef) -> String {
    let what = format!(
        "{}% of covered jobs reach their first training step within {} of submit, over {}",
        percent(d.objective),
        dur(d.threshold_ms),
        dur(d.window_ms)
    );
    if d.description.is_empty() {
        what
    } else {
        format!("{}: {what}", d.description)
    }
}

/// The SLOs in `format`, as YAML; `labels` are the collector's static alert labels (`alerts.labels`), carried
/// where the format has labels.
pub fn export(slos: &[SloDef], format: SpecFormat, labels: &BTreeMap<String, String>) -> String {
    let docs: Vec<Value> = match format {
        SpecFormat::OpenSlo => openslo(slos, labels),
        SpecFormat::Sloth => vec![sloth(slos, labels)],
        SpecFormat::Pyrra => slos.iter().map(|d| pyrra(d, labels)).collect(),
    };
    let mut out = format!(
        "# Generated by `startline-collector slo export --format {}` from the collector's [[slo]] configuration.\n",
        match format {
            SpecFormat::OpenSlo => "openslo",
            SpecFormat::Sloth => "sloth",
            SpecFormat::Pyrra => "pyrra",
        }
    );
    for (i, d) in docs.iter().enumerate() {
        if i > 0 || format != SpecFormat::Sloth {
            out.push_str("---\n");
        }
        yaml(&mut out, d, 0);
    }
    out
}

fn openslo(slos: &[SloDef], labels: &BTreeMap<String, String>) -> Vec<Value> {
    let mut docs = vec![json!({
        "apiVersion": "openslo/v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "displayName": "Startline: time to first training step"},
        "spec": {"description": "Wait from submit to the first training step of ML jobs, measured by Startline"},
    })];
    for d in slos {
        let source = |q: String| json!({"metricSource": {"type": "Prometheus", "spec": {"query": q}}});
        let mut metadata = json!({"name": d.name, "displayName": short_name(d)});
        let mut ann: Map<String, Value> = annotations(d).into_iter().map(|(k, v)| (k, Value::String(v))).collect();
        for (k, v) in labels {
            ann.insert(format!("startline.dev/label-{k}"), Value::String(v.clone()));
        }
        metadata["annotations"] = Value::Object(ann);
        docs.push(json!({
            "apiVersion": "openslo/v1",
            "kind": "SLO",
            "metadata": metadata,
            "spec": {
                "description": description(d),
                "service": SERVICE,
                "indicator": {
                    "metadata": {"name": format!("{}-time-to-first-step", d.name)},
                    "spec": {
                        "ratioMetric": {
                            "counter": true,
                            "bad": source(format!("sum({})", selector(&d.name, "bad|restated_bad"))),
                            "total": source(format!("sum({})", selector(&d.name, "good|bad"))),
                        }
                    }
                },
                "timeWindow": [{"duration": single_unit(d.window_ms), "isRolling": true}],
                "budgetingMethod": "Occurrences",
                "objectives": [{"displayName": format!("first step within {}", dur(d.threshold_ms)), "target": d.objective}],
            }
        }));
    }
    docs
}

fn sloth(slos: &[SloDef], labels: &BTreeMap<String, String>) -> Value {
    let items: Vec<Value> = slos
        .iter()
        .map(|d| {
            let inc = |results: &str| format!("sum(increase({}[{{{{.window}}}}]))", selector(&d.name, results));
            let mut alert_labels = Map::new();
            for (k, v) in labels {
                alert_labels.insert(k.clone(), Value::String(v.clone()));
            }
            alert_labels.insert("slo".into(), Value::String(d.name.clone()));
            let ann = annotations(d);
            json!({
                "name": d.name,
                "objective": percent(d.objective),
                "description": format!(
                    "{} (window {}: set Sloth's SLO period to match; threshold {}; selector {})",
                    description(d),
                    dur(d.window_ms),
                    dur(d.threshold_ms),
                    ann["startline.dev/selector"]
                ),
                "labels": {"startline_slo": d.name},
                "sli": {"events": {
                    "error_query": format!(
                        "({}) - (({}) or vector(0))",
                        inc("bad|restated_bad"),
                        inc("restated_good")
                    ),
                    "total_query": inc("good|bad"),
                }},
                "alerting": {
                    "name": "StartlineSLOBurnRate",
                    "labels": alert_labels,
                    "annotations": {"summary": format!("SLO {} is burning its error budget", d.name)},
                    "page_alert": {"labels": {"severity": "page"}},
                    "ticket_alert": {"labels": {"severity": "ticket"}},
                },
            })
        })
        .collect();
    json!({
        "version": "prometheus/v1",
        "service": SERVICE,
        "labels": {"owner": "startline"},
        "slos": items,
    })
}

fn pyrra(d: &SloDef, labels: &BTreeMap<String, String>) -> Value {
    let mut l = Map::new();
    for (k, v) in labels {
        l.insert(k.clone(), Value::String(v.clone()));
    }
    l.insert("slo".into(), Value::String(d.name.clone()));
    let ann: Map<String, Value> = annotations(d).into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    json!({
        "apiVersion": "pyrra.dev/v1alpha1",
        "kind": "ServiceLevelObjective",
        "metadata": {"name": format!("startline-{}", d.name), "labels": l, "annotations": ann},
        "spec": {
            "target": format!("{}", percent(d.objective)),
            "window": dur(d.window_ms),
            "description": description(d),
            "indicator": {"ratio": {
                "errors": {"metric": selector(&d.name, "bad|restated_bad")},
                "total": {"metric": selector(&d.name, "good|bad")},
            }},
        }
    })
}

/// A mapping key: plain when it is a simple name (`apiVersion`, `startline.dev/threshold`), else JSON-quoted.
fn plain_key(k: &str) -> String {
    let simple = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'));
    if simple {
        k.to_string()
    } else {
        Value::String(k.to_string()).to_string()
    }
}

/// Block-style YAML for a JSON value at `indent` spaces (objects and arrays of objects nest; scalars are JSON,
/// which YAML reads as the same scalars).
fn yaml(out: &mut String, v: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = plain_key(k);
                match v {
                    Value::Object(c) if !c.is_empty() => {
                        let _ = writeln!(out, "{pad}{key}:");
                        yaml(out, v, indent + 2);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let _ = writeln!(out, "{pad}{key}:");
                        yaml(out, v, indent + 2);
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}{key}: {v}");
                    }
                }
            }
        }
        Value::Array(a) => {
            for item in a {
                match item {
                    Value::Object(c) if !c.is_empty() => {
                        // The first key on the dash line, the rest aligned under it.
                        let mut inner = String::new();
                        yaml(&mut inner, item, indent + 2);
                        let inner = inner.trim_start();
                        let _ = write!(out, "{pad}- {inner}");
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}- {item}");
                    }
                }
            }
        }
        other => {
            let _ = writeln!(out, "{pad}{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_is_block_style_and_reads_back_as_the_same_value() {
        let v =
            json!({"a": 1, "b": [{"c": "x: y", "d": [1, 2]}, "e"], "f": {"g": true, "h": {}}, "i": [], "j k": null});
        let mut out = String::new();
        yaml(&mut out, &v, 0);
        assert_eq!(
            out,
            "a: 1\nb:\n  - c: \"x: y\"\n    d:\n      - 1\n      - 2\n  - \"e\"\nf:\n  g: true\n  h: {}\ni: []\n\"j k\": null\n"
        );
    }

    #[test]
    fn every_format_names_each_slo_with_its_objective_window_and_sli() {
        let slos = SloDef::defaults();
        let labels: BTreeMap<String, String> = [("cluster".to_string(), "eu-1".to_string())].into();
        let o = export(&slos, SpecFormat::OpenSlo, &labels);
        assert_eq!(o.matches("kind: \"SLO\"").count(), 2);
        assert!(o.contains("target: 0.99\n") && o.contains("duration: \"28d\""), "{o}");
        assert!(
            o.contains(
                r#"query: "sum(startline_slo_decisions_total{slo=\"urgent-start\",result=~\"bad|restated_bad\"})""#
            ),
            "{o}"
        );
        let s = export(&slos, SpecFormat::Sloth, &labels);
        assert!(s.contains("objective: 99.0\n") && s.contains("objective: 95.0\n"), "{s}");
        assert!(s.contains("[{{.window}}]") && s.contains("cluster: \"eu-1\""), "{s}");
        assert!(s.contains("error_query: ") && s.contains("page_alert:"), "Sloth's plain spec is snake_case: {s}");
        let p = export(&slos, SpecFormat::Pyrra, &labels);
        assert!(p.contains("target: \"99\"") && p.contains("window: \"28d\""), "{p}");
        assert_eq!("pyrra".parse::<SpecFormat>(), Ok(SpecFormat::Pyrra));
        assert_eq!(
            (single_unit(28 * 86_400_000), single_unit(36 * 3_600_000), single_unit(90 * 60_000)),
            ("28d".into(), "36h".into(), "90m".into())
        );
        assert!("prometheus".parse::<SpecFormat>().is_err());
    }
}
