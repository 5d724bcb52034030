"""End-to-end: one short training loop reporting through the transport the environment names (a real node agent
over its unix socket or loopback HTTP, or a real collector), as a user's script would: module-level calls only.
Prints the reporter's counters as JSON. Run by tests/tests/python_client.rs.

usage: e2e_report.py STEPS CHECKPOINT_EVERY [NO_PREPARING]"""

import json
import sys
import time

import startline


def main() -> None:
    steps, every = int(sys.argv[1]), int(sys.argv[2])
    if sys.argv[3:] != ["NO_PREPARING"]:
        startline.preparing("data_staging")
        time.sleep(0.05)
    for step in range(1, steps + 1):
        if step == 1:
            startline.first_step(step)
        if step % every == 0:
            with startline.saving_checkpoint(step, uri=f"file:///tmp/ckpt/{step}"):
                time.sleep(0.02)
    startline.done("succeeded", exit_code=0)
    ok = startline.flush(20)
    print(json.dumps({"flushed": ok, **startline.get_reporter().stats()}))


if __name__ == "__main__":
    main()
