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
from contextlib import ExitStack
from typing import Any

import goodtrace as gt
from goodtrace.record.start_end_spans import STEP_SPAN, TEARDOWN_SPAN, OpenSpans, category_of, edge_of

__all__ = ["GoodtraceHandler", "register_handler"]

_FRAMES = 24  # how far up the stack the trainer's train_step is looked for


class _SpanRaised(Exception):
    """Raised inside a span torchtitan marked ``_error``, so that it ends as raised."""


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
        self._step: Any = None  # the open step (None between steps)
        self._step_scope = ExitStack()
        self._spans: OpenSpans[ExitStack] = OpenSpans()  # each open span in a scope of its own
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
        task = getattr(record, "task_name", None)
        self._tags(step)
        edge = edge_of(kind, name)
        if edge is not None and edge.edge == "start":
            if edge.name == STEP_SPAN and isinstance(step, int):
                self._step = self._step_scope.enter_context(gt.step(step))
                return
            scope = ExitStack()
            scope.enter_context(gt.span(edge.name, category_of(edge.name)))
            self._spans.start(task, edge.name, scope)
        elif edge is not None and edge.edge == "error":
            self._spans.raised(task, edge.name)
        elif edge is not None:
            self._end(edge.name, task)
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
                self._step = None
                self._step_scope.close()
            return
        ended = self._spans.end(task, base)
        if ended is None:
            return
        scope, raised = ended
        if raised:
            try:
                with scope:
                    raise _SpanRaised(base)
            except _SpanRaised:
                pass
        else:
            scope.close()
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
