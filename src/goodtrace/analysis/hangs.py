"""Hangs: the ranks whose training thread stopped making progress (the watchdog's ``hang``
events, goodtrace.record.hang), and which of them stopped first (docs/semantics.md section 12).

When one rank hangs, every other rank soon waits for it in a collective and its watchdog fires
too. The rank that stopped **first** is the one at the lowest step (the others kept going
until they reached the collective it never entered), not waiting in a collective itself (its
open span, its stack: their last progress can be the same instant), whose last progress came
earliest on the aligned clock (section 8). Pure functions over the loaded run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from goodtrace.analysis.clock import SessionClock
from goodtrace.read.loaded import HangEvent, SessionInfo
from goodtrace.record.hang_peers import in_collective, stop_order, summary_line, where_text

__all__ = ["Hang", "describe_hangs", "find_hangs"]

NS = 1e9


@dataclasses.dataclass(frozen=True)
class Hang:
    """One rank's hang: where its training thread was, and since when."""

    rank: int
    host: str
    attempt: int
    step: int | None
    span: str | None  # the last span it closed in that step (it is stuck after it)
    phase: str | None  # the blocking phase it was in (checkpoint_save, eval), if any
    location: str | None  # file:line of the program's innermost frame
    function: str | None
    since_s: float  # its last progress, on the aligned clock, from the job's start
    silent_s: float | None  # how long it had been silent when the watchdog recorded it
    bound_s: float | None  # the bound it had learned
    detected_s: float  # when the watchdog recorded it, from the job's start
    stack: str  # the training thread's Python stack
    native: str | None  # py-spy's native frames, where installed
    action: str | None  # "record" or "abort"
    first: bool = False  # the first rank of its attempt that stopped
    resumed_after_s: float | None = None  # it moved again after this long: a stall, not a hang
    in_span: str | None = None  # the span it is in (open), as the watchdog read it from its stack
    waiting: bool = False  # it waits in a collective (its open span, its stack): not the rank that stopped

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def where(self) -> str:
        return where_text(self.function, self.location, self.span, self.phase, self.in_span)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def find_hangs(
    sessions: Sequence[SessionInfo],
    events: Mapping[int, Sequence[HangEvent]],
    attempt_of: Mapping[int, int],
    clocks: Mapping[int, SessionClock],
    job_start_wall: int,
) -> list[Hang]:
    """Every recorded hang of the given sessions, ordered by attempt, then by when the rank
    stopped (:func:`~goodtrace.record.hang_peers.stop_order`: a rank waiting in a collective
    after one that is not, at the same step); the first rank of each attempt that stopped (and
    did not resume) is ``first``."""
    found: list[tuple[int, tuple[int, bool, int, int], Hang]] = []  # (attempt, stop order, hang)
    for info in sessions:
        if info.index not in events or info.index not in attempt_of:
            continue
        clock = clocks.get(info.index)

        def wall(t: int, clock: SessionClock | None = clock, info: SessionInfo = info) -> int:
            return clock.wall_ns(t) if clock is not None else info.wall(t)

        pending: list[Hang] = []
        for name, t, step, attrs in events[info.index]:
            if name == "hang_over":
                if pending and pending[-1].resumed_after_s is None:
                    pending[-1] = dataclasses.replace(pending[-1], resumed_after_s=_number(attrs.get("silent_s")))
                continue
            since = attrs.get("since")
            since_ns = since if isinstance(since, int) and not isinstance(since, bool) else t
            step_at = attrs.get("step", step)
            pending.append(Hang(
                rank=info.rank, host=info.host, attempt=attempt_of[info.index],
                step=step_at if isinstance(step_at, int) and not isinstance(step_at, bool) else None,
                span=_text(attrs.get("span")), phase=_text(attrs.get("phase")),
                location=_text(attrs.get("location")), function=_text(attrs.get("function")),
                since_s=(wall(since_ns) - job_start_wall) / NS, silent_s=_number(attrs.get("silent_s")),
                bound_s=_number(attrs.get("bound_s")), detected_s=(wall(t) - job_start_wall) / NS,
                stack=_text(attrs.get("stack")) or "", native=_text(attrs.get("native")),
                action=_text(attrs.get("action")), in_span=_text(attrs.get("in_span")),
                waiting=in_collective(attrs.get("in_span"), attrs.get("stack")),
            ))
        found.extend((h.attempt, stop_order(h.step, round(h.since_s * NS), h.rank, h.waiting), h) for h in pending)
    found.sort(key=lambda item: (item[0], item[1]))
    hangs: list[Hang] = []
    named: set[int] = set()
    for attempt, _, hang in found:
        if hang.resumed_after_s is None and attempt not in named:
            named.add(attempt)
            hang = dataclasses.replace(hang, first=True)
        hangs.append(hang)
    return hangs


def describe_hangs(hangs: Sequence[Hang]) -> list[str]:
    """One line per attempt with a hang: the first rank that stopped, where, and where the
    others wait (the words of rank 0's line while it happens: record.hang_peers)."""
    lines = []
    for first in (h for h in hangs if h.first):
        waiting = [(h.step, where_text(h.function, h.location, in_span=h.in_span)) for h in hangs
                   if h.attempt == first.attempt and h is not first and h.resumed_after_s is None]
        lines.append(summary_line(first.rank, first.host, first.where, first.step, f"{first.since_s:.1f} s", waiting))
    return lines
