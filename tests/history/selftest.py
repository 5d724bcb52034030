#!/usr/bin/env python3
"""Checks reproduce.py without a collector: writes a small history directory with DuckDB that follows the history
schema (one Parquet file per UTC end day, `end_date=YYYY-MM-DD/jobs.parquet`), computes the expected compare and
goodput answers from the same jobs in plain Python (sorting, nearest rank by integer arithmetic, pair counting
for Mann-Whitney, exact integer sums), runs reproduce.py and compares every field. Also checks its errors
(exit 2) and its `check` of the files.

    python3 tests/history/selftest.py        # exit 0 when every check passes

Counts, sums, percentiles and their intervals must be equal exactly; the mean and its interval to 1e-12
relative, and the Mann-Whitney z and p-value to 1e-6 (the collector uses an erf approximation good to 1.5e-7,
this file the library's erfc).
"""

import datetime
import json
import math
import os
import random
import subprocess
import sys
import tempfile

import duckdb

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "reproduce.py")
DAY = 86_400_000
HOUR = 3_600_000
MIN = 60_000
T0 = 1_795_132_800_000  # 2026-11-20T00:00:00Z
NOW = T0 + 11 * DAY + 12 * HOUR  # 2026-12-01T12:00:00Z
WINDOW = 10 * DAY  # jobs submitted from 2026-11-21T12:00:00Z to NOW, both included
CATS = ["waiting", "preparing", "requeue_wait", "checkpoint", "lost", "failed", "productive"]

# Hand-made jobs: attributes, submit offset from the window's start (ms; negative = before it), time to first
# step (ms, None = never started), first-step origin, initial waits (ms by segment, None = no map), GPUs. Each
# started job then runs for a seeded random time split into requeue wait, checkpoint, lost, failed and
# productive time (make_rows).
# Fields: (id, pool_kind, provider, pool, priority, gpu_class, region, team, project, chain_stage,
#          submit_offset, ttfs_ms, origin, waits, gpus)
JOBS = [
    ("m01", "managed", "sagemaker", "sm-a", "normal", "h100", "us-east-1", "vision", "p1", "", 0,
     90_000, "container_start", {"queued:capacity": 60_000, "preparing:image_pull": 30_000}, 8),
    ("m02", "managed", "sagemaker", "sm-a", "normal", "h100", "us-east-1", "vision", "p1", "pretrain", 1 * HOUR,
     120_000, "container_start", {"queued:capacity": 100_000, "preparing:image_pull": 20_000}, 8),
    ("m03", "managed", "sagemaker", "sm-a", "urgent", "h100", "us-east-1", "vision", "p2", "", 2 * HOUR + 5,
     45_500, "training_process", {"unreported": 500, "queued:capacity": 40_000, "assigned": 5_000}, 4),
    ("m04", "managed", "vertex", "vx-b", "normal", "a100", "europe-west4", "nlp", "p3", "", 3 * DAY,
     90_000, "training_process", {"queued:quota": 90_000}, 16),
    ("m05", "managed", "vertex", "vx-b", "normal", "a100", "europe-west4", "nlp", "p3", "", 3 * DAY + 17 * HOUR,
     600_000, "container_start", {"queued:quota": 500_000, "preparing:data_staging": 100_000}, 16),
    ("m06", "managed", "vertex", "vx-b", "urgent", "a100", "europe-west4", "nlp", "p3", "finetune", 4 * DAY,
     None, None, {"queued:quota": 300_000}, 16),
    ("m07", "managed", "azureml", "az-c", "normal", "", "westeurope", "", "", "", 4 * DAY + 23 * HOUR,
     1_234_567, None, {"unreported": 1_234_567}, 1),
    ("m08", "managed", "azureml", "az-c", "normal", "", "westeurope", "", "", "", 5 * DAY,
     30_001, "container_start", {"queued:capacity": 30_000, "assigned": 1}, 2),
    ("m09", "managed", "azureml", "az-c", "urgent", "h100", "westeurope", "vision", "p1", "", 5 * DAY + HOUR,
     90_000, "training_process", {"queued:capacity": 0, "queued:priority": 90_000}, 8),
    ("m10", "managed", "sagemaker", "all", "normal", "h100", "us-east-1", "vision", "p2", "", 6 * DAY,
     7_200_000, "container_start", {"queued:capacity": 7_000_000, "preparing:image_pull": 200_000}, 8),
    ("m11", "managed", "sagemaker", "sm-a", "normal", "h100", "us-east-1", "vision", "p2", "", 6 * DAY + 1,
     None, None, {}, 8),
    ("m12", "managed", "vertex", "vx-b", "normal", "a100", "europe-west4", "nlp", "p3", "", 7 * DAY,
     45_500, "container_start", None, 4),
    ("d01", "dedicated", "slurm", "cluster-a", "normal", "h100", "on-prem", "vision", "p1", "", 10,
     15_000, "training_process", {"queued:priority": 10_000, "assigned": 5_000}, 8),
    ("d02", "dedicated", "slurm", "cluster-a", "normal", "h100", "on-prem", "vision", "p1", "pretrain", HOUR,
     15_000, "training_process", {"queued:priority": 15_000}, 8),
    ("d03", "dedicated", "slurm", "cluster-a", "urgent", "h100", "on-prem", "vision", "p2", "", 13 * HOUR,
     3_600_000, "scheduler_start", {"queued:capacity": 3_500_000, "preparing:environment": 100_000}, 64),
    ("d04", "dedicated", "slurm", "cluster-a", "normal", "h100", "on-prem", "nlp", "p3", "", DAY,
     240_000, "training_process", {"queued:capacity": 200_000, "preparing:data_staging": 40_000}, 32),
    ("d05", "dedicated", "kueue", "kq-1", "normal", "a100", "on-prem", "nlp", "p3", "", 2 * DAY,
     240_000, "training_process", {"queued:quota": 240_000}, 8),
    ("d06", "dedicated", "kueue", "kq-1", "normal", "a100", "on-prem", "nlp", "p3", "", 2 * DAY + 6 * HOUR,
     59_999, "training_process", {"unreported": 59_999}, 8),
    ("d07", "dedicated", "kueue", "kq-1", "urgent", "a100", "on-prem", "nlp", "", "", 3 * DAY,
     None, None, {"queued:quota": 7_200_000}, 8),
    ("d08", "dedicated", "kueue", "kq-1", "urgent", "a100", "on-prem", "", "", "", 3 * DAY + 30 * MIN,
     None, None, {"queued:quota": 3_600_000, "assigned": 0}, 8),
    ("d09", "dedicated", "slurm", "cluster-b", "normal", "", "on-prem", "vision", "p1", "", 4 * DAY,
     300_000, "training_process", {"queued:capacity": 300_000}, 0),
    ("d10", "dedicated", "slurm", "cluster-b", "normal", "", "on-prem", "vision", "p1", "", 5 * DAY,
     15_000, "scheduler_start", {"queued:capacity": 15_000}, 4),
    ("d11", "dedicated", "slurm", "cluster-b", "normal", "h100", "on-prem", "vision", "p1", "", 8 * DAY,
     900_000, "training_process", {"queued:capacity": 800_000, "preparing:image_pull": 100_000}, 16),
    ("d12", "dedicated", "slurm", "cluster-b", "unspecified", "h100", "on-prem", "vision", "p1", "", WINDOW,
     60_000, "training_process", {"queued:capacity": 60_000}, 16),
    ("u01", "unspecified", "", "", "unspecified", "", "", "", "", "", 2 * DAY,
     30_000, "unspecified", {"unreported": 30_000}, 1),
    ("u02", "unspecified", "", "", "normal", "h100", "", "ml", "", "", 9 * DAY,
     None, None, {"unreported": 120_000}, 2),
    # Outside the window: one millisecond before its start, and one millisecond after now.
    ("x01", "managed", "sagemaker", "sm-a", "normal", "h100", "us-east-1", "vision", "p1", "", -1,
     10_000, "container_start", {"queued:capacity": 10_000}, 8),
    ("x02", "dedicated", "slurm", "cluster-a", "normal", "h100", "on-prem", "vision", "p1", "", WINDOW + 1,
     20_000, "training_process", {"queued:capacity": 20_000}, 8),
    ("x03", "dedicated", "slurm", "cluster-a", "normal", "h100", "on-prem", "vision", "p1", "", -5 * DAY,
     20_000, "training_process", {"queued:capacity": 20_000}, 8),
]
ATTRS = ["pool_kind", "provider", "pool", "priority", "gpu_class", "region", "team", "project", "chain_stage"]


def make_rows(seed=7):
    """Complete rows (every schema column) for JOBS: ends, runs and GPU time split so the identities hold."""
    rnd = random.Random(seed)
    rows = []
    for (jid, *attrs, off, ttfs, origin, waits, gpus) in JOBS:
        sub = NOW - WINDOW + off
        row = dict(zip(ATTRS, attrs))
        initial = sum((waits or {}).values())
        started = ttfs is not None
        if started:
            # The initial waits cover submit to the first step (m12 comes without waits).
            assert waits is None or initial == ttfs, jid
            run = rnd.randrange(10 * MIN, 30 * HOUR)
            requeue = rnd.choice([0, 0, rnd.randrange(0, run // 4)])
            left = run - requeue
            checkpoint = rnd.randrange(0, left // 10 + 1)
            lost = rnd.choice([0, rnd.randrange(0, left // 10 + 1)])
            failed = rnd.choice([0, 0, rnd.randrange(0, left // 10 + 1)])
            end = sub + initial + run
        else:
            run = requeue = checkpoint = lost = failed = 0
            end = sub + initial
        productive = run - requeue - checkpoint - lost - failed
        prep = sum(v for k, v in (waits or {}).items() if k.startswith("preparing:"))
        row.update(
            job_id=jid, gpu_count=gpus, node_count=max(1, gpus // 8),
            chain_id="chain-1" if row["chain_stage"] else "",
            labels={"team": row["team"]} if row["team"] else {},
            submitted_at=sub, first_queued_at=sub + 1 if waits else None, node_assigned_at=None,
            preparing_at=None, first_step_at=sub + ttfs if started else None, ended_at=end,
            last_checkpoint_at=end - 1 if checkpoint else None,
            first_step_origin=(origin or "unspecified") if started else None,
            outcome="succeeded" if started and not failed else ("failed" if started else "cancelled"),
            exit_code=0 if started else None, time_to_first_step_ms=ttfs, initial_wait_ms=waits,
            requeue_wait_ms=requeue, lost_work_ms=lost, checkpoint_save_ms=checkpoint, failed_work_ms=failed,
            runs=1 if started else 0, attempts=1, preemptions=1 if requeue else 0, node_losses=0, lost_steps=0,
            max_step=100 if started else None, last_checkpoint_step=50 if checkpoint else None,
            waiting_gpu_ms=(initial - prep) * gpus, preparing_gpu_ms=prep * gpus,
            requeue_wait_gpu_ms=requeue * gpus, checkpoint_gpu_ms=checkpoint * gpus, lost_gpu_ms=lost * gpus,
            failed_gpu_ms=failed * gpus, productive_gpu_ms=productive * gpus, total_gpu_ms=(end - sub) * gpus,
            nodes=[f"node-{i}" for i in range(max(1, gpus // 8))] if started else [],
        )
        rows.append(row)
    return rows


COLUMNS = [
    ("job_id", "VARCHAR"), ("pool_kind", "VARCHAR"), ("provider", "VARCHAR"), ("pool", "VARCHAR"),
    ("priority", "VARCHAR"), ("gpu_class", "VARCHAR"), ("gpu_count", "UINTEGER"), ("node_count", "UINTEGER"),
    ("region", "VARCHAR"), ("team", "VARCHAR"), ("project", "VARCHAR"), ("chain_id", "VARCHAR"),
    ("chain_stage", "VARCHAR"), ("labels", "MAP(VARCHAR, VARCHAR)"),
    ("submitted_at", "TS"), ("first_queued_at", "TS"), ("node_assigned_at", "TS"), ("preparing_at", "TS"),
    ("first_step_at", "TS"), ("ended_at", "TS"), ("last_checkpoint_at", "TS"),
    ("first_step_origin", "VARCHAR"), ("outcome", "VARCHAR"), ("exit_code", "INTEGER"),
    ("time_to_first_step_ms", "BIGINT"), ("initial_wait_ms", "MAP(VARCHAR, BIGINT)"),
    ("requeue_wait_ms", "BIGINT"), ("lost_work_ms", "BIGINT"), ("checkpoint_save_ms", "BIGINT"),
    ("failed_work_ms", "BIGINT"), ("runs", "UINTEGER"), ("attempts", "UINTEGER"), ("preemptions", "UINTEGER"),
    ("node_losses", "UINTEGER"), ("lost_steps", "UBIGINT"), ("max_step", "UBIGINT"),
    ("last_checkpoint_step", "UBIGINT"),
    ("waiting_gpu_ms", "BIGINT"), ("preparing_gpu_ms", "BIGINT"), ("requeue_wait_gpu_ms", "BIGINT"),
    ("checkpoint_gpu_ms", "BIGINT"), ("lost_gpu_ms", "BIGINT"), ("failed_gpu_ms", "BIGINT"),
    ("productive_gpu_ms", "BIGINT"), ("total_gpu_ms", "BIGINT"), ("nodes", "VARCHAR[]"),
]


def write_history(directory, rows, ts_type):
    """One zstd Parquet file per UTC day of ended_at, as the collector lays them out."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    ddl = ", ".join(f"{n} {ts_type if t == 'TS' else t}" for n, t in COLUMNS)
    con.execute(f"CREATE TABLE jobs ({ddl})")
    exprs = []
    for n, t in COLUMNS:
        if t == "TS":
            exprs.append(f"CAST(epoch_ms(?::BIGINT) AS {ts_type})")
        elif t.startswith("MAP("):
            k, v = t[4:-1].split(", ")
            exprs.append(f"CASE WHEN ?::BOOLEAN THEN MAP(?::{k}[], ?::{v}[]) END")
        else:
            exprs.append(f"?::{t}")
    sql = f"INSERT INTO jobs VALUES ({', '.join(exprs)})"
    for r in rows:
        params = []
        for n, t in COLUMNS:
            if t.startswith("MAP("):
                m = r[n]
                params += [m is not None, list((m or {}).keys()), list((m or {}).values())]
            else:
                params.append(r[n])
        con.execute(sql, params)
    days = sorted({r["ended_at"] // DAY for r in rows})
    for d in days:
        name = (datetime.date(1970, 1, 1) + datetime.timedelta(days=d)).isoformat()
        part = os.path.join(directory, f"end_date={name}")
        os.makedirs(part, exist_ok=True)
        con.execute(
            f"COPY (SELECT * FROM jobs WHERE epoch_ms(ended_at::TIMESTAMP) // {DAY} = {d} ORDER BY job_id) "
            f"TO '{os.path.join(part, 'jobs.parquet')}' (FORMAT parquet, COMPRESSION zstd)")
    return len(days)


# ---------------------------------------------------------------------------------------------------------------
# The independent model of the API's answers


def nearest_rank(sorted_xs, pct):
    """The smallest value with at least pct% of the data at or below it (pct an integer percent)."""
    if not sorted_xs:
        return None
    n = len(sorted_xs)
    rank = max(1, -(-pct * n // 100))
    return sorted_xs[rank - 1]


def rank_ci(sorted_xs, pct):
    if not sorted_xs:
        return None
    n = len(sorted_xs)
    q = pct / 100
    half = 1.96 * math.sqrt(n * q * (1 - q))
    lo = min(max(math.floor(n * q - half), 1), n)
    hi = min(max(math.ceil(n * q + half), 1), n)
    return [sorted_xs[lo - 1], sorted_xs[hi - 1]]


def matches(row, sel):
    for part in sel.split(","):
        if part.strip():
            k, v = part.split("=", 1)
            if row[k.strip()] != v.strip():
                return False
    return True


def model_compare(rows, left, right, by, limit=100):
    lo = NOW - WINDOW
    groups = {}
    for r in rows:
        if not lo <= r["submitted_at"] <= NOW:
            continue
        sides = [s for s, sel in (("left", left), ("right", right)) if matches(r, sel)]
        keys = ["all"] + ([r[by]] if by else [])
        for k in keys:
            for s in sides:
                groups.setdefault(k, {"left": [], "right": []})[s].append(r)
    reports = []
    for k in ["all"] + sorted(x for x in groups if x != "all"):
        if k not in groups:
            continue
        l_rows, r_rows = groups[k]["left"], groups[k]["right"]
        lt = sorted(r["time_to_first_step_ms"] / 1000 for r in l_rows if r["time_to_first_step_ms"] is not None)
        rt = sorted(r["time_to_first_step_ms"] / 1000 for r in r_rows if r["time_to_first_step_ms"] is not None)
        left_rep, right_rep = model_side(l_rows), model_side(r_rows)
        mw = model_mw(lt, rt)
        significant = mw is not None and mw["p_value"] < 0.05
        pl, pr = nearest_rank(lt, 50), nearest_rank(rt, 50)
        srcl = {o for o, n in left_rep["first_step_sources"].items() if n}
        srcr = {o for o, n in right_rep["first_step_sources"].items() if n}
        reports.append({"group": k, "left": left_rep, "right": right_rep, "difference": {
            "test": "mann-whitney-u, two-sided, normal approximation with tie correction", "alpha": 0.05,
            "mann_whitney": mw, "significant": significant,
            "faster": ("right" if mw["prob_left_greater"] > 0.5 else "left") if significant else None,
            "p50_ratio_right_over_left": pr / pl if pl and pr is not None else None,
            "first_step_sources_differ": bool(srcl) and bool(srcr) and srcl != srcr}})
    total = len(reports) - 1 if reports else 0
    truncated = total > limit
    if truncated:
        ranked = sorted(reports[1:], key=lambda g: -(g["left"]["jobs"] + g["right"]["jobs"]))[:limit]
        reports = [reports[0]] + [g for g in reports[1:] if any(g is x for x in ranked)]
    names = {"pool_kind": "PoolKind", "provider": "Provider", "pool": "Pool", "priority": "Priority",
             "gpu_class": "GpuClass", "region": "Region"}
    return {"left": left, "right": right, "by": names[by] if by else None, "window_seconds": WINDOW // 1000,
            "groups": reports, "groups_total": total, "truncated": truncated}


def model_side(rows):
    started = [r for r in rows if r["time_to_first_step_ms"] is not None]
    xs = sorted(r["time_to_first_step_ms"] / 1000 for r in started)
    waits = {}
    for r in rows:
        for k, v in (r["initial_wait_ms"] or {}).items():
            waits[k] = waits.get(k, 0) + v
    wsum = sum(waits.values())
    sources = {"training_process": 0, "container_start": 0, "scheduler_start": 0, "unspecified": 0}
    for r in started:
        sources[r["first_step_origin"] or "unspecified"] += 1
    mean = None
    if xs:
        m = math.fsum(xs) / len(xs)
        if len(xs) > 1:
            sd = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))
            half = 1.96 * sd / math.sqrt(len(xs))
        else:
            half = 0.0
        mean = {"value": m, "ci95": [m - half, m + half]}
    by_hour = []
    for h in range(24):
        hx = sorted(r["time_to_first_step_ms"] / 1000 for r in started if (r["submitted_at"] % DAY) // HOUR == h)
        by_hour.append({"hour_utc": h, "started": len(hx), "p50": nearest_rank(hx, 50), "p90": nearest_rank(hx, 90)})
    return {
        "jobs": len(rows), "started": len(started), "still_waiting": 0,
        "ended_before_start": len(rows) - len(started),
        "ttfs_seconds": {
            "p50": {"value": nearest_rank(xs, 50), "ci95": rank_ci(xs, 50)},
            "p90": {"value": nearest_rank(xs, 90), "ci95": rank_ci(xs, 90)},
            "p99": {"value": nearest_rank(xs, 99), "ci95": rank_ci(xs, 99)},
            "mean": mean, "max": xs[-1] if xs else None},
        "first_step_sources": sources,
        "wait_split": {k: {"seconds": v / 1000, "share": v / wsum if wsum else 0.0} for k, v in sorted(waits.items())},
        "by_hour": by_hour,
    }


def model_mw(a, b):
    """U by counting pairs; z and p with the tie-corrected variance and the library's erfc."""
    if not a or not b:
        return None
    u = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)
    n1, n2 = len(a), len(b)
    n = n1 + n2
    counts = {}
    for v in a + b:
        counts[v] = counts.get(v, 0) + 1
    ties = sum(t ** 3 - t for t in counts.values())
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    d = u - n1 * n2 / 2
    z = (d - 0.5 * (1 if d >= 0 else -1)) / math.sqrt(var) if var > 0 else 0.0
    p = math.erfc(abs(z) / math.sqrt(2))
    return {"u_left": u, "z": z, "p_value": min(max(p, 0.0), 1.0), "prob_left_greater": u / (n1 * n2)}


def model_goodput(rows, by, limit=100):
    lo = NOW - WINDOW
    sums = {}
    total = new_sum()
    for r in rows:
        if not lo <= r["submitted_at"] <= NOW:
            continue
        key = r[by] or "(none)"
        for s in (sums.setdefault(key, new_sum()), total):
            s["jobs"] += 1
            for c in CATS:
                s[c] += r[f"{c}_gpu_ms"]
            for k, v in (r["initial_wait_ms"] or {}).items():
                m = s["prep"] if k.startswith("preparing:") else s["wait"]
                m[k] = m.get(k, 0) + v * r["gpu_count"]
    groups = sorted((dict(group=k, **goodput_report(s)) for k, s in sums.items()),
                    key=lambda g: (-g["total_gpu_hours"], g["group"]))
    return {"as_of": "2026-12-01T12:00:00.000Z", "by": by, "categories": CATS, "groups": groups[:limit],
            "groups_total": len(groups), "truncated": len(groups) > limit, "total": goodput_report(total),
            "window_seconds": WINDOW // 1000}


def new_sum():
    return {"jobs": 0, "wait": {}, "prep": {}, **{c: 0 for c in CATS}}


def goodput_report(s):
    total = sum(s[c] for c in CATS)
    held = s["preparing"] + s["checkpoint"] + s["lost"] + s["failed"] + s["productive"]
    rep = {f"{c}_gpu_hours": s[c] / HOUR for c in CATS}
    rep.update(jobs=s["jobs"], total_gpu_hours=total / HOUR,
               goodput=s["productive"] / total if total else None,
               overhead_share=(held - s["productive"]) / held if held else None,
               waiting_by_segment={k: v / HOUR for k, v in sorted(s["wait"].items())},
               preparing_by_phase={k: v / HOUR for k, v in sorted(s["prep"].items())})
    return rep


# ---------------------------------------------------------------------------------------------------------------
# Comparison and running


def same(want, got, path, approx):
    """Asserts got == want; floats under a path ending in one of `approx` (name -> rel tol) within tolerance."""
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: want an object, got {got!r}"
        assert set(want) == set(got), f"{path}: fields {sorted(got)} != {sorted(want)}"
        for k in want:
            same(want[k], got[k], f"{path}.{k}", approx)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (w, g) in enumerate(zip(want, got)):
            same(w, g, f"{path}[{i}]", approx)
    elif isinstance(want, float) and not isinstance(want, bool):
        assert isinstance(got, float), f"{path}: {got!r} is not a float (want {want!r})"
        tol = next((t for key, t in approx.items() if key in path), None)
        if tol is None:
            assert got == want, f"{path}: {got!r} != {want!r}"
        else:
            assert math.isclose(got, want, rel_tol=tol, abs_tol=tol), f"{path}: {got!r} != {want!r} (tol {tol})"
    else:
        assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


APPROX = {".mean.": 1e-12, ".mann_whitney.z": 1e-6, ".mann_whitney.p_value": 1e-6}


def run(*args, expect=0):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    assert p.returncode == expect, f"reproduce.py {' '.join(args)}: exit {p.returncode}, stderr:\n{p.stderr}"
    return json.loads(p.stdout) if expect == 0 else p.stderr


def main():
    rows = make_rows()
    checks = 0
    with tempfile.TemporaryDirectory(prefix="startline-history-") as tmp:
        dirs = {}
        for ts in ("TIMESTAMPTZ", "TIMESTAMP_MS"):
            d = os.path.join(tmp, ts.lower())
            days = write_history(d, rows, ts)
            assert days >= 8, days
            dirs[ts] = d
        win = ["--window-ms", str(WINDOW), "--now-ms", str(NOW)]
        for ts, d in dirs.items():
            got = run("check", "--dir", d)
            assert got == {"ok": True, "jobs": len(JOBS), "files": days}, got
            for left, right, by in [
                ("pool_kind=managed", "pool_kind=dedicated", None),
                ("pool_kind=managed", "pool_kind=dedicated", "priority"),
                ("pool_kind=managed", "pool_kind=dedicated", "pool"),
                ("pool_kind=managed, gpu_class=h100", "", "gpu_class"),
                ("provider=slurm", "priority=urgent", "region"),
                ("pool_kind=nothing", "pool_kind=dedicated", "provider"),
            ]:
                args = ["compare", "--dir", d, "--left", left, "--right", right, *win]
                if by:
                    args += ["--by", by]
                same(model_compare(rows, left, right, by), run(*args), f"compare[{left}|{right}|{by}]", APPROX)
                checks += 1
            got = run("compare", "--dir", d, "--by", "pool", "--limit", "2", *win)
            same(model_compare(rows, "pool_kind=managed", "pool_kind=dedicated", "pool", limit=2), got,
                 "compare[limit 2]", APPROX)
            assert got["truncated"] and got["groups_total"] == 6 and len(got["groups"]) == 3, got["groups_total"]
            for by in ["pool_kind", "provider", "pool", "priority", "gpu_class", "region", "team", "project",
                       "chain_stage"]:
                same(model_goodput(rows, by), run("goodput", "--dir", d, "--by", by, *win), f"goodput[{by}]", {})
                checks += 1
            got = run("goodput", "--dir", d, "--by", "team", "--limit", "1", *win)
            same(model_goodput(rows, "team", limit=1), got, "goodput[limit 1]", {})
            checks += 2
        # Hand-checked figures (not from the model): managed in the window are m01..m12, 10 started; sorted TTFS
        # 30.001 45.5 45.5 90 90 90 120 600 1234.567 7200 s: p50 = 5th = 90, p90 = 9th = 1234.567, p99 = 10th.
        a = run("compare", "--dir", dirs["TIMESTAMPTZ"], *win)
        all_left = a["groups"][0]["left"]
        assert (all_left["jobs"], all_left["started"], all_left["ended_before_start"]) == (12, 10, 2), all_left
        ttfs = all_left["ttfs_seconds"]
        assert (ttfs["p50"]["value"], ttfs["p90"]["value"], ttfs["p99"]["value"], ttfs["max"]) == (
            90.0, 1234.567, 7200.0, 7200.0), ttfs
        assert all_left["first_step_sources"] == {
            "training_process": 3, "container_start": 6, "scheduler_start": 0, "unspecified": 1}
        # Dedicated: d01..d12 (x02 is 1 ms after now, x03 before the window), 10 started, d07 and d08 did not.
        all_right = a["groups"][0]["right"]
        assert (all_right["jobs"], all_right["started"]) == (12, 10), all_right
        # queued:quota waits of dedicated: d05 240 s + d07 7200 s + d08 3600 s.
        assert all_right["wait_split"]["queued:quota"]["seconds"] == 11040.0, all_right["wait_split"]
        assert all_right["wait_split"]["assigned"]["seconds"] == 5.0
        # With by=pool, the managed job in pool "all" joins the `all` group twice (as in the collector).
        p = run("compare", "--dir", dirs["TIMESTAMPTZ"], "--by", "pool", *win)
        assert p["groups"][0]["group"] == "all" and p["groups"][0]["left"]["jobs"] == 13
        assert [g["group"] for g in p["groups"][1:]] == sorted(
            ["sm-a", "vx-b", "az-c", "cluster-a", "kq-1", "cluster-b"]), [g["group"] for g in p["groups"]]
        # Goodput by team: u01's and m07/m08's empty team is "(none)"; d09 has 0 GPUs and counts as a job.
        g = run("goodput", "--dir", dirs["TIMESTAMPTZ"], "--by", "team", *win)
        none = next(x for x in g["groups"] if x["group"] == "(none)")
        assert none["jobs"] == 4, none  # m07, m08, d08, u01
        assert g["total"]["jobs"] == 26 and "group" not in g["total"]
        checks += 1
        # Errors: exit 2 with a message naming what is wrong.
        for args, needle in [
            (["compare", "--dir", os.path.join(tmp, "missing"), *win], "is not a directory"),
            (["compare", "--dir", tmp, *win], "no history files"),
            (["compare", "--dir", dirs["TIMESTAMPTZ"], "--by", "team", *win], "'team' is not one of"),
            (["compare", "--dir", dirs["TIMESTAMPTZ"], "--left", "colour=red", *win], "'colour' is not one of"),
            (["compare", "--dir", dirs["TIMESTAMPTZ"], "--right", "pool_kind", *win], "is not attribute=value"),
            (["goodput", "--dir", dirs["TIMESTAMPTZ"], "--by", "colour", *win], "'colour' is not one of"),
            (["goodput", "--dir", dirs["TIMESTAMPTZ"], "--window-ms", "x", "--now-ms", "1"], "invalid int value"),
        ]:
            err = run(*args, expect=2)
            assert needle in err, f"{args}: {err!r} does not say {needle!r}"
            checks += 1
        # A file that breaks the identities fails `check`; a missing column fails compare.
        bad = [dict(r) for r in rows]
        bad[0]["total_gpu_ms"] += 1
        bad[1]["time_to_first_step_ms"] += 1
        write_history(os.path.join(tmp, "bad"), bad, "TIMESTAMPTZ")
        err = run("check", "--dir", os.path.join(tmp, "bad"), expect=2)
        assert "do not add up to total_gpu_ms: e.g. jobs ['m01']" in err, err
        assert "is not first_step_at - submitted_at: e.g. jobs ['m02']" in err, err
        nocol = os.path.join(tmp, "nocol", "end_date=2026-11-22")
        os.makedirs(nocol)
        duckdb.sql(f"COPY (SELECT 'j' AS job_id) TO '{nocol}/jobs.parquet' (FORMAT parquet)")
        err = run("compare", "--dir", os.path.join(tmp, "nocol"), *win, expect=2)
        assert "column pool_kind is missing" in err, err
        checks += 3
    print(f"selftest: {checks} checks passed ({len(JOBS)} jobs, {days} day files, 2 timestamp encodings)")


if __name__ == "__main__":
    main()
