"""Failure drill: the node agent is down for the whole training run. The loop (STEPS steps, a checkpoint every
EVERY) must finish without an exception and without blocking; then the script stays alive (as a run that
evaluates or uploads would) and says so on stdout; once the driver has started the node agent and writes a line
to stdin, the queued events must arrive. Prints JSON lines: {"trained": ...} then {"flushed": ...}.

usage: e2e_agent_down.py STEPS EVERY"""

import json
import sys
import time

import startline


def main() -> None:
    steps, every = int(sys.argv[1]), int(sys.argv[2])
    t0 = time.perf_counter()
    raised = None
    try:
        for step in range(1, steps + 1):
            if step == 1:
                startline.first_step(step)
            if step % every == 0:
                startline.checkpoint(step, save_seconds=0.25)
        startline.done("succeeded", exit_code=0)
    except Exception as e:  # the drill fails if anything reaches the training loop
        raised = repr(e)
    took = time.perf_counter() - t0
    print(json.dumps({"trained": True, "raised": raised, "loop_seconds": took, **startline.get_reporter().stats()}), flush=True)
    sys.stdin.readline()  # the driver started the node agent
    ok = startline.flush(30)
    print(json.dumps({"flushed": ok, **startline.get_reporter().stats()}), flush=True)


if __name__ == "__main__":
    main()
