//! Attributes learned after the submit. A job's first `submitted` (in canonical order) gives its submit time and
//! attributes; each later `submitted` updates the attributes with what it sets, so a source that learns an
//! attribute only after the submit (a Kueue Workload's GPU class comes with the flavor it is admitted to, its
//! ClusterQueue with the admission) sends `submitted` again and the job's attributes, and with them its SLO
//! selectors, comparisons and listings, follow. The fold applies updates in canonical order like every other
//! event, so the attributes stay a function of the set of events.

use super::JobAttrs;

impl JobAttrs {
    /// These attributes as updated by a later `submitted`'s: each field `later` sets (a non-empty string, a
    /// non-zero count, a known enum value; its labels when it has any, as a whole, so a job never holds more
    /// labels than one event may carry) replaces the value here. `None` when nothing changes.
    pub fn updated_by(&self, later: &JobAttrs) -> Option<JobAttrs> {
        use startline_proto::pb::{PoolKind, PriorityClass};
        let text = |old: &String, new: &String| if new.is_empty() { old.clone() } else { new.clone() };
        let count = |old: u32, new: u32| if new == 0 { old } else { new };
        let updated = JobAttrs {
            pool_kind: if later.pool_kind == PoolKind::Unspecified { self.pool_kind } else { later.pool_kind },
            provider: text(&self.provider, &later.provider),
            pool: text(&self.pool, &later.pool),
            priority: if later.priority == PriorityClass::Unspecified { self.priority } else { later.priority },
            gpu_class: text(&self.gpu_class, &later.gpu_class),
            gpu_count: count(self.gpu_count, later.gpu_count),
            node_count: count(self.node_count, later.node_count),
            region: text(&self.region, &later.region),
            team: text(&self.team, &later.team),
            project: text(&self.project, &later.project),
            chain_id: text(&self.chain_id, &later.chain_id),
            chain_stage: text(&self.chain_stage, &later.chain_stage),
            labels: if later.labels.is_empty() { self.labels.clone() } else { later.labels.clone() },
        };
        (updated != *self).then_some(updated)
    }
}
