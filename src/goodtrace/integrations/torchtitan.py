"""torchtitan: record a torchtitan trainer through goodtrace, from its structured logger.

torchtitan loads its structured logger's handlers from ``TITAN_STRUCT_LOGGER_HANDLERS``
(factories, comma-separated). Adding this module's :func:`register_handler` records the
trainer without editing it::

    TITAN_STRUCT_LOGGER_HANDLERS=torchtitan.observability.structured_logger.jsonl_handler.register_jsonl_handler,\\
goodtrace.integrations.torchtitan.register_handler

It starts goodtrace (``GOODTRACE_RUN_DIR``, else ``OUTPUT_DIR/goodtrace``) unless the program
already did, and turns the logger's records into goodtrace's, as they are logged: the
``step`` span into each step (``set_step``'s number), the other spans into spans with their
category (``fwd_bwd``, ``optim`` compute; ``fetching_batch`` data; ``checkpoint_save``,
``eval``, ``gc_collect``, ...; an ``_error`` record marks the span as raised), scalars into
metrics, instants into events, step tags into tags. Each step is completed on the model's
first parameter once the optimizer has stepped (read from the trainer's ``train_step`` as it
logs ``optim``'s end), so its time runs to the device's update, not the host's dispatch; the
loss the trainer reduces for logging becomes the metric ``loss``. The run finishes when
torchtitan's ``torch_distributed_teardown`` span ends (or at exit).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import goodtrace as gt
from goodtrace import schema

__all__ = ["GoodtraceHandler", "register_handler"]

CATEGORIES = {
    "fwd_bwd": schema.COMPUTE,
    "optim": schema.COMPUTE,
    "fetching_batch": schema.DATA,
    "post_dataloading_process": schema.DATA,
    "collect_dist_metrics": schema.LOG,
    "gc_collect": schema.GC,
    "checkpoint_save": schema.CHECKPOINT_SAVE,
    "checkpoint_load": schema.CHECKPOINT_RESTORE,
    "eval": schema.EVAL,
    "model_parallelism_init": schema.INIT,
    "torch_distributed_init": schema.INIT,
    "kineto_profiler_step_call": schema.PROFILE,
    "memory_profiler_step_call": schema.PROFILE,
}
STEP_SPAN = "step"
TEARDOWN_SPAN = "torch_distributed_teardown"
_FRAMES = 24  # how far up the stack the trainer's train_step is looked for


def register_handler(*, structured_logger: logging.Logger, rank: int, source: str, output_dir: str,
                     **kw: Any) -> None:
    """torchtitan's handler factory: start goodtrace if needed and attach :class:`GoodtraceHandler`."""
    started = False
    if not gt.is_enabled():
        run_dir = os.environ.get("GOODTRACE_RUN_DIR") or os.path.join(output_dir, "goodtrace")
        gt.init(run_dir, rank=rank)
        started = gt.is_enabled()
    structured_logger.addHandler(GoodtraceHandler(finish_at_teardown=started))


class GoodtraceHandler(logging.Handler):
    """Turns torchtitan's structured records into goodtrace steps, spans, metrics, events and tags."""

    def __init__(self, *, finish_at_teardown: bool = False) -> None:
        super().__init__(level=logging.INFO)
        self.finish_at_teardown = finish_at_teardown
        self._step: Any = None
        self._spans: dict[str | None, list[tuple[str, Any, bool]]] = {}  # per asyncio task
        self._tagged: set[tuple[int, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if not gt.is_enabled():
            return
        try:
            self._record(record)
        except Exception:  # never break the trainer's logging
            self.handleError(record)

    def _record(self, record: logging.LogRecord) -> None:
        name = str(getattr(record, "log_type_name", "") or "")
        kind = getattr(record, "log_type", None)
        step = getattr(record, "step", None)
        self._tags(step)
        if kind == "event" and name.endswith("_start"):
            base = name[: -len("_start")]
            if base == STEP_SPAN and isinstance(step, int):
                self._step = gt.step(step).__enter__()
                return
            span = gt.span(base, CATEGORIES.get(base) or schema.category_for_name(base)).__enter__()
            self._spans.setdefault(getattr(record, "task_name", None), []).append((base, span, False))
        elif kind == "event" and name.endswith("_error"):
            stack = self._spans.get(getattr(record, "task_name", None), [])
            base = name[: -len("_error")]
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == base:
                    stack[i] = (base, stack[i][1], True)
                    break
        elif kind == "event" and name.endswith("_end"):
            self._end(name[: -len("_end")], getattr(record, "task_name", None))
        elif name == "metric_value":
            value = getattr(record, "value", None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                gt.metric(str(getattr(record, "event_name", "")), float(value), "mean",
                          step=step if isinstance(step, int) else None)
        elif kind == "instant" and name:
            gt.event(name)

    def _end(self, base: str, task: str | None) -> None:
        if base == STEP_SPAN:
            if self._step is not None:
                step, self._step = self._step, None
                step.__exit__(None, None, None)
            return
        stack = self._spans.get(task, [])
        index = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == base), None)
        if index is None:
            return
        _, span, raised = stack.pop(index)
        if raised:
            span.__exit__(RuntimeError, None, None)
        else:
            span.__exit__(None, None, None)
        if base == "optim" and self._step is not None:
            marker = _trainer_value("model_parts")
            parameter = _first_parameter(marker)
            if parameter is not None:
                self._step.complete_on(parameter)
        elif base == "collect_dist_metrics":
            loss = _trainer_value("global_avg_loss")
            if isinstance(loss, (int, float)) and not isinstance(loss, bool):
                gt.metric("loss", float(loss), "mean")
        elif base == TEARDOWN_SPAN and self.finish_at_teardown:
            self.finish_at_teardown = False
            gt.finish()

    def _tags(self, step: object) -> None:
        if not isinstance(step, int):
            return
        try:
            from torchtitan.observability.structured_logger import get_step_tags
        except ImportError:
            return
        for tag in get_step_tags():
            if (step, tag) not in self._tagged:
                self._tagged.add((step, tag))
                gt.tag(str(tag), step=step)


def _trainer_value(name: str) -> Any:
    """``name`` from the trainer's ``train_step`` frame (``self.<name>`` first, then its local)."""
    frame = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == "train_step":
            owner = frame.f_locals.get("self")
            if owner is not None and hasattr(owner, name):
                return getattr(owner, name)
            return frame.f_locals.get(name)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _first_parameter(model_parts: Any) -> Any:
    try:
        for part in model_parts:
            for parameter in part.parameters():
                return parameter.detach()
    except Exception:
        return None
    return None
