"""MaxText: run a MaxText trainer recorded by goodtrace, MaxText unedited.

::

    python -m goodtrace.integrations.maxtext RUN_DIR -- <MaxText's own arguments>
    python -m goodtrace.integrations.maxtext RUN_DIR --trainer maxtext.trainers.pre_train.train -- \\
        src/maxtext/configs/base.yml run_name=r1 steps=1000 ...

MaxText has no callback API, but every trainer gets its goodput recorder from
``maxtext.common.goodput.create_goodput_recorder(config)`` and calls its
``record_<event>_start_time`` / ``_end_time`` methods by name (MaxText skips a method the
recorder does not have). This module puts :class:`MaxTextRecorder` in that seam, then runs the
trainer module as ``__main__``:

- ``step`` events: each step is a ``gt.step``, completed on the step's loss
  (``metrics["scalar"]["learning/loss"]``, read from the trainer's frame as the step's event
  ends: the train state cannot be waited on, its buffers are donated to the next step), so
  each step's time runs to the device's end of it, with its compilation in step 0;
- ``tpu_init`` and ``training_preparation``: spans of category ``init``; ``data_loading``: a
  ``data`` span;
- checkpoint saves (``maxtext.common.checkpointing.save_checkpoint``) and evaluation loops
  (``MetricLogger.mark_eval_loop_start`` up to the next training step's metrics) are blocking
  spans, ``checkpoint_save`` and ``eval``;
- MaxText's FLOPs and tokens per device and step (``maxtext_utils``) go to the JAX integration
  (:func:`goodtrace.integrations.jax.instrument`) for the MFU, with JAX's compile spans and, on
  several processes, clock alignment and the live line.

goodtrace starts in the recorder factory (after MaxText has set up ``jax.distributed``, so each
process records its own rank; start-up still counts from the process start) and finishes at
MaxText's ``job`` end. A seam that has moved in another MaxText release is named with that
release's version and the one this was tested with, and the command stops before training.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import runpy
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import goodtrace as gt
from goodtrace import schema

__all__ = ["TESTED_VERSION", "MaxTextRecorder", "SeamMoved", "install", "main"]

TESTED_VERSION = "0.2.5"
DEFAULT_TRAINER = "maxtext.trainers.pre_train.train"
_FRAMES = 16  # how far up the stack the trainer's step metrics are looked for
_SPANS = {  # MaxText's goodput events (other than job and step): goodtrace's span and category
    "tpu_init": ("tpu_init", schema.INIT),
    "training_preparation": ("training_preparation", schema.INIT),
    "data_loading": ("data_loading", schema.DATA),
}


class SeamMoved(RuntimeError):
    """A MaxText function or method this integration needs is not where it was."""


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("maxtext")
    except Exception:
        return "unknown"


def _moved(what: str) -> SeamMoved:
    return SeamMoved(f"goodtrace's MaxText integration needs {what}, which MaxText {_version()} does not have "
                     f"(tested with MaxText {TESTED_VERSION}); record this trainer with gt.step/gt.span "
                     "in its loop instead, or use MaxText " + TESTED_VERSION)


class MaxTextRecorder:
    """What ``create_goodput_recorder(config)`` returns under goodtrace: MaxText's goodput events
    as goodtrace's steps and spans (see the module's docstring)."""

    def __init__(self) -> None:
        self._step: Any = None
        self._step_scope = ExitStack()
        self._spans: dict[str, ExitStack] = {}
        self._warned_loss = False

    # MaxText calls these by name (maxtext.common.goodput.record_goodput)
    def record_job_start_time(self, *args: Any) -> None:
        pass

    def record_job_end_time(self, *args: Any) -> None:
        self._close_step()
        gt.finish()

    def record_step_start_time(self, step: Any = None, *args: Any) -> None:
        self._close_step()
        self._step = self._step_scope.enter_context(gt.step(int(step) if step is not None else 0))

    def record_step_end_time(self, step: Any = None, *args: Any) -> None:
        if self._step is None:
            return
        loss = _step_loss()
        if loss is not None:
            self._step.complete_on(loss)
        elif not self._warned_loss:
            self._warned_loss = True
            _warn("MaxText's step loss (metrics['scalar']['learning/loss']) was not found where its step "
                  "ends: steps are timed on the host")
        self._close_step()

    def __getattr__(self, name: str) -> Callable[..., None]:
        for event, (span, category) in _SPANS.items():
            if name == f"record_{event}_start_time":
                return lambda *args: self._open(span, category)
            if name == f"record_{event}_end_time":
                return lambda *args: self._close(span)
        raise AttributeError(name)  # MaxText skips the events a recorder has no method for

    def _open(self, name: str, category: str) -> None:
        self._close(name)
        scope = ExitStack()
        scope.enter_context(gt.span(name, category=category))
        self._spans[name] = scope

    def _close(self, name: str) -> None:
        scope = self._spans.pop(name, None)
        if scope is not None:
            scope.close()

    def _close_step(self) -> None:
        if self._step is not None:
            self._step = None
            self._step_scope.close()


def _warn(message: str) -> None:
    from goodtrace.record.errors import warn

    warn(message, stacklevel=3)


def _step_loss() -> Any:
    """The loss in the trainer's step metrics (``metrics["scalar"]["learning/loss"]``), from the
    nearest frame up the stack that holds them; None when none does."""
    frame = sys._getframe(2)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        metrics = frame.f_locals.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("scalar"), dict) and "learning/loss" in metrics["scalar"]:
            return metrics["scalar"]["learning/loss"]
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _announce(config: Any) -> None:
    """Start the JAX integration with MaxText's FLOPs and tokens per step of this process."""
    import jax

    from goodtrace.integrations import jax as gt_jax

    flops = tokens = None
    try:
        from maxtext.utils import maxtext_utils

        per_device_tflops = maxtext_utils.calculate_tflops_training_per_device(config, log=False)[0]
        flops = float(per_device_tflops) * 1e12 * jax.local_device_count()
        tokens = float(maxtext_utils.calculate_tokens_training_per_device(config)) * jax.local_device_count()
    except Exception as exc:  # MaxText's own arithmetic: without it, no MFU
        _warn(f"MaxText's FLOPs per step could not be read ({type(exc).__name__}: {exc}): no MFU")
    gt_jax.instrument(flops_per_step=flops, tokens_per_step=tokens)


def install(run_dir: str) -> None:
    """Put goodtrace into MaxText's seams (before the trainer module runs). Raises
    :class:`SeamMoved` naming what is missing."""
    if importlib.util.find_spec("maxtext") is None:
        raise ImportError("no module named 'maxtext'", name="maxtext")
    try:
        goodput = importlib.import_module("maxtext.common.goodput")
        checkpointing = importlib.import_module("maxtext.common.checkpointing")
        metric_logger = importlib.import_module("maxtext.common.metric_logger")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("maxtext."):
            raise _moved(f"the module {exc.name}") from None
        raise
    if not callable(getattr(goodput, "create_goodput_recorder", None)):
        raise _moved("maxtext.common.goodput.create_goodput_recorder")
    save = getattr(checkpointing, "save_checkpoint", None)
    if not callable(save):
        raise _moved("maxtext.common.checkpointing.save_checkpoint")
    logger: Any = getattr(metric_logger, "MetricLogger", None)
    for method in ("mark_eval_loop_start", "buffer_and_write_metrics"):
        if not callable(getattr(logger, method, None)):
            raise _moved(f"maxtext.common.metric_logger.MetricLogger.{method}")

    def create_goodput_recorder(config: Any) -> MaxTextRecorder:
        if not gt.is_enabled():
            gt.init(run_dir)
            _announce(config)
        return MaxTextRecorder()

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        with gt.span("checkpoint", category=schema.CHECKPOINT_SAVE):
            return save(*args, **kwargs)

    evaluating: list[ExitStack] = []
    mark_eval_loop_start, buffer_and_write_metrics = logger.mark_eval_loop_start, logger.buffer_and_write_metrics

    def eval_loop_starts(self: Any, *args: Any, **kwargs: Any) -> Any:
        scope = ExitStack()
        scope.enter_context(gt.span("eval", category=schema.EVAL))
        evaluating.append(scope)
        return mark_eval_loop_start(self, *args, **kwargs)

    def metrics_written(self: Any, metrics: Any, step: Any, step_time_delta: Any = None,
                        is_training: bool = True) -> Any:
        if is_training:
            while evaluating:  # the training step's metrics after the eval loop: the loop has ended
                evaluating.pop().close()
        return buffer_and_write_metrics(self, metrics, step, step_time_delta, is_training)

    setattr(goodput, "create_goodput_recorder", create_goodput_recorder)  # noqa: B010 (a module's attribute)
    setattr(checkpointing, "save_checkpoint", save_checkpoint)  # noqa: B010
    logger.mark_eval_loop_start = eval_loop_starts
    logger.buffer_and_write_metrics = metrics_written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m goodtrace.integrations.maxtext",
        description="Run a MaxText trainer, unedited, recorded by goodtrace into RUN_DIR.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="where goodtrace writes the run")
    parser.add_argument("--trainer", default=DEFAULT_TRAINER,
                        help=f"the MaxText trainer module to run (default {DEFAULT_TRAINER})")
    parser.add_argument("maxtext_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                        help="MaxText's own arguments (its config file and key=value overrides)")
    args = parser.parse_args(argv)
    rest = list(args.maxtext_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    try:
        install(args.run_dir)
        found = importlib.util.find_spec(args.trainer) is not None
    except SeamMoved as exc:
        print(f"goodtrace: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"goodtrace: cannot import MaxText ({exc}); install it first (pip install maxtext)", file=sys.stderr)
        return 2
    if not found:
        print(f"goodtrace: no trainer module {args.trainer!r} in MaxText {_version()}", file=sys.stderr)
        return 2
    sys.argv = [args.trainer, *rest]
    runpy.run_module(args.trainer, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
