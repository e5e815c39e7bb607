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
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

import goodtrace as gt
from goodtrace import schema
from goodtrace.record.recorder import Recorder

__all__ = ["GoodtraceCallback"]


class GoodtraceCallback(Callback):
    """Record a Lightning ``Trainer`` with goodtrace (see the module docstring)."""

    def __init__(
        self, run_dir: str | os.PathLike[str] | None = None, *, sinks: Sequence[Any] | None = None,
        tokens_per_step: float | None = None, flops_per_step: float | None = None, live: bool = True,
        **init_options: Any,
    ) -> None:
        self.run_dir = None if run_dir is None else os.fspath(run_dir)
        self.sinks = sinks
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self.live = live
        self.init_options = init_options
        self.started_goodtrace = False
        self._integration: Any = None
        self._step: Any = None
        self._phase: Any = None
        self._eval: Any = None
        self._between_batches_t0: int | None = None
        self._saved_save_checkpoint: Any = None
        self._logger: MetricLogger | None = None
        self._global_step_at_start = 0  # trainer.global_step when the open step began

    # ------------------------------------------------------------------ lifecycle
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if not gt.is_enabled() and self.run_dir is not None:
            gt.init(self.run_dir, sinks=self.sinks, **self.init_options)
            self.started_goodtrace = gt.is_enabled()
        if not gt.is_enabled():
            return
        if self._integration is None:
            from goodtrace.integrations.torch import instrument

            self._integration = instrument(
                log_every=max(1, int(getattr(trainer, "log_every_n_steps", 10) or 10)),
                tokens_per_step=self.tokens_per_step, flops_per_step=self.flops_per_step, live=self.live,
            )
        self._wrap_save_checkpoint(trainer)
        if self._logger is None:
            self._logger = MetricLogger()
            trainer.loggers = [*trainer.loggers, self._logger]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if gt.is_enabled():
            self._between_batches_t0 = _now()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer, completed=not bool(getattr(trainer, "interrupted", False)))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Record the exception and close the step; recording goes on, so that how the attempt
        ended is what the program does next (dies: no finish record, the analysis says so)."""
        if gt.is_enabled():
            gt.event("exception", type=type(exception).__name__, message=str(exception)[:500])
        self._close_step(None)
        self._unwrap_save_checkpoint(trainer)
        self._remove_logger(trainer)

    def _finish(self, trainer: Any, completed: bool) -> None:
        self._close_step(None)
        self._unwrap_save_checkpoint(trainer)
        self._remove_logger(trainer)
        if self.started_goodtrace:
            self.started_goodtrace = False
            gt.finish(completed=completed)

    # ------------------------------------------------------------------ steps
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not gt.is_enabled() or self._step is not None:
            return  # a later micro-batch of the same optimizer step
        number = _logger_step(trainer)
        self._global_step_at_start = int(trainer.global_step)
        t0 = self._between_batches_t0
        self._step = gt.step(number).__enter__()
        if t0 is not None:
            gt.recorder().record_span("data", schema.DATA, t0, self._step.t0, step=number)
        self._phase = gt.span("forward_backward").__enter__()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._step is None:
            return
        self._end_phase()
        self._phase = gt.span("optimizer").__enter__()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._step is None:
            return
        if int(trainer.global_step) == self._global_step_at_start:
            self._between_batches_t0 = _now()  # accumulating: the step goes on
            return
        self._close_step(_loss_of(outputs))

    def _close_step(self, loss: Any) -> None:
        self._end_phase()
        if self._step is None:
            return
        if loss is not None:
            self._step.complete_on(loss)
        self._step.__exit__(None, None, None)
        self._step = None
        self._between_batches_t0 = _now()

    def _end_phase(self) -> None:
        if self._phase is not None:
            self._phase.__exit__(None, None, None)
            self._phase = None

    # ------------------------------------------------------------------ validation, checkpoints
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if gt.is_enabled() and self._eval is None:
            self._eval = gt.span("eval", schema.EVAL, {"sanity_check": bool(trainer.sanity_checking)}).__enter__()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._eval is None:
            return
        self._eval.__exit__(None, None, None)
        self._eval = None
        self._between_batches_t0 = _now()

    def _wrap_save_checkpoint(self, trainer: Any) -> None:
        if self._saved_save_checkpoint is not None:
            return
        original = trainer.save_checkpoint

        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            with gt.span("checkpoint", schema.CHECKPOINT_SAVE):
                result = original(*args, **kwargs)
            if gt.is_enabled():
                self._between_batches_t0 = _now()
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


def _now() -> int:
    """The active recorder's clock (what its spans and steps are timed with)."""
    rec = gt.recorder()
    return rec.clock() if isinstance(rec, Recorder) else 0
