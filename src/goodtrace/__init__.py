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
            with gt.span("checkpoint"):       # blocking: settles pending steps first
                save(state)
    gt.finish(completed=True)

Flow: ``span()`` -> in-memory buffer -> writer thread -> per-rank segment files -> reader ->
analysis -> renderers; the package's folders follow it (``record/`` runs inside the job and
loads the standard library only, ``read/``, ``analysis/``, ``renderers/`` and ``cli/`` run
afterwards). Before ``init()`` (and with ``enabled=False``) every call is a no-op.
"""

from __future__ import annotations

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
from goodtrace.record.recorder import StepContext
from goodtrace.record.spans import Span, span
from goodtrace.record.values.adapters import register_value_type

__all__ = [
    "Config",
    "ConfigError",
    "GoodtraceWarning",
    "Span",
    "StepContext",
    "complete_on",
    "current_step",
    "event",
    "finish",
    "flush",
    "init",
    "is_enabled",
    "metric",
    "recorder",
    "register_value_type",
    "schema",
    "span",
    "step",
    "tag",
]
