//! Sealing history files (`[history]`, [`crate::store::history`]): on the maintenance thread, every
//! `seal_interval`, each UTC day that ended more than `seal_after` ago is written as one Parquet file of its
//! ended jobs, and written again when its jobs changed since (a late event, a retention delete), told by the
//! day's *fingerprint*: the job count and an order-independent hash of each job's id and version (a folded job's
//! summary number, which every refold renews; a hot job's timeline). Steps of a pass:
//!
//! 1. fingerprint the days from the index (rows only: no timeline is filled in);
//! 2. read the files' footers and pick the days to write (fingerprint differs; while folding, only days whose ended
//!    jobs have all folded), to remove (no job left, or older than `store.retention`), and leave alone the days
//!    the folded-row budget deleted jobs from (their file keeps what memory could not);
//! 3. cut those days into ranges of whole hours of at most [`COLLECT_MAX`] jobs; per scan of a few ranges, collect
//!    their jobs (timelines with placements), sort each range by end time and id, append it to its day's open
//!    file, and commit a day after its last range with the fingerprint of what was collected.
//!
//! History files are derived from the jobs (the log keeps every event): a pass that fails (a full disk) leaves
//! the previous files in place and the next pass tries again. Nothing here is on an acknowledgement's path.

use crate::index::{JobRef, SharedIndex};
use crate::job::Timeline;
use crate::store::history::columns::Columns;
use crate::store::history::{day_of, DayWriter, Fingerprint, History, HistoryError, SealStats, SealedDay};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Jobs per read lock while a pass scans.
const SCAN_CHUNK: usize = 4096;
/// Most jobs collected in memory at once (the days written per scan are grouped to stay under it): their
/// timelines are copied out of the index until their range is written, about 1 KB each (10k: ~10 MB, where 50k
/// raised RSS after a restart by ~180 MiB at 200k jobs: `startline-bench core`, BENCHMARKS.md).
pub(super) const COLLECT_MAX: u64 = 10_000;

/// `[history]` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistorySettings {
    /// A day is sealed once it ended this long ago (late reports still change it before that).
    pub seal_after: Duration,
    /// How often days to seal are looked for.
    pub seal_interval: Duration,
}

impl Default for HistorySettings {
    fn default() -> Self {
        HistorySettings { seal_after: Duration::from_secs(3600), seal_interval: Duration::from_secs(600) }
    }
}

/// One seal pass.
pub(super) struct SealPass {
    pub index: SharedIndex,
    pub history: History,
    pub settings: HistorySettings,
    /// `store.retention`.
    pub retention: Option<Duration>,
    /// Whether ended jobs fold (then a day is sealed only once all its jobs folded).
    pub folding: bool,
    pub now: i64,
    pub busy: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub stats: Arc<SealStats>,
    /// Most jobs collected at once ([`COLLECT_MAX`]; tests make it small so days are written in many ranges).
    pub collect_max: u64,
}

/// A day's fingerprint as it is built.
#[derive(Debug, Default, Clone, Copy)]
struct DayPrint {
    jobs: u64,
    hash: u64,
    /// An ended job of the day is still hot (it may change or fold soon).
    hot: bool,
    /// Jobs by the hour (UTC) they ended in: a day is written in ranges of hours of at most [`COLLECT_MAX`] jobs.
    hours: [u32; 24],
}

impl DayPrint {
    fn add(&mut self, job_id: &str, version: u64, done_at: i64) {
        self.jobs += 1;
        self.hours[hour_of(done_at)] += 1;
        self.hash = self.hash.wrapping_add(mix(startline_proto::hash::fnv1a64(job_id.as_bytes()) ^ mix(version)));
    }

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint { jobs: self.jobs, hash: self.hash }
    }
}

/// The UTC hour of the day of a time.
fn hour_of(ms: i64) -> usize {
    (ms.rem_euclid(86_400_000) / 3_600_000) as usize
}

/// splitmix64's finaliser: spreads a 64-bit value over every bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A hot job's version: a hash of its whole timeline (hot jobs are few while folding; without folding every
/// ended job is hashed each pass).
fn hot_version(t: &Timeline) -> u64 {
    startline_proto::hash::fnv1a64(format!("{t:?}").as_bytes()) | 1
}

/// A folded job's version: its summary number (every refold writes a new one) and end time.
fn folded_version(summary: u64, done_at: i64) -> u64 {
    (summary << 1) ^ mix(done_at as u64)
}

/// What a pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SealReport {
    /// Days written.
    pub written: Vec<i64>,
    /// Days removed.
    pub removed: Vec<i64>,
}

impl SealPass {
    /// Runs the pass (and clears `busy`).
    pub fn run(self) -> Result<SealReport, HistoryError> {
        let started = std::time::Instant::now();
        let out = self.pass();
        self.stats.passes.fetch_add(1, Ordering::Relaxed);
        self.stats.last_pass_ms.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        match &out {
            Ok(r) => {
                self.stats.files_written.fetch_add(r.written.len() as u64, Ordering::Relaxed);
                self.stats.files_removed.fetch_add(r.removed.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "sealing history files failed; the next pass tries again");
            }
        }
        self.busy.store(false, Ordering::Release);
        out
    }

    fn pass(&self) -> Result<SealReport, HistoryError> {
        // The last day that may be sealed: it ended `seal_after` ago.
        let seal_after_ms = i64::try_from(self.settings.seal_after.as_millis()).unwrap_or(i64::MAX);
        let last = day_of(self.now.saturating_sub(seal_after_ms)) - 1;
        let frozen_through = day_of(self.index.read().deleted.over_budget_through_ms);
        let expired_before = self
            .retention
            .map(|r| day_of(self.now.saturating_sub(i64::try_from(r.as_millis()).unwrap_or(i64::MAX))) - 1);
        let prints = self.fingerprint_days(last);
        // The footers, read again by every pass (a few hundred small reads at most): a file removed or damaged by
        // hand is written again.
        let sealed = self.history.sealed()?;
        let (write, remove) = plan(&prints, &sealed, last, frozen_through, expired_before);
        let mut report = SealReport::default();
        for day in remove {
            self.history.remove_day(day)?;
            report.removed.push(day);
        }
        let mut open: BTreeMap<i64, (DayWriter, DayPrint)> = BTreeMap::new();
        for scan in scans(&ranges(&write, &prints, self.collect_max), self.collect_max) {
            if self.stop.load(Ordering::Acquire) {
                break; // the open writers are dropped: their partial files removed
            }
            report.written.extend(self.write_ranges(&scan, &mut open)?);
        }
        Ok(report)
    }

    /// Step 1: each day's fingerprint, up to `last`, from rows (and hot ended jobs).
    fn fingerprint_days(&self, last: i64) -> BTreeMap<i64, DayPrint> {
        let mut prints: BTreeMap<i64, DayPrint> = BTreeMap::new();
        let folding = self.folding;
        let prints_cell = std::cell::RefCell::new(&mut prints);
        self.index.scan_unordered(
            SCAN_CHUNK,
            false,
            |id, r| {
                let day = day_of(r.row.done_at());
                if day <= last {
                    prints_cell.borrow_mut().entry(day).or_default().add(
                        id,
                        folded_version(r.row.summary(), r.row.done_at()),
                        r.row.done_at(),
                    );
                }
                false
            },
            |id, job: JobRef<'_>| {
                let t = job.timeline;
                let Some(done) = t.done_at.filter(|_| t.submitted_at.is_some()) else { return };
                let day = day_of(done);
                if day <= last {
                    let mut p = prints_cell.borrow_mut();
                    let e = p.entry(day).or_default();
                    e.add(id, hot_version(t), done);
                    e.hot |= folding;
                }
            },
        );
        prints
    }

    /// Step 3, one scan: collects the jobs of `scan`'s ranges (timelines with placements), appends each range's
    /// jobs, sorted by end and id, to its day's file (opened at the day's first range), and commits the days whose
    /// last range this was, with the fingerprint of the jobs written.
    fn write_ranges(
        &self,
        scan: &[Range],
        open: &mut BTreeMap<i64, (DayWriter, DayPrint)>,
    ) -> Result<Vec<i64>, HistoryError> {
        let wanted: HashMap<(i64, usize), usize> =
            scan.iter().enumerate().flat_map(|(i, r)| (r.from..r.to).map(move |h| ((r.day, h), i))).collect();
        let mut jobs: Vec<Vec<(i64, String, Timeline)>> = vec![Vec::new(); scan.len()];
        let mut prints: Vec<DayPrint> = vec![DayPrint::default(); scan.len()];
        let cell = std::cell::RefCell::new((&mut jobs, &mut prints));
        let range_of = |done: i64| wanted.get(&(day_of(done), hour_of(done))).copied();
        self.index.scan_unordered_with_placements(
            SCAN_CHUNK,
            |id, r| match range_of(r.row.done_at()) {
                Some(i) => {
                    let version = folded_version(r.row.summary(), r.row.done_at());
                    cell.borrow_mut().1[i].add(id, version, r.row.done_at());
                    true
                }
                None => false,
            },
            |id, job: JobRef<'_>| {
                let t = job.timeline;
                let Some(done) = t.done_at.filter(|_| t.submitted_at.is_some()) else { return };
                let Some(i) = range_of(done) else { return };
                let mut c = cell.borrow_mut();
                if !job.folded {
                    c.1[i].add(id, hot_version(t), done);
                }
                c.0[i].push((done, id.to_string(), t.clone()));
            },
        );
        let mut out = Vec::new();
        for ((range, mut rows), print) in scan.iter().zip(jobs).zip(prints) {
            rows.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            let (writer, day_print) = match open.entry(range.day) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert((self.history.begin_day(range.day)?, DayPrint::default()))
                }
            };
            day_print.jobs += print.jobs;
            day_print.hash = day_print.hash.wrapping_add(print.hash);
            if !rows.is_empty() {
                let mut cols = Columns::default();
                for (_, id, t) in &rows {
                    cols.push(id, t);
                }
                let batch = cols.finish().map_err(|e| HistoryError::Format {
                    path: self.history.file_of(range.day),
                    message: e.to_string(),
                })?;
                writer.append(&batch)?;
                self.stats.jobs_written.fetch_add(rows.len() as u64, Ordering::Relaxed);
            }
            if range.last {
                if let Some((writer, print)) = open.remove(&range.day) {
                    writer.commit(print.fingerprint())?;
                    out.push(range.day);
                }
            }
        }
        Ok(out)
    }
}

/// Step 2 of a pass: the days to write (their fingerprint differs from the file's; not while an ended job of the
/// day is hot; never a day the memory budget deleted from, nor one past retention) and the days to remove (past
/// retention, or sealable with no job left and not frozen). `last` is the last sealable day.
fn plan(
    prints: &BTreeMap<i64, DayPrint>,
    sealed: &BTreeMap<i64, SealedDay>,
    last: i64,
    frozen_through: i64,
    expired_before: Option<i64>,
) -> (Vec<i64>, Vec<i64>) {
    let expired = |d: i64| expired_before.is_some_and(|e| d <= e);
    let write = prints
        .iter()
        .filter(|(d, p)| !p.hot && **d > frozen_through && !expired(**d))
        .filter(|(d, p)| sealed.get(d).map(|s| s.fingerprint) != Some(p.fingerprint()))
        .map(|(d, _)| *d)
        .collect();
    let remove = sealed
        .keys()
        .copied()
        .filter(|d| expired(*d) || (*d > frozen_through && !prints.contains_key(d) && *d <= last))
        .collect();
    (write, remove)
}

/// Hours `from..to` of a day's ended jobs, written together; `last`: the day's last range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    day: i64,
    from: usize,
    to: usize,
    jobs: u64,
    last: bool,
}

/// Each day to write cut into ranges of whole hours holding at most `cap` jobs (an hour holding more
/// is a range alone), in day and hour order.
fn ranges(days: &[i64], prints: &BTreeMap<i64, DayPrint>, cap: u64) -> Vec<Range> {
    let mut out = Vec::new();
    for day in days {
        let hours = prints.get(day).map(|p| p.hours).unwrap_or_default();
        let mut from = 0;
        let mut jobs = 0u64;
        for (h, n) in hours.iter().enumerate() {
            let n = u64::from(*n);
            if h > from && jobs + n > cap {
                out.push(Range { day: *day, from, to: h, jobs, last: false });
                from = h;
                jobs = 0;
            }
            jobs += n;
        }
        out.push(Range { day: *day, from, to: 24, jobs, last: true });
    }
    out
}

/// Ranges grouped into scans of at most `cap` jobs each (a larger range is a scan alone), in order.
fn scans(ranges: &[Range], cap: u64) -> Vec<Vec<Range>> {
    let mut out: Vec<Vec<Range>> = Vec::new();
    let mut size = 0u64;
    for r in ranges {
        match out.last_mut() {
            Some(g) if size + r.jobs <= cap => {
                g.push(*r);
                size += r.jobs;
            }
            _ => {
                out.push(vec![*r]);
                size = r.jobs;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
