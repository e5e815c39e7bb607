"""goodtrace: where did the time of my training job go?

The recording API (standard library only)::

    import goodtrace as gt
    gt.init("runs/exp1")
    for step in range(start, total):
        with gt.step(step) as s:
            with gt.span("data"):
                batch = next(loader)
            loss = train_step(state, batch)   # asynchronous on GPU/TPU
            s.complete_on(loss)               # observed lazily, one step later
            gt.metric("loss", loss, reduce="mean")
        if step % 1000 == 0:
            with gt.span("checkpoint", category="checkpoint_save"):  # blocking: settles pending steps first
                save(state)
    gt.finish(completed=True)

Flow: ``span()`` -> in-memory buffer -> writer thread -> per-rank segment files -> reader ->
analysis -> renderers; the package's folders follow it (``record/`` runs inside the job and
loads the standard library only, ``read/``, ``analysis/``, ``renderers/`` and ``cli/`` run
afterwards). Before ``init()`` (and with ``enabled=False``) every call is a no-op.

The results, in a notebook or a test (needs ``goodtrace[report]``; imported when called)::

    result = gt.report("runs/exp1", since="step:100")   # goodtrace report's options, as keywords
    result.partition.goodput, result.verdict.text
    result.to_dict()                                      # what ``goodtrace report --json`` prints
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from goodtrace import schema
from goodtrace.record.api import (
    complete_on,
    current_step,
    event,
    finish,
    flush,
    init,
    is_enabled,
    metric,
    recorder,
    step,
    tag,
)
from goodtrace.record.config import Config, ConfigError
from goodtrace.record.errors import GoodtraceWarning
from goodtrace.record.hang import detect_hangs
from goodtrace.record.recorder import StepContext
from goodtrace.record.spans import Span, span
from goodtrace.record.values.adapters import register_value_type

if TYPE_CHECKING:
    from goodtrace.analysis import RunAnalysis

__all__ = [
    "Config",
    "ConfigError",
    "GoodtraceWarning",
    "ReportError",
    "Span",
    "StepContext",
    "complete_on",
    "current_step",
    "detect_hangs",
    "event",
    "finish",
    "flush",
    "init",
    "is_enabled",
    "metric",
    "recorder",
    "register_value_type",
    "report",
    "schema",
    "span",
    "step",
    "tag",
]


def report(path: str | os.PathLike[str], **options: Any) -> RunAnalysis:
    """The analysis of the run at ``path`` that ``goodtrace report`` shows, by the command's own
    path: ``options`` are its options as keywords (``since="step:100"``, ``every="10m"``,
    ``job=0``, ``flops_per_step=...``, ``accelerator="h100"``, ``html="report.html"``, ...), and
    ``report(path, **options).to_dict()`` equals what ``goodtrace report PATH --json`` prints
    with them. The stable way to get the numbers in a notebook or a test. Raises
    :class:`ReportError` where the command prints an error. Needs the reader
    (``goodtrace[report]``), imported here, not with ``goodtrace``."""
    from goodtrace.cli.commands.report import report as report_of

    result: RunAnalysis = report_of(path, **options)
    return result


def __getattr__(name: str) -> Any:
    if name == "ReportError":  # the reader's, imported when asked for
        from goodtrace.cli.commands.report import ReportError

        return ReportError
    raise AttributeError(f"module 'goodtrace' has no attribute {name!r}")
