//! The game-day scenarios as data: each is a few scripted jobs (events at fixed minutes before the run's "now"),
//! the disruptions between their phases, and what Startline must report afterwards. Pure: nothing here talks
//! to a collector, so every plan is checked by unit tests for internal consistency.

use startline_proto::pb::{self, lifecycle_event::Kind};

/// A named scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// A node is lost mid-run; the job is requeued and finishes elsewhere.
    NodeStop,
    /// A node's disk fills: the job fails while saving a checkpoint.
    DiskFull,
    /// Storage access is revoked: data staging never completes; the urgent job is paged on, then cancelled.
    StorageRevoked,
    /// GPU assignment is delayed: an urgent job waits in the queue past its deadline, is paged on, then starts.
    GpuDelay,
    /// The newest checkpoint copy is corrupt: the job restarts from an older one; the steps and time since are lost.
    CorruptCheckpoint,
    /// The collector is killed (kill -9) and restarted mid-scenario while a page is firing.
    CollectorRestart,
    /// The uplink is down: events wait in the agent's spool and arrive late, all at once.
    UplinkOutage,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    pub const ALL: [Scenario; 7] = [
        Scenario::NodeStop,
        Scenario::DiskFull,
        Scenario::StorageRevoked,
        Scenario::GpuDelay,
        Scenario::CorruptCheckpoint,
        Scenario::CollectorRestart,
        Scenario::UplinkOutage,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::NodeStop => "node-stop",
            Scenario::DiskFull => "disk-full",
            Scenario::StorageRevoked => "storage-revoked",
            Scenario::GpuDelay => "gpu-delay",
            Scenario::CorruptCheckpoint => "corrupt-checkpoint",
            Scenario::CollectorRestart => "collector-restart",
            Scenario::UplinkOutage => "uplink-outage",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|x| x.name() == s)
    }

    /// What it rehearses, one line.
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::NodeStop => "a node stops mid-run (node_lost); the job is requeued and resumes from its checkpoint",
            Scenario::DiskFull => "a node's disk fills; the job fails while saving a checkpoint",
            Scenario::StorageRevoked => "storage access is revoked; data staging never completes, the urgent job is paged on, then cancelled",
            Scenario::GpuDelay => "GPU assignment is delayed; an urgent job waits past its deadline, is paged on while waiting, then starts",
            Scenario::CorruptCheckpoint => "the newest checkpoint copy is corrupt; the job restarts from an older one",
            Scenario::CollectorRestart => "the collector is killed (kill -9) and restarted while a page is firing; events are redelivered",
            Scenario::UplinkOutage => "the uplink is down; events wait in the agent's spool and arrive late, all at once",
        }
    }
}

/// One scripted job.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Appended to the run's prefix to make the job id.
    pub name: &'static str,
    /// Urgent (held to `urgent-start` and paged on) or normal.
    pub urgent: bool,
    /// Managed endpoint or dedicated pool.
    pub managed: bool,
    /// What is injected, in words (the report repeats it).
    pub injected: &'static str,
}

/// One scripted event: its job (index), when (minutes before the run's now, negative), what, and its phase.
#[derive(Debug, Clone)]
pub struct Step {
    /// Index into [`Plan::jobs`].
    pub job: usize,
    /// Minutes relative to the run's start (negative: in the past).
    pub at_min: f64,
    /// The event.
    pub kind: Kind,
    /// 0: sent first; 1: sent after the disruptions.
    pub phase: u8,
}

/// What happens between the phases.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Disruption {
    /// Wait until the collector pages on this job (it must, while the job still waits).
    AwaitPage(usize),
    /// kill -9 the collector and start it again on the same data; send phase 0 again (duplicates).
    RestartCollector,
    /// Phase-0 events go into a node-agent spool with no uplink for a while, then are delivered.
    UplinkOutage,
}

/// What must hold of a page (`StartlineJobStartBreach`) for a job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Page {
    /// Never raised.
    Never,
    /// Raised while the job still waited, and resolved later.
    WhileWaitingThenResolved,
}

/// What Startline must report for a job.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Index into [`Plan::jobs`].
    pub job: usize,
    /// The job's final state.
    pub state: &'static str,
    /// Its outcome, once done.
    pub outcome: Option<&'static str>,
    /// Numbers of the job detail (`timeline.<field>`, or a top-level field), with the value injected.
    pub figures: Vec<(&'static str, f64)>,
    /// A waiting segment and at least how many seconds the job spent in it.
    pub segment: Option<(&'static str, f64)>,
    /// A start-SLO decision: (SLO, verdict).
    pub slo: Option<(&'static str, &'static str)>,
    /// The page.
    pub page: Page,
    /// Text the last event's message must contain.
    pub last_message: Option<&'static str>,
}

/// A scenario's script.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The scenario.
    pub scenario: Scenario,
    /// Jobs.
    pub jobs: Vec<JobSpec>,
    /// Events.
    pub steps: Vec<Step>,
    /// Between phase 0 and phase 1, in order.
    pub disruptions: Vec<Disruption>,
    /// What must be reported.
    pub expect: Vec<Expect>,
}

fn queued(raw: &str) -> Kind {
    Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, raw_reason: raw.into(), ..Default::default() })
}

fn assigned(node: &str) -> Kind {
    Kind::NodeAssigned(pb::NodeAssigned { nodes: vec![node.into()], ..Default::default() })
}

fn preparing(phase: pb::PreparingPhase) -> Kind {
    Kind::Preparing(pb::Preparing { phase: phase as i32, ..Default::default() })
}

fn first_step(step: u64) -> Kind {
    Kind::FirstStep(pb::FirstStep { step, origin: pb::StepOrigin::TrainingProcess as i32 })
}

fn checkpoint(step: u64) -> Kind {
    Kind::Checkpoint(pb::Checkpoint { step, uri: format!("s3://ckpt/gameday/step-{step}"), save_seconds: 20.0 })
}

fn done(outcome: pb::Outcome, exit_code: Option<i32>, message: &str) -> Kind {
    Kind::Done(pb::Done { outcome: outcome as i32, exit_code, message: message.into() })
}

/// A job's usual start: submitted, queued for capacity, a node, an image pull, the first step.
fn start(job: usize, t: [f64; 5], node: &str) -> Vec<Step> {
    let s = |at_min, kind| Step { job, at_min, kind, phase: 0 };
    vec![
        s(t[0], Kind::Submitted(pb::Submitted::default())),
        s(t[1], queued("Resources")),
        s(t[2], assigned(node)),
        s(t[3], preparing(pb::PreparingPhase::ImagePull)),
        s(t[4], first_step(1)),
    ]
}

fn expect(job: usize, state: &'static str, outcome: Option<&'static str>) -> Expect {
    Expect { job, state, outcome, figures: vec![], segment: None, slo: None, page: Page::Never, last_message: None }
}

/// The script of a scenario.
pub fn plan(s: Scenario) -> Plan {
    let job = |name, urgent, managed, injected| JobSpec { name, urgent, managed, injected };
    let at = |job: usize, at_min: f64, kind: Kind, phase: u8| Step { job, at_min, kind, phase };
    match s {
        Scenario::NodeStop => {
            let mut steps = start(0, [-50.0, -49.5, -45.0, -44.0, -40.0], "gd-node-1");
            steps.extend([
                at(0, -30.0, checkpoint(1000), 0),
                at(
                    0,
                    -25.0,
                    Kind::NodeLost(pb::NodeLost {
                        node: "gd-node-1".into(),
                        message: "node stopped (game day)".into(),
                    }),
                    0,
                ),
                at(0, -24.0, Kind::Requeued(pb::Requeued { resume_step: 1000 }), 0),
                at(0, -20.0, assigned("gd-node-2"), 0),
                at(0, -18.0, first_step(1000), 0),
                at(0, -10.0, checkpoint(2000), 0),
                at(0, -2.0, done(pb::Outcome::Succeeded, Some(0), ""), 0),
            ]);
            let mut e = expect(0, "done", Some("succeeded"));
            // Lost: training from the step-1000 checkpoint (-30) to the loss (-25); waiting again from the loss to
            // the next first step (-18).
            e.figures = vec![
                ("node_losses", 1.0),
                ("lost_work_seconds", 300.0),
                ("requeue_wait_seconds", 420.0),
                ("attempts", 2.0),
                ("lost_steps", 0.0),
            ];
            e.slo = Some(("normal-start", "good"));
            Plan {
                scenario: s,
                jobs: vec![job(
                    "node-stop",
                    false,
                    false,
                    "node gd-node-1 lost 15 min into the run, 5 min after the step-1000 checkpoint",
                )],
                steps,
                disruptions: vec![],
                expect: vec![e],
            }
        }
        Scenario::DiskFull => {
            let mut steps = start(0, [-40.0, -39.0, -38.0, -37.0, -30.0], "gd-node-3");
            steps.extend([
                at(0, -20.0, checkpoint(500), 0),
                at(
                    0,
                    -10.0,
                    done(
                        pb::Outcome::Failed,
                        Some(1),
                        "checkpoint save failed at step 1000: No space left on device (/scratch)",
                    ),
                    0,
                ),
            ]);
            let mut e = expect(0, "done", Some("failed"));
            e.figures = vec![("failed_work_seconds", 600.0), ("lost_work_seconds", 0.0)];
            e.slo = Some(("normal-start", "good"));
            e.last_message = Some("No space left on device");
            Plan {
                scenario: s,
                jobs: vec![job(
                    "disk-full",
                    false,
                    false,
                    "the node's disk filled: the step-1000 checkpoint save failed 10 min after the step-500 one",
                )],
                steps,
                disruptions: vec![],
                expect: vec![e],
            }
        }
        Scenario::StorageRevoked => {
            let steps = vec![
                at(0, -30.0, Kind::Submitted(pb::Submitted::default()), 0),
                at(0, -29.5, queued("Resources"), 0),
                at(0, -28.0, assigned("gd-node-4"), 0),
                at(0, -27.0, preparing(pb::PreparingPhase::ImagePull), 0),
                at(0, -26.0, preparing(pb::PreparingPhase::DataStaging), 0),
                at(
                    0,
                    -0.1,
                    done(
                        pb::Outcome::Cancelled,
                        None,
                        "data staging never completed: storage access revoked (game day)",
                    ),
                    1,
                ),
            ];
            let mut e = expect(0, "done", Some("cancelled"));
            e.segment = Some(("preparing:data_staging", 25.0 * 60.0));
            e.slo = Some(("urgent-start", "bad"));
            e.page = Page::WhileWaitingThenResolved;
            e.last_message = Some("storage access revoked");
            Plan {
                scenario: s,
                jobs: vec![job(
                    "storage-revoked",
                    true,
                    false,
                    "storage access revoked: data staging started 26 min ago and never completed",
                )],
                steps,
                disruptions: vec![Disruption::AwaitPage(0)],
                expect: vec![e],
            }
        }
        Scenario::GpuDelay => {
            let steps = vec![
                at(0, -20.0, Kind::Submitted(pb::Submitted::default()), 0),
                at(0, -19.5, queued("ResourceExhausted: no GPUs"), 0),
                at(0, -1.0, assigned("gd-node-5"), 1),
                at(0, -0.8, preparing(pb::PreparingPhase::Provisioning), 1),
                at(0, -0.2, first_step(1), 1),
            ];
            let mut e = expect(0, "running", None);
            e.segment = Some(("queued:capacity", 18.0 * 60.0));
            e.figures = vec![("time_to_first_step_seconds", 19.8 * 60.0)];
            e.slo = Some(("urgent-start", "bad"));
            e.page = Page::WhileWaitingThenResolved;
            Plan {
                scenario: s,
                jobs: vec![job("gpu-delay", true, true, "GPU assignment delayed 19 min: no GPUs for the urgent job")],
                steps,
                disruptions: vec![Disruption::AwaitPage(0)],
                expect: vec![e],
            }
        }
        Scenario::CorruptCheckpoint => {
            let mut steps = start(0, [-50.0, -49.0, -48.0, -47.0, -45.0], "gd-node-6");
            steps.extend([
                at(0, -35.0, checkpoint(1000), 0),
                at(0, -25.0, checkpoint(2000), 0),
                at(0, -20.0, Kind::Restarted(pb::Restarted { resume_step: 1000 }), 0),
                at(0, -19.0, first_step(1000), 0),
                at(0, -5.0, checkpoint(3000), 0),
                at(0, -1.0, done(pb::Outcome::Succeeded, Some(0), ""), 0),
            ]);
            let mut e = expect(0, "done", Some("succeeded"));
            // The step-2000 copy was unreadable: training resumed from step 1000 (saved at -35), so the 1000 steps
            // and the 15 minutes of training after that checkpoint are lost.
            e.figures = vec![("lost_steps", 1000.0), ("lost_work_seconds", 900.0), ("attempts", 2.0)];
            e.slo = Some(("normal-start", "good"));
            Plan {
                scenario: s,
                jobs: vec![job(
                    "corrupt-checkpoint",
                    false,
                    false,
                    "the step-2000 checkpoint copy is corrupt: the restart resumed from step 1000, saved 15 min before",
                )],
                steps,
                disruptions: vec![],
                expect: vec![e],
            }
        }
        Scenario::CollectorRestart => {
            let mut steps = start(0, [-30.0, -29.0, -28.0, -27.0, -20.0], "gd-node-7");
            steps.extend([
                at(0, -10.0, checkpoint(800), 1),
                at(0, -2.0, done(pb::Outcome::Succeeded, Some(0), ""), 1),
                at(1, -25.0, Kind::Submitted(pb::Submitted::default()), 0),
                at(1, -24.5, queued("Resources"), 0),
                at(1, -0.5, assigned("gd-node-8"), 1),
                at(1, -0.3, first_step(1), 1),
            ]);
            let mut a = expect(0, "done", Some("succeeded"));
            a.figures = vec![("events", 7.0)];
            a.slo = Some(("normal-start", "good"));
            let mut b = expect(1, "running", None);
            b.figures = vec![("events", 4.0)];
            b.slo = Some(("urgent-start", "bad"));
            b.page = Page::WhileWaitingThenResolved;
            Plan {
                scenario: s,
                jobs: vec![
                    job(
                        "restart-normal",
                        false,
                        false,
                        "half of its events before a kill -9 of the collector, half after; the first half sent again",
                    ),
                    job("restart-urgent", true, true, "paged on before the kill -9; started after the restart"),
                ],
                steps,
                disruptions: vec![Disruption::AwaitPage(1), Disruption::RestartCollector],
                expect: vec![a, b],
            }
        }
        Scenario::UplinkOutage => {
            let steps = vec![
                at(0, -25.0, Kind::Submitted(pb::Submitted::default()), 0),
                at(0, -24.5, queued("Resources"), 0),
                at(0, -23.0, assigned("gd-node-9"), 0),
                at(0, -21.0, first_step(1), 0),
                at(0, -10.0, checkpoint(600), 0),
                at(1, -22.0, Kind::Submitted(pb::Submitted::default()), 0),
                at(1, -21.8, queued("Resources"), 0),
                at(1, -0.05, done(pb::Outcome::Cancelled, None, "cancelled after the game day"), 1),
            ];
            let mut a = expect(0, "running", None);
            a.figures = vec![("time_to_first_step_seconds", 240.0)];
            a.slo = Some(("urgent-start", "good"));
            let mut b = expect(1, "done", Some("cancelled"));
            b.segment = Some(("queued:capacity", 21.0 * 60.0));
            b.slo = Some(("urgent-start", "bad"));
            b.page = Page::WhileWaitingThenResolved;
            Plan {
                scenario: s,
                jobs: vec![
                    job(
                        "outage-started",
                        true,
                        false,
                        "started in time (4 min) but its events reached the collector 21 min late, after the outage",
                    ),
                    job(
                        "outage-waiting",
                        true,
                        false,
                        "waiting past its deadline during the outage; paged once its events arrived",
                    ),
                ],
                steps,
                disruptions: vec![Disruption::UplinkOutage],
                expect: vec![a, b],
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plan_is_consistent() {
        for s in Scenario::ALL {
            let p = plan(s);
            assert_eq!(Scenario::parse(s.name()), Some(s));
            assert!(!p.expect.is_empty(), "{}", s.name());
            for (j, _) in p.jobs.iter().enumerate() {
                let mut times: Vec<f64> = p.steps.iter().filter(|x| x.job == j).map(|x| x.at_min).collect();
                assert!(!times.is_empty());
                assert!(times.iter().all(|t| *t < 0.0), "{}: events are in the past", s.name());
                let sorted = {
                    let mut t = times.clone();
                    t.sort_by(f64::total_cmp);
                    t
                };
                assert_eq!(times, sorted, "{}: steps of job {j} are in time order", s.name());
                times.dedup();
                // Phase 1 of a job comes after its phase 0.
                let last0 =
                    p.steps.iter().filter(|x| x.job == j && x.phase == 0).map(|x| x.at_min).fold(f64::MIN, f64::max);
                assert!(p.steps.iter().filter(|x| x.job == j && x.phase == 1).all(|x| x.at_min > last0));
                assert!(matches!(p.steps.iter().find(|x| x.job == j).map(|x| &x.kind), Some(Kind::Submitted(_))));
            }
            for e in &p.expect {
                assert!(e.job < p.jobs.len());
                if e.page == Page::WhileWaitingThenResolved {
                    assert!(p.jobs[e.job].urgent, "only urgent jobs are paged on");
                }
            }
            for d in &p.disruptions {
                if let Disruption::AwaitPage(j) = d {
                    assert!(p.jobs[*j].urgent);
                }
            }
        }
    }
}
