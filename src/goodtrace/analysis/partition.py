"""The partition of time (DESIGN.md section 4): one rank's timeline cut into labelled pieces.

``session_windows`` cuts one session (one process) into startup, step intervals
(T_{k-1}, T_k] and a tail, each carved into pieces labelled by the outermost overhead span
on the main thread (or ``productive``). ``assemble`` strings the sessions of one rank across
the attempts of a job on the wall clock (scheduling, disruption between attempts), moves the
first interval's excess over the ideal step time to ``compile`` and the productive time of
executions that a restart threw away to ``wasted_progress``. The result tiles the job's time
exactly, in integer nanoseconds, so buckets always add up to 100% and clip to any window.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence

from goodtrace import schema
from goodtrace.read.loaded import SessionInfo, SessionTimeline

PRODUCTIVE = schema.BUCKET_PRODUCTIVE
STARTUP = schema.BUCKET_STARTUP
TEARDOWN = schema.BUCKET_TEARDOWN
DISRUPTION = schema.BUCKET_DISRUPTION
WASTED = schema.BUCKET_WASTED_PROGRESS
SCHEDULING = schema.BUCKET_SCHEDULING
COMPILE = schema.COMPILE
DATA = schema.DATA
STARTUP_OTHER = "other"
IN_PROGRESS = "in_progress"  # a running attempt's time after its last sync point (live runs)

RULE_ASYNC = "asynchronous"
RULE_SYNC = "synchronous"
RULE_UNKNOWN = "unknown"
RULE_ASYNC_DEVICE = "asynchronous+device"
DEVICE_IDLE_METRIC = schema.DEVICE_IDLE_METRIC

DATA_RULE_TEXT = {
    RULE_ASYNC: "asynchronous loop (lagged sync points): in-step data loading overlapped queued "
    "device work, so it counts as productive",
    RULE_SYNC: "synchronous loop (host-value / ready sync points): the device waited for in-step "
    "data loading, so it counts as data badput",
    RULE_ASYNC_DEVICE: "asynchronous loop with device timing: in-step data loading counts as data badput "
    "only for the device-idle gap before its step (the device waited), the rest as productive",
    RULE_UNKNOWN: "no sync points recorded: in-step data loading is counted as data badput "
    "(synchronous assumption)",
}


@dataclasses.dataclass
class Piece:
    """A half-open wall/mono interval [start, end) with its bucket (and startup part)."""

    start: int
    end: int
    label: str
    part: str = ""

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclasses.dataclass
class Window:
    """One step interval: the steps that share it (one, unless completion was sparse)."""

    start: int
    end: int
    steps: list[int]
    pieces: list[Piece]
    first_of_attempt: bool = False
    host_timed: bool = False  # end is a step's host exit, not an observed sync point
    session: int = -1
    attempt: int = -1
    counted_steps: int = 0  # steps whose execution counts toward the final progress
    lost_steps: frozenset[int] = frozenset()  # re-done (or lost) after a restart
    compile_ns: int = 0  # productive time moved to compile

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def shared(self) -> bool:
        return len(self.steps) > 1

    def total(self, label: str) -> int:
        return sum(p.length for p in self.pieces if p.label == label)

    def overhead(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pieces:
            if p.label != PRODUCTIVE:
                out[p.label] = out.get(p.label, 0) + p.length
        return out


@dataclasses.dataclass
class SessionCut:
    """One session cut into startup pieces, windows and tail pieces (session's own clock)."""

    session: int
    start: int
    end: int
    startup: list[Piece]
    windows: list[Window]
    tail: list[Piece]
    data_rule: str
    host_timed: bool
    crashed: bool


def data_rule_of(timeline: SessionTimeline) -> str:
    """``asynchronous`` when most sync points were observed with the lag, ``synchronous`` when
    they were host values or already complete; ``unknown`` when there are none."""
    lagged = sum(1 for _, _, how in timeline.syncs if how == schema.SYNC_LAG)
    synchronous = sum(1 for _, _, how in timeline.syncs if how in (schema.SYNC_HOST, schema.SYNC_READY))
    if lagged == 0 and synchronous == 0:
        return RULE_UNKNOWN
    return RULE_ASYNC if lagged > synchronous else RULE_SYNC


def flatten_overhead(
    spans: Iterable[tuple[str, str, int, int, int | None, int | None, bool]],
    overhead: frozenset[str],
    main_tid: int | None,
) -> list[tuple[int, int, str]]:
    """Disjoint (t0, t1, category) intervals of overhead (and data) spans on the main thread.
    Nested spans count once: the outermost wins; a partial overlap adds only its new part."""
    chosen = sorted(
        (t0, -t1, cat)
        for _, cat, t0, t1, _, tid, _ in spans
        if (cat in overhead or cat == DATA) and t1 > t0 and (main_tid is None or tid is None or tid == main_tid)
    )
    out: list[tuple[int, int, str]] = []
    reach = None
    for t0, neg_t1, cat in chosen:
        t1 = -neg_t1
        if reach is None or t0 >= reach:
            out.append((t0, t1, cat))
            reach = t1
        elif t1 > reach:
            out.append((reach, t1, cat))
            reach = t1
    return out


class _Carver:
    """Cuts successive, increasing ranges [a, b) into pieces against disjoint span intervals."""

    def __init__(self, intervals: list[tuple[int, int, str]]) -> None:
        self.intervals = intervals
        self.starts = [iv[0] for iv in intervals]

    def carve(self, a: int, b: int, default: str, *, data_label: str = DATA, part_mode: bool = False) -> list[Piece]:
        pieces: list[Piece] = []
        if b <= a:
            return pieces
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        cursor = a
        intervals = self.intervals
        while i < len(intervals) and intervals[i][0] < b:
            t0, t1, cat = intervals[i]
            i += 1
            if t1 <= cursor:
                continue
            s, e = max(t0, cursor), min(t1, b)
            if s > cursor:
                _add(pieces, cursor, s, default, part_mode)
            label = data_label if cat == DATA else cat
            _add(pieces, s, e, label, part_mode)
            cursor = e
        if cursor < b:
            _add(pieces, cursor, b, default, part_mode)
        return pieces


def _add(pieces: list[Piece], s: int, e: int, label: str, part_mode: bool) -> None:
    if e <= s:
        return
    if part_mode:
        part = STARTUP_OTHER if label == STARTUP else label
        label = STARTUP
    else:
        part = ""
    last = pieces[-1] if pieces else None
    if last is not None and last.label == label and last.part == part and last.end == s:
        last.end = e
    else:
        pieces.append(Piece(s, e, label, part))


def cut_session(
    info: SessionInfo,
    timeline: SessionTimeline,
    *,
    overhead: frozenset[str] | None = None,
    data_rule: str | None = None,
    running: bool = False,
) -> SessionCut:
    """Cut one session: process start -> first step (startup), step intervals, tail. The tail
    is ``teardown`` after a finish record, ``disruption`` after a crash, ``in_progress`` when
    the process is still running."""
    categories = (overhead or schema.OVERHEAD_CATEGORIES) | info.overhead_categories
    rule = data_rule or data_rule_of(timeline)
    start = info.proc_start
    end = max(info.last_seen, start)
    crashed = not info.has_finish and not running
    spans = [s for s in timeline.spans if s[3] > start and s[2] < end]
    flat = flatten_overhead(spans, categories, info.main_tid)
    carver = _Carver(flat)  # data spans included: startup parts and the tail
    window_carver = carver
    if rule == RULE_ASYNC:
        # Productive data spans are no overhead: leave them out so nested overhead still counts.
        window_carver = _Carver(
            flatten_overhead([s for s in spans if s[1] != DATA], categories, info.main_tid)
        )
    executions = [(step, t0, t1) for step, t0, t1 in timeline.steps if t0 >= start and t1 <= end]
    sync_at: dict[int, int] = {}
    for step, t, _ in timeline.syncs:
        if start <= t <= end and (step not in sync_at or t > sync_at[step]):
            sync_at[step] = t
    host_timed = not sync_at and bool(executions)
    if host_timed:
        sync_at = {step: t1 for step, _, t1 in executions}
    windows: list[Window] = []
    if not executions:
        startup = carver.carve(start, end, STARTUP, part_mode=True)
        return SessionCut(info.index, start, end, startup, [], [], rule, host_timed, crashed)
    first_start = executions[0][1]
    startup = carver.carve(start, first_start, STARTUP, part_mode=True)
    window_start = first_start
    group: list[int] = []
    trailing_end = first_start
    for step, _, t1 in executions:
        group.append(step)
        trailing_end = max(trailing_end, t1)
        sync_t = sync_at.get(step)
        if sync_t is not None and sync_t > window_start:
            windows.append(_window(window_carver, window_start, sync_t, group, info.index, rule, host_timed))
            window_start = sync_t
            group = []
    if group:  # executions after the last sync point: closed at their host exit
        t = max(trailing_end, window_start)
        if t > window_start:
            windows.append(_window(window_carver, window_start, t, group, info.index, rule, True))
            window_start = t
        elif windows:
            windows[-1].steps.extend(group)
    if windows:
        windows[0].first_of_attempt = True
    if rule == RULE_ASYNC and _charge_device_idle(windows, timeline, info.main_tid):
        rule = RULE_ASYNC_DEVICE
    tail_label = IN_PROGRESS if running else DISRUPTION if crashed else TEARDOWN
    tail = carver.carve(window_start, end, tail_label)
    return SessionCut(info.index, start, end, startup, windows, tail, rule, host_timed, crashed)


def _charge_device_idle(windows: list[Window], timeline: SessionTimeline, main_tid: int | None) -> bool:
    """Asynchronous loop with CUDA device timing: the device-idle gap before a step, up to that
    step's data-loading time, becomes ``data`` in the step's interval. True when measured."""
    idle = {
        step: round(value * 1e9) for name, step, value, _ in timeline.metrics
        if name == DEVICE_IDLE_METRIC and step is not None and value is not None and value > 0
    }
    if not any(name == DEVICE_IDLE_METRIC for name, _, _, _ in timeline.metrics):
        return False
    loading: dict[int, int] = {}
    for _, cat, t0, t1, step, tid, _ in timeline.spans:
        if cat == DATA and step is not None and (main_tid is None or tid is None or tid == main_tid):
            loading[step] = loading.get(step, 0) + (t1 - t0)
    for w in windows:
        amount = sum(min(idle.get(s, 0), loading.get(s, 0)) for s in w.steps)
        amount = min(amount, w.total(PRODUCTIVE))
        if amount > 0:
            w.pieces = relabel(w.pieces, amount, DATA, from_end=False)
    return True


def _window(
    carver: _Carver, a: int, b: int, steps: list[int], session: int, rule: str, host_timed: bool
) -> Window:
    pieces = carver.carve(a, b, PRODUCTIVE, data_label=PRODUCTIVE if rule == RULE_ASYNC else DATA)
    return Window(a, b, list(steps), pieces, session=session, host_timed=host_timed)


# ----------------------------------------------------------------------------------------------
# Relabelling productive time: compile excess, wasted progress
# ----------------------------------------------------------------------------------------------
def relabel(pieces: list[Piece], amount: int, label: str, *, from_end: bool) -> list[Piece]:
    """Move ``amount`` ns of productive pieces to ``label`` (earliest first, or latest first)."""
    if amount <= 0:
        return pieces
    order = range(len(pieces) - 1, -1, -1) if from_end else range(len(pieces))
    result: dict[int, list[Piece]] = {}
    left = amount
    for i in order:
        p = pieces[i]
        if left <= 0 or p.label != PRODUCTIVE:
            continue
        take = min(left, p.length)
        left -= take
        if take == p.length:
            result[i] = [Piece(p.start, p.end, label)]
        elif from_end:
            result[i] = [Piece(p.start, p.end - take, PRODUCTIVE), Piece(p.end - take, p.end, label)]
        else:
            result[i] = [Piece(p.start, p.start + take, label), Piece(p.start + take, p.end, PRODUCTIVE)]
    out: list[Piece] = []
    for i, p in enumerate(pieces):
        out.extend(result.get(i, [p]))
    return out


def weighted_median(values: Sequence[tuple[float, int]]) -> float | None:
    """Median of values with integer weights (a shared window counts once per step)."""
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


def ideal_step_ns(cuts: Sequence[SessionCut]) -> float | None:
    """Median productive time per step over steady-state windows (each attempt's first window
    excluded, and windows that overhead fills entirely); the first windows themselves when
    there is nothing else."""
    steady = [
        (w.total(PRODUCTIVE) / len(w.steps), len(w.steps))
        for cut in cuts for w in cut.windows
        if not w.first_of_attempt and w.steps and w.total(PRODUCTIVE) > 0
    ]
    if not steady:
        steady = [(w.total(PRODUCTIVE) / len(w.steps), len(w.steps)) for cut in cuts for w in cut.windows if w.steps]
    return weighted_median(steady)


def apply_compile(cut: SessionCut, ideal: float | None) -> None:
    """The first window's productive time above the ideal step time becomes ``compile``
    (explicit compile spans are already out of the productive time, so they count once)."""
    if ideal is None or not cut.windows:
        return
    first = cut.windows[0]
    excess = first.total(PRODUCTIVE) - round(ideal * len(first.steps))
    if excess > 0:
        first.pieces = relabel(first.pieces, excess, COMPILE, from_end=False)
        first.compile_ns = excess


# ----------------------------------------------------------------------------------------------
# Assembly across attempts on the wall clock
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Timeline:
    """One rank's job timeline: pieces tiling [start, end) on the wall clock."""

    start: int
    end: int
    pieces: list[Piece]
    windows: list[Window]  # wall clock, in order, each with its attempt
    cuts: list[SessionCut]

    def totals(self, a: int | None = None, b: int | None = None) -> tuple[dict[str, int], dict[str, int]]:
        """Bucket totals (ns) and startup parts, optionally clipped to [a, b)."""
        lo = self.start if a is None else max(a, self.start)
        hi = self.end if b is None else min(b, self.end)
        buckets: dict[str, int] = {}
        parts: dict[str, int] = {}
        if hi <= lo:
            return buckets, parts
        starts = [p.start for p in self.pieces]
        i = max(0, bisect.bisect_right(starts, lo) - 1)
        for p in self.pieces[i:]:
            if p.start >= hi:
                break
            length = min(p.end, hi) - max(p.start, lo)
            if length <= 0:
                continue
            buckets[p.label] = buckets.get(p.label, 0) + length
            if p.part:
                parts[p.part] = parts.get(p.part, 0) + length
        return buckets, parts


def _shift(pieces: Iterable[Piece], delta: int) -> list[Piece]:
    return [Piece(p.start + delta, p.end + delta, p.label, p.part) for p in pieces]


def assemble(
    cuts: Sequence[tuple[int, SessionInfo, SessionCut]],
    *,
    submit_wall: int | None = None,
) -> Timeline:
    """String one rank's session cuts (attempt, info, cut), in attempt order, on the wall clock.

    Before the first process start: ``scheduling`` (when the submit time is known). Between an
    attempt's end and the next one's process start: ``disruption``. Productive time of
    executions whose step a later attempt started again from (or before) becomes
    ``wasted_progress``. Overlaps (a process still alive when the next started) are cut off.
    """
    ordered = sorted(cuts, key=lambda c: (c[1].start_wall, c[0]))
    pieces: list[Piece] = []
    windows: list[Window] = []
    # the restore point after each attempt: the lowest step any later attempt starts at
    restore_after: list[int | None] = [None] * len(ordered)
    lowest: int | None = None
    for k in range(len(ordered) - 1, -1, -1):
        restore_after[k] = lowest
        cut = ordered[k][2]
        if any(w.steps for w in cut.windows):
            first = min(min(w.steps) for w in cut.windows if w.steps)
            lowest = first if lowest is None else min(lowest, first)
    job_start = ordered[0][1].start_wall if ordered else 0
    if submit_wall is not None and ordered and submit_wall < job_start:
        pieces.append(Piece(submit_wall, job_start, SCHEDULING))
    start = submit_wall if submit_wall is not None and submit_wall < job_start else job_start
    cursor = job_start
    for k, (attempt, info, cut) in enumerate(ordered):
        delta = info.wall_anchor - info.mono_anchor
        next_start = ordered[k + 1][1].start_wall if k + 1 < len(ordered) else None
        session_pieces = list(_shift(cut.startup, delta))
        limit = restore_after[k]
        for w in cut.windows:
            moved = Window(
                w.start + delta, w.end + delta, w.steps, _shift(w.pieces, delta),
                first_of_attempt=w.first_of_attempt, host_timed=w.host_timed, session=w.session,
                attempt=attempt, compile_ns=w.compile_ns,
            )
            lost_steps = frozenset(s for s in w.steps if limit is not None and s >= limit)
            lost = sum(1 for s in w.steps if s in lost_steps)
            moved.counted_steps = len(w.steps) - lost
            moved.lost_steps = lost_steps
            if lost:
                productive = moved.total(PRODUCTIVE)
                amount = productive if lost == len(w.steps) else productive * lost // len(w.steps)
                moved.pieces = relabel(moved.pieces, amount, WASTED, from_end=True)
            windows.append(moved)
            session_pieces.extend(moved.pieces)
        session_pieces.extend(_shift(cut.tail, delta))
        session_start = info.start_wall
        if session_start > cursor:
            pieces.append(Piece(cursor, session_start, DISRUPTION))
            cursor = session_start
        for p in session_pieces:
            s, e = max(p.start, cursor), p.end
            if next_start is not None:
                e = min(e, next_start)
            if e > s:
                pieces.append(Piece(s, e, p.label, p.part))
                cursor = e
    end = cursor
    merged: list[Piece] = []
    for p in pieces:
        if merged and merged[-1].end == p.start and merged[-1].label == p.label and merged[-1].part == p.part:
            merged[-1].end = p.end
        else:
            merged.append(p)
    return Timeline(start, end, merged, windows, [c for _, _, c in ordered])
