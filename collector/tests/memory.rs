//! The index's memory estimates (`startline_collector_memory_bytes{part}`, which `store.hot_budget_mib` and
//! `store.folded_budget_mib` bound) against the bytes its data structures really hold: a fleet of typical jobs
//! is built in this process under a counting allocator, and the live bytes before and after are compared. (The
//! allocator's own rounding, a few percent with mimalloc's size classes, is not counted; the resident set size
//! is no measure here: an allocator keeps freed pages for reuse.) Each test runs in a process of its own.

use startline_collector::index::labels::{LabelLimiter, LabelSettings};
use startline_collector::index::JobIndex;
use startline_collector::job::CompactEvent;
use startline_collector::slo::{SloDef, SloEngine};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::collections::BTreeMap;

#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// Bytes allocated and not freed in this process.
fn live() -> usize {
    let s = GLOBAL.stats();
    // (Reallocations are counted in both already: growth as allocated, shrinking as deallocated.)
    s.bytes_allocated.saturating_sub(s.bytes_deallocated)
}

/// The events of typical job `i` (the simulator's shape: submitted, queued, assigned, pulling the image, first
/// step, a checkpoint every ~20 minutes, done), `n_events` of them in all; odd jobs are still running (no done).
fn job(i: usize, n_events: usize, t0: i64, all_done: bool) -> Vec<pb::LifecycleEvent> {
    let id = format!("slurm/a100-{}/{i:07}", i % 8);
    let at = t0 + i as i64 * 1000;
    let ev = |k: &str, dt: i64, kind: Kind| pb::LifecycleEvent {
        event_id: format!("{id}/{k}"),
        job_id: id.clone(),
        attempt: None,
        source: "agent/a100".into(),
        occurred_at: Some(ms_to_timestamp(at + dt)),
        kind: Some(kind),
    };
    let mut out = vec![
        ev(
            "s",
            0,
            Kind::Submitted(pb::Submitted {
                pool_kind: pb::PoolKind::Dedicated as i32,
                provider: "slurm".into(),
                pool: format!("a100-{}", i % 8),
                priority: pb::PriorityClass::Normal as i32,
                gpu_class: "a100-80gb".into(),
                gpu_count: 8,
                node_count: 1,
                region: "eu-west".into(),
                team: ["nlp", "vision", "speech"][i % 3].into(),
                project: format!("p{}", i % 20),
                ..Default::default()
            }),
        ),
        ev("q", 1_000, Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() })),
        ev(
            "a",
            600_000,
            Kind::NodeAssigned(pb::NodeAssigned { nodes: vec![format!("gpu-node-{:03}", i % 300)], gpu_ids: vec![] }),
        ),
        ev(
            "p",
            601_000,
            Kind::Preparing(pb::Preparing { phase: pb::PreparingPhase::ImagePull as i32, ..Default::default() }),
        ),
        ev("f", 900_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
    ];
    for c in 0..n_events.saturating_sub(6) {
        let step = (c as u64 + 1) * 1000;
        out.push(ev(
            &format!("c{c}"),
            900_000 + (c as i64 + 1) * 1_200_000,
            Kind::Checkpoint(pb::Checkpoint { step, ..Default::default() }),
        ));
    }
    if !all_done && i % 2 == 1 {
        return out;
    }
    let end = 900_000 + n_events as i64 * 1_200_000;
    out.push(ev("d", end, Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() })));
    out
}

/// An index with `n` jobs of `n_events` events each (all ended, or half of them), hot.
fn hot_index(n: usize, n_events: usize, all_done: bool) -> JobIndex {
    let t0 = startline_proto::time::now_ms() - 20 * 86_400_000;
    let mut idx = JobIndex::new(
        BTreeMap::new(),
        0,
        SloEngine::new(SloDef::defaults()),
        LabelLimiter::new(&LabelSettings::default()),
    );
    let now = startline_proto::time::now_ms();
    let mut seq = 0;
    for i in 0..n {
        for e in job(i, n_events, t0, all_done) {
            seq += 1;
            let compact = CompactEvent::from_pb(&e, seq).expect("valid");
            idx.insert(&e.job_id, compact, now);
        }
    }
    idx.dirty.clear();
    idx.dirty.shrink_to_fit();
    idx.settling.clear();
    idx.settling.shrink_to_fit();
    idx
}

/// Hot jobs: the estimate (`part="hot_jobs"`) is within 20% of what 50k typical jobs of ~20 events (half of
/// them still running) really hold.
#[test]
fn hot_jobs_take_about_what_the_estimate_says() {
    let before = live();
    let idx = hot_index(50_000, 20, false);
    let after = live();
    let m = idx.memory();
    let real = after.saturating_sub(before);
    let ratio = real as f64 / m.hot_bytes as f64;
    eprintln!("hot: {} jobs, estimate {} B, held {real} B, ratio {ratio:.2}", m.hot_jobs, m.hot_bytes);
    assert_eq!(m.hot_jobs, 50_000);
    assert!((0.8..1.2).contains(&ratio), "hot jobs: the index holds {real} bytes for an estimate of {}", m.hot_bytes);
}

/// Folded rows: the estimate (`part="folded_jobs"` + `part="dictionary"`) is within 20% of what 200k typical
/// folded jobs really hold: the rows of 10k jobs are made first (their hot jobs dropped), then inserted 20 times over under
/// new ids while the resident set is measured.
#[test]
fn folded_rows_take_about_what_the_estimate_says() {
    let mut made = hot_index(10_000, 20, true);
    let ids: Vec<String> = made.jobs.keys().cloned().collect();
    let rows: Vec<(String, startline_collector::index::cold::Folded)> =
        ids.iter().map(|id| (id.clone(), made.fold(id, 1).expect("done jobs fold"))).collect();
    let sets: Vec<_> = rows.iter().map(|(_, r)| made.cold.dict.get(r.attrs).expect("interned").clone()).collect();
    drop(made);
    let before = live();
    let mut idx = JobIndex::default();
    for b in 0..20 {
        for ((id, row), set) in rows.iter().zip(&sets) {
            let mut row = row.clone();
            row.attrs = idx.cold.dict.intern(set);
            idx.cold.insert(&format!("{id}/{b:02}"), row);
        }
    }
    let after = live();
    let m = idx.memory();
    let estimate = m.folded_bytes + m.dictionary_bytes;
    let real = after.saturating_sub(before);
    let ratio = real as f64 / estimate as f64;
    eprintln!("folded: {} rows, estimate {estimate} B, held {real} B, ratio {ratio:.2}", m.folded_jobs);
    assert_eq!(m.folded_jobs, 200_000);
    assert!((0.8..1.2).contains(&ratio), "folded rows: the index holds {real} bytes for an estimate of {estimate}");
}
