"""Failure drill: the collector answers 503 (storage unavailable, shutting down) to the first three requests.
A proxy in this process answers those itself and passes every later request to the real collector unchanged;
the reporter retries with the same event ids until the collector takes them. Prints JSON: the proxy's statuses,
the event ids of each request, the reporter's counters.

usage: e2e_collector_503.py COLLECTOR_URL TOKEN JOB_ID"""

import json
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import startline

UNAVAILABLE = 3


def main() -> None:
    collector, token, job = sys.argv[1], sys.argv[2], sys.argv[3]
    seen = {"statuses": [], "ids": []}

    class Proxy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen["ids"].append([e["event_id"] for e in json.loads(body)["events"]])
            if len(seen["statuses"]) < UNAVAILABLE:
                status, answer = 503, b'{"error": "storage unavailable: retry later"}'
            else:
                req = urllib.request.Request(collector + self.path, data=body, method="POST", headers={
                    "Content-Type": "application/json", "Authorization": self.headers["Authorization"]})
                try:
                    with urllib.request.urlopen(req, timeout=10) as resp:
                        status, answer = resp.status, resp.read()
                except urllib.error.HTTPError as e:
                    status, answer = e.code, e.read()
            seen["statuses"].append(status)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    r = startline.Reporter(
        job,
        transport=startline.Transport("collector", url=f"http://127.0.0.1:{proxy.server_address[1]}", token=token),
        max_backoff=0.2,
        env={},
    )
    r.first_step(1)
    r.checkpoint(10, save_seconds=1.25)
    r.checkpoint(20, save_seconds=1.5)
    r.done("succeeded")
    ok = r.flush(30)
    print(json.dumps({"flushed": ok, "statuses": seen["statuses"], "ids_per_request": seen["ids"], **r.stats()}))


if __name__ == "__main__":
    main()
