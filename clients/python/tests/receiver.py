"""A scripted HTTP receiver for the package's unit tests: answers each POST with the next scripted status
(then 202) and records every body. The real node agent and collector are exercised by the end-to-end scripts
(e2e_*.py, driven by tests/tests/python_client.rs)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List


class Receiver:
    def __init__(self, script: List[int]) -> None:
        self.script = list(script)
        self.bodies: List[Dict[str, Any]] = []
        self.statuses: List[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = outer.script.pop(0) if outer.script else 202
                outer.bodies.append({"body": body, "status": status, "auth": self.headers.get("Authorization")})
                outer.statuses.append(status)
                answer = b'{"spooled": 1}' if status < 300 else b'{"error": "scripted", "field": "events[0].step"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> List[Dict[str, Any]]:
        return [e for b in self.bodies if b["status"] < 300 for e in b["body"]["events"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
