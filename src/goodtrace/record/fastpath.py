"""The one place that chooses C or Python: the span hot path (``_speedups``, built from
``_speedups.c``) and the native writer (``io/_native``, built from ``io/_native.c`` and
``io/native_writer.c``) are used when they were built, unless ``GOODTRACE_PURE_PYTHON=1``
(both off) or ``GOODTRACE_NATIVE_WRITER=0`` (the Python writer threads instead of the native
one). A machine without a compiler runs the same records through the Python code."""

from __future__ import annotations

import importlib
import os
from typing import Any


def _enabled(variable: str, default: str) -> bool:
    return os.environ.get(variable, default) not in ("", "0")


def _load(module: str, *needs: str) -> Any:
    try:
        loaded = importlib.import_module(module)
    except ImportError:
        return None
    return loaded if all(hasattr(loaded, name) for name in needs) else None  # an older build: unused


PURE_PYTHON = _enabled("GOODTRACE_PURE_PYTHON", "")
speedups: Any = None if PURE_PYTHON else _load("goodtrace.record._speedups", "Sink", "encode_plain_spans")
native: Any = (
    None if PURE_PYTHON or not _enabled("GOODTRACE_NATIVE_WRITER", "1")
    else _load("goodtrace.record.io._native", "NativeRing")
)
SPANS = "python" if speedups is None else "c"
WRITER = "python" if native is None else "native"
