"""Hugging Face Transformers: ``GoodtraceCallback``, a ``TrainerCallback`` that records a ``Trainer``.

``Trainer(..., callbacks=[GoodtraceCallback("runs/exp1")])`` records, on every rank:

* each optimizer step as a goodtrace step, completed on the model's first parameter after
  the optimizer step (a CUDA event on its stream: the step is done when its update is),
  numbered like the Trainer's ``global_step``;
* inside it ``forward_backward`` (step begin to the optimizer hook, all micro-batches) and
  ``optimizer`` (the optimizer's step) as spans; the time between steps, where the Trainer
  fetches the next batches, as ``data``;
* evaluation (``eval``) and checkpoint saves (``checkpoint_save``) as blocking spans: the
  Trainer has no hook where they begin, so they begin at the step end (or epoch end) that
  decided them and end at ``on_evaluate`` / ``on_save``;
* the Trainer's logs (loss, learning rate, grad norm, eval metrics) as metrics.

goodtrace's own figures (the latest live line: step time and its overhead split, goodput,
throughput, MFU; ``goodtrace/...`` as the sinks name them, and ``goodtrace/step``, the last
step of the line's log interval: a log interval's line is ready ``lag`` steps after it, so a logging step
carries the previous log interval's figures) go into the Trainer's training logs in ``on_log``, so its ``log_history`` and its reporting integrations (``report_to``: TensorBoard,
W&B, MLflow, ...) get them; the Trainer's own values are not logged a second time
(``report_figures=False`` turns this off). For that the callback runs its ``on_log`` before
the reporting integrations' (it moves itself ahead of them in the Trainer's callback list).

It starts goodtrace (``run_dir``) unless the program already did, hooks PyTorch
(``goodtrace.integrations.torch.instrument``: live lines every ``logging_steps``, CUDA step
times, memory) and finishes at the end of training when it started goodtrace itself. The step,
its phases, the ``data`` between steps and the start and finish are
:class:`goodtrace.integrations._trainer_callback.TrainerRecording`'s (shared with the
Lightning callback).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from transformers import TrainerCallback

import goodtrace as gt
from goodtrace import schema
from goodtrace.integrations._trainer_callback import TrainerRecording, now
from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.scalars import PREFIX, line_scalars
from goodtrace.record.recorder import Recorder

__all__ = ["GoodtraceCallback"]


class GoodtraceCallback(TrainerRecording, TrainerCallback):
    """Record a Hugging Face ``Trainer`` with goodtrace (see the module docstring)."""

    def __init__(
        self, run_dir: str | os.PathLike[str] | None = None, *, sinks: Sequence[Any] | None = None,
        tokens_per_step: float | None = None, flops_per_step: float | None = None, live: bool = True,
        report_figures: bool = True, **init_options: Any,
    ) -> None:
        super().__init__(run_dir, sinks=sinks, tokens_per_step=tokens_per_step, flops_per_step=flops_per_step,
                         live=live, init_options=init_options)
        self.report_figures = report_figures
        self._marker: Any = None
        self._line: LiveLine | None = None  # the live line not yet put into the Trainer's logs
        self._listening: Any = None  # the recorder whose live lines this callback takes

    # ------------------------------------------------------------------ lifecycle
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if not self._start(log_every=max(1, int(getattr(args, "logging_steps", 10) or 10)) if self.live else 10):
            return
        self._marker = _first_parameter(model)
        self._between_steps_t0 = now()
        rec = gt.recorder()
        if self.report_figures and isinstance(rec, Recorder) and self._listening is None:
            rec.line_listeners.append(self._take_line)
            self._listening = rec
            _run_before_reporters(self)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_step(self._marker)
        self._drop_blocking()  # a save the Trainer decided against: nothing to record
        if self._listening is not None:
            try:
                self._listening.line_listeners.remove(self._take_line)
            except ValueError:
                pass
            self._listening = None
        self._finish_goodtrace(completed=bool(state.max_steps and state.global_step >= state.max_steps))

    # ------------------------------------------------------------------ steps
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not gt.is_enabled():
            return
        self._drop_blocking()
        self._open_step(int(state.global_step) + 1)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step is not None:
            self._begin_phase("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step is None:
            return
        self._close_step(self._marker)
        self._after_step(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if gt.is_enabled() and self._blocking is None:
            self._after_step(control)

    def _after_step(self, control: Any) -> None:
        """The Trainer logs, evaluates and saves right after this hook, without a hook of its own."""
        if control.should_evaluate:
            self._begin_blocking("eval", "eval", schema.EVAL)
        elif control.should_save:
            self._begin_blocking("save", "checkpoint", schema.CHECKPOINT_SAVE)

    # ------------------------------------------------------------------ eval, save, logs
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._blocking != "eval":
            return  # an evaluate() outside training: no hook marks its start
        self._end_blocking()
        if control.should_save:
            self._begin_blocking("save", "checkpoint", schema.CHECKPOINT_SAVE)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not gt.is_enabled():
            return
        if self._blocking == "save":
            self._end_blocking()
            return
        if self._between_steps_t0 is not None:  # decided after evaluating (save_strategy="best")
            gt.recorder().record_span("checkpoint", schema.CHECKPOINT_SAVE, self._between_steps_t0, now())
        self._drop_blocking()
        self._between_steps_t0 = now()

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not gt.is_enabled() or not logs:
            return
        own = list(logs.items())  # the Trainer's values, before goodtrace's figures join them
        line = self._line
        if line is not None and isinstance(logs, dict) and not any(k.startswith("eval_") for k in logs):
            self._line = None
            figures = {k: v for k, v in line_scalars(line).items()
                       if not k.startswith(f"{PREFIX}/metric/")}  # the Trainer's own values: not again
            figures[f"{PREFIX}/step"] = float(line.step)  # the last step of the line's log interval
            logs.update(figures)  # the reporting integrations after this callback read these
            last = state.log_history[-1] if state.log_history else None
            if isinstance(last, dict) and all(last.get(k) == v for k, v in own):
                last.update(figures)  # the Trainer appended its copy just before calling on_log
        for name, value in own:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "epoch":
                gt.metric(name, float(value), "mean", step=int(state.global_step))


    def _take_line(self, line: LiveLine) -> None:
        self._line = line


def _run_before_reporters(callback: TrainerCallback) -> None:
    """Move ``callback`` ahead of the reporting integrations in its Trainer's callback list,
    so that what its ``on_log`` adds reaches them. The Trainer puts ``report_to``'s callbacks
    before the program's and hands callbacks no reference to itself: the list is found on the
    ``CallbackHandler`` that is calling this hook. Only reporters are overtaken (they change
    no control flags); the list is replaced, not mutated, while the handler iterates it."""
    import sys

    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
    from transformers.trainer_callback import CallbackHandler

    reporters = tuple(c for c in INTEGRATION_TO_CALLBACK.values() if isinstance(c, type))
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not isinstance(frame.f_locals.get("self"), CallbackHandler):
        frame = frame.f_back
    if frame is None:
        return
    handler: Any = frame.f_locals["self"]
    callbacks = list(handler.callbacks)
    if callback not in callbacks:
        return
    first = next((i for i, c in enumerate(callbacks) if isinstance(c, reporters)), None)
    if first is None or callbacks.index(callback) < first:
        return
    callbacks.remove(callback)
    callbacks.insert(first, callback)
    handler.callbacks = callbacks


def _first_parameter(model: Any) -> Any:
    try:
        return next(iter(model.parameters()))
    except Exception:
        return None

