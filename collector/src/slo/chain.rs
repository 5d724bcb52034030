//! Chain SLOs (`[[chain_slo]]`): a deadline on time to artifact for the chains a selector covers (e.g. a safety fix
//! chain done within 6 hours, 95% of the time over 28 days). Owns the definitions, their config section, and the
//! pure maths: each chain's verdict and an SLO's counts over a window. Evaluated by the alert loop and the API
//! from chains derived by [`crate::job::chain`].
//!
//! # Verdicts
//! - *good*: complete within the threshold of its first submit, decided when it completed;
//! - *bad*: complete after the threshold, or still open past it; decided at the deadline (first submit +
//!   threshold), so a late chain counts against the SLO from the moment it is late, not when it finally ends;
//! - *pending*: open and not yet past its deadline.

use crate::job::chain::Chain;
use serde::{Deserialize, Serialize};

/// Which chains an SLO covers; empty lists match every chain.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChainSelector {
    /// Chain ids starting with one of these, e.g. `safety-fix/`.
    #[serde(default)]
    pub chain_id_prefix: Vec<String>,
    /// Chain kinds (stage names in order, e.g. `train>evaluate>merge>quantize`).
    #[serde(default)]
    pub kind: Vec<String>,
    /// Teams of the chain's first job.
    #[serde(default)]
    pub team: Vec<String>,
}

impl ChainSelector {
    /// Whether a chain with this id, kind and first job's team is covered.
    pub fn matches(&self, chain_id: &str, kind: &str, team: &str) -> bool {
        (self.chain_id_prefix.is_empty() || self.chain_id_prefix.iter().any(|p| chain_id.starts_with(p.as_str())))
            && (self.kind.is_empty() || self.kind.iter().any(|k| k == kind))
            && (self.team.is_empty() || self.team.iter().any(|t| t == team))
    }
}

/// `[[chain_slo]]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChainSloSection {
    /// Unique name, `[a-z0-9-]{1,64}` (a bounded metric label).
    pub name: Option<String>,
    /// Free text.
    pub description: Option<String>,
    /// Time to artifact that counts as good, e.g. `"6h"`.
    pub threshold: Option<String>,
    /// Target share of good chains, in percent, e.g. `95`.
    pub objective: Option<f64>,
    /// Rolling window (default `28d`).
    pub window: Option<String>,
    /// Page on each covered chain still open past its threshold (default true).
    pub page_on_breach: Option<bool>,
    /// Which chains it covers.
    #[serde(default)]
    pub selector: ChainSelector,
}

/// A validated chain SLO.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainSloDef {
    /// Name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Which chains.
    pub selector: ChainSelector,
    /// Time to artifact that counts as good, ms.
    pub threshold_ms: i64,
    /// Target share of good chains, in (0, 1).
    pub objective: f64,
    /// Rolling window, ms.
    pub window_ms: i64,
    /// Page on each chain open past its threshold.
    pub page_on_breach: bool,
}

fn duration(at: &str, field: &str, v: Option<&str>, errs: &mut Vec<String>) -> Option<i64> {
    match v.map(humantime::parse_duration) {
        None => None,
        Some(Ok(d)) if d.as_secs() >= 60 && d.as_secs() <= 400 * 86_400 => Some(d.as_millis() as i64),
        Some(Ok(_)) => {
            errs.push(format!("{at}.{field}: must be between 1m and 400d"));
            None
        }
        Some(Err(e)) => {
            errs.push(format!("{at}.{field}: {e}"));
            None
        }
    }
}

/// Validates every `[[chain_slo]]`, adding problems (field named) to `errs`.
pub fn validate(sections: &[ChainSloSection], errs: &mut Vec<String>) -> Vec<ChainSloDef> {
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, s) in sections.iter().enumerate() {
        let at = format!("chain_slo[{i}]");
        let name = s.name.clone().unwrap_or_default();
        super::def::check_name(&at, &name, &mut names, errs);
        let threshold_ms = duration(&at, "threshold", s.threshold.as_deref(), errs);
        if s.threshold.is_none() {
            errs.push(format!("{at}.threshold: is required, e.g. \"6h\""));
        }
        let objective = super::def::objective_share(&at, s.objective, "95", 0.95, errs);
        let window_ms = duration(&at, "window", s.window.as_deref(), errs).unwrap_or(28 * 86_400_000);
        for (field, list) in
            [("chain_id_prefix", &s.selector.chain_id_prefix), ("kind", &s.selector.kind), ("team", &s.selector.team)]
        {
            for v in list {
                if v.is_empty() || v.len() > 256 {
                    errs.push(format!("{at}.selector.{field}: {v:?} must be 1 to 256 characters"));
                }
            }
        }
        out.push(ChainSloDef {
            name,
            description: s.description.clone().unwrap_or_default(),
            selector: s.selector.clone(),
            threshold_ms: threshold_ms.unwrap_or(6 * 3_600_000),
            objective,
            window_ms,
            page_on_breach: s.page_on_breach.unwrap_or(true),
        });
    }
    out
}

impl ChainSloDef {
    /// Written back as a section (every field set).
    pub fn section(&self) -> ChainSloSection {
        let d = |ms: i64| humantime::format_duration(std::time::Duration::from_millis(ms as u64)).to_string();
        ChainSloSection {
            name: Some(self.name.clone()),
            description: Some(self.description.clone()),
            threshold: Some(d(self.threshold_ms)),
            objective: Some((self.objective * 100.0 * 1e9).round() / 1e9),
            window: Some(d(self.window_ms)),
            page_on_breach: Some(self.page_on_breach),
            selector: self.selector.clone(),
        }
    }
}

/// One chain against one SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Complete in time; decided at completion.
    Good { decided_ms: i64 },
    /// Late (complete after its deadline, or open past it); decided at the deadline.
    Bad { decided_ms: i64, open: bool },
    /// Open, deadline ahead.
    Pending { deadline_ms: i64 },
}

impl Verdict {
    /// `good`, `late` or `pending`.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Good { .. } => "good",
            Verdict::Bad { .. } => "late",
            Verdict::Pending { .. } => "pending",
        }
    }
}

/// The verdict on `chain` at `now` (an open chain's `end_ms` is `now`).
pub fn verdict(def: &ChainSloDef, chain: &Chain, now: i64) -> Verdict {
    let deadline = chain.start_ms + def.threshold_ms;
    if chain.complete {
        if chain.span_ms() <= def.threshold_ms {
            Verdict::Good { decided_ms: chain.end_ms }
        } else {
            Verdict::Bad { decided_ms: deadline, open: false }
        }
    } else if now > deadline {
        Verdict::Bad { decided_ms: deadline, open: true }
    } else {
        Verdict::Pending { deadline_ms: deadline }
    }
}

/// Good and bad chains decided in `(now - window, now]`.
pub fn counts(verdicts: &[Verdict], now: i64, window_ms: i64) -> crate::slo::Counts {
    let mut c = crate::slo::Counts::default();
    for v in verdicts {
        match *v {
            Verdict::Good { decided_ms } if decided_ms > now - window_ms && decided_ms <= now => c.good += 1,
            Verdict::Bad { decided_ms, .. } if decided_ms > now - window_ms && decided_ms <= now => c.bad += 1,
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::chain::{derive, Member};

    const H: i64 = 3_600_000;

    fn member(id: &str, stage: &str, sub: i64, done: Option<i64>) -> Member {
        Member {
            job_id: id.into(),
            stage: stage.into(),
            submitted_at: sub,
            first_step_at: Some(sub + 60_000),
            done_at: done,
            succeeded: done.is_some(),
            team: "safety".into(),
        }
    }

    fn def(threshold_h: i64) -> ChainSloDef {
        let mut errs = Vec::new();
        let s = ChainSloSection {
            name: Some("safety-fix".into()),
            threshold: Some(format!("{threshold_h}h")),
            objective: Some(95.0),
            ..Default::default()
        };
        let d = validate(&[s], &mut errs).remove(0);
        assert!(errs.is_empty(), "{errs:?}");
        d
    }

    #[test]
    fn verdicts_are_decided_at_completion_or_at_the_deadline() {
        let d = def(6);
        let fin = ["quantize".to_string()];
        let t0 = 1_000 * H;
        // Done in 5 h: good at completion.
        let quick = derive(
            vec![member("a", "train", t0, Some(t0 + 3 * H)), member("b", "quantize", t0 + 3 * H, Some(t0 + 5 * H))],
            &fin,
            t0 + 9 * H,
        )
        .expect("chain");
        assert_eq!(verdict(&d, &quick, t0 + 9 * H), Verdict::Good { decided_ms: t0 + 5 * H });
        // Done in 8 h: bad, decided at the 6 h deadline.
        let slow = derive(
            vec![member("a", "train", t0, Some(t0 + 4 * H)), member("b", "quantize", t0 + 4 * H, Some(t0 + 8 * H))],
            &fin,
            t0 + 9 * H,
        )
        .expect("chain");
        assert_eq!(verdict(&d, &slow, t0 + 9 * H), Verdict::Bad { decided_ms: t0 + 6 * H, open: false });
        // Open: pending until the deadline, then bad (and open) before it ends.
        let open = derive(vec![member("a", "train", t0, None)], &fin, t0 + 5 * H).expect("chain");
        assert_eq!(verdict(&d, &open, t0 + 5 * H), Verdict::Pending { deadline_ms: t0 + 6 * H });
        let open = derive(vec![member("a", "train", t0, None)], &fin, t0 + 7 * H).expect("chain");
        assert_eq!(verdict(&d, &open, t0 + 7 * H), Verdict::Bad { decided_ms: t0 + 6 * H, open: true });
        // Counts over a window: decisions inside (now - window, now].
        let vs = [
            Verdict::Good { decided_ms: t0 + 5 * H },
            Verdict::Bad { decided_ms: t0 + 6 * H, open: false },
            Verdict::Pending { deadline_ms: t0 + 6 * H },
            Verdict::Good { decided_ms: t0 - 30 * 24 * H },
        ];
        let c = counts(&vs, t0 + 9 * H, 28 * 24 * H);
        assert_eq!((c.good, c.bad), (1, 1));
        let c = counts(&vs, t0 + 9 * H, 3 * H + 30 * 60_000);
        assert_eq!((c.good, c.bad), (0, 1), "only the 6 h decision is within 3.5 h of now");
    }

    #[test]
    fn selectors_and_sections_are_checked() {
        let s =
            ChainSelector { chain_id_prefix: vec!["safety-fix/".into()], kind: vec![], team: vec!["safety".into()] };
        assert!(s.matches("safety-fix/7", "train>quantize", "safety"));
        assert!(!s.matches("release/7", "train>quantize", "safety"));
        assert!(!s.matches("safety-fix/7", "train>quantize", "nlp"));
        let mut errs = Vec::new();
        let bad = ChainSloSection {
            name: Some("Bad Name".into()),
            threshold: Some("10s".into()),
            objective: Some(100.0),
            window: Some("forever".into()),
            ..Default::default()
        };
        validate(&[bad, ChainSloSection::default()], &mut errs);
        for want in [
            "chain_slo[0].name",
            "chain_slo[0].threshold: must be between",
            "chain_slo[0].objective",
            "chain_slo[0].window",
            "chain_slo[1].name",
            "chain_slo[1].threshold: is required",
            "chain_slo[1].objective: is required",
        ] {
            assert!(errs.iter().any(|e| e.starts_with(want)), "{want}: {errs:?}");
        }
        // Written back, a definition reads back the same.
        let d = def(6);
        let mut errs = Vec::new();
        assert_eq!(validate(&[d.section()], &mut errs), vec![d]);
        assert!(errs.is_empty());
    }
}
