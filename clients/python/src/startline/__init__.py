"""Startline from inside the training process: the true first step, checkpoint saves and the end of a job.

Module-level calls use one default :class:`Reporter`, configured from the environment on first use (or by
:func:`configure`)::

    import startline
    startline.first_step(step=1)
    with startline.saving_checkpoint(step=1000):
        save(model)
    startline.done("succeeded")

Every call returns in microseconds and never raises; see ``docs/training-process.md``.
"""

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ._identity import global_rank, job_identity
from ._reporter import OUTCOMES, PHASES, Reporter
from ._transport import Transport

__all__ = [
    "Reporter",
    "Transport",
    "configure",
    "get_reporter",
    "first_step",
    "checkpoint",
    "saving_checkpoint",
    "preparing",
    "done",
    "flush",
    "job_identity",
    "global_rank",
    "PHASES",
    "OUTCOMES",
]
__version__ = "0.1.0"

_default: Optional[Reporter] = None
_default_lock = threading.Lock()


def configure(**kwargs: Any) -> Reporter:
    """Replaces the default reporter with ``Reporter(**kwargs)`` (the old one is flushed briefly) and returns it."""
    global _default
    with _default_lock:
        old, _default = _default, Reporter(**kwargs)
    if old is not None:
        old.close(timeout=1.0)
    return _default


def get_reporter() -> Reporter:
    """The default reporter, created from the environment on first use."""
    global _default
    r = _default
    if r is None:
        with _default_lock:
            if _default is None:
                _default = Reporter()
            r = _default
    return r


def first_step(step: int = 1) -> None:
    """See :meth:`Reporter.first_step`."""
    get_reporter().first_step(step)


def checkpoint(step: int, *, save_seconds: Optional[float] = None, uri: Optional[str] = None) -> None:
    """See :meth:`Reporter.checkpoint`."""
    get_reporter().checkpoint(step, save_seconds=save_seconds, uri=uri)


@contextmanager
def saving_checkpoint(step: int, *, uri: Optional[str] = None) -> Iterator[None]:
    """See :meth:`Reporter.saving_checkpoint`."""
    with get_reporter().saving_checkpoint(step, uri=uri):
        yield


def preparing(phase: str, message: Optional[str] = None) -> None:
    """See :meth:`Reporter.preparing`."""
    get_reporter().preparing(phase, message)


def done(outcome: str = "succeeded", *, exit_code: Optional[int] = None, message: Optional[str] = None) -> None:
    """See :meth:`Reporter.done`."""
    get_reporter().done(outcome, exit_code=exit_code, message=message)


def flush(timeout: Optional[float] = None) -> bool:
    """See :meth:`Reporter.flush`."""
    return get_reporter().flush(timeout)
