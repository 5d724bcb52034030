//! The history file's columns: one row per ended job, named as the API's job fields, built from the job's
//! [`Timeline`] with Arrow's array builders. Durations are exact integer milliseconds and GPU time exact integer
//! GPU-milliseconds (a warehouse's integer sums then equal the collector's); times are UTC timestamps in
//! milliseconds.

use crate::job::goodput::account;
use crate::job::Timeline;
use arrow_array::builder::{
    Int32Builder, Int64Builder, ListBuilder, MapBuilder, StringBuilder, TimestampMillisecondBuilder, UInt32Builder,
    UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, Field, Schema};
use startline_proto::labels::Label;
use std::sync::Arc;

/// The goodput categories as column names, in [`crate::job::goodput::CATEGORIES`] order, then the total.
pub const GPU_MS_COLUMNS: [&str; 8] = [
    "waiting_gpu_ms",
    "preparing_gpu_ms",
    "requeue_wait_gpu_ms",
    "checkpoint_gpu_ms",
    "lost_gpu_ms",
    "failed_gpu_ms",
    "productive_gpu_ms",
    "total_gpu_ms",
];

/// Accumulates jobs into columns.
pub struct Columns {
    rows: usize,
    job_id: StringBuilder,
    pool_kind: StringBuilder,
    provider: StringBuilder,
    pool: StringBuilder,
    priority: StringBuilder,
    gpu_class: StringBuilder,
    gpu_count: UInt32Builder,
    node_count: UInt32Builder,
    region: StringBuilder,
    team: StringBuilder,
    project: StringBuilder,
    chain_id: StringBuilder,
    chain_stage: StringBuilder,
    labels: MapBuilder<StringBuilder, StringBuilder>,
    submitted_at: TimestampMillisecondBuilder,
    first_queued_at: TimestampMillisecondBuilder,
    node_assigned_at: TimestampMillisecondBuilder,
    preparing_at: TimestampMillisecondBuilder,
    first_step_at: TimestampMillisecondBuilder,
    ended_at: TimestampMillisecondBuilder,
    last_checkpoint_at: TimestampMillisecondBuilder,
    first_step_origin: StringBuilder,
    outcome: StringBuilder,
    exit_code: Int32Builder,
    time_to_first_step_ms: Int64Builder,
    initial_wait_ms: MapBuilder<StringBuilder, Int64Builder>,
    requeue_wait_ms: Int64Builder,
    lost_work_ms: Int64Builder,
    checkpoint_save_ms: Int64Builder,
    failed_work_ms: Int64Builder,
    runs: UInt32Builder,
    attempts: UInt32Builder,
    preemptions: UInt32Builder,
    node_losses: UInt32Builder,
    lost_steps: UInt64Builder,
    max_step: UInt64Builder,
    last_checkpoint_step: UInt64Builder,
    gpu_ms: [Int64Builder; 8],
    nodes: ListBuilder<StringBuilder>,
}

fn utc() -> TimestampMillisecondBuilder {
    TimestampMillisecondBuilder::new().with_timezone("UTC")
}

impl Default for Columns {
    fn default() -> Self {
        Columns {
            rows: 0,
            job_id: StringBuilder::new(),
            pool_kind: StringBuilder::new(),
            provider: StringBuilder::new(),
            pool: StringBuilder::new(),
            priority: StringBuilder::new(),
            gpu_class: StringBuilder::new(),
            gpu_count: UInt32Builder::new(),
            node_count: UInt32Builder::new(),
            region: StringBuilder::new(),
            team: StringBuilder::new(),
            project: StringBuilder::new(),
            chain_id: StringBuilder::new(),
            chain_stage: StringBuilder::new(),
            labels: MapBuilder::new(None, StringBuilder::new(), StringBuilder::new()),
            submitted_at: utc(),
            first_queued_at: utc(),
            node_assigned_at: utc(),
            preparing_at: utc(),
            first_step_at: utc(),
            ended_at: utc(),
            last_checkpoint_at: utc(),
            first_step_origin: StringBuilder::new(),
            outcome: StringBuilder::new(),
            exit_code: Int32Builder::new(),
            time_to_first_step_ms: Int64Builder::new(),
            initial_wait_ms: MapBuilder::new(None, StringBuilder::new(), Int64Builder::new()),
            requeue_wait_ms: Int64Builder::new(),
            lost_work_ms: Int64Builder::new(),
            checkpoint_save_ms: Int64Builder::new(),
            failed_work_ms: Int64Builder::new(),
            runs: UInt32Builder::new(),
            attempts: UInt32Builder::new(),
            preemptions: UInt32Builder::new(),
            node_losses: UInt32Builder::new(),
            lost_steps: UInt64Builder::new(),
            max_step: UInt64Builder::new(),
            last_checkpoint_step: UInt64Builder::new(),
            gpu_ms: std::array::from_fn(|_| Int64Builder::new()),
            nodes: ListBuilder::new(StringBuilder::new()),
        }
    }
}

impl Columns {
    /// Rows added so far.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Adds an ended job; a job without its `submitted` or its end is skipped (returns false): it has no row.
    pub fn push(&mut self, job_id: &str, t: &Timeline) -> bool {
        let (Some(attrs), Some(submitted), Some(ended), Some(acc)) =
            (t.attrs.as_deref(), t.submitted_at, t.done_at, t.done_at.and_then(|d| account(t, d)))
        else {
            return false;
        };
        self.rows += 1;
        self.job_id.append_value(job_id);
        self.pool_kind.append_value(attrs.pool_kind.label());
        self.provider.append_value(&attrs.provider);
        self.pool.append_value(&attrs.pool);
        self.priority.append_value(attrs.priority.label());
        self.gpu_class.append_value(&attrs.gpu_class);
        self.gpu_count.append_value(attrs.gpu_count);
        self.node_count.append_value(attrs.node_count);
        self.region.append_value(&attrs.region);
        self.team.append_value(&attrs.team);
        self.project.append_value(&attrs.project);
        self.chain_id.append_value(&attrs.chain_id);
        self.chain_stage.append_value(&attrs.chain_stage);
        for (k, v) in &attrs.labels {
            self.labels.keys().append_value(k);
            self.labels.values().append_value(v);
        }
        // A map builder only fails when keys and values differ in length: they were appended in pairs.
        let _ = self.labels.append(true);
        self.submitted_at.append_value(submitted);
        self.first_queued_at.append_option(t.first_queued_at);
        self.node_assigned_at.append_option(t.node_assigned_at);
        self.preparing_at.append_option(t.preparing_at);
        self.first_step_at.append_option(t.first_step_at);
        self.ended_at.append_value(ended);
        self.last_checkpoint_at.append_option(t.last_checkpoint.map(|c| c.0));
        self.first_step_origin.append_option(t.first_step_at.map(|_| t.first_step_origin.unwrap_or_default().label()));
        self.outcome.append_option(t.outcome.map(|o| o.label()));
        self.exit_code.append_option(t.exit_code);
        self.time_to_first_step_ms.append_option(t.time_to_first_step_ms());
        for (seg, ms) in t.initial_wait_ms.iter() {
            self.initial_wait_ms.keys().append_value(seg.label());
            self.initial_wait_ms.values().append_value(*ms);
        }
        let _ = self.initial_wait_ms.append(true);
        self.requeue_wait_ms.append_value(t.requeue_wait_ms);
        self.lost_work_ms.append_value(t.lost_work_ms);
        self.checkpoint_save_ms.append_value(t.checkpoint_save_ms);
        self.failed_work_ms.append_value(t.failed_work_ms);
        self.runs.append_value(t.runs);
        self.attempts.append_value(t.attempts);
        self.preemptions.append_value(t.preemptions);
        self.node_losses.append_value(t.node_losses);
        self.lost_steps.append_value(t.lost_steps);
        self.max_step.append_option(t.max_step);
        self.last_checkpoint_step.append_option(t.last_checkpoint.map(|c| c.1));
        let gpus = i64::from(acc.gpus);
        let by = acc.by_category();
        for (b, ms) in self.gpu_ms.iter_mut().zip(by.iter().chain(std::iter::once(&acc.total))) {
            b.append_value(ms.saturating_mul(gpus));
        }
        let mut seen: Vec<&str> = Vec::new();
        for p in &t.placements {
            for n in p.nodes.iter() {
                if !seen.contains(&&**n) {
                    seen.push(n);
                    self.nodes.values().append_value(n);
                }
            }
        }
        self.nodes.append(true);
        true
    }

    /// The columns as one record batch (the builders are emptied).
    pub fn finish(&mut self) -> Result<RecordBatch, ArrowError> {
        self.rows = 0;
        let mut cols: Vec<(&str, ArrayRef, bool)> = vec![
            ("job_id", Arc::new(self.job_id.finish()), false),
            ("pool_kind", Arc::new(self.pool_kind.finish()), false),
            ("provider", Arc::new(self.provider.finish()), false),
            ("pool", Arc::new(self.pool.finish()), false),
            ("priority", Arc::new(self.priority.finish()), false),
            ("gpu_class", Arc::new(self.gpu_class.finish()), false),
            ("gpu_count", Arc::new(self.gpu_count.finish()), false),
            ("node_count", Arc::new(self.node_count.finish()), false),
            ("region", Arc::new(self.region.finish()), false),
            ("team", Arc::new(self.team.finish()), false),
            ("project", Arc::new(self.project.finish()), false),
            ("chain_id", Arc::new(self.chain_id.finish()), false),
            ("chain_stage", Arc::new(self.chain_stage.finish()), false),
            ("labels", Arc::new(self.labels.finish()), false),
            ("submitted_at", Arc::new(self.submitted_at.finish()), false),
            ("first_queued_at", Arc::new(self.first_queued_at.finish()), true),
            ("node_assigned_at", Arc::new(self.node_assigned_at.finish()), true),
            ("preparing_at", Arc::new(self.preparing_at.finish()), true),
            ("first_step_at", Arc::new(self.first_step_at.finish()), true),
            ("ended_at", Arc::new(self.ended_at.finish()), false),
            ("last_checkpoint_at", Arc::new(self.last_checkpoint_at.finish()), true),
            ("first_step_origin", Arc::new(self.first_step_origin.finish()), true),
            ("outcome", Arc::new(self.outcome.finish()), true),
            ("exit_code", Arc::new(self.exit_code.finish()), true),
            ("time_to_first_step_ms", Arc::new(self.time_to_first_step_ms.finish()), true),
            ("initial_wait_ms", Arc::new(self.initial_wait_ms.finish()), false),
            ("requeue_wait_ms", Arc::new(self.requeue_wait_ms.finish()), false),
            ("lost_work_ms", Arc::new(self.lost_work_ms.finish()), false),
            ("checkpoint_save_ms", Arc::new(self.checkpoint_save_ms.finish()), false),
            ("failed_work_ms", Arc::new(self.failed_work_ms.finish()), false),
            ("runs", Arc::new(self.runs.finish()), false),
            ("attempts", Arc::new(self.attempts.finish()), false),
            ("preemptions", Arc::new(self.preemptions.finish()), false),
            ("node_losses", Arc::new(self.node_losses.finish()), false),
            ("lost_steps", Arc::new(self.lost_steps.finish()), false),
            ("max_step", Arc::new(self.max_step.finish()), true),
            ("last_checkpoint_step", Arc::new(self.last_checkpoint_step.finish()), true),
        ];
        for (name, b) in GPU_MS_COLUMNS.iter().zip(self.gpu_ms.iter_mut()) {
            cols.push((name, Arc::new(b.finish()), false));
        }
        cols.push(("nodes", Arc::new(self.nodes.finish()), false));
        let fields: Vec<Field> =
            cols.iter().map(|(n, a, nullable)| Field::new(*n, a.data_type().clone(), *nullable)).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols.into_iter().map(|(_, a, _)| a).collect())
    }
}
