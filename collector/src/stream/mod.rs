//! The stream out (gRPC `StreamService.Subscribe`): one resumable, cursor-ordered sequence of what the collector
//! accepted (lifecycle events), what it derived (job changes: state, waiting segment, start-SLO decisions,
//! outcome) and the alerts it raised or resolved.
//!
//! Owns the record format (built here, as protobuf bytes, once per record), the pure job-change derivation
//! ([`JobView`], [`change`]), subscriber filters ([`Filter`]), the live [`Hub`] and the alert [`Outbox`], and the
//! `[stream]` settings. It imports only the domain and the SLO maths; the applier writes and publishes, the
//! alert loop posts to the outbox, the gRPC service (`export::stream`) reads.
//!
//! # Ordering and durability (the contract a subscriber relies on)
//! One writer assigns cursors: the committer. A group commit's event records are written once its log append
//! is synced (the ack waits for that sync only), then the group's job changes (one per job it changed: the view
//! before its first event of the group against the view after the group) and alert changes posted meanwhile;
//! a flush thread makes them durable off the commit path. Records are handed to live subscribers, and become
//! readable by a catch-up ([`Stream::durable`]), only once durable, in cursor order, so a record a subscriber
//! has seen is never lost by a crash and a reconnect after cursor `c` (reading the store's `stream` tree, then
//! live) yields exactly the records after `c`. A crash (or a store failure) can lose records nobody was sent
//! yet: at start (or after the reopen) the event records of log entries past the stream's log marker are
//! added from the log, and a *resync* change (the job's state now) is written for every job whose event
//! records lack their changes.

use crate::job::{JobAttrs, JobState, Segment, Timeline};
use crate::slo::eta::Eta;
use crate::slo::{Contribution, Standing};
use prost::Message;
use startline_proto::labels::Label;
use startline_proto::pb;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `[stream]` as written.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSection {
    /// Keep and serve the stream (default true).
    pub enabled: Option<bool>,
    /// How long records stay resumable (default `24h`, at least `1m`).
    pub retention: Option<String>,
    /// Records a subscriber may fall behind the live stream before it is disconnected (default 100000).
    pub subscriber_buffer: Option<usize>,
    /// Subscribers at once (default 64).
    pub max_subscribers: Option<usize>,
    /// How often a filtered subscriber that received nothing is sent a progress record (default `10s`).
    pub progress_interval: Option<String>,
    /// Longest a record waits for room toward a subscriber (its client not reading) before the call is ended
    /// (default `10s`, at least `100ms`).
    pub send_timeout: Option<String>,
    /// How often every waiting job's expected start is estimated for the stream's expected-start changes
    /// (default `1m`, at least `1s`; `0s` turns them off).
    pub expected_start_interval: Option<String>,
}

/// `[stream]` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamSettings {
    /// Keep and serve the stream.
    pub enabled: bool,
    /// How long records stay resumable.
    pub retention: Duration,
    /// Records a subscriber may fall behind.
    pub subscriber_buffer: usize,
    /// Subscribers at once.
    pub max_subscribers: usize,
    /// Progress records for quiet filtered subscribers.
    pub progress_interval: Duration,
    /// Longest one send to a subscriber may wait for room before the call is ended.
    pub send_timeout: Duration,
    /// How often waiting jobs are estimated for expected-start changes (zero: never).
    pub expected_start_interval: Duration,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            enabled: true,
            retention: Duration::from_secs(86_400),
            subscriber_buffer: 100_000,
            max_subscribers: 64,
            progress_interval: Duration::from_secs(10),
            send_timeout: Duration::from_secs(10),
            expected_start_interval: Duration::from_secs(60),
        }
    }
}

impl StreamSection {
    /// Checks the section, naming each bad field.
    pub fn validate(&self, errs: &mut Vec<String>) -> StreamSettings {
        let d = StreamSettings::default();
        let count =
            |field: &str, v: Option<usize>, lo: usize, hi: usize, default: usize, errs: &mut Vec<String>| match v {
                None => default,
                Some(n) if (lo..=hi).contains(&n) => n,
                Some(n) => {
                    errs.push(format!("stream.{field}: {n} must be between {lo} and {hi}"));
                    default
                }
            };
        StreamSettings {
            enabled: self.enabled.unwrap_or(true),
            retention: crate::settings::duration(
                errs,
                "stream.retention",
                &self.retention,
                d.retention,
                Duration::from_secs(60),
            ),
            subscriber_buffer: count(
                "subscriber_buffer",
                self.subscriber_buffer,
                100,
                10_000_000,
                d.subscriber_buffer,
                errs,
            ),
            max_subscribers: count("max_subscribers", self.max_subscribers, 1, 10_000, d.max_subscribers, errs),
            progress_interval: crate::settings::duration(
                errs,
                "stream.progress_interval",
                &self.progress_interval,
                d.progress_interval,
                Duration::from_millis(100),
            ),
            send_timeout: crate::settings::duration(
                errs,
                "stream.send_timeout",
                &self.send_timeout,
                d.send_timeout,
                Duration::from_millis(100),
            ),
            expected_start_interval: {
                let v = crate::settings::duration(
                    errs,
                    "stream.expected_start_interval",
                    &self.expected_start_interval,
                    d.expected_start_interval,
                    Duration::ZERO,
                );
                if !v.is_zero() && v < Duration::from_secs(1) {
                    errs.push(format!(
                        "stream.expected_start_interval: {} must be at least 1s (or 0s: off)",
                        crate::settings::format_duration(v)
                    ));
                    d.expected_start_interval
                } else {
                    v
                }
            },
        }
    }

    /// Written back with every field set.
    pub fn of(s: &StreamSettings) -> StreamSection {
        StreamSection {
            enabled: Some(s.enabled),
            retention: Some(crate::settings::format_duration(s.retention)),
            subscriber_buffer: Some(s.subscriber_buffer),
            max_subscribers: Some(s.max_subscribers),
            progress_interval: Some(crate::settings::format_duration(s.progress_interval)),
            send_timeout: Some(crate::settings::format_duration(s.send_timeout)),
            expected_start_interval: Some(crate::settings::format_duration(s.expected_start_interval)),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Records.

/// Which kind a record is (a bit of [`Filter::kinds`]).
pub const KIND_EVENT: u8 = 1;
/// A job change.
pub const KIND_CHANGE: u8 = 2;
/// An alert change.
pub const KIND_ALERT: u8 = 4;

/// One record as written and published: its encoded `StreamRecord` and what filters match on.
#[derive(Debug, Clone)]
pub struct Rec {
    /// Its cursor.
    pub cursor: u64,
    /// `KIND_*`.
    pub kind: u8,
    /// The encoded `StreamRecord`.
    pub bytes: Arc<[u8]>,
}

/// The header every record carries: job and its filter attributes.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// The job (empty for alerts about no single job).
    pub job_id: String,
    /// Pool, priority, team when known.
    pub pool: String,
    /// Priority class.
    pub priority: i32,
    /// Team.
    pub team: String,
}

impl Subject {
    /// The subject of a job with (possibly unknown) attributes.
    pub fn job(job_id: &str, attrs: Option<&JobAttrs>) -> Subject {
        match attrs {
            Some(a) => Subject {
                job_id: job_id.to_string(),
                pool: a.pool.clone(),
                priority: a.priority as i32,
                team: a.team.clone(),
            },
            None => Subject { job_id: job_id.to_string(), ..Subject::default() },
        }
    }

    /// The subject of an alert: its job, pool, priority and team labels where it has them.
    pub fn alert(labels: &std::collections::BTreeMap<String, String>) -> Subject {
        let l = |k: &str| labels.get(k).cloned().unwrap_or_default();
        Subject {
            job_id: l("job_id"),
            pool: l("pool"),
            priority: labels.get("priority").and_then(|p| pb::PriorityClass::from_label(p)).map_or(0, |p| p as i32),
            team: l("team"),
        }
    }

    fn header(&self, cursor: u64, at_ms: i64) -> pb::StreamRecord {
        pb::StreamRecord {
            cursor,
            recorded_at: Some(startline_proto::time::ms_to_timestamp(at_ms)),
            job_id: self.job_id.clone(),
            pool: self.pool.clone(),
            priority: self.priority,
            team: self.team.clone(),
            record: None,
        }
    }
}

/// An accepted event's record, built from its stored protobuf bytes without decoding them: the header's encoding
/// followed by field 10 (`AcceptedEvent { seq, event }`), which protobuf reads as the same message.
pub fn event_record(cursor: u64, at_ms: i64, subject: &Subject, seq: u64, event_protobuf: &[u8]) -> Rec {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
    let header = subject.header(cursor, at_ms);
    let inner_len =
        1 + encoded_len_varint(seq) + 1 + encoded_len_varint(event_protobuf.len() as u64) + event_protobuf.len();
    let mut out = Vec::with_capacity(header.encoded_len() + 2 + encoded_len_varint(inner_len as u64) + inner_len);
    // Encoding into a Vec cannot fail.
    let _ = header.encode(&mut out);
    encode_key(10, WireType::LengthDelimited, &mut out);
    encode_varint(inner_len as u64, &mut out);
    encode_key(1, WireType::Varint, &mut out);
    encode_varint(seq, &mut out);
    encode_key(2, WireType::LengthDelimited, &mut out);
    encode_varint(event_protobuf.len() as u64, &mut out);
    out.extend_from_slice(event_protobuf);
    Rec { cursor, kind: KIND_EVENT, bytes: out.into() }
}

/// A job change's record.
pub fn change_record(cursor: u64, at_ms: i64, subject: &Subject, change: pb::JobChange) -> Rec {
    let mut r = subject.header(cursor, at_ms);
    r.record = Some(pb::stream_record::Record::Change(change));
    Rec { cursor, kind: KIND_CHANGE, bytes: r.encode_to_vec().into() }
}

/// An alert change's record.
pub fn alert_record(cursor: u64, at_ms: i64, alert: &AlertNote) -> Rec {
    let mut r = Subject::alert(&alert.labels).header(cursor, at_ms);
    let ts = startline_proto::time::ms_to_timestamp;
    r.record = Some(pb::stream_record::Record::Alert(pb::AlertChange {
        key: alert.key.clone(),
        labels: alert.labels.clone().into_iter().collect(),
        annotations: alert.annotations.clone().into_iter().collect(),
        status: if alert.resolved_at_ms.is_some() { "resolved" } else { "firing" }.to_string(),
        starts_at: Some(ts(alert.starts_at_ms)),
        ends_at: alert.resolved_at_ms.map(ts),
    }));
    Rec { cursor, kind: KIND_ALERT, bytes: r.encode_to_vec().into() }
}

/// The kind of an encoded or decoded record.
pub fn kind_of(r: &pb::StreamRecord) -> u8 {
    match r.record {
        Some(pb::stream_record::Record::Event(_)) => KIND_EVENT,
        Some(pb::stream_record::Record::Change(_)) => KIND_CHANGE,
        Some(pb::stream_record::Record::Alert(_)) => KIND_ALERT,
        _ => 0,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Job changes (pure).

/// What a subscriber sees of a job: compared before and after each event.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobView {
    /// State.
    pub state: Option<JobState>,
    /// The open waiting segment.
    pub segment: Option<Segment>,
    /// Outcome once done.
    pub outcome: Option<pb::Outcome>,
    /// Decided start SLOs: (SLO index, good, time to first step ms).
    pub decided: Vec<(u16, bool, Option<i64>)>,
    /// What the first step was observed from, once the job started.
    pub first_step_origin: Option<pb::StepOrigin>,
}

impl JobView {
    /// The view of a timeline and its SLO contributions.
    pub fn of(t: &Timeline, contributions: &[Contribution]) -> JobView {
        JobView {
            state: Some(t.state),
            segment: t.current_wait.map(|(s, _)| s),
            outcome: if t.state == JobState::Done { t.outcome } else { None },
            decided: contributions
                .iter()
                .filter_map(|c| match c.standing {
                    Standing::Good { .. } => Some((c.slo, true, c.ttfs.map(|x| x.1))),
                    Standing::Bad { .. } => Some((c.slo, false, c.ttfs.map(|x| x.1))),
                    _ => None,
                })
                .collect(),
            first_step_origin: t.first_step_at.and(t.first_step_origin),
        }
    }
}

/// The change from `before` (none for a job new to the collector) to `after`, if a subscriber would see one;
/// `slo_name` names an SLO by its index.
pub fn change(
    before: Option<&JobView>,
    after: &JobView,
    event_seq: u64,
    slo_name: impl Fn(u16) -> String,
) -> Option<pb::JobChange> {
    let empty = JobView::default();
    let before = before.unwrap_or(&empty);
    let decisions: Vec<pb::SloDecision> = after
        .decided
        .iter()
        .filter(|d| !before.decided.contains(d))
        .map(|(slo, good, ttfs)| pb::SloDecision {
            slo: slo_name(*slo),
            verdict: if *good { "good" } else { "bad" }.to_string(),
            time_to_first_step_seconds: ttfs.map(|ms| ms as f64 / 1000.0),
            first_step_origin: ttfs.and(after.first_step_origin).unwrap_or_default() as i32,
        })
        .collect();
    if before.state == after.state
        && before.segment == after.segment
        && before.outcome == after.outcome
        && decisions.is_empty()
    {
        return None;
    }
    Some(pb::JobChange {
        event_seq,
        previous_state: before.state.map(|s| s.label().to_string()).unwrap_or_default(),
        state: after.state.map(|s| s.label().to_string()).unwrap_or_default(),
        previous_segment: before.segment.map(Segment::label).unwrap_or_default(),
        segment: after.segment.map(Segment::label).unwrap_or_default(),
        slo_decisions: decisions,
        outcome: after.outcome.map(|o| o.label().to_string()).unwrap_or_default(),
        resync: false,
        expected_start: None,
    })
}

/// A resync change: the job's view now, for a subscriber whose earlier change records were lost in a crash.
pub fn resync(after: &JobView, slo_name: impl Fn(u16) -> String) -> pb::JobChange {
    let mut c = change(None, after, 0, slo_name).unwrap_or_default();
    c.resync = true;
    c.state = after.state.map(|s| s.label().to_string()).unwrap_or_default();
    c
}

/// A waiting job's expected start, estimated for the stream (the applier's estimate sweep posts these; the
/// committer writes them while the job is still in the state and segment it was estimated in).
#[derive(Debug, Clone)]
pub struct EstimateNote {
    /// The job (its filter subject is taken when the record is written, from its attributes then).
    pub job_id: String,
    /// Its state when estimated.
    pub state: JobState,
    /// Its open waiting segment when estimated.
    pub segment: Option<Segment>,
    /// The estimate.
    pub eta: Eta,
}

impl EstimateNote {
    /// Whether the job is still in the view it was estimated in.
    pub fn holds_for(&self, t: &Timeline) -> bool {
        t.state == self.state && t.current_wait.map(|(s, _)| s) == self.segment
    }
}

/// The change record of an expected start: state and segment unchanged, `expected_start` set; `event_seq` is the
/// job's newest event.
pub fn expected_start_change(note: &EstimateNote, event_seq: u64) -> pb::JobChange {
    use startline_proto::time::ms_to_timestamp;
    let state = note.state.label().to_string();
    let segment = note.segment.map(Segment::label).unwrap_or_default();
    let e = &note.eta;
    pb::JobChange {
        event_seq,
        previous_state: state.clone(),
        state,
        previous_segment: segment.clone(),
        segment,
        expected_start: Some(pb::ExpectedStart {
            at: Some(ms_to_timestamp(e.at_ms)),
            low: Some(ms_to_timestamp(e.low_ms)),
            high: Some(ms_to_timestamp(e.high_ms)),
            basis: e.basis.label().to_string(),
            comparable_jobs: e.comparable_jobs as u64,
            waited_seconds: e.waited_ms as f64 / 1000.0,
        }),
        ..pb::JobChange::default()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Filters.

/// A subscriber's filters (all must match; a list matches any of its values).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    /// Pools.
    pub pools: Vec<String>,
    /// Priority classes.
    pub priorities: Vec<i32>,
    /// Teams.
    pub teams: Vec<String>,
    /// Job id prefix.
    pub job_id_prefix: String,
    /// `KIND_*` bits wanted.
    pub kinds: u8,
}

impl Filter {
    /// Reads a request's filters; a bad one is `(field, why)`.
    pub fn of(req: &pb::SubscribeRequest) -> Result<Filter, (String, String)> {
        let bad = |f: &str, why: &str| Err((f.to_string(), why.to_string()));
        for (field, list) in [("pools", &req.pools), ("teams", &req.teams)] {
            if list.len() > 64 {
                return bad(field, "at most 64 values");
            }
            if let Some(i) = list.iter().position(|v| v.is_empty() || v.len() > 256) {
                return Err((format!("{field}[{i}]"), "must be 1 to 256 bytes".to_string()));
            }
        }
        if req.job_id_prefix.len() > 512 {
            return bad("job_id_prefix", "must be at most 512 bytes");
        }
        for (i, p) in req.priorities.iter().enumerate() {
            match pb::PriorityClass::try_from(*p) {
                Ok(pb::PriorityClass::Unspecified) | Err(_) => {
                    return Err((
                        format!("priorities[{i}]"),
                        format!("{p} is not a priority class (1 normal, 2 urgent)"),
                    ))
                }
                Ok(_) => {}
            }
        }
        let mut kinds = 0;
        for (i, k) in req.kinds.iter().enumerate() {
            kinds |= match k.as_str() {
                "event" => KIND_EVENT,
                "change" => KIND_CHANGE,
                "alert" => KIND_ALERT,
                _ => return Err((format!("kinds[{i}]"), format!("{k:?} is not one of event, change, alert"))),
            };
        }
        Ok(Filter {
            pools: req.pools.clone(),
            priorities: req.priorities.clone(),
            teams: req.teams.clone(),
            job_id_prefix: req.job_id_prefix.clone(),
            kinds: if kinds == 0 { KIND_EVENT | KIND_CHANGE | KIND_ALERT } else { kinds },
        })
    }

    /// Whether the filter needs the record's header (anything but kinds).
    fn needs_header(&self) -> bool {
        !(self.pools.is_empty() && self.priorities.is_empty() && self.teams.is_empty() && self.job_id_prefix.is_empty())
    }

    /// Whether a decoded record passes.
    pub fn matches(&self, r: &pb::StreamRecord) -> bool {
        if kind_of(r) & self.kinds == 0 {
            return false;
        }
        if !self.needs_header() {
            return true;
        }
        (self.pools.is_empty() || self.pools.contains(&r.pool))
            && (self.priorities.is_empty() || self.priorities.contains(&r.priority))
            && (self.teams.is_empty() || self.teams.contains(&r.team))
            && r.job_id.starts_with(&self.job_id_prefix)
    }

    /// Decodes a published record if it passes (kind first, without decoding).
    pub fn decode_if_match(&self, rec: &Rec) -> Option<pb::StreamRecord> {
        if rec.kind & self.kinds == 0 {
            return None;
        }
        let r = pb::StreamRecord::decode(&*rec.bytes).ok()?;
        self.matches(&r).then_some(r)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The live hub and the alert outbox.

/// Why a live subscription ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// It fell more than its buffer behind; the first record it did not get.
    Overflow {
        /// That record's cursor.
        first_missed: u64,
    },
    /// The collector is stopping.
    Closed,
}

struct Sub {
    tx: tokio::sync::mpsc::UnboundedSender<Arc<[Rec]>>,
    queued: Arc<AtomicU64>,
    max: u64,
    ended: Arc<Mutex<Option<Ended>>>,
}

/// Live subscribers of durable records. Publishing never waits: a subscriber whose queue would pass its buffer is
/// disconnected (told the first cursor it missed), never slowed down to.
#[derive(Default)]
pub struct Hub {
    subs: Mutex<Vec<Sub>>,
    count: AtomicU64,
}

/// A live subscription.
pub struct Live {
    rx: tokio::sync::mpsc::UnboundedReceiver<Arc<[Rec]>>,
    queued: Arc<AtomicU64>,
    ended: Arc<Mutex<Option<Ended>>>,
}

impl Live {
    /// Whether the hub already disconnected this subscription for falling more than its buffer behind (the
    /// records queued before it still come from [`Live::recv`]).
    pub fn overflowed(&self) -> bool {
        matches!(*self.ended.lock().unwrap_or_else(|p| p.into_inner()), Some(Ended::Overflow { .. }))
    }

    /// The next batch of records, or why there are no more.
    pub async fn recv(&mut self) -> Result<Arc<[Rec]>, Ended> {
        match self.rx.recv().await {
            Some(b) => {
                self.queued.fetch_sub(b.len() as u64, Ordering::Relaxed);
                Ok(b)
            }
            None => Err(self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or(Ended::Closed)),
        }
    }
}

impl Hub {
    /// Subscribes with a buffer of `max` records.
    pub fn subscribe(&self, max: usize) -> Live {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let queued = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(Mutex::new(None));
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.push(Sub { tx, queued: queued.clone(), max: max.max(1) as u64, ended: ended.clone() });
        self.count.store(subs.len() as u64, Ordering::Relaxed);
        Live { rx, queued, ended }
    }

    /// Live subscribers now.
    pub fn subscribers(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Hands durable records (in cursor order) to every subscriber; never waits.
    pub fn publish(&self, recs: Arc<[Rec]>) {
        if recs.is_empty() || self.subscribers() == 0 {
            return;
        }
        let n = recs.len() as u64;
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| {
            let queued = s.queued.load(Ordering::Relaxed);
            if queued > 0 && queued + n > s.max {
                *s.ended.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Ended::Overflow { first_missed: recs[0].cursor });
                return false;
            }
            s.queued.fetch_add(n, Ordering::Relaxed);
            s.tx.send(recs.clone()).is_ok()
        });
        self.count.store(subs.len() as u64, Ordering::Relaxed);
    }

    /// Ends every subscription (shutdown).
    pub fn close(&self) {
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.clear();
        self.count.store(0, Ordering::Relaxed);
    }
}

/// An alert change for the stream (the alert loop's record, copied).
#[derive(Debug, Clone, PartialEq)]
pub struct AlertNote {
    /// Identity.
    pub key: String,
    /// Labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Firing since.
    pub starts_at_ms: i64,
    /// Resolved at.
    pub resolved_at_ms: Option<i64>,
}

/// The stream's shared state: settings, the live hub, and the alert changes waiting for the committer (the one
/// writer of cursors).
pub struct Stream {
    /// Settings.
    pub settings: StreamSettings,
    /// Live subscribers.
    pub hub: Hub,
    outbox: Mutex<Vec<AlertNote>>,
    /// Expected starts waiting for the committer, one per job (the newest posted wins).
    estimates: Mutex<std::collections::HashMap<String, EstimateNote>>,
    /// Jobs whose posted expected start the committer dropped (the job had moved on): the sweep forgets having
    /// posted them, so the next sweep posts their estimate again.
    estimates_dropped: Mutex<Vec<String>>,
    /// Expected-start changes written (self-metric).
    pub expected_starts: AtomicU64,
    /// How long the last estimate sweep took, microseconds (self-metric).
    pub estimate_sweep_micros: AtomicU64,
    /// Records written (self-metric).
    pub written: AtomicU64,
    /// The newest cursor known durable (flushed, or read back from disk at start): catch-up reads stop there, so
    /// a subscriber never sees a record a crash could still lose.
    pub durable: AtomicU64,
    /// Subscribers disconnected for falling behind (self-metric).
    pub overflows: AtomicU64,
    /// Subscribers disconnected because a send to them waited more than `send_timeout` (self-metric).
    pub send_timeouts: AtomicU64,
    /// Woken when alert changes are posted (the committer writes them without waiting for a group commit).
    pub wake: tokio::sync::Notify,
    /// Subscribe calls open (catching up from disk or following live).
    calls: AtomicU64,
}

/// An open Subscribe call, counted until it is dropped.
pub struct CallSlot(Arc<Stream>);

impl Drop for CallSlot {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Stream {
    /// A stream with these settings.
    pub fn new(settings: StreamSettings) -> Arc<Stream> {
        Arc::new(Stream {
            settings,
            hub: Hub::default(),
            outbox: Mutex::new(Vec::new()),
            estimates: Mutex::new(std::collections::HashMap::new()),
            estimates_dropped: Mutex::new(Vec::new()),
            expected_starts: AtomicU64::new(0),
            estimate_sweep_micros: AtomicU64::new(0),
            written: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            send_timeouts: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
            calls: AtomicU64::new(0),
        })
    }

    /// Opens a call if fewer than `max_subscribers` are open (catching up or live).
    pub fn open_call(self: &Arc<Self>) -> Option<CallSlot> {
        let before = self.calls.fetch_add(1, Ordering::Relaxed);
        if before >= self.settings.max_subscribers as u64 {
            self.calls.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(CallSlot(self.clone()))
    }

    /// Subscribe calls open now.
    pub fn open_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Posts alert changes (the committer writes them with its next group or tick).
    pub fn post_alerts(&self, notes: impl IntoIterator<Item = AlertNote>) {
        if !self.settings.enabled {
            return;
        }
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        let before = outbox.len();
        outbox.extend(notes);
        if outbox.len() > before {
            self.wake.notify_one();
        }
    }

    /// Takes the posted alert changes.
    pub fn take_alerts(&self) -> Vec<AlertNote> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether alert changes wait.
    pub fn alerts_waiting(&self) -> bool {
        !self.outbox.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Posts expected starts (the committer writes them with its next group or tick); a job's newer note
    /// replaces one still waiting.
    pub fn post_estimates(&self, notes: impl IntoIterator<Item = EstimateNote>) {
        if !self.settings.enabled {
            return;
        }
        let mut waiting = self.estimates.lock().unwrap_or_else(|p| p.into_inner());
        let mut posted = false;
        for n in notes {
            waiting.insert(n.job_id.clone(), n);
            posted = true;
        }
        drop(waiting);
        if posted {
            self.wake.notify_one();
        }
    }

    /// Takes the posted expected starts, in job order.
    pub fn take_estimates(&self) -> Vec<EstimateNote> {
        let taken = std::mem::take(&mut *self.estimates.lock().unwrap_or_else(|p| p.into_inner()));
        let mut notes: Vec<EstimateNote> = taken.into_values().collect();
        notes.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        notes
    }

    /// Whether expected starts wait.
    pub fn estimates_waiting(&self) -> bool {
        !self.estimates.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Names jobs whose posted expected start was dropped unwritten.
    pub fn estimates_dropped(&self, jobs: impl IntoIterator<Item = String>) {
        self.estimates_dropped.lock().unwrap_or_else(|p| p.into_inner()).extend(jobs);
    }

    /// Takes the jobs whose posted expected start was dropped unwritten.
    pub fn take_estimates_dropped(&self) -> Vec<String> {
        std::mem::take(&mut *self.estimates_dropped.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests;
