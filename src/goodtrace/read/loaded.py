"""What the analytical reader returns: plain dataclasses, no I/O.

A :class:`LoadedRun` holds one :class:`SessionInfo` per session (one process of one rank),
per-session figures computed in SQL for every rank (:class:`RankSummary`), and the full
:class:`SessionTimeline` of the sessions the analysis needs record by record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from goodtrace import schema

__all__ = ["LoadError", "LoadedRun", "Progress", "RankSummary", "SessionInfo", "SessionTimeline"]

Progress = Callable[[str, int, int], None]  # (what, done, total)


class LoadError(RuntimeError):
    """The records exist but cannot be read (the message says which and why)."""


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """One process of one rank (all its segments), summarised. Times are that process's
    monotonic ns; ``wall()`` converts them with the header's (wall, mono) anchor."""

    index: int
    session: str
    rank: int
    world: int
    host: str
    pid: int
    restart: int | None
    proc_start: int
    init: int
    submit_wall: int | None
    wall_anchor: int
    mono_anchor: int
    last_seen: int
    finish_completed: bool | None = None
    finish_t: int | None = None
    finish_reason: str | None = None
    has_finish: bool = False
    main_tid: int | None = None
    overhead_categories: frozenset[str] = frozenset()
    lag: int = 1
    dropped: int = 0
    schema_version: int = schema.SCHEMA_VERSION
    first_step: int | None = None
    last_step: int | None = None
    step_count: int = 0
    sync_count: int = 0
    preempt_events: int = 0

    def wall(self, mono: int) -> int:
        """This session's monotonic ns -> wall-clock ns (the header anchor)."""
        return self.wall_anchor + (mono - self.mono_anchor)

    @property
    def start_wall(self) -> int:
        return self.wall(self.proc_start)

    @property
    def last_seen_wall(self) -> int:
        return self.wall(self.last_seen)


@dataclasses.dataclass
class SessionTimeline:
    """Every record of one session, as tuples sorted by time (loaded for detail ranks only)."""

    steps: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # step, t0, t1
    syncs: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)  # step, t, how
    # name, category, t0, t1, step (or None), thread id (or None), error
    spans: list[tuple[str, str, int, int, int | None, int | None, bool]] = dataclasses.field(
        default_factory=list
    )
    tags: list[tuple[int | None, str, int]] = dataclasses.field(default_factory=list)  # step, name, t
    events: list[tuple[str, int, int | None]] = dataclasses.field(default_factory=list)  # name, t, step
    # name, step, value, reduce
    metrics: list[tuple[str, int | None, float | None, str]] = dataclasses.field(default_factory=list)
    clock_offset: int = 0  # latest measured offset of this rank's clock to rank 0 (ns)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # attrs of the last "model" event


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """Per-session figures computed in SQL for every rank (bounded memory at any scale)."""

    index: int  # session index
    step_time_median_ns: float | None
    step_time_p90_ns: float | None
    compute_median_ns: float | None
    lateness_median_ns: float | None  # arrival at sync points vs the earliest rank, same attempt
    late_fraction: float | None  # share of sync points where this rank was the last to arrive
    records: int


@dataclasses.dataclass
class LoadedRun:
    """What the analysis reads: sessions of every rank, timelines of the detail ranks."""

    path: str
    sessions: list[SessionInfo]
    timelines: dict[int, SessionTimeline]
    rank_summaries: dict[int, RankSummary] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    form: str = "jsonl"  # "jsonl", "parquet" or "parquet+jsonl"
    records: int = 0
