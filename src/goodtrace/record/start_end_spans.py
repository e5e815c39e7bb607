"""Spans logged as ``NAME_start`` / ``NAME_end`` records (torchtitan's structured logger).

One place for what both readers of such records need: the category of each span name, and the
pairing of a ``_start`` with its ``_end`` per asyncio task (last opened first closed; a
``NAME_error`` between them marks the span as raised). The in-job handler
(``goodtrace.integrations.torchtitan``) holds open spans in it; the converter of saved logs
(``goodtrace.read.torchtitan``) holds start times. Standard library only.
"""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

from goodtrace import schema

__all__ = ["CATEGORIES", "STEP_SPAN", "TEARDOWN_SPAN", "Edge", "OpenSpans", "category_of", "edge_of"]

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
STEP_SPAN = "step"  # a step's execution, numbered by set_step
TEARDOWN_SPAN = "torch_distributed_teardown"  # the trainer's last span: the process ended normally
_EDGES = ("start", "error", "end")

T = TypeVar("T")


class Edge(NamedTuple):
    """What a record does to a span: ``edge`` is ``start``, ``error`` or ``end``."""

    edge: str
    name: str


def edge_of(log_type: object, record_name: str) -> Edge | None:
    """The span edge an ``event`` record named ``NAME_start``/``_error``/``_end`` marks, else None."""
    if log_type != "event":
        return None
    for edge in _EDGES:
        if record_name.endswith("_" + edge):
            return Edge(edge, record_name[: -len(edge) - 1])
    return None


def category_of(name: str) -> str:
    """The goodtrace category of a span name (the table, else the schema's rule for names)."""
    return CATEGORIES.get(name) or schema.category_for_name(name)


class OpenSpans(Generic[T]):
    """Spans opened and not yet ended, per asyncio task, each with a value (its start time, or
    the open span itself) and whether it raised."""

    def __init__(self) -> None:
        self._stacks: dict[object, list[tuple[str, T, bool]]] = {}

    def start(self, task: object, name: str, value: T) -> None:
        self._stacks.setdefault(task, []).append((name, value, False))

    def raised(self, task: object, name: str) -> None:
        """Mark the latest open span of ``name`` in ``task`` as raised."""
        stack = self._stacks.get(task, [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == name:
                stack[i] = (name, stack[i][1], True)
                return

    def end(self, task: object, name: str) -> tuple[T, bool] | None:
        """The value of the latest open span of ``name`` in ``task`` and whether it raised,
        now closed; None when no such span is open (its start was not seen)."""
        stack = self._stacks.get(task, [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == name:
                _, value, raised = stack.pop(i)
                return value, raised
        return None
