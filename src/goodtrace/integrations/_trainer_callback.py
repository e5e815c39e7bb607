"""What the Lightning and Hugging Face trainer callbacks share (neither library is imported).

A trainer calls a callback's hooks at the edges of what goodtrace times, never around it, so a
step, its phase (``forward_backward``, then ``optimizer``) and a blocking span (evaluation, a
checkpoint save) are each held open in an :class:`contextlib.ExitStack` from one hook to the
next and closed through it. :class:`TrainerRecording` holds those, starts goodtrace (unless
the program did), hooks PyTorch, records the time between steps (where the trainer fetches
the next batches) as ``data`` and finishes goodtrace when it started it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import goodtrace as gt
from goodtrace import schema
from goodtrace.record.recorder import Recorder

__all__ = ["TrainerRecording", "now"]


class TrainerRecording:
    """The state a trainer callback records with: the open step, its phase, a blocking span."""

    def __init__(
        self, run_dir: str | os.PathLike[str] | None, *, sinks: Sequence[Any] | None,
        tokens_per_step: float | None, flops_per_step: float | None, live: bool, init_options: dict[str, Any],
    ) -> None:
        self.run_dir = None if run_dir is None else os.fspath(run_dir)
        self.sinks = sinks
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self.live = live
        self.init_options = init_options
        self.started_goodtrace = False
        self._integration: Any = None
        self._step: Any = None  # the open step's context (None between steps)
        self._step_scope = ExitStack()
        self._phase_scope = ExitStack()  # the forward_backward or optimizer span inside the step
        self._blocking: str | None = None  # the kind of the blocking span in progress ("eval", "save")
        self._blocking_scope = ExitStack()
        self._between_steps_t0: int | None = None  # the last step's (or blocking span's) end

    # ------------------------------------------------------------------ lifecycle
    def _start(self, log_every: int) -> bool:
        """Start goodtrace (unless the program did) and hook PyTorch; False when it is off."""
        if not gt.is_enabled() and self.run_dir is not None:
            gt.init(self.run_dir, sinks=self.sinks, **self.init_options)
            self.started_goodtrace = gt.is_enabled()
        if not gt.is_enabled():
            return False
        if self._integration is None:
            from goodtrace.integrations.torch import instrument

            self._integration = instrument(log_every=log_every, tokens_per_step=self.tokens_per_step,
                                           flops_per_step=self.flops_per_step, live=self.live)
        return True

    def _finish_goodtrace(self, completed: bool) -> None:
        """Finish goodtrace if this callback started it."""
        if self.started_goodtrace:
            self.started_goodtrace = False
            gt.finish(completed=completed)

    # ------------------------------------------------------------------ steps
    def _open_step(self, number: int) -> None:
        """Begin step ``number`` and its ``forward_backward`` phase; the time since the last
        step's end is the step's ``data``."""
        t0 = self._between_steps_t0
        self._step = self._step_scope.enter_context(gt.step(number))
        if t0 is not None:
            gt.recorder().record_span("data", schema.DATA, t0, self._step.t0, step=number)
        self._begin_phase("forward_backward")

    def _begin_phase(self, name: str) -> None:
        """End the step's current phase and begin ``name``."""
        self._phase_scope.close()
        self._phase_scope.enter_context(gt.span(name))

    def _close_step(self, complete_on: Any) -> None:
        """End the phase and the step (completed on ``complete_on`` when given)."""
        self._phase_scope.close()
        if self._step is None:
            return
        if complete_on is not None:
            self._step.complete_on(complete_on)
        self._step_scope.close()
        self._step = None
        self._between_steps_t0 = now()

    # ------------------------------------------------------------------ blocking spans
    def _begin_blocking(self, kind: str, name: str, category: str, attrs: dict[str, Any] | None = None) -> None:
        """Begin a blocking span (``kind`` names it for :meth:`_end_blocking`)."""
        self._blocking_scope.enter_context(gt.span(name, category) if attrs is None else gt.span(name, category, attrs))
        self._blocking = kind

    def _end_blocking(self) -> None:
        """End the blocking span in progress; what follows it up to the next step is ``data``."""
        self._blocking_scope.close()
        self._blocking = None
        self._between_steps_t0 = now()

    def _drop_blocking(self) -> None:
        """Forget a blocking span that was begun for work the trainer then did not do: it is
        never ended, so nothing of it is recorded."""
        self._blocking_scope.pop_all()
        self._blocking = None


def now() -> int:
    """The active recorder's clock (what its spans and steps are timed with)."""
    rec = gt.recorder()
    return rec.clock() if isinstance(rec, Recorder) else 0
