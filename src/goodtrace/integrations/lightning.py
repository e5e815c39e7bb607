"""PyTorch Lightning: ``GoodtraceCallback``, a ``Callback`` that records a ``Trainer``'s fit.

``Trainer(callbacks=[GoodtraceCallback("runs/exp1")])`` records, on every rank:

* each optimizer step as a goodtrace step (with gradient accumulation, from its first
  micro-batch to the batch that stepped the optimizer), completed on the loss the training
  step returned, numbered like Lightning's loggers number it (0 for the first: the step its
  ``self.log`` values are logged at);
* inside it ``forward_backward`` (batch start to ``on_before_optimizer_step``: Lightning runs
  the forward and backward in the optimizer's closure) and ``optimizer`` (from there to the
  batch end) as spans; the time between batches, where Lightning fetches the next one, as
  ``data``;
* validation (``eval``, the sanity check included) and every checkpoint the trainer saves
  (``checkpoint_save``, around ``trainer.save_checkpoint``) as blocking spans;
* the values the module logs (``self.log``) as metrics, exactly as Lightning hands them to
  its loggers (a logger of goodtrace's is added to ``trainer.loggers`` for the fit): each
  value once, at the logging step or validation that produced it, at Lightning's step.

It starts goodtrace (``run_dir``) unless the program already did, hooks PyTorch
(``goodtrace.integrations.torch.instrument``: live lines every ``log_every_n_steps``) and
finishes when the fit ends if it started it (an exception is recorded as an event and leaves
the run open: the program's exit, or its own ``finish()``, says how the attempt ended).

The step, its phases, the ``data`` between steps and the start and finish are
:class:`goodtrace.integrations._trainer_callback.TrainerRecording`'s (shared with the Hugging
Face callback).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

import goodtrace as gt
from goodtrace import schema
from goodtrace.integrations._trainer_callback import TrainerRecording, now

__all__ = ["GoodtraceCallback"]


class GoodtraceCallback(TrainerRecording, Callback):
    """Record a Lightning ``Trainer`` with goodtrace (see the module docstring)."""

    def __init__(
        self, run_dir: str | os.PathLike[str] | None = None, *, sinks: Sequence[Any] | None = None,
        tokens_per_step: float | None = None, flops_per_step: float | None = None, live: bool = True,
        **init_options: Any,
    ) -> None:
        super().__init__(run_dir, sinks=sinks, tokens_per_step=tokens_per_step, flops_per_step=flops_per_step,
                         live=live, init_options=init_options)
        self._saved_save_checkpoint: Any = None
        self._logger: MetricLogger | None = None
        self._global_step_at_start = 0  # trainer.global_step when the open step began

    # ------------------------------------------------------------------ lifecycle
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._start(log_every=max(1, int(getattr(trainer, "log_every_n_steps", 10) or 10))):
            return
        self._wrap_save_checkpoint(trainer)
        if self._logger is None:
            self._logger = MetricLogger()
            trainer.loggers = [*trainer.loggers, self._logger]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if gt.is_enabled():
            self._between_steps_t0 = now()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close_step(None)
        self._unwrap_save_checkpoint(trainer)
        self._remove_logger(trainer)
        self._finish_goodtrace(completed=not bool(getattr(trainer, "interrupted", False)))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Record the exception and close the step; recording goes on, so that how the attempt
        ended is what the program does next (dies: no finish record, the analysis says so)."""
        if gt.is_enabled():
            gt.event("exception", type=type(exception).__name__, message=str(exception)[:500])
        self._close_step(None)
        self._unwrap_save_checkpoint(trainer)
        self._remove_logger(trainer)

    # ------------------------------------------------------------------ steps
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not gt.is_enabled() or self._step is not None:
            return  # a later micro-batch of the same optimizer step
        self._global_step_at_start = int(trainer.global_step)
        self._open_step(_logger_step(trainer))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._step is not None:
            self._begin_phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._step is None:
            return
        if int(trainer.global_step) == self._global_step_at_start:
            self._between_steps_t0 = now()  # accumulating: the step goes on
            return
        self._close_step(_loss_of(outputs))

    # ------------------------------------------------------------------ validation, checkpoints
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if gt.is_enabled() and self._blocking is None:
            self._begin_blocking("eval", "eval", schema.EVAL, {"sanity_check": bool(trainer.sanity_checking)})

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._blocking is not None:
            self._end_blocking()

    def _wrap_save_checkpoint(self, trainer: Any) -> None:
        if self._saved_save_checkpoint is not None:
            return
        original = trainer.save_checkpoint

        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            with gt.span("checkpoint", schema.CHECKPOINT_SAVE):
                result = original(*args, **kwargs)
            if gt.is_enabled():
                self._between_steps_t0 = now()
            return result

        self._saved_save_checkpoint = original
        trainer.save_checkpoint = save_checkpoint

    def _unwrap_save_checkpoint(self, trainer: Any) -> None:
        if self._saved_save_checkpoint is not None:
            try:
                del trainer.save_checkpoint  # the instance attribute: the class's method again
            except AttributeError:
                pass
            self._saved_save_checkpoint = None

    def _remove_logger(self, trainer: Any) -> None:
        if self._logger is not None:
            trainer.loggers = [lg for lg in trainer.loggers if lg is not self._logger]
            self._logger = None


class MetricLogger(Logger):
    """A Lightning logger that records what Lightning logs as goodtrace metrics, at its step.

    Lightning calls its loggers with exactly the values logged since the last call (each
    training value at its logging step, each validation value once, after the validation).
    Every rank records its own values: no ``rank_zero_only``.
    """

    @property
    def name(self) -> str:
        return "goodtrace"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not gt.is_enabled():
            return
        for name, value in metrics.items():
            if name != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool):
                gt.metric(str(name), float(value), "mean", step=None if step is None else int(step))


def _logger_step(trainer: Any) -> int:
    """The step Lightning's loggers log the next optimizer step's values at (batches that
    stepped so far; ``global_step`` counts every optimizer's steps)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    stepped = getattr(loop, "_batches_that_stepped", None)
    return int(stepped) if isinstance(stepped, int) else int(trainer.global_step)


def _loss_of(outputs: Any) -> Any:
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    return outputs if getattr(outputs, "numel", None) is not None else None

