//! Chains as readers need them: one scan of every job (hot and folded) grouped by `chain_id` into
//! [`Member`]s, and the chains derived from them ([`crate::job::chain::derive`]). Shared by the API and the alert
//! loop's chain SLO evaluation.

use super::SharedIndex;
use crate::job::chain::{derive, Chain, Member};
use std::collections::BTreeMap;

/// Jobs scanned per read lock.
const SCAN_CHUNK: usize = 4096;

/// Every chain's members.
pub fn members(index: &SharedIndex) -> BTreeMap<String, Vec<Member>> {
    let mut out: BTreeMap<String, Vec<Member>> = BTreeMap::new();
    index.for_each_job(SCAN_CHUNK, |id, job| {
        let Some(a) = job.timeline.attrs.as_ref() else { return };
        if a.chain_id.is_empty() {
            return;
        }
        if let Some(m) = Member::of(id, job.timeline) {
            match out.get_mut(a.chain_id.as_str()) {
                Some(v) => v.push(m),
                None => {
                    out.insert(a.chain_id.clone(), vec![m]);
                }
            }
        }
    });
    out
}

/// Every chain, derived at `now`.
pub fn chains(index: &SharedIndex, final_stages: &[String], now: i64) -> BTreeMap<String, Chain> {
    members(index).into_iter().filter_map(|(id, m)| derive(m, final_stages, now).map(|c| (id, c))).collect()
}

/// One chain SLO's figures as of the alert loop's last evaluation (read by the metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChainSloFigures {
    /// The SLO's name.
    pub slo: String,
    /// Chains decided good in its window.
    pub good: u64,
    /// Chains decided bad (late) in its window.
    pub bad: u64,
    /// Open chains with their deadline ahead.
    pub pending: u64,
    /// Open chains past their deadline.
    pub late_open: u64,
}

/// The latest [`ChainSloFigures`] of every chain SLO.
#[derive(Debug, Clone, Default)]
pub struct ChainSloBoard(std::sync::Arc<std::sync::Mutex<Vec<ChainSloFigures>>>);

impl ChainSloBoard {
    /// Replaces the figures.
    pub fn publish(&self, figures: Vec<ChainSloFigures>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = figures;
    }

    /// The figures.
    pub fn figures(&self) -> Vec<ChainSloFigures> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
