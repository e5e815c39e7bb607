"""Disabled recording: the recorder ``goodtrace`` uses before ``init`` and on ranks that do not
record. Every method does nothing; ``step`` returns one shared no-op object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from goodtrace import schema
from goodtrace.record.spans import NOOP_SPAN


class NoopRecorder:
    """Disabled recording: every method is a no-op; ``span`` returns one shared object."""

    enabled = False
    current_step: int | None = None
    observations = 0
    dropped_records = 0
    session = ""
    run_dir = ""
    finished = False

    def step(self, number: int) -> Any:
        return NOOP_SPAN

    def complete_on(self, value: object, step: int | None = None) -> None:
        return None

    def metric(self, name: str, value: object, reduce: str = "mean", step: int | None = None) -> None:
        return None

    def tag(self, name: str, step: int | None = None) -> None:
        return None

    def event(self, name: str, attrs: Mapping[str, Any] | None = None) -> None:
        return None

    def record_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_clock_offset(self, *args: Any, **kwargs: Any) -> None:
        return None

    def settle(self, how: str = schema.SYNC_BLOCKING) -> None:
        return None

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def finish(self, completed: bool | None = None, reason: str = "finish", exception: str | None = None) -> bool:
        return True

    def after_fork_in_child(self) -> None:
        return None


NOOP_RECORDER = NoopRecorder()
