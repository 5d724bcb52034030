#!/usr/bin/env python3
"""Recomputes the collector's answers from its history files (Parquet, one row per ended job) with DuckDB.

    reproduce.py compare --dir HISTORY_DIR --left 'pool_kind=managed' --right 'pool_kind=dedicated' \
        [--by priority] --window-ms N --now-ms N [--limit 100]
    reproduce.py goodput --dir HISTORY_DIR [--by pool_kind] --window-ms N --now-ms N [--limit 100]
    reproduce.py check --dir HISTORY_DIR

`compare` prints what `GET /api/v1/compare` answers for the same selectors, grouping, window and clock, and
`goodput` what `GET /api/v1/goodput` answers, both as JSON with the API's field names, so a test can compare
them field by field. Counts, sums, maxima and nearest-rank percentiles are computed in SQL; the mean, the
confidence intervals and the Mann-Whitney test in Python over the sorted samples SQL returns, in the same
floating-point order as collector/src/compare/stats.rs, so they match bit for bit.

Not reproduced (they need the collector's configuration, not its files): each side's `slo` and `cost`, and the
compare answer's `history_deleted_through`. Jobs that had not ended are not in the files, so `still_waiting` is
0 unless a row lacks `ended_at`.

`check` validates the files themselves: the column types and nullability of the history schema, one row per job,
each row in the file of its end day, time to first step = first step - submit, and the GPU-time identities (categories
sum to total = (end - submit) x GPUs; waiting and preparing = the initial waits x GPUs).

Exit status 2, with a message on stderr, on a missing directory, no files, an unknown attribute, a malformed
selector, a file that does not follow the schema, or (check) a violated identity.
"""

import argparse
import datetime
import glob
import json
import math
import os
import sys

try:
    import duckdb
except ImportError:  # pragma: no cover
    sys.stderr.write("reproduce.py: the duckdb Python package is missing (python3 -m pip install duckdb)\n")
    sys.exit(2)

# Attributes a compare selector or grouping can name (collector/src/compare/mod.rs, Attr), and how the
# compare answer's `by` spells each (the Rust Debug name of the variant).
COMPARE_ATTRS = {
    "pool_kind": "PoolKind",
    "provider": "Provider",
    "pool": "Pool",
    "priority": "Priority",
    "gpu_class": "GpuClass",
    "region": "Region",
}
# Attributes goodput can group by (collector/src/api/goodput.rs, BY).
GOODPUT_BY = ["pool_kind", "provider", "pool", "priority", "gpu_class", "region", "team", "project", "chain_stage"]
# Goodput categories, in the API's order (collector/src/job/goodput.rs, CATEGORIES).
CATEGORIES = ["waiting", "preparing", "requeue_wait", "checkpoint", "lost", "failed", "productive"]
# First-step origins (labels of pb::StepOrigin), each a field of FirstStepSources; a started job without one
# counts as unspecified.
ORIGINS = ["training_process", "container_start", "scheduler_start", "unspecified"]
MW_TEST = "mann-whitney-u, two-sided, normal approximation with tie correction"
DEFAULT_LIMIT = 100
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
I64_MIN = -(2**63)

INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT"}
TIMESTAMP_TYPES = {"TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMP_MS", "TIMESTAMP_NS", "TIMESTAMP_S"}

# The history schema: column -> (type family, exact DuckDB type a Parquet file of that Arrow type reads as,
# nullable). Families are what compare/goodput need; `check` holds the files to the exact types.
STR, INT, TS, WAITS = "string", "integer", "timestamp", "map<string,int64>"
SCHEMA = {
    "job_id": (STR, "VARCHAR", False),
    "pool_kind": (STR, "VARCHAR", False),
    "provider": (STR, "VARCHAR", False),
    "pool": (STR, "VARCHAR", False),
    "priority": (STR, "VARCHAR", False),
    "gpu_class": (STR, "VARCHAR", False),
    "gpu_count": (INT, "UINTEGER", False),
    "node_count": (INT, "UINTEGER", False),
    "region": (STR, "VARCHAR", False),
    "team": (STR, "VARCHAR", False),
    "project": (STR, "VARCHAR", False),
    "chain_id": (STR, "VARCHAR", False),
    "chain_stage": (STR, "VARCHAR", False),
    "labels": ("map<string,string>", "MAP(VARCHAR, VARCHAR)", True),
    "submitted_at": (TS, None, False),
    "first_queued_at": (TS, None, True),
    "node_assigned_at": (TS, None, True),
    "preparing_at": (TS, None, True),
    "first_step_at": (TS, None, True),
    "ended_at": (TS, None, False),
    "last_checkpoint_at": (TS, None, True),
    "first_step_origin": (STR, "VARCHAR", True),
    "outcome": (STR, "VARCHAR", True),
    "exit_code": (INT, "INTEGER", True),
    "time_to_first_step_ms": (INT, "BIGINT", True),
    "initial_wait_ms": (WAITS, "MAP(VARCHAR, BIGINT)", True),
    "requeue_wait_ms": (INT, "BIGINT", False),
    "lost_work_ms": (INT, "BIGINT", False),
    "checkpoint_save_ms": (INT, "BIGINT", False),
    "failed_work_ms": (INT, "BIGINT", False),
    "runs": (INT, "UINTEGER", False),
    "attempts": (INT, "UINTEGER", False),
    "preemptions": (INT, "UINTEGER", False),
    "node_losses": (INT, "UINTEGER", False),
    "lost_steps": (INT, "UBIGINT", False),
    "max_step": (INT, "UBIGINT", True),
    "last_checkpoint_step": (INT, "UBIGINT", True),
    "waiting_gpu_ms": (INT, "BIGINT", False),
    "preparing_gpu_ms": (INT, "BIGINT", False),
    "requeue_wait_gpu_ms": (INT, "BIGINT", False),
    "checkpoint_gpu_ms": (INT, "BIGINT", False),
    "lost_gpu_ms": (INT, "BIGINT", False),
    "failed_gpu_ms": (INT, "BIGINT", False),
    "productive_gpu_ms": (INT, "BIGINT", False),
    "total_gpu_ms": (INT, "BIGINT", False),
    "nodes": ("list<string>", "VARCHAR[]", True),
}
# The columns compare and goodput read.
COMPARE_COLUMNS = list(COMPARE_ATTRS) + [
    "job_id", "submitted_at", "ended_at", "time_to_first_step_ms", "first_step_origin", "initial_wait_ms"]
GOODPUT_COLUMNS = GOODPUT_BY + ["job_id", "submitted_at", "gpu_count", "initial_wait_ms"] + [
    f"{c}_gpu_ms" for c in CATEGORIES]


class Fail(Exception):
    """An input error: printed on stderr, exit status 2."""


# ---------------------------------------------------------------------------------------------------------------
# Reading the files


def open_history(directory, columns):
    """A DuckDB connection with a view `h` over DIRECTORY/*/*.parquet (Hive partitions), its columns checked."""
    if not os.path.isdir(directory):
        raise Fail(f"--dir: {directory!r} is not a directory")
    pattern = os.path.join(directory, "*", "*.parquet")
    files = sorted(glob.glob(pattern))
    if not files:
        raise Fail(f"--dir: no history files ({pattern}) in {directory!r}")
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    # Unix milliseconds of a timestamp column, whichever unit and zone flag the file has (a timestamp without
    # the UTC flag is read as UTC).
    con.execute("CREATE MACRO ms(x) AS epoch_ms(CAST(x AS TIMESTAMPTZ))")
    quoted = "'" + pattern.replace("'", "''") + "'"
    con.execute(f"CREATE VIEW h AS SELECT * FROM read_parquet({quoted}, hive_partitioning = true)")
    types = {name: typ for name, typ, *_ in con.execute("DESCRIBE h").fetchall()}
    for col in columns:
        family = SCHEMA[col][0]
        typ = types.get(col)
        if typ is None:
            raise Fail(f"{directory}: column {col} is missing from the history files")
        if not type_fits(family, typ):
            raise Fail(f"{directory}: column {col} is {typ}, the history schema says {family}")
    dup = con.execute(
        "SELECT job_id, count(*) FROM h GROUP BY job_id HAVING count(*) > 1 ORDER BY job_id LIMIT 5").fetchall()
    if dup:
        raise Fail(f"{directory}: job_id not unique across the files (job, rows): {dup}")
    origins = [r[0] for r in con.execute(
        "SELECT DISTINCT first_step_origin FROM h WHERE first_step_origin IS NOT NULL ORDER BY 1").fetchall()] \
        if "first_step_origin" in columns else []
    unknown = [o for o in origins if o not in ORIGINS]
    if unknown:
        raise Fail(f"{directory}: first_step_origin has values that are no pb::StepOrigin label: {unknown}")
    return con


def type_fits(family, typ):
    if family == STR:
        return typ == "VARCHAR"
    if family == INT:
        return typ in INTEGER_TYPES
    if family == TS:
        return typ in TIMESTAMP_TYPES
    if family == WAITS:
        return typ.startswith("MAP(VARCHAR, ") and typ[len("MAP(VARCHAR, "):-1] in INTEGER_TYPES
    return True


def in_window_sql():
    """The window condition (both ends inclusive), parameters: lower bound, now."""
    return "ms(submitted_at) >= ? AND ms(submitted_at) <= ?"


def window_start(now_ms, window_ms):
    """now - window, saturating at i64::MIN like the collector."""
    return max(now_ms - window_ms, I64_MIN)


# ---------------------------------------------------------------------------------------------------------------
# compare


def parse_selector(text, which):
    """`k=v[,k=v]` as collector/src/compare/mod.rs Selector::parse reads it: [(attr, value)]."""
    terms = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" not in part:
            raise Fail(f"--{which}: {part!r} is not attribute=value")
        k, v = part.split("=", 1)
        if k.strip() not in COMPARE_ATTRS:
            raise Fail(f"--{which}: {k!r} is not one of {', '.join(COMPARE_ATTRS)}")
        terms.append((k.strip(), v.strip()))
    return terms


def selector_sql(terms):
    if not terms:
        return "TRUE", []
    return " AND ".join(f"{attr} = ?" for attr, _ in terms), [v for _, v in terms]


def percentile(sorted_xs, q):
    """Nearest rank (stats::percentile)."""
    if not sorted_xs:
        return None
    q = min(max(q, 0.0), 1.0)
    rank = int(max(math.ceil(q * float(len(sorted_xs))), 1.0))
    return sorted_xs[min(rank, len(sorted_xs)) - 1]


def percentile_ci(sorted_xs, q):
    """stats::percentile_ci."""
    n = len(sorted_xs)
    if n == 0:
        return None
    q = min(max(q, 0.0), 1.0)
    nf = float(n)
    half = 1.96 * math.sqrt(nf * q * (1.0 - q))
    lo = min(int(max(math.floor(nf * q - half), 1.0)), n)
    hi = min(int(max(math.ceil(nf * q + half), 1.0)), n)
    return [sorted_xs[lo - 1], sorted_xs[hi - 1]]


def fsum_seq(xs):
    """Left-to-right float sum (Rust's Iterator::sum), not Python's compensated sum."""
    acc = 0.0
    for x in xs:
        acc += x
    return acc


def mean_ci(values):
    """stats::mean_ci, operation for operation."""
    n = len(values)
    if n == 0:
        return None
    lo_v, hi_v = min(values), max(values)
    scale = 0.0
    for v in values:
        scale = max(scale, abs(v))
    if scale == 0.0 or not math.isfinite(scale):
        mean = fsum_seq(values) / float(n)
        return mean, mean, mean
    nf = float(n)
    mean_s = fsum_seq(v / scale for v in values) / nf
    mean = min(max(mean_s * scale, lo_v), hi_v)
    if n == 1:
        return mean, mean, mean
    var_s = fsum_seq((v / scale - mean_s) * (v / scale - mean_s) for v in values) / (nf - 1.0)
    half_s = 1.96 * math.sqrt(var_s / nf)
    fmax = sys.float_info.max

    def bound(x):
        return min(max(x * scale, -fmax), fmax)

    return mean, min(bound(mean_s - half_s), mean), max(bound(mean_s + half_s), mean)


def normal_cdf(x):
    """stats::normal_cdf (Abramowitz-Stegun 7.1.26)."""
    t = 1.0 / (1.0 + 0.3275911 * abs(x) / math.sqrt(2.0))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * math.exp(-(x * x) / 2.0)
    return 0.5 * (1.0 + erf) if x >= 0.0 else 0.5 * (1.0 - erf)


def mann_whitney(left, right):
    """stats::mann_whitney."""
    n1, n2 = len(left), len(right)
    if n1 == 0 or n2 == 0:
        return None
    allv = sorted([(v, True) for v in left] + [(v, False) for v in right], key=lambda p: p[0])
    n = len(allv)
    rank_sum_left = 0.0
    tie_term = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and allv[j + 1][0] == allv[i][0]:
            j += 1
        t = float(j - i + 1)
        avg_rank = float(i + j) / 2.0 + 1.0
        rank_sum_left += float(sum(1 for p in allv[i:j + 1] if p[1])) * avg_rank
        tie_term += t * t * t - t
        i = j + 1
    n1f, n2f, nf = float(n1), float(n2), float(n)
    u_left = rank_sum_left - n1f * (n1f + 1.0) / 2.0
    mean = n1f * n2f / 2.0
    var = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)))
    if var > 0.0:
        d = u_left - mean
        z = (d - 0.5 * math.copysign(1.0, d)) / math.sqrt(var)
    else:
        z = 0.0
    p = 2.0 * (1.0 - normal_cdf(abs(z)))
    p_value = 1.0 if math.isnan(p) else min(max(p, 0.0), 1.0)
    return {"u_left": u_left, "z": z, "p_value": p_value, "prob_left_greater": u_left / (n1f * n2f)}


def empty_side():
    return {"jobs": 0, "started": 0, "still_waiting": 0, "ended_before_start": 0, "ttfs_s": [],
            "sources": {o: 0 for o in ORIGINS}, "p": {}, "max": None, "wait_split": {}, "by_hour": {}}


def compare(args):
    left = parse_selector(args.left, "left")
    right = parse_selector(args.right, "right")
    by = args.by or None
    if by is not None and by not in COMPARE_ATTRS:
        raise Fail(f"--by: {by!r} is not one of {', '.join(COMPARE_ATTRS)}")
    con = open_history(args.dir, COMPARE_COLUMNS)
    lsql, lparams = selector_sql(left)
    rsql, rparams = selector_sql(right)
    # One row per (group, side, job): `all` and, with a grouping, the job's value again (a job whose value is
    # literally `all` joins that group twice, as in the collector).
    group_expr = "'all' AS grp"
    sides_cte = f"""
        win AS (SELECT * FROM h WHERE {in_window_sql()}),
        sides AS (SELECT 'left' AS side, * FROM win WHERE {lsql}
                  UNION ALL SELECT 'right' AS side, * FROM win WHERE {rsql}),
        g AS (SELECT {group_expr}, * FROM sides
              {f"UNION ALL SELECT {by} AS grp, * FROM sides" if by else ""})"""
    params = [window_start(args.now_ms, args.window_ms), args.now_ms] + lparams + rparams
    # Counts, sources, sorted samples, nearest-rank percentiles (q x n in f64, as the collector computes it).
    rank = "least(greatest(ceil({q}::DOUBLE * started::DOUBLE), 1.0)::BIGINT, started)"
    pcts = ", ".join(f"CASE WHEN started > 0 THEN ttfs_s[{rank.format(q=q)}] END AS p{k}"
                     for k, q in (("50", "0.5"), ("90", "0.9"), ("99", "0.99")))
    origin_counts = ", ".join(
        f"count(*) FILTER (WHERE time_to_first_step_ms IS NOT NULL AND "
        f"coalesce(first_step_origin, 'unspecified') = '{o}') AS src_{o}" for o in ORIGINS)
    rows = con.execute(f"""
        WITH {sides_cte},
        agg AS (
            SELECT grp, side, count(*) AS jobs,
                   count(time_to_first_step_ms) AS started,
                   count(*) FILTER (WHERE time_to_first_step_ms IS NULL AND ended_at IS NULL) AS still_waiting,
                   count(*) FILTER (WHERE time_to_first_step_ms IS NULL AND ended_at IS NOT NULL)
                       AS ended_before_start,
                   coalesce(list(time_to_first_step_ms::DOUBLE / 1000.0::DOUBLE ORDER BY time_to_first_step_ms)
                       FILTER (WHERE time_to_first_step_ms IS NOT NULL), []) AS ttfs_s,
                   max(time_to_first_step_ms::DOUBLE / 1000.0::DOUBLE) AS max_s,
                   {origin_counts}
            FROM g GROUP BY grp, side)
        SELECT grp, side, jobs, started, still_waiting, ended_before_start, ttfs_s, max_s,
               {', '.join('src_' + o for o in ORIGINS)}, {pcts}
        FROM agg""", params).fetchall()
    groups = {}
    for r in rows:
        grp, side = r[0], r[1]
        s = groups.setdefault(grp, {"left": empty_side(), "right": empty_side()})[side]
        s.update(jobs=r[2], started=r[3], still_waiting=r[4], ended_before_start=r[5], ttfs_s=r[6], max=r[7])
        s["sources"] = dict(zip(ORIGINS, r[8:12]))
        s["p"] = {"p50": r[12], "p90": r[13], "p99": r[14]}
    # Initial waiting by segment: wall milliseconds summed exactly over every job of the side (started or not),
    # seconds and share of the side's total.
    waits = con.execute(f"""
        WITH {sides_cte},
        seg AS (SELECT grp, side, unnest(map_keys(initial_wait_ms)) AS k,
                       unnest(map_values(initial_wait_ms)) AS ms
                FROM g WHERE initial_wait_ms IS NOT NULL),
        s AS (SELECT grp, side, k, sum(ms::HUGEINT) AS ms FROM seg GROUP BY grp, side, k)
        SELECT grp, side, k, ms::DOUBLE / 1000.0::DOUBLE AS seconds,
               CASE WHEN sum(ms) OVER (PARTITION BY grp, side) > 0
                    THEN ms::DOUBLE / (sum(ms) OVER (PARTITION BY grp, side))::DOUBLE ELSE 0.0 END AS share
        FROM s""", params).fetchall()
    for grp, side, k, seconds, share in waits:
        groups[grp][side]["wait_split"][k] = {"seconds": seconds, "share": share}
    # Started jobs by the UTC hour of their submit, with nearest-rank p50 and p90.
    hours = con.execute(f"""
        WITH {sides_cte},
        hs AS (SELECT grp, side,
                      (((ms(submitted_at) % {DAY_MS}) + {DAY_MS}) % {DAY_MS}) // {HOUR_MS} AS hour,
                      list(time_to_first_step_ms::DOUBLE / 1000.0::DOUBLE ORDER BY time_to_first_step_ms) AS xs,
                      count(*) AS n
               FROM g WHERE time_to_first_step_ms IS NOT NULL GROUP BY ALL)
        SELECT grp, side, hour, n,
               xs[least(greatest(ceil(0.5::DOUBLE * n::DOUBLE), 1.0)::BIGINT, n)],
               xs[least(greatest(ceil(0.9::DOUBLE * n::DOUBLE), 1.0)::BIGINT, n)]
        FROM hs""", params).fetchall()
    for grp, side, hour, n, p50, p90 in hours:
        groups[grp][side]["by_hour"][int(hour)] = (n, p50, p90)

    out = []
    order = ["all"] + sorted(k for k in groups if k != "all") if "all" in groups else sorted(groups)
    for key in order:
        ls, rs = groups[key]["left"], groups[key]["right"]
        left_r, right_r = side_report(ls), side_report(rs)
        mw = mann_whitney(ls["ttfs_s"], rs["ttfs_s"])
        significant = mw is not None and mw["p_value"] < 0.05
        faster = ("right" if mw["prob_left_greater"] > 0.5 else "left") if significant else None
        a, b = percentile(ls["ttfs_s"], 0.5), percentile(rs["ttfs_s"], 0.5)
        ratio = None
        if a is not None and b is not None and a > 0.0:
            ratio = b / a if math.isfinite(b / a) else None
        out.append({
            "group": key,
            "left": left_r,
            "right": right_r,
            "difference": {
                "test": MW_TEST,
                "alpha": 0.05,
                "mann_whitney": mw,
                "significant": significant,
                "faster": faster,
                "p50_ratio_right_over_left": ratio,
                "first_step_sources_differ": sources_differ(ls["sources"], rs["sources"]),
            },
        })
    groups_total = max(len(out) - 1, 0)
    truncated = False
    if groups_total > args.limit:
        by_size = sorted(range(1, len(out)), key=lambda i: (-(out[i]["left"]["jobs"] + out[i]["right"]["jobs"]), i))
        keep = {0} | set(by_size[:args.limit])
        out = [g for i, g in enumerate(out) if i in keep]
        truncated = True
    return {
        "left": args.left,
        "right": args.right,
        "by": COMPARE_ATTRS[by] if by else None,
        "window_seconds": trunc_div(args.window_ms, 1000),
        "groups": out,
        "groups_total": groups_total,
        "truncated": truncated,
    }


def sources_differ(a, b):
    present = [frozenset(o for o in ORIGINS if s[o] > 0) for s in (a, b)]
    return bool(present[0]) and bool(present[1]) and present[0] != present[1]


def side_report(s):
    v = s["ttfs_s"]
    m = mean_ci(v)

    def est(key, q):
        return {"value": s["p"].get(key), "ci95": percentile_ci(v, q)}

    return {
        "jobs": s["jobs"],
        "started": s["started"],
        "still_waiting": s["still_waiting"],
        "ended_before_start": s["ended_before_start"],
        "ttfs_seconds": {
            "p50": est("p50", 0.5),
            "p90": est("p90", 0.9),
            "p99": est("p99", 0.99),
            "mean": None if m is None else {"value": m[0], "ci95": [m[1], m[2]]},
            "max": s["max"],
        },
        "first_step_sources": dict(s["sources"]),
        "wait_split": dict(sorted(s["wait_split"].items())),
        "by_hour": [
            {"hour_utc": h, "started": s["by_hour"].get(h, (0, None, None))[0],
             "p50": s["by_hour"].get(h, (0, None, None))[1], "p90": s["by_hour"].get(h, (0, None, None))[2]}
            for h in range(24)
        ],
    }


def trunc_div(a, b):
    """Integer division toward zero (Rust's `/` on i64)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# ---------------------------------------------------------------------------------------------------------------
# goodput


def goodput(args):
    by = args.by
    if by not in GOODPUT_BY:
        raise Fail(f"--by: {by!r} is not one of {', '.join(GOODPUT_BY)}")
    con = open_history(args.dir, GOODPUT_COLUMNS)
    params = [window_start(args.now_ms, args.window_ms), args.now_ms]
    win = f"win AS (SELECT * FROM h WHERE {in_window_sql()})"
    # GPU-milliseconds summed exactly (HUGEINT) and turned into hours once, per group and for all jobs.
    cat_sums = ", ".join(f"sum({c}_gpu_ms::HUGEINT) AS {c}" for c in CATEGORIES)
    held = "(preparing + checkpoint + lost + failed + productive)"
    total = "(" + " + ".join(CATEGORIES) + ")"
    hours = ", ".join(f"{c}::DOUBLE / {HOUR_MS}.0::DOUBLE AS {c}_gpu_hours" for c in CATEGORIES)

    def category_query(group_sql):
        return con.execute(f"""
            WITH {win},
            s AS (SELECT {group_sql} AS grp, count(*) AS jobs, {cat_sums} FROM win GROUP BY 1)
            SELECT grp, jobs, {hours},
                   {total}::DOUBLE / {HOUR_MS}.0::DOUBLE AS total_gpu_hours,
                   CASE WHEN {total} > 0 THEN productive::DOUBLE / {total}::DOUBLE END AS goodput,
                   CASE WHEN {held} > 0 THEN ({held} - productive)::DOUBLE / {held}::DOUBLE END AS overhead_share
            FROM s""", params).fetchall()

    def segment_query(group_sql):
        return con.execute(f"""
            WITH {win},
            seg AS (SELECT {group_sql} AS grp, gpu_count, unnest(map_keys(initial_wait_ms)) AS k,
                           unnest(map_values(initial_wait_ms)) AS ms
                    FROM win WHERE initial_wait_ms IS NOT NULL)
            SELECT grp, k, sum(ms::HUGEINT * gpu_count)::DOUBLE / {HOUR_MS}.0::DOUBLE
            FROM seg GROUP BY grp, k""", params).fetchall()

    group_sql = f"CASE WHEN {by} = '' THEN '(none)' ELSE {by} END"
    reports = {}
    for key_sql, is_total in ((group_sql, False), ("'total'", True)):
        for r in category_query(key_sql):
            rep = {"jobs": r[1]}
            for i, c in enumerate(CATEGORIES):
                rep[f"{c}_gpu_hours"] = r[2 + i]
            rep.update(total_gpu_hours=r[9], goodput=r[10], overhead_share=r[11],
                       waiting_by_segment={}, preparing_by_phase={})
            reports[(is_total, r[0])] = rep
        for grp, k, h in segment_query(key_sql):
            field = "preparing_by_phase" if k.startswith("preparing:") else "waiting_by_segment"
            reports[(is_total, grp)][field][k] = h
    groups = []
    for (is_total, grp), rep in reports.items():
        if not is_total:
            groups.append(dict(group=grp, **finish(rep)))
    groups.sort(key=lambda g: (-g["total_gpu_hours"], g["group"]))
    groups_total = len(groups)
    groups = groups[:args.limit]
    total_rep = reports.get((True, "total"))
    if total_rep is None:  # no job in the window: the collector's empty sum
        total_rep = {"jobs": 0, **{f"{c}_gpu_hours": 0.0 for c in CATEGORIES}, "total_gpu_hours": 0.0,
                     "goodput": None, "overhead_share": None, "waiting_by_segment": {}, "preparing_by_phase": {}}
    return {
        "as_of": format_ms(args.now_ms),
        "by": by,
        "categories": CATEGORIES,
        "groups": groups,
        "groups_total": groups_total,
        "truncated": len(groups) < groups_total,
        "total": finish(total_rep),
        "window_seconds": trunc_div(args.window_ms, 1000),
    }


def finish(rep):
    rep = dict(rep)
    rep["waiting_by_segment"] = dict(sorted(rep["waiting_by_segment"].items()))
    rep["preparing_by_phase"] = dict(sorted(rep["preparing_by_phase"].items()))
    return dict(sorted(rep.items()))


def format_ms(ms):
    """RFC 3339 with milliseconds, UTC (collector/src/time.rs format_ms)."""
    t = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


# ---------------------------------------------------------------------------------------------------------------
# check


def check(args):
    con = open_history(args.dir, list(SCHEMA))
    types = {name: typ for name, typ, *_ in con.execute("DESCRIBE h").fetchall()}
    problems = []
    for col, (_, exact, nullable) in SCHEMA.items():
        if exact is not None and types[col] != exact:
            problems.append(f"column {col} is {types[col]}, expected {exact}")
        if not nullable:
            n = con.execute(f"SELECT count(*) FROM h WHERE {col} IS NULL").fetchone()[0]
            if n:
                problems.append(f"column {col} is null in {n} rows (the schema says NOT NULL)")
    if "end_date" not in types:
        problems.append("the files are not in end_date=YYYY-MM-DD directories")
    extra = sorted(set(types) - set(SCHEMA) - {"end_date"})
    if extra:
        problems.append(f"columns not in the schema: {extra}")

    def rows_where(cond, what):
        bad = con.execute(f"SELECT job_id FROM h WHERE {cond} ORDER BY job_id LIMIT 5").fetchall()
        if bad:
            problems.append(f"{what}: e.g. jobs {[b[0] for b in bad]}")

    rows_where("strftime(epoch_ms(ms(ended_at)), '%Y-%m-%d') <> "
               "CAST(end_date AS VARCHAR)",
               "row in the file of another day than its ended_at (UTC)")
    rows_where("(time_to_first_step_ms IS NULL) <> (first_step_at IS NULL) OR "
               "time_to_first_step_ms <> ms(first_step_at) - ms(submitted_at)",
               "time_to_first_step_ms is not first_step_at - submitted_at")
    rows_where("(first_step_at IS NULL) <> (first_step_origin IS NULL)",
               "first_step_origin set without a first step, or missing with one")
    cats = " + ".join(f"{c}_gpu_ms::HUGEINT" for c in CATEGORIES)
    rows_where(f"{cats} <> total_gpu_ms", "the categories' GPU-ms do not add up to total_gpu_ms")
    rows_where("total_gpu_ms::HUGEINT <> (ms(ended_at) - ms(submitted_at))::HUGEINT * gpu_count",
               "total_gpu_ms is not (ended_at - submitted_at) x gpu_count")
    for col, cond in (("waiting_gpu_ms", "NOT"), ("preparing_gpu_ms", "")):
        rows_where(f"""{col}::HUGEINT <> gpu_count * coalesce((SELECT sum(e.value::HUGEINT)
                         FROM (SELECT unnest(map_entries(initial_wait_ms)) AS e)
                         WHERE {cond} starts_with(e.key, 'preparing:')), 0)""",
                   f"{col} is not gpu_count x the initial waits' {'non-' if cond else ''}preparing segments")
    if problems:
        raise Fail(f"{args.dir}: the history files break the schema:\n  " + "\n  ".join(problems))
    jobs = con.execute("SELECT count(*) FROM h").fetchone()[0]
    return {"ok": True, "jobs": jobs, "files": len(glob.glob(os.path.join(args.dir, "*", "*.parquet")))}


# ---------------------------------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--dir", required=True, help="the history directory (holds end_date=YYYY-MM-DD/*.parquet)")

    def windowed(sp):
        sp.add_argument("--window-ms", type=int, required=True, help="jobs submitted in this many ms before now")
        sp.add_argument("--now-ms", type=int, required=True, help="the API's clock, Unix ms")
        sp.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="groups shown (the API's limit)")

    c = sub.add_parser("compare", help="GET /api/v1/compare")
    common(c)
    c.add_argument("--left", default="pool_kind=managed")
    c.add_argument("--right", default="pool_kind=dedicated")
    c.add_argument("--by", default="")
    windowed(c)
    g = sub.add_parser("goodput", help="GET /api/v1/goodput")
    common(g)
    g.add_argument("--by", default="pool_kind")
    windowed(g)
    k = sub.add_parser("check", help="validate the files against the history schema")
    common(k)
    args = p.parse_args(argv)
    if getattr(args, "limit", 1) < 1:
        p.error("--limit must be at least 1")
    try:
        result = {"compare": compare, "goodput": goodput, "check": check}[args.cmd](args)
    except Fail as e:
        sys.stderr.write(f"reproduce.py {args.cmd}: {e}\n")
        return 2
    except duckdb.Error as e:
        sys.stderr.write(f"reproduce.py {args.cmd}: DuckDB could not read {args.dir}: {e}\n")
        return 2
    json.dump(result, sys.stdout, indent=1, allow_nan=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
