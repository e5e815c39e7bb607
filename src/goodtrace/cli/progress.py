"""A progress bar for long CLI work: rich on a terminal's stderr, nothing otherwise."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["progress_bar"]


def progress_bar() -> tuple[Any, Any]:
    """A rich progress bar on stderr when it is a terminal; (callback, stop) otherwise no-ops."""
    if not sys.stderr.isatty() and os.environ.get("GOODTRACE_PROGRESS") != "1":
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task("loading", total=1)
    bar.start()

    def update(what: str, done: int, total: int) -> None:
        bar.update(task, description=what, completed=done, total=max(total, 1))

    return update, bar.stop
