"""The reader's settings from the environment, read in one place: where its caches live
(``GOODTRACE_CACHE_DIR``, and the folder of each run in it: :func:`keyed_dir`,
:func:`run_cache_dir`), and counts such as ``GOODTRACE_WORKERS`` and
``GOODTRACE_MIRROR_THREADS`` (a whole number, at least 1, or a clear error).

A reader writes only here, never into the run directory it reads (``goodtrace compact``, asked
to, is the one command that writes beside a run)."""

from __future__ import annotations

import hashlib
import os

MIRROR_SOURCE = "SOURCE"  # in a mirror (read.mirror): the URL it was fetched from


def cache_root() -> str:
    """``$GOODTRACE_CACHE_DIR``, by default ``$XDG_CACHE_HOME/goodtrace/runs`` (that is,
    ``~/.cache/goodtrace/runs``): everything a reader keeps (the mirrors of remote runs, each
    run's segment cache, the rings it recovered, torchtitan's converted logs)."""
    return os.environ.get("GOODTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "goodtrace", "runs")


def keyed_dir(key: str, under: str = "", cache_dir: str | None = None) -> str:
    """The cache's folder for ``key`` (a run's :func:`run_key`, a URL): ``<cache root>[/<under>]/<hash
    of the key>``; ``cache_dir`` in place of :func:`cache_root`."""
    return os.path.join(cache_dir or cache_root(), under, hashlib.sha256(key.encode()).hexdigest()[:16])


def run_key(root: str) -> str:
    """The stable key of the run at ``root``: the URL a mirror in the cache was fetched from (a
    mirror is the reader's own copy: its URL names the run), else the run's real path."""
    real = os.path.realpath(root)
    if os.path.dirname(os.path.dirname(real)) == os.path.realpath(cache_root()):
        try:
            with open(os.path.join(real, MIRROR_SOURCE), encoding="utf-8") as handle:
                url = handle.read().strip()
        except OSError:
            url = ""
        if url:
            return url
    return real


def run_cache_dir(root: str, part: str) -> str:
    """Where a reader keeps ``part`` (``segments``: the segment cache, ``rings``: what it read of
    the rings killed processes left) of the run at ``root``: ``<cache root>/<part>/<hash of the
    run's key>``."""
    return keyed_dir(run_key(root), part)


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
