"""A rank that became slower than it was: a change point in its own compute (or step) time
per execution, with the onset step and the size (docs/semantics.md section 7.1).

Per session (one process of one rank), over its steady-state executions in order (compute
time where it has compute spans, else the step time), the rule of
:mod:`goodtrace.record.live.change_point` (shared with the live line and ``goodtrace watch``):
a sustained, large upward shift at a change point, larger by 10% than the other ranks' median
change at the same step.

Pure functions over the run model's cuts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from goodtrace.analysis.cut import SessionCut
from goodtrace.analysis.spill import SpillFile
from goodtrace.read.loaded import SessionInfo
from goodtrace.record.live.change_point import (
    MIN_SIDE,
    OwnSlowdown,
    change_at,
    its_own,
    own_slowdown,
    slower_since,
)

__all__ = ["Series", "SeriesStore", "Slowdown", "slowdown_of", "slowdown_series", "slowdowns_of"]

Series = tuple[str, Any, Any]  # (measure, steps, seconds per execution): numpy arrays (steps: or a range)

NS = 1e9


@dataclasses.dataclass(frozen=True)
class Slowdown:
    rank: int
    host: str
    attempt: int
    measure: str  # "compute" (the rank's compute spans per execution) or "step" (step time)
    onset_step: int  # the first step at the higher level
    before_s: float  # median per execution before the onset
    after_s: float  # ... from the onset on
    increase: float  # after / before - 1
    others_increase: float | None  # the other ranks' median change at the same step

    @property
    def reason(self) -> str:
        return (f"{slower_since(self.measure, self.increase, self.onset_step)} "
                f"({self.before_s * 1e3:.1f} -> {self.after_s * 1e3:.1f} ms per step)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"reason": self.reason}


def _series(cut: SessionCut) -> Series | None:
    """(measure, steps, seconds) per steady-state execution in entry order: compute time where
    the session has compute spans, else the step time (:meth:`SessionCut.step_ns`)."""
    import numpy as np

    steps = np.frombuffer(cut.exec_step, dtype=np.int64)
    interval = np.frombuffer(cut.exec_interval, dtype=np.int64)
    if len(steps) < 2 * MIN_SIDE + 1:
        return None
    compute = np.frombuffer(cut.exec_compute, dtype=np.int64) if len(cut.exec_compute) == len(steps) else None
    keep = np.arange(len(steps)) > 0  # the first execution (compile, warm-up) is not steady state
    if compute is not None and (compute[keep] > 0).mean() > 0.9:
        keep &= compute > 0
        return "compute", steps[keep], compute[keep] / NS
    keep &= interval >= 0
    return "step", steps[keep], cut.step_ns()[interval[keep]] / NS


def slowdown_of(steps: Any, seconds: Any) -> tuple[int, float, float] | None:
    """One process's own slowdown in a series of times per execution (sequences or numpy
    arrays, in order): (onset step, median before, median after), or None. Without the
    comparison with other ranks (see :func:`slowdowns_of`)."""
    return own_slowdown(steps, seconds)


def slowdown_series(cut: SessionCut) -> Series | None:
    """What the slowdown rule keeps of a session once cut: its measure and its steady-state
    executions' steps and times (8 bytes an execution: consecutive steps, as most are, kept as
    a range), or None (too few)."""
    import numpy as np

    found = _series(cut)
    if found is None:
        return None
    measure, steps, seconds = found
    if len(steps) and int(steps[-1]) - int(steps[0]) == len(steps) - 1 and bool((np.diff(steps) == 1).all()):
        return measure, range(int(steps[0]), int(steps[-1]) + 1), seconds
    return found


class SeriesStore(Mapping[int, Series]):
    """Each session's slowdown series (:func:`slowdown_series`), kept in a temporary file as they
    are added, not in memory: 8 bytes a steady-state execution of every session would grow with
    steps x ranks (48 GB for a week of 10,000 ranks). A series is read back when asked for, one
    at a time (:func:`slowdowns_of` reads each twice at most). Where the file cannot be written
    (a full disk), a series stays in memory: the numbers are the same."""

    def __init__(self) -> None:
        self._file = SpillFile("goodtrace-series-")
        self._where: dict[int, tuple[int, int]] = {}  # per session, where its series is in the file
        self._held: dict[int, Series] = {}  # the series that could not be written

    def add(self, index: int, series: Series) -> None:
        try:
            self._where[index] = self._file.put(series)
        except OSError:
            self._held[index] = series

    @property
    def spill_failure(self) -> str | None:
        """Why a series could not be written to the temporary file (then kept in memory); None."""
        return self._file.failure

    def __getitem__(self, index: int) -> Series:
        if index in self._held:
            return self._held[index]
        series: Series = self._file.get(self._where[index])
        return series

    def __iter__(self) -> Iterator[int]:
        yield from self._where
        yield from self._held

    def __len__(self) -> int:
        return len(self._where) + len(self._held)

    def close(self) -> None:
        self._file.close()


def slowdowns_of(
    sessions: Sequence[SessionInfo], series: Mapping[int, Series], attempt_of: Mapping[int, int],
) -> list[Slowdown]:
    """The sessions whose own time per execution rose by a sustained margin, with the onset,
    from their series (:func:`slowdown_series`; a
    :class:`SeriesStore` reads them back one at a time), their cuts released, in two passes
    over the series: each session's own slowdown, then every session's change at each onset
    found in its attempt (each distinct onset once), which a slowed rank's change is compared
    with (numpy arrays, compared as arrays: :mod:`goodtrace.record.live.change_point`)."""
    ordered = [info for info in sessions if info.index in series]
    own: list[tuple[SessionInfo, str, OwnSlowdown]] = []
    for info in ordered:
        measure, steps, x = series[info.index]
        found = own_slowdown(steps, x)
        del steps, x
        if found is not None:
            own.append((info, measure, found))
    onsets: dict[tuple[int, str], set[int]] = {}
    for info, measure, found in own:
        onsets.setdefault((attempt_of.get(info.index, 0), measure), set()).add(found.onset_step)
    changes: dict[tuple[int, str, int], dict[int, float]] = {}
    for info in ordered if onsets else ():
        attempt = attempt_of.get(info.index, 0)
        measure, steps, x = series[info.index]
        for onset in sorted(onsets.get((attempt, measure), ())):
            change = change_at(steps, x, onset)
            if change is not None:
                changes.setdefault((attempt, measure, onset), {})[info.index] = change
        del steps, x
    slowdowns = []
    for info, measure, found in own:
        attempt = attempt_of.get(info.index, 0)
        at_onset = changes.get((attempt, measure, found.onset_step), {})
        others = [c for i, c in at_onset.items() if i != info.index]  # the job's order of sessions
        increase = found.after / found.before - 1
        named, others_increase = its_own(increase, others)
        if not named:
            continue
        slowdowns.append(Slowdown(info.rank, info.host, attempt, measure, found.onset_step, found.before, found.after,
                                  increase, others_increase))
    return sorted(slowdowns, key=lambda s: (s.attempt, s.onset_step, s.rank))
