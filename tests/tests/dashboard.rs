//! The built-in dashboard in a real headless Chromium (Debian `chromium`, installed by scripts/test.sh): each
//! view is loaded against a collector fed by the simulator, the rendered numbers are compared with the JSON API,
//! and a screenshot of each view is kept under `test-artifacts/`.

use startline_tests::{binary, workspace_root, Collector};
use std::process::Command;

fn chromium(args: &[&str], profile: &std::path::Path) -> std::process::Output {
    Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs (scripts/test.sh installs Debian's chromium)")
}

/// The value of attribute `attr` on the element whose `id` is `id`.
fn attr_of(dom: &str, id: &str, attr: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let tag_start = dom[..at].rfind('<')?;
    let tag_end = at + dom[at..].find('>')?;
    let tag = &dom[tag_start..tag_end];
    let key = format!("{attr}=\"");
    let v = tag.find(&key)? + key.len();
    Some(tag[v..v + tag[v..].find('"')?].to_string())
}

/// The text right after the element with `id`'s opening tag, up to the next `<`.
fn text_of(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let open_end = at + dom[at..].find('>')? + 1;
    Some(dom[open_end..open_end + dom[open_end..].find('<')?].trim().to_string())
}

/// The DOM of a dashboard view once Chromium rendered it (asserting that it finished and loaded its data).
pub(crate) fn rendered_dom(c: &Collector, view: &str, dir: &std::path::Path) -> String {
    let url = format!("http://{}/#{view}", c.http);
    let out = chromium(&["--dump-dom", &url], &dir.join(format!("profile-dom-{}", view.replace('/', "_"))));
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let name = view.split(['/', '?']).next().unwrap_or(view);
    assert!(
        dom.contains(&format!("data-ready=\"{name}\"")),
        "view {view} did not finish rendering: {}",
        &dom[..dom.len().min(2000)]
    );
    assert!(!dom.contains("data-failed="), "view {view} failed to load data: {}", &dom[..dom.len().min(3000)]);
    dom
}

fn render(c: &Collector, view: &str, dir: &std::path::Path) -> String {
    let url = format!("http://{}/#{view}", c.http);
    let dom = rendered_dom(c, view, dir);
    let name = view.split(['/', '?']).next().unwrap_or(view);
    // Keep a screenshot as an artifact.
    let shots = workspace_root().join("test-artifacts");
    std::fs::create_dir_all(&shots).expect("artifacts dir");
    let png = shots.join(format!("dashboard-{name}.png"));
    let _ = chromium(&[&format!("--screenshot={}", png.display()), &url], &dir.join(format!("profile-shot-{name}")));
    assert!(png.metadata().map(|m| m.len() > 10_000).unwrap_or(false), "screenshot {} missing or empty", png.display());
    dom
}

/// The `<tr ...>` element (up to `</tr>`) that starts with `key`.
fn row_of<'a>(dom: &'a str, key: &str) -> Option<&'a str> {
    let at = dom.match_indices(key).map(|(i, _)| i).find(|i| !dom[i + key.len()..].starts_with("\"$"))?;
    Some(&dom[at..at + dom[at..].find("</tr>")?])
}

/// Checks a row's expected-start cells against the API's `expected_start` read before and after the render: a
/// dash when it is null, else its basis, and its time and interval between the two reads (an estimate moves with
/// the clock as the job waits, never earlier; the times share one format, so they compare as text).
fn check_expected_start(what: &str, tr: &str, before: &serde_json::Value, after: &serde_json::Value) {
    if after.is_null() && before.is_null() {
        assert!(tr.contains("<td class=\"n eta\" data-at=\"\">–</td>"), "{what}: a dash when there is none: {tr}");
        return;
    }
    let shown = |k: &str| {
        let key = format!("{k}=\"");
        let v = tr.find(&key).map(|i| i + key.len())?;
        Some(tr[v..v + tr[v..].find('"')?].to_string())
    };
    let basis = shown("data-basis").unwrap_or_else(|| panic!("{what}: no basis in {tr}"));
    assert!(
        [before, after].iter().any(|e| e["basis"].as_str() == Some(basis.as_str())),
        "{what}: basis {basis}, API {} / {}",
        before["basis"],
        after["basis"]
    );
    for (attr, field) in [("data-at", "at"), ("data-low", "low"), ("data-high", "high")] {
        let got = shown(attr).unwrap_or_else(|| panic!("{what}: no {attr} in {tr}"));
        let api: Vec<&str> = [before, after].iter().filter_map(|e| e[field].as_str()).collect();
        let (lo, hi) = (api.iter().min().copied().unwrap_or(""), api.iter().max().copied().unwrap_or(""));
        assert!(lo <= got.as_str() && got.as_str() <= hi, "{what}: {attr} {got}, API {lo} .. {hi}");
    }
}

#[test]
fn every_dashboard_view_renders_the_api_numbers_in_chromium() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Prices for the simulator's pools (managed per use, dedicated amortised over their capacity; l40s is the Kueue
    // cluster queue).
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        "[cost]\ncurrency = \"USD\"\n\
         [[cost.price]]\nmatch = \"pool=sm-p4d\"\nper_gpu_hour = 4.10\n\
         [[cost.price]]\nmatch = \"pool=vertex-a3\"\nper_gpu_hour = 11.0\n\
         [[cost.dedicated]]\npool = \"a100\"\ngpus = 64\nper_gpu_hour = 1.6\n\
         [[cost.dedicated]]\npool = \"h100\"\ngpus = 48\nper_gpu_hour = 2.9\n\
         [[cost.dedicated]]\npool = \"l40s\"\ngpus = 88\nper_gpu_hour = 0.9\n\
         [[chain_slo]]\nname = \"safety-fix\"\nthreshold = \"1h\"\nobjective = 90\n\
         [chain_slo.selector]\nchain_id_prefix = [\"safety-fix/\"]\n",
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", &cfg.display().to_string()]);
    let sim = Command::new(binary("startline-agent"))
        .args(["--collector", &c.endpoint(), "simulate", "--history", "2d", "--seed", "7", "--jobs-per-hour", "40"])
        .output()
        .expect("simulator");
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));

    // The page itself is served from the binary, with no external resources.
    let (status, _) = c.get("/api/v1/overview");
    assert_eq!(status, 200);
    let page = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(c.http).expect("connect");
        write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("write");
        let mut b = String::new();
        s.read_to_string(&mut b).expect("read");
        b
    };
    assert!(page.contains("<title>Startline</title>"));
    assert!(!page.contains("https://") && !page.contains("src=\"http"), "no external assets");

    // Queue latency.
    let dom = render(&c, "queue", dir.path());
    let (_, o) = c.get("/api/v1/overview?window=7d");
    assert_eq!(attr_of(&dom, "waiting-total", "data-value"), Some(o["waiting_total"].to_string()));
    assert_eq!(text_of(&dom, "waiting-total"), Some(o["waiting_total"].to_string()));
    for p in o["ttfs_by_pool"].as_array().expect("pools") {
        let row = format!(
            "data-pool=\"{}\" data-priority=\"{}\"",
            p["pool"].as_str().expect("pool"),
            p["priority"].as_str().expect("prio")
        );
        let at = dom.find(&row).unwrap_or_else(|| panic!("row {row} missing"));
        let end = at + dom[at..].find("</tr>").expect("row end");
        let tr = &dom[at..end];
        assert!(tr.contains(&format!("<td class=\"n started\">{}</td>", p["started"])), "{tr}");
        assert!(tr.contains(&format!("class=\"n p50\" data-value=\"{}\"", p["p50"])), "{tr} vs {}", p["p50"]);
    }

    // The waiting list: each queued job with its expected start as the API gives it, a dash where it has none.
    let queued = || c.get("/api/v1/jobs?state=queued&limit=100").1;
    let before = queued();
    let dom = render(&c, "queue", dir.path());
    let after = queued();
    let jobs = after["jobs"].as_array().expect("jobs");
    assert!(!jobs.is_empty(), "the simulated fleet leaves jobs waiting");
    assert!(jobs.iter().any(|j| !j["expected_start"].is_null()), "some waiting job has an expected start");
    let mut checked = 0;
    for j in jobs {
        let id = j["job_id"].as_str().expect("id");
        let Some(earlier) = before["jobs"].as_array().and_then(|b| b.iter().find(|x| x["job_id"] == id)) else {
            continue;
        };
        let tr = row_of(&dom, &format!("<tr data-job=\"{id}\"")).unwrap_or_else(|| panic!("waiting job {id} missing"));
        check_expected_start(id, tr, &earlier["expected_start"], &j["expected_start"]);
        checked += 1;
    }
    assert!(checked > 0, "jobs waiting across the render");

    // SLOs and alerts.
    let firing_now = || {
        let (_, a) = c.get("/api/v1/alerts?state=firing");
        a["alerts"].as_array().map_or(0, Vec::len)
    };
    let firing_before = firing_now();
    let histories = |s: &serde_json::Value| -> Vec<serde_json::Value> {
        s["slos"]
            .as_array()
            .expect("slos")
            .iter()
            .map(|x| c.get(&format!("/api/v1/slos/{}/history", x["name"].as_str().expect("name"))).1)
            .collect()
    };
    let before = histories(&c.get("/api/v1/slos").1);
    let dom = render(&c, "slos", dir.path());
    let (_, s) = c.get("/api/v1/slos");
    let after = histories(&s);
    // The SLO charts: one budget and one burn chart per SLO, with every point of its history; the last value is
    // the history's (read before or after the render: deadlines may cross meanwhile).
    for (i, x) in s["slos"].as_array().expect("slos").iter().enumerate() {
        let name = x["name"].as_str().expect("name");
        for (chart, last_of) in [("budget", "/error_budget_remaining"), ("burn", "/burn_rates/0/long")] {
            let key = format!("data-chart=\"{chart}\" data-slo=\"{name}\"");
            let at = dom.find(&key).unwrap_or_else(|| panic!("{chart} chart of {name} missing"));
            let svg = &dom[at..at + dom[at..].find("</svg>").expect("svg end")];
            let attr = |a: &str| {
                let k = format!("{a}=\"");
                let v = svg.find(&k).expect("attribute") + k.len();
                svg[v..v + svg[v..].find('"').expect("quote")].to_string()
            };
            let points = after[i]["points"].as_array().expect("points");
            assert!(points.len() > 100, "{name}: {} points", points.len());
            assert_eq!(attr("data-points"), points.len().to_string(), "{chart} of {name}");
            // (serde_json's default float parsing may differ from the browser's in the last digit.)
            let last = |h: &serde_json::Value| {
                let p = h["points"].as_array().and_then(|p| p.last()).cloned().unwrap_or_default();
                p.pointer(last_of).and_then(|v| v.as_f64()).unwrap_or(f64::NAN)
            };
            let shown: f64 = attr("data-last").parse().expect("a number");
            let same = |v: f64| (shown - v).abs() <= 1e-9 * v.abs().max(1.0);
            assert!(
                same(last(&before[i])) || same(last(&after[i])),
                "{chart} of {name}: shown {shown}, before {}, after {}",
                last(&before[i]),
                last(&after[i])
            );
            // Each series is drawn through every point.
            let paths = svg.matches("<path data-series=").count();
            assert_eq!(
                paths,
                if chart == "budget" { 1 } else { after[i]["burn_rules"].as_array().map_or(0, Vec::len) }
            );
            let d = svg.find(" d=\"M").expect("path data");
            let d = &svg[d..d + svg[d..].find("\" fill").expect("path end")];
            assert_eq!(d.matches('L').count() + 1, points.len(), "{chart} of {name}: one vertex per point");
        }
    }
    for x in s["slos"].as_array().expect("slos") {
        let name = x["name"].as_str().expect("name");
        let at = dom.find(&format!("<tr data-slo=\"{name}\"")).expect("slo row");
        let tr = &dom[at..at + dom[at..].find("</tr>").expect("end")];
        assert!(tr.contains(&format!("<td class=\"n good-n\">{}</td>", x["status"]["good"])), "{tr}");
        let shown = format!("{:.2}%", x["status"]["compliance"].as_f64().expect("c") * 100.0);
        // Deadlines may cross between the render and this read; the good count cannot change without events.
        if tr.contains(&format!("<td class=\"n bad-n\">{}</td>", x["status"]["bad"])) {
            assert!(tr.contains(&shown), "{tr} should show {shown}");
        }
    }
    // Pages fire as deadlines cross during the render (no event arrives meanwhile, so none resolves): the
    // count shown lies between the counts read before and after it.
    let firing_after = firing_now();
    let shown: usize = attr_of(&dom, "alerts-firing", "data-value").and_then(|v| v.parse().ok()).expect("count shown");
    assert!(
        (firing_before.min(firing_after)..=firing_before.max(firing_after)).contains(&shown),
        "shown {shown}, firing before {firing_before} and after {firing_after}"
    );

    // Managed vs dedicated.
    let dom = render(&c, "compare", dir.path());
    let (_, cmp) = c.get("/api/v1/compare?window=30d&by=gpu_class");
    let all = &cmp["groups"][0];
    assert_eq!(
        attr_of(&dom, "cmp-left-p50", "data-value"),
        Some(all["left"]["ttfs_seconds"]["p50"]["value"].to_string())
    );
    assert_eq!(
        attr_of(&dom, "cmp-right-p50", "data-value"),
        Some(all["right"]["ttfs_seconds"]["p50"]["value"].to_string())
    );
    assert_eq!(attr_of(&dom, "cmp-verdict", "data-significant"), Some(all["difference"]["significant"].to_string()));
    // Where first steps came from, each count as the API gives it (rows only for sources either side has). The
    // simulated Vertex AI jobs report only their containers' start, the SageMaker and dedicated ones the training
    // loop's first step: the sides differ, and the page says so.
    for key in ["training_process", "container_start", "scheduler_start", "unspecified"] {
        let (l, r) = (&all["left"]["first_step_sources"][key], &all["right"]["first_step_sources"][key]);
        let shown = (text_of(&dom, &format!("cmp-left-{key}")), text_of(&dom, &format!("cmp-right-{key}")));
        if l.as_u64().unwrap_or(0) + r.as_u64().unwrap_or(0) > 0 {
            assert_eq!(shown, (Some(l.to_string()), Some(r.to_string())), "{key}");
        } else {
            assert_eq!(shown, (None, None), "{key}");
        }
    }
    assert!(all["left"]["first_step_sources"]["container_start"].as_u64() > Some(0), "{}", all["left"]);
    assert_eq!(all["right"]["first_step_sources"]["container_start"], 0);
    assert_eq!(all["difference"]["first_step_sources_differ"], true);
    assert!(dom.contains("id=\"cmp-sources-warning\""), "the page warns that the sides measure different things");
    // Cost per useful GPU-hour (priced by the config above); open jobs' cost grows with the clock between the
    // render and the API call, by far less than 0.1%.
    for (id, side) in [("cmp-left-cost", "left"), ("cmp-right-cost", "right")] {
        let shown: f64 = attr_of(&dom, id, "data-value").and_then(|v| v.parse().ok()).expect("cost shown");
        let api = all[side]["cost"]["per_useful_gpu_hour"]["value"].as_f64().expect("cost in the API");
        assert!((shown - api).abs() <= 1e-3 * api, "{side}: {shown} vs {api}");
    }

    // Where would a job start now: for the GPU class with the most jobs, each pool the advice names, in its order,
    // with its expected start, expected cost, goodput and failure rate as the API says.
    let class = cmp["groups"]
        .as_array()
        .and_then(|g| g.iter().find(|x| x["group"] != "all" && x["group"] != ""))
        .and_then(|x| x["group"].as_str())
        .expect("a GPU class")
        .to_string();
    let ask = format!("gpus=8&gpu_class={class}&priority=normal&duration=12h");
    let before = c.get(&format!("/api/v1/advice?{ask}")).1;
    let dom = render(&c, &format!("compare?{ask}"), dir.path());
    let after = c.get(&format!("/api/v1/advice?{ask}")).1;
    let pools = after["pools"].as_array().expect("pools");
    assert!(!pools.is_empty(), "{class}: some pool can run it: {after}");
    assert!(pools.iter().any(|p| !p["expected_start"].is_null()), "{after}");
    let order: Vec<&str> = dom
        .match_indices("<tr data-advice-pool=\"")
        .filter(|(i, _)| !dom[i + 22..].starts_with('$'))
        .map(|(i, _)| &dom[i + 22..i + 22 + dom[i + 22..].find('"').expect("quote")])
        .collect();
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["pools"].as_array().expect("pools").iter().map(|p| p["pool"].as_str().expect("pool").to_string()).collect()
    };
    assert!(order == names(&before) || order == names(&after), "{order:?} vs {:?}", names(&after));
    for p in pools {
        let name = p["pool"].as_str().expect("pool");
        let earlier = before["pools"].as_array().and_then(|b| b.iter().find(|x| x["pool"] == p["pool"]));
        let tr = row_of(&dom, &format!("<tr data-advice-pool=\"{name}\"")).expect("advice row");
        check_expected_start(
            name,
            tr,
            &earlier.map_or(serde_json::Value::Null, |e| e["expected_start"].clone()),
            &p["expected_start"],
        );
        for (class, field) in [("goodput", "/goodput"), ("failure", "/failure_rate"), ("cost", "/cost/total")] {
            let key = format!("class=\"n {class}\" data-value=\"");
            let at = tr.find(&key).unwrap_or_else(|| panic!("{name}: no {class} in {tr}")) + key.len();
            let shown = &tr[at..at + tr[at..].find('"').expect("quote")];
            let api = |v: Option<&serde_json::Value>| v.and_then(|v| v.pointer(field)).and_then(|x| x.as_f64());
            match (shown.parse::<f64>().ok(), api(Some(p)), api(earlier)) {
                (None, None, _) => {}
                // Goodput and cost may move with open jobs between the calls: shown lies between before and after.
                (Some(v), Some(hi), lo) => {
                    let lo = lo.unwrap_or(hi);
                    assert!(
                        v >= lo.min(hi) * (1.0 - 1e-9) - 1e-12 && v <= lo.max(hi) * (1.0 + 1e-9) + 1e-12,
                        "{name} {class}: shown {v}, API {lo}..{hi}"
                    );
                }
                other => panic!("{name} {class}: shown {shown:?}, API {other:?}"),
            }
        }
    }
    // A refused request is shown in the panel, naming the parameter; the rest of the view still renders.
    let dom = render(&c, &format!("compare?gpus=8&gpu_class={class}&duration=soon"), dir.path());
    assert!(text_of(&dom, "advice-error").is_some_and(|t| t.starts_with("duration:")), "the error named");
    assert!(dom.contains("id=\"cmp-left-p50\""), "the comparison still renders");

    // GPU time: the total and each pool's row as the API says. Open jobs' time grows with the clock, so what is
    // shown lies between the API's answers before and after the render.
    let before = c.get("/api/v1/goodput?by=pool&window=30d").1;
    let dom = render(&c, "goodput", dir.path());
    let after = c.get("/api/v1/goodput?by=pool&window=30d").1;
    let within = |what: &str, shown: Option<String>, lo: f64, hi: f64| {
        let v: f64 = shown.and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{what}: no number shown"));
        assert!(v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9), "{what}: shown {v}, API {lo}..{hi}");
    };
    let hours = |g: &serde_json::Value| g["total_gpu_hours"].as_f64().expect("hours");
    within("total", attr_of(&dom, "gp-total", "data-value"), hours(&before["total"]), hours(&after["total"]));
    let rows = after["groups"].as_array().expect("groups");
    assert!(rows.len() >= 2, "{after}");
    for r in rows {
        let name = r["group"].as_str().expect("group");
        let earlier =
            before["groups"].as_array().and_then(|g| g.iter().find(|x| x["group"] == r["group"])).expect("row");
        let key = format!("data-goodput-row=\"{name}\" data-total=\"");
        let at = dom.find(&key).unwrap_or_else(|| panic!("row {name} missing"));
        let v = &dom[at + key.len()..];
        within(name, Some(v[..v.find('"').expect("quote")].to_string()), hours(earlier), hours(r));
    }

    // Cost: each pool's cost as the API says (per-use costs grow with open jobs: between before and after).
    let cost_before = c.get("/api/v1/cost?window=30d").1;
    let dom = render(&c, "goodput", dir.path());
    let cost_after = c.get("/api/v1/cost?window=30d").1;
    for p in cost_after["pools"].as_array().expect("pools") {
        let name = p["pool"].as_str().expect("pool");
        let earlier =
            cost_before["pools"].as_array().and_then(|g| g.iter().find(|x| x["pool"] == p["pool"])).expect("pool");
        let key = format!("data-cost-pool=\"{name}\" data-cost=\"");
        let at = dom.find(&key).unwrap_or_else(|| panic!("cost row {name} missing"));
        let v = &dom[at + key.len()..];
        let (lo, hi) = (earlier["cost"].as_f64().expect("priced"), p["cost"].as_f64().expect("priced"));
        within(name, Some(v[..v.find('"').expect("quote")].to_string()), lo, hi);
        if p["model"] == "amortised" {
            // Capacity x price x the hours the collector holds jobs for, whatever the jobs did.
            let (gpus, price) = match name {
                "a100" => (64.0, 1.6),
                "h100" => (48.0, 2.9),
                _ => (88.0, 0.9),
            };
            let hours = cost_after["covered_seconds"].as_f64().expect("covered") / 3600.0;
            // (`covered_seconds` is whole seconds; the cost is charged to the millisecond.)
            let one_second = gpus * price / 3600.0;
            assert!((hi - gpus * price * hours).abs() <= one_second, "{name}: {hi} vs {}", gpus * price * hours);
        }
    }
    assert_eq!(cost_after["pool_kinds"].as_array().map(Vec::len), Some(2));

    // Chains: a two-stage chain sent over gRPC; its row and its kind's median as the API says.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        use startline_proto::pb::{self, lifecycle_event::Kind};
        let sub = |stage: &str| {
            Kind::Submitted(pb::Submitted {
                pool_kind: pb::PoolKind::Dedicated as i32,
                provider: "slurm".into(),
                pool: "a100".into(),
                priority: pb::PriorityClass::Urgent as i32,
                gpu_count: 8,
                chain_id: "safety-fix/7".into(),
                chain_stage: stage.into(),
                ..Default::default()
            })
        };
        let t = startline_tests::ago(4 * 3600);
        let ev = startline_tests::event;
        let done = || Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() });
        let evs = vec![
            ev("sf7/train", "s", t, sub("train")),
            ev("sf7/train", "f", t + 600_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
            ev("sf7/train", "d", t + 3_600_000, done()),
            ev("sf7/eval", "s", t + 4_200_000, sub("evaluate")),
            ev("sf7/eval", "f", t + 4_500_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
            ev("sf7/eval", "d", t + 5_400_000, done()),
        ];
        let mut up =
            startline_agent::uplink::Publisher::new(startline_agent::uplink::UplinkSettings::new(c.endpoint()))
                .expect("publisher");
        up.send(evs).await.expect("send");
        up.flush().await.expect("flush");
    });
    let dom = render(&c, "chains", dir.path());
    let (_, l) = c.get("/api/v1/chains?window=30d");
    let chain = &l["chains"][0];
    assert_eq!(chain["chain_id"], "safety-fix/7");
    assert_eq!(chain["span_seconds"].as_f64(), Some(5400.0), "no final stages: complete when every member is done");
    assert!(dom.contains("data-chain=\"safety-fix/7\" data-span=\"5400\""), "{}", &dom[..dom.len().min(3000)]);
    assert!(dom.contains("data-chain-kind=\"train&gt;evaluate\" data-p50=\"5400\""), "kind row");
    // The chain SLO: 1 h deadline, the chain took 1.5 h: late.
    assert_eq!(l["slos"][0]["bad"], 1, "{}", l["slos"]);
    assert!(dom.contains("data-chain-slo=\"safety-fix\" data-bad=\"1\" data-late-open=\"0\""), "chain SLO row");
    assert!(dom.contains("safety-fix: late"), "the chain's verdict");

    // Nodes: the simulated fleet's placements, suspects first, as the API lists them (the view asks for pages of
    // 50); the managed pools' one-off instances summed up in their pool's row; then one node's jobs.
    let dom = render(&c, "nodes", dir.path());
    let (_, l) = c.get("/api/v1/nodes?limit=50");
    let rows = l["nodes"].as_array().expect("nodes");
    assert!(!rows.is_empty(), "the simulator names nodes");
    let first = &rows[0];
    let want = format!(
        "data-node=\"{}\" data-suspect=\"{}\" data-bad=\"{}\"",
        first["node"].as_str().expect("name"),
        first["suspect"],
        first["bad"]
    );
    assert!(dom.contains(&want), "{want} in {}", &dom[..dom.len().min(3000)]);
    // Rendered rows only (the page's own script holds the template, with `${` after the attribute).
    let rendered =
        |dom: &str, key: &str| dom.match_indices(key).filter(|(i, _)| !dom[i + key.len()..].starts_with("\"$")).count();
    assert_eq!(rendered(&dom, "<tr data-node="), rows.len(), "one row per node of the page");
    assert!(rows.iter().all(|r| r["pool_kind"] != "managed" || r["suspect"] == true), "instances only when suspect");
    let pools = l["pools"].as_array().expect("pools");
    let (mut listed, mut instances) = (0, 0);
    for p in pools {
        let row = format!(
            "data-pool=\"{}\" data-grouped=\"{}\" data-nodes=\"{}\" data-placements=\"{}\" data-suspects=\"{}\"",
            p["pool"].as_str().expect("pool"),
            p["grouped"],
            p["nodes"],
            p["placements"],
            p["suspects"]
        );
        assert!(dom.contains(&row), "{row} missing");
        assert_eq!(p["grouped"], p["kind"] == "managed", "{p}");
        if p["grouped"] == true {
            instances += p["nodes"].as_u64().expect("n");
        } else {
            listed += p["nodes"].as_u64().expect("n");
        }
    }
    assert!(pools.iter().any(|p| p["grouped"] == true), "the simulated fleet has managed pools: {}", l["pools"]);
    assert_eq!(attr_of(&dom, "nodes-listed", "data-value"), Some(listed.to_string()));
    assert_eq!(attr_of(&dom, "nodes-instances", "data-value"), Some(instances.to_string()));
    assert_eq!(
        l["grouped_instances"].as_u64(),
        Some(instances - rows.iter().filter(|r| r["pool_kind"] == "managed").count() as u64)
    );
    assert_eq!(attr_of(&dom, "node-page", "data-total"), Some(l["total"].to_string()));
    // A second page of 10.
    let dom = render(&c, "nodes?offset=10&limit=10", dir.path());
    let (_, p2) = c.get("/api/v1/nodes?offset=10&limit=10");
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["nodes"].as_array().expect("nodes").iter().map(|n| n["node"].as_str().expect("name").to_string()).collect()
    };
    let drawn: Vec<String> = dom
        .match_indices("<tr data-node=\"")
        .filter(|(i, _)| !dom[i + 15..].starts_with('$'))
        .map(|(i, _)| dom[i + 15..i + 15 + dom[i + 15..].find('"').expect("quote")].to_string())
        .collect();
    assert_eq!(drawn, names(&p2), "the page the API gives");
    assert_eq!(attr_of(&dom, "node-page", "data-first"), Some(if drawn.is_empty() { "0" } else { "11" }.to_string()));
    assert!(dom.contains("id=\"node-prev\""));
    // The filter: suspects only, and a name that finds one managed instance (from a managed job's placement).
    let dom = render(&c, "nodes?suspect=true", dir.path());
    let (_, sus) = c.get("/api/v1/nodes?suspect=true&limit=50");
    assert_eq!(rendered(&dom, "<tr data-node="), sus["nodes"].as_array().map_or(0, Vec::len));
    assert!(dom.contains("id=\"node-suspect\" checked"), "the filter shows what it filters");
    let (_, managed) = c.get("/api/v1/jobs?pool_kind=managed&state=done&limit=20");
    let instance = managed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find_map(|j| {
            let (_, d) = c.get(&format!("/api/v1/jobs/{}", j["job_id"].as_str().expect("id")));
            d["events"].as_array()?.iter().find(|e| e["kind"] == "node_assigned")?["detail"]["nodes"][0]
                .as_str()
                .map(str::to_string)
        })
        .expect("a managed job placed on an instance");
    let dom = render(&c, &format!("nodes?name={instance}"), dir.path());
    assert!(dom.contains(&format!("data-node=\"{instance}\"")), "{instance} found by name");
    assert!(!rows.iter().any(|r| r["node"] == instance.as_str()), "{instance} is not listed without the search");
    let node = first["node"].as_str().expect("name").to_string();
    let dom = render(&c, &format!("nodes/{node}"), dir.path());
    let (_, d) = c.get(&format!("/api/v1/nodes/{node}"));
    assert!(dom.contains(&format!("id=\"node-detail\" data-node=\"{node}\"")));
    let key = "<tr data-job=";
    let drawn = dom.match_indices(key).filter(|(i, _)| !dom[i + key.len()..].starts_with("\"$")).count();
    assert_eq!(drawn, d["incidents"].as_array().map_or(0, Vec::len));

    // Job timeline, for a job that started (the newest done jobs may include one that ended without starting).
    let (_, jobs) = c.get("/api/v1/jobs?state=done&limit=100");
    let id = jobs["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|j| j["time_to_first_step_seconds"].is_number())
        .and_then(|j| j["job_id"].as_str())
        .expect("a finished job that started")
        .to_string();
    let dom = render(&c, &format!("job/{id}"), dir.path());
    let (_, j) = c.get(&format!("/api/v1/jobs/{id}"));
    assert_eq!(text_of(&dom, "job-id"), Some(id.clone()));
    assert_eq!(text_of(&dom, "job-state").as_deref(), j["state"].as_str());
    assert_eq!(attr_of(&dom, "job-ttfs", "data-value"), Some(j["time_to_first_step_seconds"].to_string()));
    // Rendered bars (the page's own script holds the template, with `${` after the attribute).
    let key = "class=\"seg\" data-kind=\"";
    let bars = dom.match_indices(key).filter(|(i, _)| !dom[i + key.len()..].starts_with('$')).count();
    assert_eq!(bars, j["events"].as_array().map_or(0, Vec::len), "one bar per event");
}

/// A fresh, empty install: every view renders (with its "nothing yet" text where it has one) and none fails.
#[test]
fn every_view_of_an_empty_install_renders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    for view in ["queue", "slos", "compare", "goodput", "chains", "nodes", "job"] {
        let dom = render(&c, view, dir.path());
        if view == "chains" {
            assert!(dom.contains("id=\"chains-none\""), "chains: the empty text");
        }
        if view == "nodes" {
            assert!(dom.contains("id=\"nodes-none\""), "nodes: the empty text");
        }
    }
}
