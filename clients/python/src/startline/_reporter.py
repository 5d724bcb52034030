"""The reporter: calls that cost the training loop microseconds and can never fail it.

Each call builds one event (a small dict, stamped with the wall clock advanced by the monotonic clock, with its
own event id) and appends it to a bounded in-process queue; a daemon thread sends the queue in batches. What
goes wrong there stays there:

- a failed send (receiver down, timeout, 429, 5xx) is retried with backoff (0.2 s doubling to
  ``max_backoff``), with the **same** events and event ids, so a batch the receiver stored but could not answer
  comes back as duplicates, never as second events;
- an answer a retry cannot change (400, 401, 403, 413, 415) drops what it refused (the one event a 400 names,
  else the batch) and counts it;
- each kind of problem is logged once (logger ``startline``), and once more when sending works again;
- a full queue drops its oldest progress event (``checkpoint``, ``preparing``), never a ``first_step`` or a
  ``done``;
- at interpreter exit the queue is flushed for at most ``flush_timeout`` seconds.

No call raises: a bad argument or an internal error is counted and logged once. Exceptions of the caller's own
code inside ``saving_checkpoint`` propagate unchanged (and no save is reported).

Distributed runs: only global rank 0 (``RANK``, else ``SLURM_PROCID``, else ``LOCAL_RANK``) reports the first
step, ``preparing`` and ``done``; every rank may report its own checkpoint saves.
"""

import atexit
import collections
import json
import logging
import os
import socket
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional

from ._identity import global_rank, job_identity
from ._transport import Transport, from_env

log = logging.getLogger("startline")

PHASES = ("image_pull", "data_staging", "environment", "provisioning", "other")
OUTCOMES = ("succeeded", "failed", "cancelled", "preempted", "timed_out")
_CRITICAL = ("first_step", "done")

# Every live reporter, flushed at exit and reset in a forked child; weak, so a replaced reporter can go.
_LIVE: "weakref.WeakSet[Reporter]" = weakref.WeakSet()
_HOOKS_LOCK = threading.Lock()
_HOOKS = False


def _at_exit_all() -> None:
    for r in list(_LIVE):
        r._at_exit()


def _after_fork_all() -> None:
    for r in list(_LIVE):
        r._after_fork()


def _register(r: "Reporter") -> None:
    global _HOOKS
    with _HOOKS_LOCK:
        _LIVE.add(r)
        if not _HOOKS:
            _HOOKS = True
            atexit.register(_at_exit_all)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_all)


class Reporter:
    """Reports one training process's events.

    Arguments (all optional; the environment supplies the rest, see ``docs/training-process.md``):

    - ``job_id``: the Startline job id (default: derived from the environment as the adapters derive it);
    - ``transport``: a :class:`startline.Transport` (default: from ``STARTLINE_COLLECTOR_HTTP``,
      ``STARTLINE_NODE_SOCKET`` or ``STARTLINE_AGENT``);
    - ``attempt``: the attempt number sent with every event (default: Slurm's restart count + 1, else none);
    - ``source``: the source name sent to a collector (default ``STARTLINE_SOURCE``, else
      ``training-process/<host>``; the node agent stamps its own);
    - ``rank``: this process's global rank (default from the environment);
    - ``queue_size``: events held at most (default 10000); ``batch_size``: events per request (default 100);
    - ``flush_timeout``: seconds the exit flush waits at most (default 5); ``max_backoff``: the longest wait
      between retries (default 5 s); ``timeout``: seconds per request (default 5);
    - ``enabled``: ``False`` makes every call a no-op (also ``STARTLINE_DISABLED=1``).
    """

    def __init__(
        self,
        job_id: Optional[str] = None,
        *,
        transport: Optional[Transport] = None,
        attempt: Optional[int] = None,
        source: Optional[str] = None,
        rank: Optional[int] = None,
        queue_size: int = 10000,
        batch_size: int = 100,
        flush_timeout: float = 5.0,
        max_backoff: float = 5.0,
        timeout: float = 5.0,
        env: Optional[Mapping[str, str]] = None,
        enabled: bool = True,
    ) -> None:
        env = os.environ if env is None else env
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: "collections.deque[Dict[str, Any]]" = collections.deque()
        self._inflight = 0
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._logged: set = set()
        self._failing = False
        self.queue_size = max(1, int(queue_size))
        self.batch_size = max(1, int(batch_size))
        self.flush_timeout = float(flush_timeout)
        self.max_backoff = max(0.05, float(max_backoff))
        self.counters = {
            "queued": 0,
            "sent": 0,
            "duplicates": 0,
            "dropped": 0,
            "refused": 0,
            "retries": 0,
            "skipped": 0,
            "errors": 0,
        }
        derived, derived_attempt = job_identity(env)
        self.job_id = job_id or derived
        self.attempt = attempt if attempt is not None else derived_attempt
        self.rank = global_rank(env) if rank is None else int(rank)
        problem = ""
        if transport is None:
            transport, problem = from_env(env, timeout=timeout)
        self.transport = transport
        self.source = source or (env.get("STARTLINE_SOURCE") or "").strip() or f"training-process/{socket.gethostname()}"
        self.enabled = bool(enabled) and (env.get("STARTLINE_DISABLED") or "") not in ("1", "true", "yes")
        if problem:
            self._once("config", "startline: %s", problem)
        if self.enabled and not self.job_id:
            self._once(
                "no-job",
                "startline: no job id (set STARTLINE_JOB_ID, or run under Slurm, Kubernetes, SageMaker, Vertex AI "
                "or Azure ML); nothing will be reported",
            )
            self.enabled = False
        self._id_prefix = f"py-{os.urandom(6).hex()}-{os.getpid()}"
        self._seq = 0
        self._first_step_sent = False
        self._done_sent = False
        self._wall0 = time.time()
        self._mono0 = time.monotonic()
        _register(self)

    # --- the calls ---------------------------------------------------------------------------------------

    def first_step(self, step: int = 1) -> None:
        """The training loop finished its first step (rank 0 only; later calls are no-ops)."""
        if not self.enabled or self._first_step_sent:
            return
        if self.rank != 0:
            self.counters["skipped"] += 1
            return
        try:
            self._first_step_sent = True
            self._put({"kind": "first_step", "step": int(step), "origin": "training_process"})
        except Exception as e:  # noqa: BLE001 - a reporter never raises into the training loop
            self._error(e)

    def checkpoint(self, step: int, *, save_seconds: Optional[float] = None, uri: Optional[str] = None) -> None:
        """A checkpoint of ``step`` was saved, taking ``save_seconds`` (any rank)."""
        if not self.enabled:
            return
        try:
            ev: Dict[str, Any] = {"kind": "checkpoint", "step": int(step)}
            if save_seconds is not None:
                ev["save_seconds"] = float(save_seconds)
            if uri:
                ev["uri"] = str(uri)
            self._put(ev)
        except Exception as e:  # noqa: BLE001
            self._error(e)

    @contextmanager
    def saving_checkpoint(self, step: int, *, uri: Optional[str] = None) -> Iterator[None]:
        """Times the save in its block and reports it when the block ends without an exception."""
        t0 = time.perf_counter()
        yield
        self.checkpoint(step, save_seconds=time.perf_counter() - t0, uri=uri)

    def preparing(self, phase: str, message: Optional[str] = None) -> None:
        """The job entered a preparation phase: ``image_pull``, ``data_staging``, ``environment``,
        ``provisioning`` or ``other`` (rank 0 only)."""
        if not self.enabled:
            return
        if self.rank != 0:
            self.counters["skipped"] += 1
            return
        try:
            if phase not in PHASES:
                raise ValueError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
            ev: Dict[str, Any] = {"kind": "preparing", "phase": phase}
            if message:
                ev["message"] = str(message)
            self._put(ev)
        except Exception as e:  # noqa: BLE001
            self._error(e)

    def done(self, outcome: str = "succeeded", *, exit_code: Optional[int] = None, message: Optional[str] = None) -> None:
        """The job ended: ``succeeded``, ``failed``, ``cancelled``, ``preempted`` or ``timed_out`` (rank 0 only,
        once)."""
        if not self.enabled or self._done_sent:
            return
        if self.rank != 0:
            self.counters["skipped"] += 1
            return
        try:
            if outcome not in OUTCOMES:
                raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
            self._done_sent = True
            ev: Dict[str, Any] = {"kind": "done", "outcome": outcome}
            if exit_code is not None:
                ev["exit_code"] = int(exit_code)
            if message:
                ev["message"] = str(message)[:1000]
            self._put(ev)
        except Exception as e:  # noqa: BLE001
            self._error(e)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits (at most ``timeout`` seconds, default ``flush_timeout``) until every queued event was sent or
        given up; ``True`` when the queue is empty. Retries waiting out a backoff are tried at once."""
        deadline = time.monotonic() + (self.flush_timeout if timeout is None else float(timeout))
        try:
            self._hurry.set()
            self._wake.set()
            with self._idle:
                while self._queue or self._inflight:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._thread is None or not self._thread.is_alive():
                        return False
                    self._idle.wait(min(left, 0.05))
            return True
        except Exception as e:  # noqa: BLE001
            self._error(e)
            return False
        finally:
            self._hurry.clear()

    def stats(self) -> Dict[str, int]:
        """Counters: ``queued``, ``sent``, ``duplicates`` (sent before), ``dropped`` (queue full), ``refused``
        (the receiver said no for good), ``retries``, ``skipped`` (not this rank's to report), ``errors``
        (bad arguments, internal errors), and ``pending`` (still queued)."""
        with self._lock:
            out = dict(self.counters)
            out["pending"] = len(self._queue)
        return out

    def close(self, timeout: Optional[float] = None) -> None:
        """Flushes (bounded) and stops the sender; later calls are no-ops."""
        if self._thread is not None:
            self.flush(timeout)
        self.enabled = False
        self._closed = True
        self._wake.set()

    # --- the queue ---------------------------------------------------------------------------------------

    def _put(self, ev: Dict[str, Any]) -> None:
        now = self._wall0 + (time.monotonic() - self._mono0)
        ev["job_id"] = self.job_id
        ev["occurred_at"] = round(now, 3)
        if self.attempt is not None:
            ev["attempt"] = self.attempt
        if not self.transport.stamps_source:
            ev["source"] = self.source
        with self._lock:
            # Numbered under the lock: calls from several threads never share an id.
            self._seq += 1
            ev["event_id"] = f"{self._id_prefix}-{self._seq}"
            q = self._queue
            if len(q) >= self.queue_size:
                self._drop_oldest_progress()
            q.append(ev)
            self.counters["queued"] += 1
        if self._thread is None:
            self._start()
        self._wake.set()

    def _drop_oldest_progress(self) -> None:
        """Under the lock: drops the oldest queued event that is not being sent and is neither a first step
        nor a done; none such: nothing is dropped (the queue holds only those, a handful)."""
        q = self._queue
        for i in range(self._inflight, len(q)):
            if q[i]["kind"] not in _CRITICAL:
                del q[i]
                self.counters["dropped"] += 1
                if "dropped" not in self._logged:
                    self._once("dropped", "startline: queue full (%d events): dropping the oldest progress events", len(q))
                return

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="startline-sender", daemon=True)
            self._thread.start()

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) has no sender thread and reports nothing of the parent's queue.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue = collections.deque()
        self._inflight = 0
        self._thread = None
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self.transport.close()

    # --- the sender --------------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.2
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            while True:
                with self._lock:
                    # At most half the queue is in flight, so a full queue always has older events to drop
                    # than the one just added.
                    n = min(self.batch_size, max(1, self.queue_size // 2), len(self._queue))
                    batch: List[Dict[str, Any]] = [self._queue[i] for i in range(n)]
                    self._inflight = len(batch)
                    if not batch:
                        self._idle.notify_all()
                        break
                try:
                    answer = self.transport.post(batch)
                except Exception as e:  # noqa: BLE001 - the sender must outlive anything
                    self._error(e)
                    answer = None
                if answer is not None and answer.ok:
                    self._sent(batch, answer.body)
                    backoff = 0.2
                    continue
                if answer is not None and not answer.retryable:
                    self._refused(batch, answer)
                    continue
                with self._lock:
                    self._inflight = 0
                    self.counters["retries"] += 1
                    self._idle.notify_all()
                what = answer.describe() if answer is not None else "internal error"
                self._failing = True
                self._once(
                    f"retry:{answer.status if answer is not None else 'x'}",
                    "startline: %s %s; retrying with the same event ids (logged once)",
                    self.transport.describe(),
                    what,
                )
                wait = backoff
                if answer is not None and answer.retry_after:
                    wait = min(max(backoff, answer.retry_after), self.max_backoff)
                self._hurry.wait(wait)
                backoff = min(backoff * 2, self.max_backoff)
            if self._closed:
                return

    def _remove(self, batch: List[Dict[str, Any]]) -> None:
        """Under the lock: takes the sent batch off the queue's front (events the queue dropped meanwhile are
        already gone)."""
        ids = {id(ev) for ev in batch}
        q = self._queue
        while q and id(q[0]) in ids:
            q.popleft()
        self._inflight = 0
        self._idle.notify_all()

    def _sent(self, batch: List[Dict[str, Any]], body: str) -> None:
        duplicates = 0
        if '"duplicates"' in body:
            try:
                duplicates = int(json.loads(body).get("duplicates") or 0)
            except (ValueError, AttributeError, TypeError):
                duplicates = 0
        with self._lock:
            self._remove(batch)
            self.counters["sent"] += len(batch) - duplicates
            self.counters["duplicates"] += duplicates
        if self._failing:
            self._failing = False
            log.warning("startline: sending to the %s works again", self.transport.describe())

    def _refused(self, batch: List[Dict[str, Any]], answer: Any) -> None:
        """An answer a retry cannot change: a 400 naming ``events[i]`` drops that event; anything else the batch."""
        index = None
        if answer.status == 400:
            try:
                field = str(json.loads(answer.body).get("field") or "")
                if field.startswith("events["):
                    index = int(field[len("events[") : field.index("]")])
            except (ValueError, AttributeError, TypeError):
                index = None
        self._once(
            f"refused:{answer.status}",
            "startline: %s %s; %s dropped (logged once)",
            self.transport.describe(),
            answer.describe(),
            "that event" if index is not None else f"{len(batch)} events",
        )
        with self._lock:
            if index is not None and 0 <= index < len(batch):
                victim = batch[index]
                for i in range(len(self._queue)):
                    if self._queue[i] is victim:
                        del self._queue[i]
                        break
                self.counters["refused"] += 1
                self._inflight = 0
                self._idle.notify_all()
            else:
                self._remove(batch)
                self.counters["refused"] += len(batch)

    # --- logging and exit --------------------------------------------------------------------------------

    def _once(self, key: str, message: str, *args: Any) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        log.warning(message, *args)

    def _error(self, e: BaseException) -> None:
        self.counters["errors"] += 1
        self._once(f"error:{type(e).__name__}", "startline: %s: %s (nothing raised; logged once)", type(e).__name__, e)

    def _at_exit(self) -> None:
        if not self._closed and self._thread is not None and (self._queue or self._inflight):
            if not self.flush():
                log.warning(
                    "startline: %d events not sent to the %s at exit (flush_timeout %.1fs)",
                    len(self._queue),
                    self.transport.describe(),
                    self.flush_timeout,
                )
