//! Properties of the comparison, its statistics and its chart over degenerate inputs: no data, one value, all
//! equal, zeros, negative and huge values (up to `f64::MAX`, durations from extreme `i64` timestamps), NaN and
//! infinities where a caller could pass them, one side empty. Everything must return with finite numbers, no
//! panic, and (for the chart) a well-formed SVG of bounded size.

use super::svg::{cdf_overlay, MAX_NAME_CHARS, NO_DATA};
use super::*;
use crate::index::HotJob;
use crate::job::{Segment, Timeline};
use crate::slo::Contribution;
use proptest::prelude::*;
use startline_proto::pb;
use std::sync::Arc;

/// Upper bound on the chart's size, whatever the inputs (two curves of at most `MAX_STEPS` steps, two names).
const SVG_MAX_BYTES: usize = 100_000;
const ELLIPSIS: char = '\u{2026}';

/// Checks that `s` is one well-formed XML element tree (tags balanced, attributes quoted, only the five predefined
/// entities, only characters XML 1.0 allows) whose numeric attributes and path data are finite numbers.
/// Returns the text content.
fn check_svg(s: &str) -> Result<String, String> {
    if let Some(c) = s.chars().find(|c| (c.is_control() && !matches!(c, '\t' | '\n' | '\r')) || *c == '\u{FFFE}') {
        return Err(format!("character {c:?} is not allowed"));
    }
    let check_entities = |t: &str| -> Result<(), String> {
        let mut rest = t;
        while let Some(i) = rest.find('&') {
            rest = &rest[i..];
            let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| rest.starts_with(e));
            if !ok {
                return Err(format!("bad entity at {:?}", &rest[..rest.len().min(10)]));
            }
            rest = &rest[1..];
        }
        Ok(())
    };
    let mut stack: Vec<String> = Vec::new();
    let mut roots = 0;
    let mut text = String::new();
    let mut rest = s;
    while !rest.is_empty() {
        let Some(open) = rest.find('<') else {
            return Err("text after the root".into());
        };
        let chunk = &rest[..open];
        if !chunk.is_empty() {
            if stack.is_empty() {
                return Err(format!("text outside the root: {chunk:?}"));
            }
            if chunk.contains('>') {
                return Err(format!("unescaped > in text {chunk:?}"));
            }
            check_entities(chunk)?;
            text.push_str(chunk);
            text.push('\n');
        }
        rest = &rest[open + 1..];
        let close = rest.find('>').ok_or("unterminated tag")?;
        let tag = &rest[..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            if stack.pop().as_deref() != Some(name) {
                return Err(format!("unbalanced </{name}>"));
            }
            continue;
        }
        let (tag, empty) = match tag.strip_suffix('/') {
            Some(t) => (t, true),
            None => (tag, false),
        };
        let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
        let name = &tag[..name_end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("bad tag name {name:?}"));
        }
        let mut attrs = tag[name_end..].trim_start();
        while !attrs.is_empty() {
            let eq = attrs.find("=\"").ok_or_else(|| format!("unquoted attribute in <{name} {attrs}>"))?;
            let key = &attrs[..eq];
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':') {
                return Err(format!("bad attribute name {key:?}"));
            }
            let after = &attrs[eq + 2..];
            let end = after.find('"').ok_or("unterminated attribute")?;
            let value = &after[..end];
            if value.contains('<') {
                return Err(format!("< in attribute {key}"));
            }
            check_entities(value)?;
            let numeric = ["x", "y", "x1", "y1", "x2", "y2", "width", "height", "font-size", "stroke-width"];
            if numeric.contains(&key) {
                let v: f64 = value.parse().map_err(|_| format!("{key}={value:?} is not a number"))?;
                if !v.is_finite() {
                    return Err(format!("{key}={value:?} is not finite"));
                }
            }
            if key == "d" {
                for num in
                    value.split(|c: char| c.is_ascii_alphabetic() || c == ',' || c == ' ').filter(|x| !x.is_empty())
                {
                    let v: f64 = num.parse().map_err(|_| format!("path number {num:?}"))?;
                    if !v.is_finite() {
                        return Err(format!("path number {num:?} is not finite"));
                    }
                }
            }
            if key == "viewBox" {
                for num in value.split(' ') {
                    num.parse::<f64>().map_err(|_| format!("viewBox {value:?}"))?;
                }
            }
            attrs = after[end + 1..].trim_start();
        }
        if stack.is_empty() {
            roots += 1;
        }
        if !empty {
            stack.push(name.to_string());
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed {stack:?}"));
    }
    if roots != 1 || !s.starts_with("<svg ") {
        return Err(format!("{roots} roots"));
    }
    if s.contains("NaN") || s.contains("inf\"") {
        return Err("non-finite number".into());
    }
    Ok(text)
}

/// Seconds, with the odd values a caller could pass: zeros, tiny, huge, negative, NaN and infinities.
fn seconds() -> BoxedStrategy<f64> {
    prop_oneof![
        3 => 0.0..1e7f64,
        1 => prop_oneof![
            Just(0.0),
            Just(-0.0),
            Just(1.0),
            Just(f64::MIN_POSITIVE),
            Just(5e-324),
            Just(f64::MAX),
            Just(u64::MAX as f64 / 1000.0),
            Just(i64::MAX as f64 / 1000.0),
            Just(-1.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
        ],
        1 => any::<f64>(),
    ]
    .boxed()
}

/// Finite seconds, including zeros, subnormals and the largest `f64`.
fn finite_seconds() -> BoxedStrategy<f64> {
    prop_oneof![
        3 => 0.0..1e7f64,
        1 => prop_oneof![Just(0.0), Just(f64::MIN_POSITIVE), Just(f64::MAX), Just(i64::MAX as f64 / 1000.0)],
        1 => prop::num::f64::POSITIVE | prop::num::f64::ZERO | prop::num::f64::SUBNORMAL | prop::num::f64::NORMAL,
    ]
    .boxed()
}

/// A sample: empty, one value, all equal, or mixed.
fn sample(values: BoxedStrategy<f64>) -> impl Strategy<Value = Vec<f64>> {
    prop_oneof![
        Just(Vec::new()),
        values.clone().prop_map(|v| vec![v]),
        (values.clone(), 1..50usize).prop_map(|(v, n)| vec![v; n]),
        prop::collection::vec(values, 0..60),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("pool_kind=managed".to_string()),
        prop::collection::vec(any::<char>(), 0..300).prop_map(|c| c.into_iter().collect()),
    ]
}

fn assert_chart(svg: &str, left: &[f64], right: &[f64]) -> Result<(), TestCaseError> {
    prop_assert!(svg.len() < SVG_MAX_BYTES, "chart of {} bytes", svg.len());
    let text = check_svg(svg).map_err(|e| TestCaseError::fail(format!("{e} in {svg}")))?;
    let any = left.iter().chain(right).any(|v| v.is_finite());
    prop_assert_eq!(text.contains(NO_DATA), !any);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn chart_is_well_formed_finite_and_bounded(
        left in sample(seconds()),
        right in sample(seconds()),
        ln in name(),
        rn in name(),
    ) {
        let svg = cdf_overlay(&ln, &left, &rn, &right);
        assert_chart(&svg, &left, &right)?;
        // Both legends survive (cut to their limit), with the count of drawable values.
        let finite = |v: &[f64]| v.iter().filter(|x| x.is_finite()).count();
        let ln_len = finite(&left);
        let rn_len = finite(&right);
        let legends = (format!("(n={ln_len})"), format!("(n={rn_len})"));
        prop_assert!(svg.contains(&legends.0) && svg.contains(&legends.1), "legends {:?}", legends);
        let cut = ln.chars().count() <= MAX_NAME_CHARS || svg.contains(ELLIPSIS);
        prop_assert!(cut, "a long name is cut");
    }

    #[test]
    fn statistics_are_finite_and_consistent(
        left in sample(finite_seconds()),
        right in sample(finite_seconds()),
        q in prop_oneof![0.0..=1.0f64, Just(0.0), Just(1.0), Just(0.99), Just(-1.0), Just(2.0), Just(f64::NAN)],
    ) {
        let mut sorted = left.clone();
        sorted.sort_by(f64::total_cmp);
        match (stats::percentile(&sorted, q), stats::percentile_ci(&sorted, q)) {
            (Some(p), Some((lo, hi))) => {
                prop_assert!(!q.is_nan() && !sorted.is_empty());
                prop_assert!(sorted.contains(&p) && sorted.contains(&lo) && sorted.contains(&hi));
                prop_assert!(lo <= p && p <= hi, "{lo} <= {p} <= {hi}");
            }
            (None, None) => prop_assert!(sorted.is_empty() || q.is_nan()),
            other => prop_assert!(false, "percentile and its interval disagree: {other:?}"),
        }
        match stats::mean_ci(&left) {
            Some((m, lo, hi)) => {
                prop_assert!(m.is_finite() && lo.is_finite() && hi.is_finite(), "{m} [{lo}, {hi}]");
                prop_assert!(lo <= m && m <= hi);
                prop_assert!(sorted[0] <= m && m <= sorted[sorted.len() - 1]);
                if sorted[0] == sorted[sorted.len() - 1] {
                    prop_assert_eq!(m, sorted[0]);
                    prop_assert!(lo == m && hi == m, "equal values: {lo} {m} {hi}");
                }
            }
            None => prop_assert!(left.is_empty()),
        }
        match (stats::mann_whitney(&left, &right), stats::mann_whitney(&right, &left)) {
            (Some(a), Some(b)) => {
                let pairs = left.len() as f64 * right.len() as f64;
                for r in [a, b] {
                    prop_assert!(r.u_left.is_finite() && r.z.is_finite());
                    prop_assert!((0.0..=1.0).contains(&r.p_value) && (0.0..=1.0).contains(&r.prob_left_greater));
                    prop_assert!((0.0..=pairs).contains(&r.u_left));
                }
                prop_assert!((a.u_left + b.u_left - pairs).abs() < 1e-9 * pairs.max(1.0));
                prop_assert!((a.p_value - b.p_value).abs() < 1e-9);
            }
            (None, None) => prop_assert!(left.is_empty() || right.is_empty()),
            other => prop_assert!(false, "asymmetric: {other:?}"),
        }
    }

    #[test]
    fn comparison_of_odd_timelines_is_finite(
        jobs in prop::collection::vec(job(), 0..24),
        now_ms in prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0i64), Just(NOW), any::<i64>()],
        window_ms in prop_oneof![Just(60_000i64), Just(400 * 86_400_000i64), Just(i64::MAX), any::<i64>()],
        by in prop_oneof![Just(None), Just(Some(Attr::PoolKind)), Just(Some(Attr::GpuClass))],
    ) {
        let q = Query {
            left: Selector::parse("pool_kind=managed").map_err(TestCaseError::fail)?,
            right: Selector::parse("pool_kind=dedicated").map_err(TestCaseError::fail)?,
            by,
            window_ms,
            now_ms,
            cost: None,
        };
        let slos = crate::slo::SloDef::defaults();
        let mut c = Collector::new(q.clone());
        let mut s = Collector::new(Query { by: None, ..q });
        for rec in &jobs {
            c.add(rec.view());
            s.add(rec.view());
        }
        let report = c.finish(&slos);
        let text = serde_json::to_string(&report).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(!text.contains("NaN") && !text.contains("inf"));
        for g in &report.groups {
            for side in [&g.left, &g.right] {
                let t = &side.ttfs_seconds;
                prop_assert_eq!(side.started > 0, t.p50.value.is_some());
                if side.started > 0 {
                    for e in [&t.p50, &t.p90, &t.p99] {
                        let v = e.value.unwrap_or(f64::NAN);
                        let [lo, hi] = e.ci95.unwrap_or([f64::NAN; 2]);
                        prop_assert!(v.is_finite() && lo.is_finite() && hi.is_finite());
                    }
                    let m = t.mean.as_ref().map(|m| (m.value, m.ci95));
                    prop_assert!(m.is_some_and(|(v, [lo, hi])| v.is_finite() && lo.is_finite() && hi.is_finite()));
                }
                for w in side.wait_split.values() {
                    prop_assert!(w.seconds.is_finite() && (0.0..=1.0).contains(&w.share));
                }
                prop_assert_eq!(side.by_hour.len(), 24);
            }
            prop_assert!(g.difference.p50_ratio_right_over_left.is_none_or(f64::is_finite));
        }
        let samples = s.samples();
        let svg = cdf_overlay("l", &samples.left, "r", &samples.right);
        assert_chart(&svg, &samples.left, &samples.right)?;
    }

    /// Scans walk hot and folded jobs in an order of their own: the comparison (costs included) is the same
    /// whatever order the jobs come in, to the bit.
    #[test]
    fn the_comparison_does_not_depend_on_the_order_jobs_come_in(
        jobs in prop::collection::vec(job(), 0..24),
        rotate in 0usize..24,
        reverse in any::<bool>(),
    ) {
        let mut errs = Vec::new();
        let model = cost::CostSection {
            currency: Some("USD".into()),
            price: vec![cost::PriceEntry { selector: "pool_kind=managed".into(), per_gpu_hour: 4.1 }],
            dedicated: vec![cost::DedicatedEntry { pool: "p".into(), gpus: 64, per_gpu_hour: 2.3, capacity: vec![] }],
        }
        .validate(&mut errs);
        prop_assert!(errs.is_empty(), "{:?}", errs);
        let q = Query {
            left: Selector::parse("pool_kind=managed").map_err(TestCaseError::fail)?,
            right: Selector::parse("pool_kind=dedicated").map_err(TestCaseError::fail)?,
            by: Some(Attr::GpuClass),
            window_ms: 400 * 86_400_000,
            now_ms: NOW,
            cost: Some(Arc::new(model)),
        };
        let slos = crate::slo::SloDef::defaults();
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        if !order.is_empty() {
            let k = rotate % order.len();
            order.rotate_left(k);
        }
        if reverse {
            order.reverse();
        }
        let mut a = Collector::new(q.clone());
        let mut b = Collector::new(q);
        for rec in &jobs {
            a.add(rec.view());
        }
        for i in order {
            b.add(jobs[i].view());
        }
        prop_assert_eq!(a.finish(&slos), b.finish(&slos));
    }

    /// A scan may skip (not fill in) a folded job `wants` refuses: the comparison of only the jobs it accepts is
    /// the comparison of all of them.
    #[test]
    fn skipping_the_jobs_wants_refuses_changes_nothing(
        jobs in prop::collection::vec(job(), 0..24),
        now_ms in prop_oneof![Just(NOW), Just(NOW - 20 * 86_400_000), any::<i64>()],
        window_ms in prop_oneof![Just(60_000i64), Just(7 * 86_400_000i64), Just(30 * 86_400_000i64), Just(i64::MAX)],
        left in prop_oneof![Just("pool_kind=managed"), Just("gpu_class=h100"), Just("")],
    ) {
        let q = Query {
            left: Selector::parse(left).map_err(TestCaseError::fail)?,
            right: Selector::parse("pool_kind=dedicated,gpu_class=a100").map_err(TestCaseError::fail)?,
            by: Some(Attr::GpuClass),
            window_ms,
            now_ms,
            cost: None,
        };
        let slos = crate::slo::SloDef::defaults();
        let mut all = Collector::new(q.clone());
        let mut wanted = Collector::new(q);
        for rec in &jobs {
            all.add(rec.view());
            let t = &rec.rec.timeline;
            if let (Some(a), Some(sub)) = (t.attrs.as_deref(), t.submitted_at) {
                if wanted.wants(a, sub) {
                    wanted.add(rec.view());
                }
            }
        }
        prop_assert_eq!(all.finish(&slos), wanted.finish(&slos));
    }
}

const NOW: i64 = 1_767_225_600_000;

fn attrs(kind: pb::PoolKind, gpu: &str) -> Arc<JobAttrs> {
    Arc::new(JobAttrs {
        pool_kind: kind,
        provider: "p".into(),
        pool: "p".into(),
        priority: pb::PriorityClass::Normal,
        gpu_class: gpu.into(),
        gpu_count: 8,
        node_count: 1,
        region: "r".into(),
        team: String::new(),
        project: String::new(),
        chain_id: String::new(),
        chain_stage: String::new(),
        labels: Default::default(),
    })
}

fn instant() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => (NOW - 40 * 86_400_000)..NOW,
        1 => prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0i64), Just(NOW)],
        1 => any::<i64>(),
    ]
}

/// A job record with a hand-made timeline (as odd as timestamps from clients can make it).
fn job() -> impl Strategy<Value = HotJob> {
    (
        prop_oneof![Just(pb::PoolKind::Managed), Just(pb::PoolKind::Dedicated)],
        prop_oneof![Just("h100"), Just("a100")],
        instant(),
        prop::option::of(instant()),
        prop::option::of(instant()),
        prop::collection::vec(prop_oneof![Just(0i64), Just(i64::MAX), 0..86_400_000i64], 0..3),
        prop::collection::vec((0u16..3, any::<bool>()), 0..3),
    )
        .prop_map(|(kind, gpu, submitted, first_step, done, waits, slo)| {
            let segments = [Segment::Unreported, Segment::Assigned, Segment::Queued(pb::WaitReason::Capacity)];
            let timeline = Timeline {
                attrs: Some(attrs(kind, gpu)),
                submitted_at: Some(submitted),
                first_step_at: first_step,
                done_at: done,
                initial_wait_ms: segments.into_iter().zip(waits).collect(),
                ..Timeline::default()
            };
            let slo = slo
                .into_iter()
                .map(|(i, good)| Contribution {
                    slo: i,
                    standing: if good { Standing::Good { at_ms: 0 } } else { Standing::Bad { at_ms: 0 } },
                    ttfs: None,
                    first_step_origin: pb::StepOrigin::Unspecified,
                    breached_waiting: false,
                })
                .collect();
            let mut rec = HotJob::default();
            (rec.rec.timeline, rec.slo) = (timeline, slo);
            rec
        })
}

#[test]
fn empty_chart_says_there_is_no_data() {
    for (l, r) in [(vec![], vec![]), (vec![f64::NAN], vec![f64::INFINITY])] {
        let svg = cdf_overlay("pool_kind=managed", &l, "pool_kind=dedicated", &r);
        let text = check_svg(&svg).expect("well-formed");
        assert!(text.contains(NO_DATA), "{svg}");
        assert!(svg.len() < 4_000);
    }
}

#[test]
fn zeros_one_value_and_one_empty_side_draw_a_curve() {
    for (l, r) in [(vec![0.0, 0.0], vec![]), (vec![], vec![42.0]), (vec![7.0; 5], vec![7.0; 5])] {
        let svg = cdf_overlay("l", &l, "r", &r);
        let text = check_svg(&svg).expect("well-formed");
        assert!(!text.contains(NO_DATA));
        assert!(svg.contains("<path "), "{svg}");
    }
}

#[test]
fn huge_samples_and_huge_values_keep_the_chart_small() {
    let left: Vec<f64> = (0..200_000).map(|i| f64::from(i) * 3.7).collect();
    let right = vec![f64::MAX, u64::MAX as f64 / 1000.0, 1.0];
    let started = std::time::Instant::now();
    let svg = cdf_overlay("l", &left, "r", &right);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert!(svg.len() < SVG_MAX_BYTES, "{} bytes", svg.len());
    check_svg(&svg).expect("well-formed");
    // At most 13 labelled decades although the axis spans 1 s to 1e309 s.
    assert!(svg.matches("text-anchor=\"middle\"").count() <= 13);
}

#[test]
fn the_ratio_interval_matches_the_delta_method_by_hand() {
    // Three jobs: (cost, useful hours) = (10, 2), (30, 4), (20, 4): R = 60 / 10 = 6.
    let pairs = [(10.0, 2.0), (30.0, 4.0), (20.0, 4.0)];
    let (r, lo, hi) = stats::ratio_ci(&pairs).expect("ratio");
    assert_eq!(r, 6.0);
    // Residuals 10 - 12 = -2, 30 - 24 = 6, 20 - 24 = -4; variance (4 + 36 + 16) / 2 = 28; se = sqrt(28 / 3) / (10 / 3).
    let se = (28.0f64 / 3.0).sqrt() / (10.0 / 3.0);
    assert!((lo - (6.0 - 1.96 * se)).abs() < 1e-12 && (hi - (6.0 + 1.96 * se)).abs() < 1e-12, "{lo} {hi}");
    assert_eq!(stats::ratio_ci(&[(5.0, 1.0)]), Some((5.0, 5.0, 5.0)));
    assert_eq!(stats::ratio_ci(&[(5.0, 0.0)]), None, "no useful hours: no ratio");
    assert_eq!(stats::ratio_ci(&[]), None);
}

#[test]
fn cost_columns_price_each_side_per_use_or_at_the_amortised_rate() {
    use crate::job::{CompactEvent, EventKind, JobRecord};
    const H: i64 = 3_600_000;
    let mut errs = Vec::new();
    let model = cost::CostSection {
        currency: Some("USD".into()),
        price: vec![cost::PriceEntry { selector: "pool_kind=managed".into(), per_gpu_hour: 4.0 }],
        dedicated: vec![cost::DedicatedEntry {
            pool: "p-dedicated".into(),
            gpus: 64,
            per_gpu_hour: 2.0,
            capacity: vec![],
        }],
    }
    .validate(&mut errs);
    assert!(errs.is_empty(), "{errs:?}");
    // A job with `gpus` GPUs: submitted, preparing for `prep` hours after a 1 h wait, trains `train` hours, done.
    let job = |kind: pb::PoolKind, prep: i64, train: i64| {
        let mut a = (*attrs(kind, "h100")).clone();
        a.pool = if kind == pb::PoolKind::Managed { "p-managed".into() } else { "p-dedicated".into() };
        a.gpu_count = 2;
        let t0 = NOW - 20 * H;
        let ev = |n: u64, at: i64, kind: EventKind| CompactEvent { at_ms: at, id_hash: n, seq: n, attempt: None, kind };
        let rec = JobRecord::from_events(vec![
            ev(1, t0, EventKind::Submitted(Arc::new(a))),
            ev(2, t0 + H, EventKind::Preparing { phase: pb::PreparingPhase::ImagePull }),
            ev(
                3,
                t0 + H + prep,
                EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
            ),
            ev(4, t0 + H + prep + train, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: Some(0) }),
        ]);
        HotJob { rec, ..HotJob::default() }
    };
    let jobs = [
        job(pb::PoolKind::Managed, H, 2 * H), // held 3 h x 2 GPUs x 4 = 24, useful 4 GPU-h
        job(pb::PoolKind::Managed, 2 * H, 6 * H), // held 8 h x 2 x 4 = 64, useful 12
        job(pb::PoolKind::Dedicated, 0, 5 * H), // held 5 h x 2 x 2 = 20, useful 10
    ];
    let q = Query {
        left: Selector::parse("pool_kind=managed").expect("left"),
        right: Selector::parse("pool_kind=dedicated").expect("right"),
        by: None,
        window_ms: 86_400_000,
        now_ms: NOW,
        cost: Some(Arc::new(model)),
    };
    let mut c = Collector::new(q);
    for j in &jobs {
        c.add(j.view());
    }
    let r = c.finish(&crate::slo::SloDef::defaults());
    let all = &r.groups[0];
    let left = all.left.cost.as_ref().expect("priced");
    assert_eq!((left.priced_jobs, left.unpriced_jobs), (2, 0));
    assert!((left.total - 88.0).abs() < 1e-9, "{left:?}");
    assert!((left.per_useful_gpu_hour.value.expect("ratio") - 88.0 / 16.0).abs() < 1e-9);
    let want = stats::ratio_ci(&[(24.0, 4.0), (64.0, 12.0)]).expect("ratio");
    let ci = left.per_useful_gpu_hour.ci95.expect("ci");
    assert!((ci[0] - want.1.max(0.0)).abs() < 1e-9 && (ci[1] - want.2).abs() < 1e-9);
    assert!((left.per_job.as_ref().expect("mean").value - 44.0).abs() < 1e-9);
    let right = all.right.cost.as_ref().expect("priced");
    assert!((right.total - 20.0).abs() < 1e-9 && (right.per_useful_gpu_hour.value.expect("r") - 2.0).abs() < 1e-9);
}

/// Each side counts its started jobs by where their first step came from; a managed side measured to its
/// containers' start against a dedicated side measured to the training process is flagged. Figures by hand.
#[test]
fn sides_count_first_steps_by_source_and_flag_a_difference() {
    use crate::job::{CompactEvent, EventKind, JobRecord};
    use pb::StepOrigin::*;
    const M: i64 = 60_000;
    let t0 = NOW - 3_600_000;
    // A job submitted at t0 with first steps `(minutes after submit, origin)`.
    let job = |kind: pb::PoolKind, first_steps: &[(i64, pb::StepOrigin)]| {
        let ev = |n: u64, at: i64, kind: EventKind| CompactEvent { at_ms: at, id_hash: n, seq: n, attempt: None, kind };
        let mut events = vec![ev(1, t0, EventKind::Submitted(attrs(kind, "h100")))];
        for (i, (m, origin)) in first_steps.iter().enumerate() {
            events.push(ev(2 + i as u64, t0 + m * M, EventKind::FirstStep { step: i as u64, origin: *origin }));
        }
        HotJob { rec: JobRecord::from_events(events), ..HotJob::default() }
    };
    let report = |jobs: &[HotJob]| {
        let mut c = Collector::new(Query {
            left: Selector::parse("pool_kind=managed").expect("left"),
            right: Selector::parse("pool_kind=dedicated").expect("right"),
            by: None,
            window_ms: 86_400_000,
            now_ms: NOW,
            cost: None,
        });
        for j in jobs {
            c.add(j.view());
        }
        c.finish(&[]).groups.remove(0)
    };
    let managed_a = job(pb::PoolKind::Managed, &[(10, ContainerStart), (15, TrainingProcess)]);
    let managed_b = job(pb::PoolKind::Managed, &[(5, ContainerStart)]);
    let dedicated = [
        job(pb::PoolKind::Dedicated, &[(20, TrainingProcess)]),
        job(pb::PoolKind::Dedicated, &[(30, TrainingProcess)]),
    ];
    let all = report(&[managed_a.clone(), managed_b, dedicated[0].clone(), dedicated[1].clone()]);
    let s = |tp, cs, ss, un| FirstStepSources {
        training_process: tp,
        container_start: cs,
        scheduler_start: ss,
        unspecified: un,
    };
    assert_eq!(all.left.first_step_sources, s(1, 1, 0, 0));
    assert_eq!(all.right.first_step_sources, s(2, 0, 0, 0));
    assert!(all.difference.first_step_sources_differ);
    // The managed job with the trainer's step is measured to it (15 min), not to its container (10 min).
    assert_eq!((all.left.started, all.left.ttfs_seconds.max), (2, Some(900.0)));
    // Both sides measured by the training process: comparable.
    let fair = report(&[managed_a, dedicated[0].clone()]);
    assert_eq!(fair.left.first_step_sources, s(1, 0, 0, 0));
    assert!(!fair.difference.first_step_sources_differ);
    // A side without started jobs differs from nothing.
    let one_sided = report(&[job(pb::PoolKind::Managed, &[]), dedicated[0].clone()]);
    assert_eq!(one_sided.left.first_step_sources, s(0, 0, 0, 0));
    assert!(!one_sided.difference.first_step_sources_differ);
    // Unspecified (older agents) on both sides against unspecified: comparable; against scheduler starts: not.
    let old = report(&[
        job(pb::PoolKind::Managed, &[(5, Unspecified)]),
        job(pb::PoolKind::Dedicated, &[(5, SchedulerStart)]),
    ]);
    assert_eq!((old.left.first_step_sources, old.right.first_step_sources), (s(0, 0, 0, 1), s(0, 0, 1, 0)));
    assert!(old.difference.first_step_sources_differ);
}
