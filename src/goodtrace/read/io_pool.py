"""Per-file work of the reader on many files at once: a header read, a stat, a prefix check,
a range copy. On a network filesystem (NFS, Lustre, GPFS) each is one or more round trips
that the server answers many at a time, so a loop over thousands of rank files waits for each
in turn when it need not: :func:`io_map` runs such calls on a few threads (the GIL is released
while they wait), in order, and on local disk costs little more than the loop."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["IO_THREADS", "io_map", "stat_or_none"]

IO_THREADS = 16  # calls in flight (an NFS client sends them over one connection: the server's slots decide)
_MANY = 8  # fewer items: a plain loop

T = TypeVar("T")
R = TypeVar("R")


def io_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]``, on :data:`IO_THREADS` threads when there are many items. ``fn``
    returns its errors rather than raising them (the first one raised is re-raised here, the
    other calls having run)."""
    work = list(items)
    if len(work) < _MANY:
        return [fn(x) for x in work]
    with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(work)), thread_name_prefix="goodtrace-io") as pool:
        return list(pool.map(fn, work))


def stat_or_none(path: str) -> os.stat_result | None:
    """The file's stat, None when it is gone or cannot be reached (a per-file call for :func:`io_map`)."""
    try:
        return os.stat(path)
    except OSError:
        return None
