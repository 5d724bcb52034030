"""PyTorch Lightning: ``Trainer(callbacks=[StartlineCallback()])``.

- the first ``on_train_batch_end`` is the first step (global rank 0);
- each checkpoint save is timed around the trainer's ``save_checkpoint`` (what ``ModelCheckpoint`` and a
  manual ``trainer.save_checkpoint(path)`` call), and reported with its ``save_seconds`` and file;
- the end of ``fit`` reports ``done: succeeded`` (unless training was interrupted), an exception
  ``done: failed`` (``cancelled`` for ``KeyboardInterrupt``) with the exception's type.
"""

import functools
import os
import time
from typing import Any, Optional

import lightning.pytorch as pl

from .._reporter import Reporter


class StartlineCallback(pl.Callback):
    """Reports the first step, checkpoint saves and the end of training. ``reporter`` defaults to the module's
    default reporter (configured from the environment); ``report_done=False`` leaves ``done`` to the caller."""

    def __init__(self, reporter: Optional[Reporter] = None, *, report_done: bool = True) -> None:
        super().__init__()
        self._reporter = reporter
        self._report_done = report_done
        self._first = False

    @property
    def reporter(self) -> Reporter:
        if self._reporter is None:
            from .. import get_reporter

            self._reporter = get_reporter()
        return self._reporter

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if getattr(trainer, "_startline_timed", False):
            return
        save = trainer.save_checkpoint
        reporter = self.reporter

        @functools.wraps(save)
        def timed_save(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = save(filepath, *args, **kwargs)
            uri = f"file://{os.path.abspath(str(filepath))}" if "://" not in str(filepath) else str(filepath)
            reporter.checkpoint(int(trainer.global_step), save_seconds=time.perf_counter() - t0, uri=uri)
            return result

        trainer.save_checkpoint = timed_save  # type: ignore[method-assign]
        trainer._startline_timed = True  # type: ignore[attr-defined]

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", *args: Any, **kwargs: Any) -> None:
        if not self._first:
            self._first = True
            if trainer.is_global_zero:
                self.reporter.first_step(max(1, int(trainer.global_step)))

    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._report_done and trainer.is_global_zero and not trainer.interrupted:
            self.reporter.done("succeeded")

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        if self._report_done and trainer.is_global_zero:
            outcome = "cancelled" if isinstance(exception, KeyboardInterrupt) else "failed"
            self.reporter.done(outcome, message=f"{type(exception).__name__}: {exception}")
