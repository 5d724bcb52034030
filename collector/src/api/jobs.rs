//! `GET /api/v1/jobs` (filtered; ordered by submit time, end time or job id, newest first by default; paged by a
//! token naming the last job shown) and `GET /api/v1/jobs/{job_id}`.

use super::eta::ExpectedStart;
use super::extract::{quote, ApiPath, Params};
use super::types::{Job, JobList};
use super::{ApiError, ApiState};
use crate::index::FoldedRef;
use crate::job::{CompactEvent, EventKind, JobAttrs, JobRecord, JobState, Timeline};
use crate::slo::eta;
use crate::time::parse_time;
use axum::extract::State;
use axum::Json;
use startline_proto::labels::Label;
use startline_proto::pb;
use std::collections::{BinaryHeap, HashMap};

/// Filters of a job listing.
#[derive(Debug, Default)]
struct Filter {
    pool_kind: Option<pb::PoolKind>,
    provider: Option<String>,
    pool: Option<String>,
    priority: Option<pb::PriorityClass>,
    gpu_class: Option<String>,
    region: Option<String>,
    team: Option<String>,
    project: Option<String>,
    state: Option<JobState>,
    submitted_after: Option<i64>,
    submitted_before: Option<i64>,
}

impl Filter {
    fn matches(&self, t: &Timeline) -> bool {
        if self.state.is_some_and(|s| s != t.state) {
            return false;
        }
        if let Some(after) = self.submitted_after {
            if t.submitted_at.is_none_or(|s| s < after) {
                return false;
            }
        }
        if let Some(before) = self.submitted_before {
            if t.submitted_at.is_none_or(|s| s >= before) {
                return false;
            }
        }
        if !self.attr_filtered() {
            return true;
        }
        t.attrs.as_ref().is_some_and(|a| self.attrs_match(a))
    }

    /// Whether a folded job (always done) can match, from its row alone: its attributes' verdict is worked out
    /// once per attribute set (`memo`, by the row's attribute number), not once per job.
    fn matches_row(&self, r: FoldedRef<'_>, memo: &mut HashMap<u32, bool>) -> bool {
        if self.state.is_some_and(|s| s != JobState::Done) {
            return false;
        }
        let at = r.row.submitted_at();
        if self.submitted_after.is_some_and(|after| at < after) || self.submitted_before.is_some_and(|b| at >= b) {
            return false;
        }
        *memo.entry(r.row.attrs).or_insert_with(|| self.attrs_match(r.attrs))
    }

    fn attr_filtered(&self) -> bool {
        self.pool_kind.is_some()
            || self.provider.is_some()
            || self.pool.is_some()
            || self.priority.is_some()
            || self.gpu_class.is_some()
            || self.region.is_some()
            || self.team.is_some()
            || self.project.is_some()
    }

    fn attrs_match(&self, a: &JobAttrs) -> bool {
        let eq = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        self.pool_kind.is_none_or(|k| k == a.pool_kind)
            && eq(&self.provider, &a.provider)
            && eq(&self.pool, &a.pool)
            && self.priority.is_none_or(|p| p == a.priority)
            && eq(&self.gpu_class, &a.gpu_class)
            && eq(&self.region, &a.region)
            && eq(&self.team, &a.team)
            && eq(&self.project, &a.project)
    }
}

/// What a listing is ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Job id (bytewise).
    JobId,
    /// Submit time; jobs whose `submitted` is not known come last.
    SubmittedAt,
    /// End time; jobs that have not ended come last.
    EndedAt,
}

/// A listing's order: the key, its direction, then the job id ascending (a total order, so a page token names
/// one place in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sort {
    order: Order,
    desc: bool,
}

/// A job's place in a [`Sort`]: (the key is missing, the key (bitwise-negated when descending), the job id).
type Place = (bool, i64, String);

impl Sort {
    fn parse(order: Option<&str>, desc: Option<&str>) -> Result<Sort, ApiError> {
        let order = match order.unwrap_or("submitted_at") {
            "submitted_at" => Order::SubmittedAt,
            "ended_at" => Order::EndedAt,
            "job_id" => Order::JobId,
            v => {
                return Err(ApiError::bad_request(format!("order: {v:?} is not one of submitted_at, ended_at, job_id")))
            }
        };
        let desc = match desc {
            None => order != Order::JobId,
            Some("true") => true,
            Some("false") => false,
            Some(v) => return Err(ApiError::bad_request(format!("desc: {v:?} is not true or false"))),
        };
        Ok(Sort { order, desc })
    }

    /// The job-id order the index walks natively (a page is read from the token on, stopping when full).
    fn is_native(self) -> bool {
        self.order == Order::JobId && !self.desc
    }

    fn place(self, id: &str, submitted_at: Option<i64>, done_at: Option<i64>) -> Place {
        let key = match self.order {
            Order::JobId => Some(0),
            Order::SubmittedAt => submitted_at,
            Order::EndedAt => done_at,
        };
        let sortable = key.map_or(0, |k| if self.desc { !k } else { k });
        (key.is_none(), sortable, id.to_string())
    }

    /// The token naming `place`: the job id alone in job-id order, else `KEY.JOB_ID` (`-` for a missing key).
    fn token(self, place: &Place) -> String {
        if self.order == Order::JobId {
            return place.2.clone();
        }
        match place.0 {
            true => format!("-.{}", place.2),
            false => format!("{}.{}", if self.desc { !place.1 } else { place.1 }, place.2),
        }
    }

    fn parse_token(self, token: &str) -> Result<Place, ApiError> {
        if self.order == Order::JobId {
            return Ok((false, 0, token.to_string()));
        }
        let bad = || ApiError::bad_request(format!("page_token: {token:?} is not a token of this order"));
        let (key, id) = token.split_once('.').ok_or_else(bad)?;
        if key == "-" {
            return Ok((true, 0, id.to_string()));
        }
        let k: i64 = key.parse().map_err(|_| bad())?;
        Ok((false, if self.desc { !k } else { k }, id.to_string()))
    }
}

/// The `limit + 1` first places after the token, in order: a bounded max-heap over one scan.
struct FirstPlaces {
    keep: usize,
    after: Option<Place>,
    heap: BinaryHeap<Place>,
}

impl FirstPlaces {
    fn offer(&mut self, place: Place) {
        if self.after.as_ref().is_some_and(|a| place <= *a) {
            return;
        }
        if self.heap.len() < self.keep {
            self.heap.push(place);
        } else if self.heap.peek().is_some_and(|top| place < *top) {
            self.heap.pop();
            self.heap.push(place);
        }
    }
}

fn enum_param<T: Label>(name: &str, v: &str) -> Result<T, ApiError> {
    T::from_label(v).ok_or_else(|| {
        let names: Vec<&str> = T::all().iter().skip(1).map(|x| x.label()).collect();
        ApiError::bad_request(format!("{name}: {v:?} is not one of {}", names.join(", ")))
    })
}

/// `GET /api/v1/jobs?pool_kind=&provider=&pool=&priority=&gpu_class=&region=&team=&project=&state=&submitted_after=&submitted_before=&order=&desc=&limit=&page_token=`
pub async fn list(State(s): State<ApiState>, Params(q): Params) -> Result<Json<JobList>, ApiError> {
    let mut f = Filter::default();
    let mut limit = 100usize;
    let mut page_token: Option<String> = None;
    let sort = Sort::parse(q.get("order").map(String::as_str), q.get("desc").map(String::as_str))?;
    let after = page_token_of(&q).map(|t| sort.parse_token(t)).transpose()?;
    for (k, v) in &q {
        match k.as_str() {
            "pool_kind" => f.pool_kind = Some(enum_param(k, v)?),
            "priority" => f.priority = Some(enum_param(k, v)?),
            "provider" => f.provider = Some(v.clone()),
            "pool" => f.pool = Some(v.clone()),
            "gpu_class" => f.gpu_class = Some(v.clone()),
            "region" => f.region = Some(v.clone()),
            "team" => f.team = Some(v.clone()),
            "project" => f.project = Some(v.clone()),
            "state" => {
                f.state = Some(JobState::from_label(v).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "state: {v:?} is not one of unsubmitted, queued, assigned, preparing, running, done"
                    ))
                })?)
            }
            "submitted_after" => {
                f.submitted_after = Some(parse_time(v).map_err(|e| ApiError::bad_request(format!("{k}: {e}")))?)
            }
            "submitted_before" => {
                f.submitted_before = Some(parse_time(v).map_err(|e| ApiError::bad_request(format!("{k}: {e}")))?)
            }
            "limit" => {
                limit = v.parse().ok().filter(|n| (1..=s.max_page_size).contains(n)).ok_or_else(|| {
                    ApiError::bad_request(format!("limit: must be an integer in 1..={}", s.max_page_size))
                })?
            }
            "page_token" => page_token = Some(v.clone()),
            "order" | "desc" => {}
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let now = s.clock.now_ms();
    let index = s.index.clone();
    // A filtered listing may scan many jobs: off the async workers, in chunks under short read locks.
    let (jobs, next) = s
        .reads
        .run(move || {
            let mut jobs: Vec<Job> = Vec::with_capacity(limit.min(1000));
            let mut next = None;
            // Folded jobs are judged by their rows first: only those that can match have their timelines filled in.
            let mut memo = HashMap::new();
            if !sort.is_native() {
                (jobs, next) = page_in_order(&index, &f, sort, after, limit, now);
            } else {
                let pre = |_: &str, r: FoldedRef<'_>| f.matches_row(r, &mut memo);
                index.scan_where(page_token.as_deref(), super::compare::SCAN_CHUNK, pre, |id, job| {
                    if !f.matches(job.timeline) {
                        return true;
                    }
                    if jobs.len() == limit {
                        // There is at least one more match: the page ends at the previous job.
                        next = jobs.last().map(|j| j.job_id.clone());
                        return false;
                    }
                    jobs.push(Job::summary(id, job.timeline, now));
                    true
                });
            }
            // Expected starts of the page's waiting jobs (always hot), under one more read lock: the history
            // without queue positions, which only a job's detail reads from the store.
            let idx = index.read();
            for j in jobs.iter_mut().filter(|j| j.waiting_seconds.is_some()) {
                let eta = idx.jobs.get(&j.job_id).and_then(|h| eta::for_job(&idx.waits, &h.rec.timeline, None, now));
                j.expected_start = eta.as_ref().map(ExpectedStart::of);
            }
            drop(idx);
            (jobs, next)
        })
        .await?;
    Ok(Json(JobList { jobs, next_page_token: next }))
}

fn page_token_of(q: &HashMap<String, String>) -> Option<&str> {
    q.get("page_token").map(String::as_str)
}

/// One page of a listing in a time order (or descending ids): one scan keeps the `limit + 1` first matching
/// places after the token (folded jobs judged and placed from their rows, no timeline filled), then the page's
/// jobs are read under one read lock (a job deleted in between is left out of the page).
fn page_in_order(
    index: &crate::index::SharedIndex,
    f: &Filter,
    sort: Sort,
    after: Option<Place>,
    limit: usize,
    now: i64,
) -> (Vec<Job>, Option<String>) {
    let mut first = FirstPlaces { keep: limit + 1, after, heap: BinaryHeap::new() };
    let mut memo = HashMap::new();
    let cell = std::cell::RefCell::new(&mut first);
    index.scan_unordered(
        super::compare::SCAN_CHUNK,
        false,
        |id, r| {
            if f.matches_row(r, &mut memo) {
                cell.borrow_mut().offer(sort.place(id, Some(r.row.submitted_at()), Some(r.row.done_at())));
            }
            false
        },
        |id, job| {
            let t = job.timeline;
            if f.matches(t) {
                cell.borrow_mut().offer(sort.place(id, t.submitted_at, t.done_at));
            }
        },
    );
    let mut places = first.heap.into_sorted_vec();
    let more = places.len() > limit;
    places.truncate(limit);
    let next = if more { places.last().map(|p| sort.token(p)) } else { None };
    let idx = index.read();
    let mut t = Timeline::default();
    let jobs = places
        .iter()
        .filter_map(|(_, _, id)| match idx.jobs.get(id) {
            Some(h) => Some(Job::summary(id, &h.rec.timeline, now)),
            None => idx.folded(id).map(|row| {
                idx.cold.fill(row, &mut t);
                Job::summary(id, &t, now)
            }),
        })
        .collect();
    (jobs, next)
}

/// Events one page of a job's detail holds when `events_limit` is not given: a job of a few thousand events
/// answers in a few hundred KB.
pub const EVENTS_PAGE: usize = 1000;
/// The largest `events_limit`.
pub const MAX_EVENTS_PAGE: usize = 10_000;

/// Which of a job's events its detail shows: `events_offset` (default 0) into the job's canonical order,
/// `events_limit` (default [`EVENTS_PAGE`], 0 for none, at most [`MAX_EVENTS_PAGE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EventsPage {
    offset: usize,
    limit: usize,
}

fn events_page(q: &HashMap<String, String>) -> Result<EventsPage, ApiError> {
    let mut page = EventsPage { offset: 0, limit: EVENTS_PAGE };
    for (k, v) in q {
        let number = |max: usize| {
            v.parse::<usize>().ok().filter(|n| *n <= max).ok_or_else(|| {
                ApiError::bad_request(format!("{k}: {} is not a whole number from 0 to {max}", quote(v)))
            })
        };
        match k.as_str() {
            "events_offset" => page.offset = number(usize::MAX)?,
            "events_limit" => page.limit = number(MAX_EVENTS_PAGE)?,
            other => return Err(ApiError::bad_request(format!("{}: unknown query parameter", quote(other)))),
        }
    }
    Ok(page)
}

/// `GET /api/v1/jobs/{job_id}?events_offset=0&events_limit=1000`: the job's summary, attributes, timeline and one
/// page of its raw events (`events_total` says how many it has, `events_next_offset` where the next page starts).
/// A hot job's page is read from the store alone; a folded job's events are all read (its timeline is derived
/// again from them), then paged.
pub async fn detail(
    State(s): State<ApiState>,
    ApiPath(job_id): ApiPath<String>,
    Params(q): Params,
) -> Result<Json<Job>, ApiError> {
    let page = events_page(&q)?;
    let now = s.clock.now_ms();
    let index = s.index.clone();
    let store = s.store.clone();
    let id = job_id.clone();
    let found = s
        .reads
        .run(move || -> Result<_, crate::store::StoreError> {
            // A folded job's summary is replaced when a late event unfolds it and a fold folds it again: a read
            // that finds its summary gone looks the job up again (a few times at most).
            for _ in 0..3 {
                let hot = {
                    let idx = index.read();
                    match idx.jobs.get(&id) {
                        Some(h) => {
                            let seqs: Vec<u64> = h.rec.events.iter().map(|e| e.seq).collect();
                            // The current wait's `queued` events, for its queue positions.
                            let t = &h.rec.timeline;
                            let queued: Vec<u64> = match t.wait_started_at.filter(|_| t.state.is_waiting()) {
                                Some(since) => h
                                    .rec
                                    .events
                                    .iter()
                                    .filter(|e| e.at_ms >= since && matches!(e.kind, EventKind::Queued { .. }))
                                    .map(|e| e.seq)
                                    .collect(),
                                None => Vec::new(),
                            };
                            Ok((h.rec.timeline.clone(), seqs, queued))
                        }
                        None => match idx.folded(&id) {
                            Some(row) => Err(row.summary()),
                            None => return Ok(None),
                        },
                    }
                };
                match hot {
                    // Events that vanish meanwhile (retention deleted the job after the lookup) are left out.
                    Ok((t, seqs, queued)) => {
                        let total = seqs.len();
                        let wanted = page_of(&seqs, page);
                        let events = store.job_events_present(&id, wanted)?;
                        let progress = if queued.is_empty() {
                            None
                        } else {
                            super::eta::queue_progress(&store.job_events_present(&id, &queued)?)
                        };
                        let eta = eta::for_job(&index.read().waits, &t, progress, now);
                        return Ok(Some((t, events, total, eta)));
                    }
                    Err(summary) => {
                        let events = store.folded_events_present(&id, summary)?;
                        let moved = events.is_empty() && index.read().folded(&id).map(|r| r.summary()) != Some(summary);
                        if moved {
                            continue;
                        }
                        // Shown in the job's canonical order, as for a hot job.
                        let mut by_seq: HashMap<u64, _> = events.into_iter().collect();
                        let compact = by_seq.iter().filter_map(|(seq, e)| CompactEvent::from_pb(e, *seq)).collect();
                        let rec = JobRecord::from_events(compact);
                        let total = rec.events.len();
                        let events = page_of(&rec.events, page)
                            .iter()
                            .filter_map(|c| Some((c.seq, by_seq.remove(&c.seq)?)))
                            .collect();
                        return Ok(Some((rec.timeline, events, total, None)));
                    }
                }
            }
            Ok(None)
        })
        .await?
        .map_err(ApiError::unavailable)?;
    let Some((timeline, events, total, eta)) = found else {
        return Err(ApiError::not_found(format!("job {job_id:?} is not known")));
    };
    let mut job = Job::detail(&job_id, &timeline, &events, now);
    let end = page.offset.saturating_add(page.limit);
    job.events_total = Some(total as u64);
    job.expected_start = eta.as_ref().map(ExpectedStart::of);
    job.events_next_offset = (end < total).then_some(end as u64);
    Ok(Json(job))
}

/// The part of `items` (a job's events in canonical order) that `page` shows.
fn page_of<T>(items: &[T], page: EventsPage) -> &[T] {
    let from = page.offset.min(items.len());
    let to = from.saturating_add(page.limit).min(items.len());
    &items[from..to]
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn pages_cover_every_event_once_in_order() {
        let items: Vec<u32> = (0..2_345).collect();
        for limit in [1, 7, 1000, 2_345, 10_000] {
            let mut seen = Vec::new();
            let mut offset = 0;
            loop {
                let p = page_of(&items, EventsPage { offset, limit });
                seen.extend_from_slice(p);
                let end = offset + limit;
                if end >= items.len() {
                    break;
                }
                offset = end;
            }
            assert_eq!(seen, items, "limit {limit}");
        }
        assert!(page_of(&items, EventsPage { offset: 5_000, limit: 10 }).is_empty());
        assert!(page_of(&items, EventsPage { offset: usize::MAX, limit: 10 }).is_empty());
        assert!(page_of(&items, EventsPage { offset: 3, limit: 0 }).is_empty());
    }

    #[test]
    fn bad_page_parameters_are_refused_naming_the_field() {
        let q = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(events_page(&HashMap::new()).ok(), Some(EventsPage { offset: 0, limit: EVENTS_PAGE }));
        assert_eq!(events_page(&q("events_limit", "10000")).ok(), Some(EventsPage { offset: 0, limit: 10_000 }));
        for (k, v) in [("events_limit", "10001"), ("events_limit", "-1"), ("events_offset", "x"), ("events", "1")] {
            let e = events_page(&q(k, v)).expect_err(v);
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert!(e.message.starts_with(&format!("\"{k}\"")) || e.message.starts_with(k), "{}", e.message);
        }
    }
}
