"""Hugging Face Transformers: ``Trainer(..., callbacks=[StartlineCallback()])``.

- the first ``on_step_end`` is the first step (the main process);
- a checkpoint save is timed from the end of the step that triggers it (``control.should_save``) to
  ``on_save`` (the Trainer calls it right after writing the checkpoint), and reported with its ``save_seconds``
  and the checkpoint's directory;
- ``on_train_end`` reports ``done: succeeded``.
"""

import os
import time
from typing import Any, Optional

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .._reporter import Reporter


class StartlineCallback(TrainerCallback):
    """Reports the first step, checkpoint saves and the end of training. ``reporter`` defaults to the module's
    default reporter; ``report_done=False`` leaves ``done`` to the caller."""

    def __init__(self, reporter: Optional[Reporter] = None, *, report_done: bool = True) -> None:
        self._reporter = reporter
        self._report_done = report_done
        self._first = False
        self._save_started: Optional[float] = None

    @property
    def reporter(self) -> Reporter:
        if self._reporter is None:
            from .. import get_reporter

            self._reporter = get_reporter()
        return self._reporter

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if not self._first:
            self._first = True
            self.reporter.first_step(max(1, int(state.global_step)))
        if control.should_save:
            self._save_started = time.perf_counter()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        started = self._save_started
        self._save_started = None
        seconds = time.perf_counter() - started if started is not None else None
        uri = os.path.join(str(args.output_dir), f"checkpoint-{state.global_step}")
        self.reporter.checkpoint(int(state.global_step), save_seconds=seconds, uri=f"file://{os.path.abspath(uri)}")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._report_done and state.is_world_process_zero:
            self.reporter.done("succeeded")
