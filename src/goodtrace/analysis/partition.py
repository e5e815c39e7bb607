"""The partition of time (docs/semantics.md): one rank's sessions strung across a job's attempts.

:func:`assemble` places each session's cut (:mod:`goodtrace.analysis.cut`) on the wall
clock in start order: ``scheduling`` before the first process start (when the submit time is
known), ``disruption`` between an attempt's end and the next one's process start, each
attempt's first interval's productive time above the ideal step time as ``warmup`` (inferred,
only when beyond noise; compile spans are ``compile`` already), and the productive time of
executions that a later attempt ran again, or a later rewind in their own session threw away
(:mod:`goodtrace.analysis.rewinds`), as ``wasted_progress``. The result tiles the job's
time exactly, in integer nanoseconds, so buckets always add up to 100% and clip to any range of time.

With ``pieces=False`` the same walk adds up bucket totals only (what every rank's spread
needs), cutting pieces just for the rare interval that crosses the next attempt's start.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, overload

from goodtrace import schema
from goodtrace.analysis.cut import FLAG_REWOUND, Piece, Relabels, SessionCut, label_totals, relabel
from goodtrace.analysis.pieces import PieceBuilder, PieceColumns, ordered_sums
from goodtrace.columns import median
from goodtrace.read.loaded import SessionInfo

__all__ = [
    "DISRUPTION",
    "IN_PROGRESS",
    "PRODUCTIVE",
    "TEARDOWN",
    "WARMUP",
    "WASTED",
    "IntervalList",
    "StepInterval",
    "Timeline",
    "assemble",
    "ideal_step_ns",
    "interval_pieces",
    "noise_threshold_ns",
    "plain_intervals",
]

PRODUCTIVE = schema.BUCKET_PRODUCTIVE
TEARDOWN = schema.BUCKET_TEARDOWN
DISRUPTION = schema.BUCKET_DISRUPTION
WASTED = schema.BUCKET_WASTED_PROGRESS
SCHEDULING = schema.BUCKET_SCHEDULING
WARMUP = schema.BUCKET_WARMUP
IN_PROGRESS = "in_progress"  # a running attempt's time after its last sync point (live runs)


@dataclasses.dataclass
class StepInterval:
    """One step interval of the timeline, on the wall clock, with its pieces after the
    attempt-level relabels (warm-up, wasted progress)."""

    cut: SessionCut
    index: int  # interval index in the cut
    attempt: int
    start: int
    end: int
    pieces: list[Piece]
    lost: frozenset[int]  # executions (indexes in the cut) whose work a later attempt redid
    first_of_attempt: bool
    warmup_ns: int

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def executions(self) -> range:
        return self.cut.executions_of(self.index)

    def total(self, label: str) -> int:
        return sum(p.length for p in self.pieces if p.label == label)

    def overhead(self) -> dict[str, int]:
        return label_totals(self.pieces, skip=PRODUCTIVE)

    @property
    def counted_steps(self) -> int:
        return len(self.executions) - len(self.lost)


@dataclasses.dataclass(frozen=True)
class PlacedCut:
    """The intervals of one session on a timeline: where they sit on the wall clock (``delta``),
    its attempt, and the attempt-level relabels (warm-up, the restore point after it)."""

    first: int  # index of its first interval in the timeline
    cut: SessionCut
    attempt: int
    delta: int
    relabels: Relabels


class IntervalList(Sequence[StepInterval]):
    """The step intervals of a timeline in order, made on demand: a long run has millions of
    them, so each :class:`StepInterval` (with its pieces) is built when it is read, from its cut."""

    def __init__(self) -> None:
        self.placed: list[PlacedCut] = []
        self._firsts: list[int] = []
        self._count = 0

    def add(self, cut: SessionCut, attempt: int, delta: int, relabels: Relabels) -> None:
        if cut.intervals:
            self.placed.append(PlacedCut(self._count, cut, attempt, delta, relabels))
            self._firsts.append(self._count)
            self._count += cut.intervals

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> StepInterval: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepInterval]: ...

    def __getitem__(self, index: int | slice) -> StepInterval | list[StepInterval]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        placed = self.placed[bisect.bisect_right(self._firsts, index) - 1]
        return placed_interval(placed, index - placed.first)

    def __iter__(self) -> Iterator[StepInterval]:
        for placed in self.placed:
            for w in range(placed.cut.intervals):
                yield placed_interval(placed, w)

    def counted_steps(self) -> int:
        """Executions in the intervals that count toward the final progress (not re-done later)."""
        import numpy as np

        counted = 0
        for placed in self.placed:
            cut, limit = placed.cut, placed.relabels.redone_from
            interval = np.frombuffer(cut.exec_interval, dtype=np.int64)
            kept = (interval >= 0) & ((np.frombuffer(cut.exec_flags, dtype=np.int64) & FLAG_REWOUND) == 0)
            if limit is not None:  # the same rule as _lost: re-done by a later attempt or rewound
                kept &= np.frombuffer(cut.exec_step, dtype=np.int64) < limit
            counted += int(kept.sum())
        return counted

    def any_warmup(self) -> bool:
        return any(placed.relabels.warmup_ns for placed in self.placed)


def placed_interval(placed: PlacedCut, w: int) -> StepInterval:
    """StepInterval ``w`` of a placed cut, on the wall clock, with its pieces."""
    cut, delta = placed.cut, placed.delta
    own, lost = interval_pieces(cut, w, placed.relabels)
    wall = [Piece(p.start + delta, p.end + delta, p.label) for p in own]
    warm = placed.relabels.warmup_ns if w == 0 else 0
    return StepInterval(cut, w, placed.attempt, cut.interval_start[w] + delta, cut.interval_end[w] + delta, wall, lost, w == 0, warm)


@dataclasses.dataclass
class Timeline:
    """One rank's job timeline: pieces tiling [start, end) on the wall clock, as columns (empty
    in totals mode, where ``buckets``/``parts`` hold the sums)."""

    start: int
    end: int
    columns: PieceColumns | None
    intervals: IntervalList
    cuts: list[SessionCut]
    buckets: dict[str, int] = dataclasses.field(default_factory=dict)
    parts: dict[str, int] = dataclasses.field(default_factory=dict)
    # per session: (warm-up ns moved out of its first interval, the restore point after it)
    relabels: dict[int, Relabels] = dataclasses.field(default_factory=dict)

    @property
    def pieces(self) -> list[Piece]:
        """The pieces as objects, made when asked for (the HTML report's legend, tests): the
        analysis reads the columns."""
        c = self.columns
        if c is None:
            return []
        return [Piece(s, e, c.labels[label], c.parts[part]) for s, e, label, part in
                zip(c.start.tolist(), c.end.tolist(), c.label.tolist(), c.part.tolist(), strict=True)]

    def totals(self, a: int | None = None, b: int | None = None) -> tuple[dict[str, int], dict[str, int]]:
        """Bucket totals (ns) and startup parts, optionally clipped to [a, b)."""
        import numpy as np

        c = self.columns
        if c is None or not len(c):
            return dict(self.buckets), dict(self.parts)
        lo = self.start if a is None else max(a, self.start)
        hi = self.end if b is None else min(b, self.end)
        if hi <= lo:
            return {}, {}
        i = max(0, int(np.searchsorted(c.start, lo, side="right")) - 1)
        j = max(i, int(np.searchsorted(c.start, hi, side="left")))
        lengths = np.minimum(c.end[i:j], hi) - np.maximum(c.start[i:j], lo)
        keep = lengths > 0
        lengths, labels, parts = lengths[keep], c.label[i:j][keep], c.part[i:j][keep]
        return ordered_sums(labels, lengths, c.labels, False), ordered_sums(parts, lengths, c.parts, True)


def weighted_median(values: Sequence[tuple[float, int]]) -> float | None:
    """Median of values with integer weights (a shared interval counts once per step)."""
    items = sorted((v, w) for v, w in values if w > 0)
    total = sum(w for _, w in items)
    if total == 0:
        return None
    lower_index, upper_index = (total - 1) // 2, total // 2
    seen = 0
    lower = upper = None
    for v, w in items:
        if lower is None and seen + w > lower_index:
            lower = v
        if seen + w > upper_index:
            upper = v
            break
        seen += w
    assert lower is not None and upper is not None
    return (lower + upper) / 2


@dataclasses.dataclass(frozen=True)
class Steady:
    """The steady-state intervals of some sessions (each session's first excluded, and those
    overhead fills entirely): their productive time per step and their number of steps."""

    per_step: Any  # numpy float64 array
    steps: Any  # numpy int64 array


def steady_steps(cuts: Sequence[SessionCut]) -> Steady:
    import numpy as np

    values, weights = [], []
    for cut in cuts:
        if cut.intervals > 1:
            productive = np.frombuffer(cut.interval_productive, dtype=np.int64)[1:]
            count = np.frombuffer(cut.interval_count, dtype=np.int64)[1:]
            keep = productive > 0
            values.append(productive[keep] / count[keep])
            weights.append(count[keep])
    if not values:
        return Steady(np.zeros(0), np.zeros(0, dtype=np.int64))
    return Steady(np.concatenate(values), np.concatenate(weights))


def ideal_step_ns(cuts: Sequence[SessionCut], steady: Steady | None = None) -> float | None:
    """Median productive time per step over steady-state intervals (each attempt's first
    excluded, and intervals that overhead fills entirely), weighted by steps; the first ones
    when nothing else."""
    import numpy as np

    steady = steady_steps(cuts) if steady is None else steady
    if not len(steady.per_step):
        return weighted_median([(cut.interval_productive[0] / cut.interval_count[0], cut.interval_count[0])
                                for cut in cuts if cut.intervals])
    return median(np.repeat(steady.per_step, steady.steps))


def noise_threshold_ns(cuts: Sequence[SessionCut], steady: Steady | None = None) -> float:
    """How far above the ideal a step must be to be more than noise: max(5 x 1.4826 x MAD,
    5% of the median) of the steady productive step times (the anomaly rule)."""
    import numpy as np

    values = (steady_steps(cuts) if steady is None else steady).per_step
    if len(values) < 3:
        return 0.05 * (median(values) if len(values) else 0.0)
    middle = median(values)
    mad = median(np.abs(values - middle))
    return max(5 * 1.4826 * mad, 0.05 * middle)


def _warmup(cut: SessionCut, ideal: float | None, noise: float) -> int:
    """The first interval's productive time above the ideal, when beyond noise (else 0)."""
    if ideal is None or not cut.intervals:
        return 0
    excess = cut.interval_productive[0] - round(ideal * cut.interval_count[0])
    return excess if excess > noise * cut.interval_count[0] and excess > 0 else 0


_NONE: frozenset[int] = frozenset()


def _lost(cut: SessionCut, w: int, limit: int | None) -> frozenset[int]:
    """The executions of interval ``w`` thrown away: a later attempt started at or below their
    step number (``limit``), or a later rewind in the same session threw them away."""
    if limit is None and not cut.rewinds:
        return _NONE
    executions = cut.executions_of(w)
    steps, flags = cut.exec_step, cut.exec_flags
    if len(executions) == 1:
        first = executions[0]
        return frozenset((first,)) if _thrown(steps[first], flags[first], limit) else _NONE
    return frozenset(i for i in executions if _thrown(steps[i], flags[i], limit))


def _thrown(step: int, flags: int, limit: int | None) -> bool:
    return bool(flags & FLAG_REWOUND) or (limit is not None and step >= limit)


def assemble(
    cuts: Sequence[tuple[int, SessionInfo, SessionCut]],
    *,
    ideal: float | None,
    noise: float = 0.0,
    submit_wall: int | None = None,
    pieces: bool = True,
) -> Timeline:
    """String one rank's session cuts (attempt, info, cut), in attempt order, on the wall clock
    (see the module docstring). Overlaps (a process still alive when the next one started) are
    cut off at the next one's start."""
    import numpy as np

    ordered = sorted(cuts, key=lambda c: (c[1].start_wall, c[0]))
    out = PieceBuilder() if pieces else None
    intervals = IntervalList()
    buckets: dict[str, int] = {}
    parts: dict[str, int] = {}

    def emit(p: Piece, lo: int, hi: int | None) -> int:
        """Add ``p`` clipped to [lo, hi); returns the new cursor."""
        s, e = max(p.start, lo), p.end if hi is None else min(p.end, hi)
        if e <= s:
            return lo
        if out is not None:
            out.add(s, e, p.label, p.part)
        buckets[p.label] = buckets.get(p.label, 0) + e - s
        if p.part:
            parts[p.part] = parts.get(p.part, 0) + e - s
        return e

    # the restore point after each attempt: the lowest step any later attempt starts at
    restore_after: list[int | None] = [None] * len(ordered)
    lowest: int | None = None
    for k in range(len(ordered) - 1, -1, -1):
        restore_after[k] = lowest
        cut = ordered[k][2]
        done = np.frombuffer(cut.exec_step, dtype=np.int64)[np.frombuffer(cut.exec_interval, dtype=np.int64) >= 0]
        # a rollback the program named restored its step: every step above it ran again
        starts = [int(done.min())] if len(done) else []
        starts += [r.to_step + 1 for r in cut.rewinds if r.explicit]
        if starts:
            lowest = min(starts) if lowest is None else min(lowest, *starts)
    job_start = ordered[0][1].start_wall if ordered else 0
    start = job_start
    if submit_wall is not None and ordered and submit_wall < job_start:
        emit(Piece(submit_wall, job_start, SCHEDULING), submit_wall, None)
        start = submit_wall
    cursor = job_start
    relabels: dict[int, Relabels] = {}
    for k, (attempt, info, cut) in enumerate(ordered):
        delta = info.wall_anchor - info.mono_anchor
        limit = None if k + 1 == len(ordered) else ordered[k + 1][1].start_wall
        session_start = info.start_wall
        if session_start > cursor:
            cursor = emit(Piece(cursor, session_start, DISRUPTION), cursor, None)
        for p in cut.startup_pieces():
            cursor = emit(Piece(p.start + delta, p.end + delta, p.label, p.part), cursor, limit)
        warmup = _warmup(cut, ideal, noise)
        relabels[cut.session] = Relabels(warmup, restore_after[k])
        if pieces:
            intervals.add(cut, attempt, delta, relabels[cut.session])
        if (not pieces and cut.intervals and (limit is None or cut.interval_end[-1] + delta <= limit)
                and cut.interval_start[0] + delta >= cursor):
            cursor = _add_interval_totals(cut, warmup, restore_after[k], buckets) + delta
            for p in cut.tail_pieces():
                cursor = emit(Piece(p.start + delta, p.end + delta, p.label), cursor, limit)
            continue
        plain_until = _plain_runs(cut, warmup, restore_after[k]) if pieces else None
        w = -1
        while w + 1 < cut.intervals:
            w += 1
            if plain_until is not None and plain_until[w] > w:
                # a run of intervals that nothing relabels: their pieces, merged as emit merges
                # them, are the carve of the whole run (one walk over its overhead, not one per interval)
                last = int(plain_until[w]) - 1
                a, b = cut.interval_start[w] + delta, cut.interval_end[last] + delta
                if a >= cursor and (limit is None or b <= limit) and out is not None:
                    # inside [cursor, limit): nothing to clip; emitted as one run of columns
                    run_s, run_e, run_labels, run_names = cut.carve_columns(cut.interval_start[w],
                                                                             cut.interval_end[last])
                    if len(run_s):
                        run_s, run_e = run_s + delta, run_e + delta
                        codes = out.add_run(run_s, run_e, run_labels, run_names)
                        for label, ns in ordered_sums(codes, run_e - run_s, list(out.codes), False).items():
                            buckets[label] = buckets.get(label, 0) + ns
                        cursor = int(run_e[-1])
                    w = last
                    continue
            a, b = cut.interval_start[w] + delta, cut.interval_end[w] + delta
            lost = _lost(cut, w, restore_after[k])
            amount_warm = warmup if w == 0 else 0
            if not pieces and (limit is None or b <= limit) and a >= cursor:
                # totals only: the whole interval, without cutting pieces
                productive = cut.interval_productive[w] - amount_warm
                wasted = _wasted(productive, len(lost), cut.interval_count[w])
                for label, column in cut.interval_overhead.items():
                    if column[w]:
                        buckets[label] = buckets.get(label, 0) + column[w]
                for label, ns in ((PRODUCTIVE, productive - wasted), (WARMUP, amount_warm), (WASTED, wasted)):
                    if ns:
                        buckets[label] = buckets.get(label, 0) + ns
                cursor = b
                continue
            own, _ = interval_pieces(cut, w, relabels[cut.session])
            for p in own:
                cursor = emit(Piece(p.start + delta, p.end + delta, p.label), cursor, limit)
        for p in cut.tail_pieces():
            cursor = emit(Piece(p.start + delta, p.end + delta, p.label), cursor, limit)
    return Timeline(start, cursor, out.columns() if out is not None else None, intervals, [c for _, _, c in ordered],
                    buckets, parts, relabels)


def _plain_runs(cut: SessionCut, warmup: int, limit: int | None) -> Any:
    """For each interval, where the run of *plain* intervals (:func:`plain_intervals`) it
    begins ends (the index after it; the interval itself when it is not plain)."""
    import numpy as np

    n = cut.intervals
    plain = plain_intervals(cut, warmup, limit)
    # the end of each run: the next index that is not plain
    index = np.arange(n)
    stops = np.where(plain, n, index)
    ends = np.minimum.accumulate(stops[::-1])[::-1]
    return np.where(plain, ends, index)


def plain_intervals(cut: SessionCut, warmup: int, limit: int | None) -> Any:
    """Whether each interval of ``cut`` is *plain* (a bool column): its pieces are its carve
    alone (:meth:`SessionCut.interval_pieces` and :func:`interval_pieces` relabel nothing in
    it: no warm-up, no execution thrown away, no data moved, no recovery)."""
    import numpy as np

    n = cut.intervals
    plain = np.ones(n, dtype=bool)
    if warmup and n:
        plain[0] = False
    for w in (*cut.data_moved, *cut.recovered):
        plain[w] = False
    if limit is not None or cut.rewinds:
        interval = np.frombuffer(cut.exec_interval, dtype=np.int64)
        thrown = (np.frombuffer(cut.exec_flags, dtype=np.int64) & FLAG_REWOUND) != 0
        if limit is not None:
            thrown |= np.frombuffer(cut.exec_step, dtype=np.int64) >= limit
        plain[interval[(interval >= 0) & thrown]] = False
    return plain


def interval_pieces(cut: SessionCut, w: int, relabels: Relabels) -> tuple[list[Piece], frozenset[int]]:
    """StepInterval ``w`` of ``cut`` with the attempt-level relabels :func:`assemble` applied (on the
    session's own clock), and the executions in it that a later attempt redid."""
    warmup, limit = relabels
    pieces = cut.interval_pieces(w)
    if warmup and w == 0:
        pieces = relabel(pieces, warmup, WARMUP, from_end=False)
    lost = _lost(cut, w, limit)
    if lost:
        productive = sum(p.length for p in pieces if p.label == PRODUCTIVE)
        pieces = relabel(pieces, _wasted(productive, len(lost), cut.interval_count[w]), WASTED, from_end=True)
    return pieces, lost


def _add_interval_totals(cut: SessionCut, warmup: int, limit: int | None, buckets: dict[str, int]) -> int:
    """Every interval of ``cut`` into ``buckets`` at once (totals mode, no interval clipped): the
    same warm-up and wasted-progress rules as the piece-by-piece walk. Returns the last end."""
    import numpy as np

    productive = np.frombuffer(cut.interval_productive, dtype=np.int64).copy()
    productive[0] -= warmup
    wasted = np.zeros_like(productive)
    if limit is not None or cut.rewinds:
        count = np.frombuffer(cut.interval_count, dtype=np.int64)
        first = np.frombuffer(cut.interval_first, dtype=np.int64)
        interval = np.frombuffer(cut.exec_interval, dtype=np.int64)
        steps = np.frombuffer(cut.exec_step, dtype=np.int64)
        thrown = (np.frombuffer(cut.exec_flags, dtype=np.int64) & FLAG_REWOUND) != 0
        if limit is not None:
            thrown |= steps >= limit
        in_interval = interval >= 0
        lost = np.bincount(interval[in_interval], weights=thrown[in_interval], minlength=len(count)).astype(np.int64)
        lost = np.where(first >= 0, lost, 0)
        wasted = np.where(lost == count, productive, productive * lost // np.maximum(count, 1))
    for label, column in cut.interval_overhead.items():
        total = int(np.frombuffer(column, dtype=np.int64).sum())
        if total:
            buckets[label] = buckets.get(label, 0) + total
    for label, ns in ((PRODUCTIVE, int(productive.sum() - wasted.sum())), (WARMUP, warmup), (WASTED, int(wasted.sum()))):
        if ns:
            buckets[label] = buckets.get(label, 0) + ns
    return int(cut.interval_end[-1])


def _wasted(productive: int, lost: int, count: int) -> int:
    """The productive time of ``lost`` of the ``count`` executions sharing an interval."""
    if lost == 0:
        return 0
    return productive if lost == count else productive * lost // count
