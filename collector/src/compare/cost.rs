//! The cost model (`[cost]`): a price per GPU-hour for the jobs of each pool (first matching `[[cost.price]]`)
//! and, for dedicated pools, their capacity at an amortised price (`[[cost.dedicated]]`), turned into money and
//! utilisation from the jobs' GPU-time accounting ([`crate::job::goodput`]).
//!
//! Two ways a pool costs money:
//! - **per use** (managed endpoints, and any pool not listed under `[[cost.dedicated]]`): the GPU time its jobs
//!   *held* (preparing, checkpoint saves, lost and failed work, productive training) at each job's price. Waiting
//!   before nodes are assigned is not billed.
//! - **amortised** (a pool listed under `[[cost.dedicated]]`): its capacity at its price for the whole window,
//!   used or not (the window as far back as the collector holds jobs: a fresh install is not charged for days it
//!   has no data for). Its *useful utilisation* is productive GPU-hours / (capacity GPUs x those hours).
//!
//! Either way, *cost per useful GPU-hour* is the pool's cost / its productive GPU-hours, and the *cost of
//! waiting* prices the GPU-hours its jobs spent waiting (initial and requeue waits) at the pool's price: what the
//! delay would have cost had the GPUs been held for it (an opportunity figure, not a bill).
//!
//! The window counts jobs submitted in it, with their time up to their end or now (as `GET /api/v1/goodput`), so
//! a dedicated pool's utilisation near the window's edges is approximate (runs of jobs submitted before the
//! window are left out, runs of the window's jobs after it are counted).

use super::Selector;
use crate::job::goodput::Account;
use crate::job::JobAttrs;
use serde::{Deserialize, Serialize};
use startline_proto::labels::Label;
use std::collections::BTreeMap;

/// `[cost]`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CostSection {
    /// Shown with every amount. Default `USD`.
    pub currency: Option<String>,
    /// Prices per GPU-hour of jobs, first match wins.
    #[serde(default)]
    pub price: Vec<PriceEntry>,
    /// Dedicated pools: capacity and amortised price.
    #[serde(default)]
    pub dedicated: Vec<DedicatedEntry>,
}

/// `[[cost.price]]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PriceEntry {
    /// Which jobs: `attribute=value` terms joined by `,` over pool_kind, provider, pool, priority, gpu_class,
    /// region (as the comparison's selections); empty matches every job.
    #[serde(rename = "match")]
    pub selector: String,
    /// Price of one GPU for one hour.
    pub per_gpu_hour: f64,
}

/// `[[cost.dedicated]]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DedicatedEntry {
    /// The pool's name (`pool` of its jobs).
    pub pool: String,
    /// GPUs the pool has.
    pub gpus: u32,
    /// Amortised cost of one of its GPUs for one hour (hardware, power, space, staff).
    pub per_gpu_hour: f64,
    /// Capacity that differs by time of day (e.g. nodes lent to inference during the working day): in each
    /// window the pool has that window's GPUs instead of `gpus` (the first window that holds a moment wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity: Vec<CapacityEntry>,
}

/// `[[cost.dedicated.capacity]]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CapacityEntry {
    /// `"HH:MM-HH:MM"` (may wrap midnight).
    pub hours: String,
    /// Time zone of `hours` (tz database name; default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// GPUs in the window.
    pub gpus: u32,
}

/// A dedicated pool's capacity and price.
#[derive(Debug, Clone)]
struct Dedicated {
    gpus: u32,
    price: f64,
    windows: Vec<(crate::slo::Hours, u32)>,
}

impl Dedicated {
    /// GPUs at `ms`.
    fn gpus_at(&self, ms: i64) -> u32 {
        self.windows.iter().find(|(h, _)| h.contains(ms)).map_or(self.gpus, |(_, g)| *g)
    }

    /// GPU-hours available over `[from, to)`: exact for windows on whole minutes (one step per minute).
    fn gpu_hours(&self, from: i64, to: i64) -> f64 {
        if to <= from {
            return 0.0;
        }
        if self.windows.is_empty() {
            return f64::from(self.gpus) * (to - from) as f64 / 3_600_000.0;
        }
        const MIN: i64 = 60_000;
        let mut total = 0.0;
        let mut t = from;
        while t < to {
            let next = ((t.div_euclid(MIN) + 1) * MIN).min(to);
            total += f64::from(self.gpus_at(t)) * (next - t) as f64;
            t = next;
        }
        total / 3_600_000.0
    }
}

/// Validated `[cost]`.
#[derive(Debug, Clone, Default)]
pub struct CostModel {
    /// Currency label.
    pub currency: String,
    prices: Vec<(Selector, f64)>,
    dedicated: BTreeMap<String, Dedicated>,
}

impl CostSection {
    /// Checks the section, naming each bad field.
    pub fn validate(&self, errs: &mut Vec<String>) -> CostModel {
        let mut prices = Vec::new();
        for (i, p) in self.price.iter().enumerate() {
            match Selector::parse(&p.selector) {
                Ok(s) => prices.push((s, p.per_gpu_hour)),
                Err(e) => errs.push(format!("cost.price[{i}].match: {e}")),
            }
            if !(p.per_gpu_hour.is_finite() && p.per_gpu_hour >= 0.0) {
                errs.push(format!("cost.price[{i}].per_gpu_hour: {} must be a number >= 0", p.per_gpu_hour));
            }
        }
        let mut dedicated = BTreeMap::new();
        for (i, d) in self.dedicated.iter().enumerate() {
            if d.pool.is_empty() {
                errs.push(format!("cost.dedicated[{i}].pool: must name a pool"));
            }
            if d.gpus == 0 {
                errs.push(format!("cost.dedicated[{i}].gpus: must be at least 1"));
            }
            if !(d.per_gpu_hour.is_finite() && d.per_gpu_hour >= 0.0) {
                errs.push(format!("cost.dedicated[{i}].per_gpu_hour: {} must be a number >= 0", d.per_gpu_hour));
            }
            let mut windows = Vec::new();
            for (j, c) in d.capacity.iter().enumerate() {
                match crate::slo::Hours::parse(&c.hours, c.timezone.as_deref()) {
                    Ok(h) => windows.push((h, c.gpus)),
                    Err(problems) => errs.extend(
                        problems.into_iter().map(|(f, why)| format!("cost.dedicated[{i}].capacity[{j}].{f}: {why}")),
                    ),
                }
            }
            let entry = Dedicated { gpus: d.gpus, price: d.per_gpu_hour, windows };
            if dedicated.insert(d.pool.clone(), entry).is_some() {
                errs.push(format!("cost.dedicated[{i}].pool: {:?} is listed twice", d.pool));
            }
        }
        let currency = self.currency.clone().unwrap_or_else(|| "USD".to_string());
        if currency.is_empty() || currency.len() > 16 {
            errs.push(format!("cost.currency: {currency:?} must be 1 to 16 characters"));
        }
        CostModel { currency, prices, dedicated }
    }
}

impl CostModel {
    /// Whether anything is priced.
    pub fn configured(&self) -> bool {
        !self.prices.is_empty() || !self.dedicated.is_empty()
    }

    /// The per-use price of a job's GPU-hour (first matching rule).
    pub fn price(&self, a: &JobAttrs) -> Option<f64> {
        self.prices.iter().find(|(s, _)| s.matches(a)).map(|(_, p)| *p)
    }

    /// A dedicated pool's base capacity and amortised price.
    pub fn dedicated(&self, pool: &str) -> Option<(u32, f64)> {
        self.dedicated.get(pool).map(|d| (d.gpus, d.price))
    }

    /// GPU-hours a dedicated pool has over `[from, to)`, by its time-of-day capacity.
    pub fn capacity_gpu_hours(&self, pool: &str, from: i64, to: i64) -> Option<f64> {
        self.dedicated.get(pool).map(|d| d.gpu_hours(from, to))
    }
}

/// One pool's figures over a window, before pricing the capacity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolTally {
    /// `managed` or `dedicated`.
    pub pool_kind: &'static str,
    /// Provider.
    pub provider: String,
    /// Jobs counted.
    pub jobs: u64,
    /// Jobs no price rule matched (per-use pools only).
    pub unpriced_jobs: u64,
    /// GPU-hours held (preparing, checkpoint, lost, failed, productive).
    pub held_gpu_hours: f64,
    /// GPU-hours of useful training.
    pub productive_gpu_hours: f64,
    /// GPU-hours waiting (initial and requeue waits).
    pub waiting_gpu_hours: f64,
    /// Per use: held GPU-hours x each job's price.
    pub use_cost: f64,
    /// Waiting GPU-hours x each job's price (per-use pools).
    pub waiting_use_cost: f64,
}

const HOUR_MS: f64 = 3_600_000.0;

impl PoolTally {
    /// Adds one job's account.
    pub fn add(&mut self, model: &CostModel, a: &JobAttrs, acc: &Account) {
        let [waiting, preparing, requeue, checkpoint, lost, failed, productive] = acc.by_category();
        let g = f64::from(acc.gpus) / HOUR_MS;
        // In f64: each part is at most i64::MAX (saturated), their sum need not be.
        let held = [preparing, checkpoint, lost, failed, productive].iter().map(|x| *x as f64).sum::<f64>() * g;
        let wait = (waiting as f64 + requeue as f64) * g;
        self.pool_kind = a.pool_kind.label();
        if self.provider.is_empty() {
            self.provider = a.provider.clone();
        }
        self.jobs += 1;
        self.held_gpu_hours += held;
        self.productive_gpu_hours += productive as f64 * g;
        self.waiting_gpu_hours += wait;
        if model.dedicated(&a.pool).is_none() {
            match model.price(a) {
                Some(p) => {
                    self.use_cost += held * p;
                    self.waiting_use_cost += wait * p;
                }
                None => self.unpriced_jobs += 1,
            }
        }
    }
}

/// A pool's cost over a window of `window_hours`.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolCost {
    /// `per_use`, `amortised`, or `unpriced` (no rule matched any of its jobs).
    pub model: &'static str,
    /// Base capacity, for amortised pools.
    pub capacity_gpus: Option<u32>,
    /// GPU-hours the pool had over the window (by its time-of-day capacity), for amortised pools.
    pub capacity_gpu_hours: Option<f64>,
    /// The window's cost.
    pub cost: Option<f64>,
    /// cost / productive GPU-hours.
    pub cost_per_useful_gpu_hour: Option<f64>,
    /// Waiting GPU-hours at the pool's price.
    pub waiting_cost: Option<f64>,
    /// Productive GPU-hours / (capacity x window hours), for amortised pools.
    pub useful_utilisation: Option<f64>,
}

/// Prices a pool's tally over `[from, to)` (a dedicated pool's capacity by its time-of-day schedule).
pub fn price_pool(model: &CostModel, pool: &str, t: &PoolTally, from: i64, to: i64) -> PoolCost {
    let per_useful = |cost: f64| (t.productive_gpu_hours > 0.0).then(|| cost / t.productive_gpu_hours);
    match (model.dedicated(pool), model.capacity_gpu_hours(pool, from, to)) {
        (Some((gpus, price)), Some(available)) => {
            let cost = available * price;
            PoolCost {
                model: "amortised",
                capacity_gpus: Some(gpus),
                capacity_gpu_hours: Some(available),
                cost: Some(cost),
                cost_per_useful_gpu_hour: per_useful(cost),
                waiting_cost: Some(t.waiting_gpu_hours * price),
                useful_utilisation: (available > 0.0).then(|| t.productive_gpu_hours / available),
            }
        }
        _ if t.jobs > t.unpriced_jobs => PoolCost {
            model: "per_use",
            capacity_gpus: None,
            capacity_gpu_hours: None,
            cost: Some(t.use_cost),
            cost_per_useful_gpu_hour: per_useful(t.use_cost),
            waiting_cost: Some(t.waiting_use_cost),
            useful_utilisation: None,
        },
        _ => PoolCost {
            model: "unpriced",
            capacity_gpus: None,
            capacity_gpu_hours: None,
            cost: None,
            cost_per_useful_gpu_hour: None,
            waiting_cost: None,
            useful_utilisation: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Segment;
    use startline_proto::pb;

    fn model() -> CostModel {
        let s: CostSection = toml::from_str(
            r#"
            currency = "EUR"
            [[price]]
            match = "pool_kind=managed,gpu_class=h100"
            per_gpu_hour = 10.0
            [[price]]
            match = "pool_kind=managed"
            per_gpu_hour = 4.0
            [[dedicated]]
            pool = "a100"
            gpus = 64
            per_gpu_hour = 1.5
            "#,
        )
        .expect("toml");
        let mut errs = Vec::new();
        let m = s.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        m
    }

    fn attrs(kind: pb::PoolKind, pool: &str, gpu: &str) -> JobAttrs {
        JobAttrs { pool_kind: kind, pool: pool.into(), gpu_class: gpu.into(), gpu_count: 8, ..JobAttrs::unknown() }
    }

    /// A job of 8 GPUs: 1 h waiting, 0.5 h preparing, 2 h productive, 0.5 h lost.
    fn account() -> Account {
        const H: i64 = 3_600_000;
        Account {
            waiting: [(Segment::Unreported, H)].into(),
            preparing: [(Segment::Preparing(pb::PreparingPhase::ImagePull), H / 2)].into(),
            lost: H / 2,
            productive: 2 * H,
            total: 4 * H,
            gpus: 8,
            ..Account::default()
        }
    }

    #[test]
    fn per_use_and_amortised_pools_by_hand() {
        let m = model();
        assert_eq!(m.price(&attrs(pb::PoolKind::Managed, "vx", "h100")), Some(10.0), "first match wins");
        assert_eq!(m.price(&attrs(pb::PoolKind::Managed, "sm", "a100")), Some(4.0));
        // Managed h100: held 3 h x 8 GPUs = 24 GPU-h at 10 = 240; useful 16 GPU-h -> 15 per useful GPU-hour;
        // waiting 8 GPU-h -> 80.
        let mut t = PoolTally::default();
        t.add(&m, &attrs(pb::PoolKind::Managed, "vx", "h100"), &account());
        let close = |got: Option<f64>, want: f64| {
            assert!(got.is_some_and(|g| (g - want).abs() <= 1e-9 * want.abs().max(1.0)), "{got:?} vs {want}")
        };
        let c = price_pool(&m, "vx", &t, 0, 720 * 3_600_000);
        assert_eq!(c.model, "per_use");
        close(c.cost, 240.0);
        close(c.cost_per_useful_gpu_hour, 15.0);
        close(c.waiting_cost, 80.0);
        // Dedicated a100: 64 GPUs x 720 h x 1.5 = 69,120 whatever the jobs; two jobs' 32 useful GPU-h -> 2,160
        // per useful GPU-hour and a utilisation of 32 / 46,080.
        let mut t = PoolTally::default();
        for _ in 0..2 {
            t.add(&m, &attrs(pb::PoolKind::Dedicated, "a100", "a100"), &account());
        }
        let c = price_pool(&m, "a100", &t, 0, 720 * 3_600_000);
        assert_eq!(c.model, "amortised");
        close(c.cost, 69_120.0);
        close(c.cost_per_useful_gpu_hour, 2_160.0);
        close(c.useful_utilisation, 32.0 / 46_080.0);
        close(c.waiting_cost, 16.0 * 1.5);
        // A dedicated pool with no capacity entry and no matching price is unpriced, and says so.
        let mut t = PoolTally::default();
        t.add(&m, &attrs(pb::PoolKind::Dedicated, "h100", "h100"), &account());
        assert_eq!((t.unpriced_jobs, price_pool(&m, "h100", &t, 0, 720 * 3_600_000).model), (1, "unpriced"));
    }

    #[test]
    fn bad_fields_are_named() {
        let s = CostSection {
            currency: Some(String::new()),
            price: vec![PriceEntry { selector: "colour=blue".into(), per_gpu_hour: -1.0 }],
            dedicated: vec![
                DedicatedEntry { pool: "a".into(), gpus: 0, per_gpu_hour: f64::NAN, capacity: vec![] },
                DedicatedEntry { pool: "a".into(), gpus: 1, per_gpu_hour: 1.0, capacity: vec![] },
            ],
        };
        let mut errs = Vec::new();
        s.validate(&mut errs);
        let text = errs.join("\n");
        for f in [
            "cost.price[0].match",
            "cost.price[0].per_gpu_hour",
            "cost.dedicated[0].gpus",
            "cost.dedicated[0].per_gpu_hour",
            "cost.dedicated[1].pool: \"a\" is listed twice",
            "cost.currency",
        ] {
            assert!(text.contains(f), "{f} missing from {text}");
        }
    }

    #[test]
    fn capacity_by_time_of_day_is_integrated_over_the_window() {
        let s: CostSection = toml::from_str(
            r#"
            [[dedicated]]
            pool = "a100"
            gpus = 64
            per_gpu_hour = 2.0
            [[dedicated.capacity]]
            hours = "08:00-20:00"
            gpus = 32
            [[dedicated]]
            pool = "berlin"
            gpus = 10
            per_gpu_hour = 1.0
            [[dedicated.capacity]]
            hours = "22:00-02:00"
            timezone = "Europe/Berlin"
            gpus = 0
            "#,
        )
        .expect("toml");
        let mut errs = Vec::new();
        let m = s.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        const H: i64 = 3_600_000;
        let day = 1_767_225_600_000; // 2026-01-01T00:00Z, winter: Berlin is UTC+1
                                     // One day from midnight UTC: 12 h at 64 and 12 h at 32 GPUs.
        assert_eq!(m.capacity_gpu_hours("a100", day, day + 24 * H), Some(12.0 * 64.0 + 12.0 * 32.0));
        // 07:30 to 08:30: half an hour at each.
        assert_eq!(m.capacity_gpu_hours("a100", day + 7 * H + H / 2, day + 8 * H + H / 2), Some(32.0 + 16.0));
        // Berlin 22:00-02:00 is 21:00-01:00 UTC: a UTC day has 20 h at 10 GPUs (00:00-01:00 and 21:00-24:00 at 0).
        assert_eq!(m.capacity_gpu_hours("berlin", day, day + 24 * H), Some(200.0));
        // Priced over that day: the amortised cost follows the schedule.
        let t = PoolTally { jobs: 1, productive_gpu_hours: 100.0, ..PoolTally::default() };
        let c = price_pool(&m, "a100", &t, day, day + 24 * H);
        assert_eq!(c.cost, Some(1152.0 * 2.0));
        assert_eq!(c.useful_utilisation, Some(100.0 / 1152.0));
        assert_eq!(m.capacity_gpu_hours("nowhere", day, day + H), None);
        // Bad windows are named.
        let bad: CostSection = toml::from_str(
            r#"
            [[dedicated]]
            pool = "x"
            gpus = 1
            per_gpu_hour = 1.0
            [[dedicated.capacity]]
            hours = "8-20"
            timezone = "Mars/Olympus"
            gpus = 1
            "#,
        )
        .expect("toml");
        let mut errs = Vec::new();
        bad.validate(&mut errs);
        assert!(errs.iter().any(|e| e.starts_with("cost.dedicated[0].capacity[0].hours:")), "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("cost.dedicated[0].capacity[0].timezone:")), "{errs:?}");
    }
}
