//! Chains: jobs that share a `chain_id` (train -> evaluate -> merge -> quantize) seen as one timeline from the
//! first stage's submit to the last stage's end. Pure: built from the member jobs' timelines.
//!
//! - A chain is *complete* when a job of a final stage (`[chains] final_stages`, e.g. `quantize`) succeeded (a
//!   failed final stage is usually retried), or, with no final stages configured, when every member is done. Its
//!   end is then the latest member's end (members submitted after it, re-runs, are left out of its time); an open
//!   chain is measured up to now.
//! - *Gaps* are the stretches inside the chain's span when none of its jobs existed (one stage ended and the next
//!   was not submitted yet): time nobody was running, waiting or preparing anything for it.
//! - The *critical path* walks back from the member that ended last: each step's predecessor is the member that
//!   ended latest at or before the step's submit. Its waits, runs and the gaps between its steps add up to the
//!   chain's time to artifact exactly.

use super::Timeline;

/// One member of a chain, as the chain needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Its job id.
    pub job_id: String,
    /// Its stage (`chain_stage`; may be empty).
    pub stage: String,
    /// Submitted.
    pub submitted_at: i64,
    /// First training step, if it started.
    pub first_step_at: Option<i64>,
    /// Ended, if it did.
    pub done_at: Option<i64>,
    /// Whether it ended succeeded.
    pub succeeded: bool,
    /// Its team (a chain SLO may select chains by their first job's team).
    pub team: String,
}

impl Member {
    /// A member from a job's timeline; `None` before its `submitted` is known.
    pub fn of(job_id: &str, t: &Timeline) -> Option<Member> {
        let a = t.attrs.as_ref()?;
        Some(Member {
            job_id: job_id.to_string(),
            stage: a.chain_stage.clone(),
            submitted_at: t.submitted_at?,
            first_step_at: t.first_step_at,
            done_at: t.done_at,
            succeeded: t.outcome == Some(startline_proto::pb::Outcome::Succeeded),
            team: a.team.clone(),
        })
    }

    fn end(&self, now: i64) -> i64 {
        self.done_at.unwrap_or(now).max(self.submitted_at)
    }
}

/// One step of the critical path.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The member (index into [`Chain::members`]).
    pub member: usize,
    /// Time between the previous step's end (the chain's start for the first step) and this step's submit.
    pub gap_before_ms: i64,
    /// Submit to first step (or to its end/now if it never started).
    pub wait_ms: i64,
    /// First step to end (or now).
    pub run_ms: i64,
}

/// A chain, derived.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// Members sorted by submit time (then job id).
    pub members: Vec<Member>,
    /// First submit.
    pub start_ms: i64,
    /// The latest end (complete chains), else now.
    pub end_ms: i64,
    /// Whether the chain is complete.
    pub complete: bool,
    /// Stretches `(from, to)` inside the span with no member in existence.
    pub gaps: Vec<(i64, i64)>,
    /// From the first step on the path to the member that ended last.
    pub critical_path: Vec<Step>,
}

impl Chain {
    /// Time to artifact (complete) or so far (open).
    pub fn span_ms(&self) -> i64 {
        self.end_ms - self.start_ms
    }

    /// Total idle time.
    pub fn gap_ms(&self) -> i64 {
        self.gaps.iter().map(|(a, b)| b - a).sum()
    }

    /// The team of its first job.
    pub fn team(&self) -> &str {
        self.members.first().map_or("", |m| m.team.as_str())
    }

    /// Stage names in order of their first submit (the chain's *kind*, e.g. `train>evaluate>quantize`).
    pub fn kind(&self) -> String {
        let mut seen: Vec<&str> = Vec::new();
        for m in &self.members {
            let s = if m.stage.is_empty() { "(none)" } else { m.stage.as_str() };
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        seen.join(">")
    }
}

/// Derives a chain from its members at `now`; `final_stages` decide completion (empty: every member done).
pub fn derive(mut members: Vec<Member>, final_stages: &[String], now: i64) -> Option<Chain> {
    if members.is_empty() {
        return None;
    }
    members.sort_by(|a, b| a.submitted_at.cmp(&b.submitted_at).then_with(|| a.job_id.cmp(&b.job_id)));
    let complete = if final_stages.is_empty() {
        members.iter().all(|m| m.done_at.is_some())
    } else {
        members.iter().any(|m| m.succeeded && final_stages.contains(&m.stage))
    };
    let start_ms = members[0].submitted_at;
    let end_ms = if complete {
        members.iter().filter_map(|m| m.done_at).max().unwrap_or(start_ms).max(start_ms)
    } else {
        now.max(start_ms)
    };
    // Gaps: the span minus the union of the members' [submit, end] intervals (sorted by submit already).
    let mut gaps = Vec::new();
    let mut covered_to = start_ms;
    for m in &members {
        if m.submitted_at > covered_to {
            gaps.push((covered_to, m.submitted_at.min(end_ms)));
        }
        covered_to = covered_to.max(m.end(end_ms).min(end_ms));
    }
    if covered_to < end_ms {
        // An open chain whose members have all ended: idle since, waiting for its next stage.
        gaps.push((covered_to, end_ms));
    }
    gaps.retain(|(a, b)| b > a);
    // Critical path: back from the member that ended last, among those submitted within the span (a complete
    // chain may have members submitted after its final stage ended: a re-run after the artifact was out).
    let within: Vec<usize> = (0..members.len()).filter(|&i| members[i].submitted_at <= end_ms).collect();
    let mut path = Vec::new();
    let last = within.iter().copied().max_by_key(|&i| (members[i].end(end_ms).min(end_ms), std::cmp::Reverse(i)));
    let mut at = last;
    while let Some(i) = at {
        let m = &members[i];
        let end = m.end(end_ms).min(end_ms);
        let started = m.first_step_at.map_or(end, |f| f.clamp(m.submitted_at, end));
        let pred = within
            .iter()
            .copied()
            .filter(|&j| j != i && members[j].end(end_ms) <= m.submitted_at)
            .max_by_key(|&j| (members[j].end(end_ms), std::cmp::Reverse(j)));
        let gap = pred.map_or(m.submitted_at - start_ms, |j| m.submitted_at - members[j].end(end_ms));
        path.push(Step { member: i, gap_before_ms: gap, wait_ms: started - m.submitted_at, run_ms: end - started });
        at = pred;
    }
    path.reverse();
    Some(Chain { members, start_ms, end_ms, complete, gaps, critical_path: path })
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: i64 = 60_000;

    fn m(id: &str, stage: &str, sub: i64, first: Option<i64>, done: Option<i64>) -> Member {
        Member {
            job_id: id.into(),
            stage: stage.into(),
            submitted_at: sub * M,
            first_step_at: first.map(|x| x * M),
            done_at: done.map(|x| x * M),
            succeeded: done.is_some(),
            team: String::new(),
        }
    }

    #[test]
    fn a_four_stage_chain_by_hand() {
        // train 0-100 (started at 20), eval submitted at 110 (10 idle) 110-130 (started 115), a retried merge:
        // 130-140 failed then 150-170 (started 160; 10 idle before it), quantize 175-200 (started 180).
        let members = vec![
            m("q", "quantize", 175, Some(180), Some(200)),
            m("t", "train", 0, Some(20), Some(100)),
            m("e", "evaluate", 110, Some(115), Some(130)),
            m("m1", "merge", 130, Some(132), Some(140)),
            m("m2", "merge", 150, Some(160), Some(170)),
        ];
        let c = derive(members, &["quantize".to_string()], 10_000 * M).expect("chain");
        assert!(c.complete);
        assert_eq!((c.start_ms, c.end_ms, c.span_ms()), (0, 200 * M, 200 * M));
        assert_eq!(c.gaps, vec![(100 * M, 110 * M), (140 * M, 150 * M), (170 * M, 175 * M)]);
        assert_eq!(c.gap_ms(), 25 * M);
        assert_eq!(c.kind(), "train>evaluate>merge>quantize");
        let path: Vec<(&str, i64, i64, i64)> = c
            .critical_path
            .iter()
            .map(|s| (c.members[s.member].job_id.as_str(), s.gap_before_ms / M, s.wait_ms / M, s.run_ms / M))
            .collect();
        assert_eq!(
            path,
            vec![("t", 0, 20, 80), ("e", 10, 5, 15), ("m1", 0, 2, 8), ("m2", 10, 10, 10), ("q", 5, 5, 20)]
        );
        let total: i64 = c.critical_path.iter().map(|s| s.gap_before_ms + s.wait_ms + s.run_ms).sum();
        assert_eq!(total, c.span_ms(), "the critical path accounts for the whole time to artifact");
    }

    #[test]
    fn a_member_submitted_after_the_artifact_is_left_off_the_path() {
        // quantize completes the chain at 100; a re-run submitted at 150 (still running) must not stretch it.
        let members = vec![
            m("t", "train", 0, Some(10), Some(60)),
            m("q", "quantize", 70, Some(75), Some(100)),
            m("again", "train", 150, Some(160), None),
        ];
        let c = derive(members, &["quantize".to_string()], 1_000 * M).expect("chain");
        assert!(c.complete);
        assert_eq!((c.end_ms, c.gap_ms()), (100 * M, 10 * M));
        let path: Vec<&str> = c.critical_path.iter().map(|s| c.members[s.member].job_id.as_str()).collect();
        assert_eq!(path, vec!["t", "q"]);
    }

    #[test]
    fn open_and_overlapping_chains() {
        // No final stage configured: complete only when every member is done; overlapping members leave no gap.
        let members = vec![m("a", "train", 0, Some(5), Some(50)), m("b", "evaluate", 30, None, None)];
        let c = derive(members.clone(), &[], 80 * M).expect("chain");
        assert!(!c.complete);
        assert_eq!((c.end_ms, c.gaps.len()), (80 * M, 0));
        let path: Vec<&str> = c.critical_path.iter().map(|s| c.members[s.member].job_id.as_str()).collect();
        assert_eq!(path, vec!["b"], "b overlaps a: nothing ended before b's submit");
        assert_eq!(c.critical_path[0].gap_before_ms, 30 * M);
        let mut done = members;
        done[1].done_at = Some(90 * M);
        let c = derive(done, &[], 100 * M).expect("chain");
        assert!(c.complete);
        assert_eq!(c.end_ms, 90 * M);
        assert!(derive(Vec::new(), &[], 0).is_none());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the members: gaps lie inside the span, never overlap a member, and together with the union of
        /// the members' lives cover the span exactly; a complete chain's critical path adds up to its span.
        #[test]
        fn gaps_and_the_critical_path_account_for_the_span(
            raw in proptest::collection::vec((0i64..500, 0i64..100, proptest::option::of(0i64..300), 0u8..3), 1..12),
            now_off in 0i64..1000,
            with_final in any::<bool>(),
        ) {
            let members: Vec<Member> = raw
                .iter()
                .enumerate()
                .map(|(i, (sub, first, run, stage))| Member {
                    job_id: format!("j{i}"),
                    stage: ["train", "eval", "quantize"][*stage as usize].to_string(),
                    submitted_at: *sub,
                    first_step_at: Some(sub + first),
                    done_at: run.map(|r| sub + first + r),
                    succeeded: run.is_some(),
                    team: String::new(),
                })
                .collect();
            let now = members.iter().map(|m| m.done_at.unwrap_or(m.submitted_at)).max().unwrap_or(0) + now_off;
            let finals = if with_final { vec!["quantize".to_string()] } else { Vec::new() };
            let c = derive(members.clone(), &finals, now).expect("chain");
            // Union of lives clipped to the span, by a plain sweep over every time unit.
            let mut covered = 0;
            for t in c.start_ms..c.end_ms {
                let alive = c.members.iter().any(|m| m.submitted_at <= t && t < m.end(c.end_ms).min(c.end_ms));
                let in_gap = c.gaps.iter().any(|(a, b)| *a <= t && t < *b);
                prop_assert!(alive != in_gap, "t={t}: alive {alive}, gap {in_gap}");
                covered += i64::from(alive);
            }
            prop_assert_eq!(covered + c.gap_ms(), c.span_ms());
            if c.complete {
                let total: i64 = c.critical_path.iter().map(|s| s.gap_before_ms + s.wait_ms + s.run_ms).sum();
                prop_assert_eq!(total, c.span_ms());
            }
            prop_assert!(c.critical_path.iter().all(|s| s.gap_before_ms >= 0 && s.wait_ms >= 0 && s.run_ms >= 0));
        }
    }
}
