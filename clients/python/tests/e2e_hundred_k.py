"""Failure drill: a 100,000-step loop calling checkpoint every step, with the receiver down (nothing drains the
queue). Memory stays bounded (the queue holds at most queue_size events; traced allocations stay under a few
MiB) and the loop is not slowed beyond the per-call cost: the per-call times are printed (the figure in
BENCHMARKS.md comes from bench_calls.py). Prints JSON.

usage: e2e_hundred_k.py"""

import json
import time
import tracemalloc

import startline


def main() -> None:
    r = startline.get_reporter()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    costs = []
    raised = None
    try:
        for step in range(1, 100_001):
            t0 = time.perf_counter_ns()
            r.checkpoint(step, save_seconds=0.001)
            costs.append(time.perf_counter_ns() - t0)
    except Exception as e:
        raised = repr(e)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    costs.sort()
    stats = r.stats()
    print(json.dumps({
        "raised": raised,
        "calls": len(costs),
        "p50_us": costs[len(costs) // 2] / 1000,
        "p99_us": costs[int(len(costs) * 0.99)] / 1000,
        "peak_bytes": peak - base - len(costs) * 0,
        "costs_list_bytes": len(costs) * 36,
        "queue_size": r.queue_size,
        **stats,
    }))
    r.close(0)


if __name__ == "__main__":
    main()
