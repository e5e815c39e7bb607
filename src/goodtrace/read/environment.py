"""The reader's settings from the environment, read in one place: where its caches live
(``GOODTRACE_CACHE_DIR``), and counts such as ``GOODTRACE_WORKERS`` and
``GOODTRACE_MIRROR_THREADS`` (a whole number, at least 1, or a clear error)."""

from __future__ import annotations

import os


def cache_root() -> str:
    """``$GOODTRACE_CACHE_DIR``, by default ``$XDG_CACHE_HOME/goodtrace/runs`` (that is,
    ``~/.cache/goodtrace/runs``): the mirrors of remote runs, and the segment caches of runs
    whose folder cannot be written."""
    return os.environ.get("GOODTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "goodtrace", "runs")


def count_from_environment(name: str, of: str) -> int | None:
    """Environment variable ``name`` as a count of ``of`` (workers, threads): None when unset.
    Raises ValueError, naming the variable, when it is not a whole number of at least 1."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of {of}, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value
