"""Where events go: the node agent's unix socket, the node agent over loopback HTTP, or the collector's
``POST /api/v1/events`` (HTTP or HTTPS with a bearer token). One POST of a JSON batch, with a timeout; the
answer is classified as sent, retry later, or refused for good."""

import http.client
import json
import socket
import ssl
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

DEFAULT_AGENT = "http://127.0.0.1:7465"

# Statuses a retry may change: timeouts, throttling, an unavailable receiver.
RETRYABLE = {408, 425, 429, 500, 502, 503, 504}


class Answer:
    """One POST's outcome: ``status`` (0: no answer), the body text, ``Retry-After`` seconds if given."""

    __slots__ = ("status", "body", "retry_after", "error")

    def __init__(self, status: int, body: str = "", retry_after: Optional[float] = None, error: str = "") -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after
        self.error = error

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status in RETRYABLE

    def describe(self) -> str:
        if self.status == 0:
            return f"unreachable: {self.error}"
        return f"answered {self.status}: {self.body.strip()[:300]}"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class Transport:
    """Posts JSON batches to one receiver.

    ``kind`` is ``socket`` (the node agent's unix socket at ``path``), ``agent`` (the node agent at ``url``) or
    ``collector`` (the collector's HTTP API at ``url``). ``token`` is sent as ``Authorization: Bearer``: the node
    agent's local token, or a collector token with the ``ingest`` scope. ``ca_file`` verifies an ``https://``
    collector (default: the system's roots).
    """

    def __init__(
        self,
        kind: str,
        *,
        url: Optional[str] = None,
        path: Optional[str] = None,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        timeout: float = 5.0,
    ) -> None:
        if kind not in ("socket", "agent", "collector"):
            raise ValueError(f"transport kind {kind!r} is not socket, agent or collector")
        self.kind = kind
        self.path = path
        self.token = token
        self.timeout = timeout
        self._ssl: Optional[ssl.SSLContext] = None
        if kind == "socket":
            if not path:
                raise ValueError("the socket transport needs a path")
            self.route = "/v1/events"
            self.host, self.port, self.scheme = "localhost", None, "http"
        else:
            parts = urlsplit(url or DEFAULT_AGENT)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
            self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
            base = parts.path.rstrip("/")
            self.route = base + ("/api/v1/events" if kind == "collector" else "/v1/events")
            if parts.scheme == "https":
                self._ssl = ssl.create_default_context(cafile=ca_file)
        self._conn: Optional[http.client.HTTPConnection] = None

    @property
    def stamps_source(self) -> bool:
        """Whether the receiver stamps the source itself (the node agent refuses one sent by the client)."""
        return self.kind != "collector"

    def describe(self) -> str:
        if self.kind == "socket":
            return f"node agent at unix:{self.path}"
        port = f":{self.port}" if self.port else ""
        who = "collector" if self.kind == "collector" else "node agent"
        return f"{who} at {self.scheme}://{self.host}{port}{self.route}"

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.kind == "socket":
                self._conn = _UnixConnection(self.path or "", self.timeout)
            elif self.scheme == "https":
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout, context=self._ssl
                )
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None

    def post(self, events: List[Dict[str, Any]]) -> Answer:
        """POSTs ``{"events": [...]}``; never raises."""
        body = json.dumps({"events": events}, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for fresh in (False, True):
            conn = self._connection()
            try:
                conn.request("POST", self.route, body=body, headers=headers)
                resp = conn.getresponse()
                text = resp.read().decode("utf-8", "replace")
                return Answer(resp.status, text, _retry_after(resp.getheader("Retry-After")))
            except (OSError, http.client.HTTPException) as e:
                self.close()
                # A kept-alive connection the receiver closed: one fresh try at once, then report.
                if fresh or not isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)):
                    return Answer(0, error=f"{type(e).__name__}: {e}")
        return Answer(0, error="no answer")


def _retry_after(value: Optional[str]) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _read_token(env: Mapping[str, str], file_key: str, value_key: str) -> Tuple[Optional[str], str]:
    """A token from a file (trimmed) or a variable; the second value names a problem, if any."""
    path = (env.get(file_key) or "").strip()
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            return None, f"{file_key}={path}: {e}"
        return (token or None), ("" if token else f"{file_key}={path} is empty")
    token = (env.get(value_key) or "").strip()
    return (token or None), ""


def from_env(env: Mapping[str, str], timeout: float = 5.0) -> Tuple[Transport, str]:
    """The transport the environment asks for, and a problem to log once (empty when none):

    - ``STARTLINE_COLLECTOR_HTTP`` (the collector's HTTP API, ``https://...``): straight to the collector, with
      ``STARTLINE_TOKEN_FILE`` or ``STARTLINE_TOKEN`` and ``STARTLINE_CA_FILE``;
    - else ``STARTLINE_NODE_SOCKET``: the node agent's unix socket;
    - else ``STARTLINE_AGENT`` (default ``http://127.0.0.1:7465``): the node agent over loopback HTTP;
    both node-agent transports with the local token from ``STARTLINE_NODE_TOKEN_FILE`` or
    ``STARTLINE_NODE_TOKEN`` (the variables ``startline-agent emit`` reads).
    """
    collector = (env.get("STARTLINE_COLLECTOR_HTTP") or "").strip()
    if collector:
        token, problem = _read_token(env, "STARTLINE_TOKEN_FILE", "STARTLINE_TOKEN")
        ca = (env.get("STARTLINE_CA_FILE") or "").strip() or None
        return Transport("collector", url=collector, token=token, ca_file=ca, timeout=timeout), problem
    token, problem = _read_token(env, "STARTLINE_NODE_TOKEN_FILE", "STARTLINE_NODE_TOKEN")
    sock = (env.get("STARTLINE_NODE_SOCKET") or "").strip()
    if sock:
        return Transport("socket", path=sock, token=token, timeout=timeout), problem
    agent = (env.get("STARTLINE_AGENT") or "").strip() or DEFAULT_AGENT
    return Transport("agent", url=agent, token=token, timeout=timeout), problem
