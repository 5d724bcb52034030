"""A training loop posting the node agent's JSON form with the Python standard library only, blocking on each
post: the raw protocol that docs/node-agent.md mentions for clients other than the `startline` package (which
never blocks or fails the loop), run by the test suite against a real agent. Environment:
STARTLINE_AGENT (default http://127.0.0.1:7465) and STARTLINE_JOB_ID (or Slurm/Kubernetes variables, which
the agent's `emit` command reads; here the job id is passed explicitly).
"""
import json
import os
import time
import urllib.request

AGENT = os.environ.get("STARTLINE_AGENT", "http://127.0.0.1:7465")
JOB = os.environ["STARTLINE_JOB_ID"]
# Wall time advanced by the monotonic clock: a clock step during the run cannot reorder this job's events.
_WALL0, _MONO0 = time.time(), time.monotonic()


def now():
    return _WALL0 + (time.monotonic() - _MONO0)


def report(kind, **fields):
    """Post one lifecycle event; the agent spools it durably before answering 202."""
    body = json.dumps({"kind": kind, "job_id": JOB, "occurred_at": now(), **fields}).encode()
    req = urllib.request.Request(AGENT + "/v1/events", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 202, resp.status


def main():
    report("node_assigned", nodes=[os.uname().nodename])
    report("preparing", phase="data_staging")
    time.sleep(0.2)                      # download the dataset
    report("preparing", phase="environment")
    time.sleep(0.2)                      # import torch, compile, rendezvous
    for step in range(1, 301):
        # loss = train_step(batch)
        if step == 1:
            report("first_step", step=step)
        if step % 100 == 0:
            t0 = time.time()
            # save_checkpoint(step)
            report("checkpoint", step=step, uri=f"file:///tmp/ckpt/{step}", save_seconds=time.time() - t0)
    report("done", outcome="succeeded", exit_code=0)


if __name__ == "__main__":
    main()
