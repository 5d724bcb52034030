"""Per-call cost of the package in the training thread: each call timed alone (perf_counter_ns), 200,000 calls
of checkpoint and 200,000 of the whole first_step/checkpoint/saving_checkpoint mix, against a node agent on
loopback that accepts everything (a stdlib server in this process: the sender thread competes for the GIL as it
does in a real run) and against a receiver that is down (every send fails and the queue stays full).
Prints p50/p99/p999 in microseconds as JSON.

usage: python bench_calls.py   (with the startline package installed)"""

import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import threading

import startline

N = 200_000


class Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(202)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a) -> None:
        pass


def measure(r: startline.Reporter, what: str):
    costs = []
    for i in range(1, N + 1):
        t0 = time.perf_counter_ns()
        if what == "checkpoint":
            r.checkpoint(i, save_seconds=0.5)
        else:
            r.first_step(i)
            with r.saving_checkpoint(i):
                pass
        costs.append(time.perf_counter_ns() - t0)
    costs.sort()
    q = lambda p: round(costs[min(len(costs) - 1, int(len(costs) * p))] / 1000, 2)  # noqa: E731
    return {"p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999), "max_us": round(costs[-1] / 1000, 1)}


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    up = f"http://127.0.0.1:{server.server_address[1]}"
    out = {}
    for name, url in (("agent_up", up), ("agent_down", "http://127.0.0.1:9")):
        for what in ("checkpoint", "mix"):
            r = startline.Reporter("bench/1", transport=startline.Transport("agent", url=url), env={}, max_backoff=1.0)
            out[f"{name}/{what}"] = measure(r, what)
            r.close(0)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
