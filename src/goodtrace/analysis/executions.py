"""Step executions of one session and their intervals: the one derivation every view draws.

:func:`cut_session` turns a session's records (executions, sync points, main-thread overhead
spans) into a :class:`SessionSteps`: its startup, its step intervals (T_{k-1}, T_k] closed by
sync points (several executions share one when completion was sparse), the overhead of each,
and its tail. Every execution is its own row, numbered by ``seq`` (entry order), so repeated
and decreasing step numbers are timed right and flagged. The rules (docs/semantics.md):

- a sync point belongs to one execution (the recorder names it; for older files the k-th sync
  point of step n belongs to the k-th execution of n); the earliest one counts;
- no sync point at all: each execution closes at its host exit (``host`` timing);
- sync points must increase in execution order; one that does not is ignored (flagged);
- a blocking span never includes the wait for its step: when a sync point falls inside a
  blocking span, the span counts from that sync point on;
- executions after the last sync point are closed at their host exit when the session ended
  normally; after a crash (or while running) they never completed: their time is the tail's;
- overhead spans are counted once (the outermost wins); in an asynchronous loop in-step data
  loading overlapped queued device work and is productive, in a synchronous one it is ``data``.

Columns are arrays (a long run on thousands of ranks holds millions of executions).
"""

from __future__ import annotations

import bisect
import dataclasses
from array import array
from collections.abc import Iterable, Sequence

from goodtrace import schema
from goodtrace.read.loaded import NO_TIME, SessionInfo, SessionRecords

__all__ = [
    "DATA_RULE_TEXT",
    "FLAG_DECREASING",
    "FLAG_REPEATED",
    "FLAG_UNORDERED_SYNC",
    "HOST_EXIT",
    "RULE_ASYNC",
    "RULE_ASYNC_DEVICE",
    "RULE_SYNC",
    "RULE_UNKNOWN",
    "Piece",
    "SessionSteps",
    "cut_session",
]

PRODUCTIVE = schema.BUCKET_PRODUCTIVE
STARTUP = schema.BUCKET_STARTUP
DATA = schema.DATA
STARTUP_OTHER = "other"
HOST_EXIT = "exit"  # a window closed at an execution's host exit (no sync point of its own)

RULE_ASYNC = "asynchronous"
RULE_SYNC = "synchronous"
RULE_UNKNOWN = "unknown"
RULE_ASYNC_DEVICE = "asynchronous+device"
DATA_RULE_TEXT = {
    RULE_ASYNC: "asynchronous loop (the host entered the next step before the previous one was ready): "
    "in-step data loading overlapped queued device work, so it counts as productive",
    RULE_SYNC: "synchronous loop (each step was ready before the next began): the device waited for "
    "in-step data loading, so it counts as data badput",
    RULE_ASYNC_DEVICE: "asynchronous loop with device timing: in-step data loading counts as data badput "
    "only for the device-idle gap before its step (the device waited), the rest as productive",
    RULE_UNKNOWN: "no sync points recorded (host-timed steps): in-step data loading is counted as data "
    "badput (synchronous assumption)",
}

FLAG_REPEATED = 1  # the step number ran before in this session
FLAG_DECREASING = 2  # the step number is lower than the previous execution's
FLAG_UNORDERED_SYNC = 4  # its sync point came before an earlier execution's: ignored
FLAG_HOST_TIMED = 8  # its interval closed at a host exit, not an observed sync point


@dataclasses.dataclass
class Piece:
    """A half-open interval [start, end) with its bucket (and startup part)."""

    start: int
    end: int
    label: str
    part: str = ""

    @property
    def length(self) -> int:
        return self.end - self.start


def _ints() -> array[int]:
    return array("q")


@dataclasses.dataclass
class SessionSteps:
    """One session cut into startup, step intervals and a tail, on its own monotonic clock.

    Windows (step intervals) ``(win_start[w], win_end[w]]`` hold ``win_count[w]`` executions
    from ``win_first[w]`` on (more than one: sparse completion, each gets the average);
    ``win_how[w]`` is how its closing sync point was taken (``exit``: a host exit).
    Executions ``exec_*`` are in entry order; ``exec_window`` is -1 for one that never
    completed (dispatched before a crash). ``overhead`` holds the disjoint main-thread overhead
    intervals the pieces of every window, the startup and the tail are cut from.
    """

    session: int
    start: int
    end: int
    data_rule: str
    host_timed: bool
    tail_label: str
    exec_seq: array[int] = dataclasses.field(default_factory=_ints)
    exec_step: array[int] = dataclasses.field(default_factory=_ints)
    exec_t0: array[int] = dataclasses.field(default_factory=_ints)
    exec_t1: array[int] = dataclasses.field(default_factory=_ints)
    exec_window: array[int] = dataclasses.field(default_factory=_ints)
    exec_flags: array[int] = dataclasses.field(default_factory=_ints)
    exec_compute: array[int] = dataclasses.field(default_factory=_ints)  # outermost compute ns
    win_start: array[int] = dataclasses.field(default_factory=_ints)
    win_end: array[int] = dataclasses.field(default_factory=_ints)
    win_first: array[int] = dataclasses.field(default_factory=_ints)
    win_count: array[int] = dataclasses.field(default_factory=_ints)
    win_how: list[str] = dataclasses.field(default_factory=list)
    win_productive: array[int] = dataclasses.field(default_factory=_ints)  # ns, before attempt relabels
    win_overhead: dict[str, array[int]] = dataclasses.field(default_factory=dict)  # category -> ns per window
    over_start: array[int] = dataclasses.field(default_factory=_ints)
    over_end: array[int] = dataclasses.field(default_factory=_ints)
    over_label: list[str] = dataclasses.field(default_factory=list)
    data_moved: dict[int, int] = dataclasses.field(default_factory=dict)  # window -> device-idle data ns
    ignored_syncs: int = 0

    @property
    def windows(self) -> int:
        return len(self.win_start)

    @property
    def last_end(self) -> int:
        """Where the tail begins: the last window's end (the first step's entry without one)."""
        if self.win_end:
            return self.win_end[-1]
        return self.exec_t0[0] if self.exec_t0 else self.end

    def overhead_of(self, w: int) -> dict[str, int]:
        return {c: v[w] for c, v in self.win_overhead.items() if v[w]}

    def _carve(self, a: int, b: int, default: str, *, skip_data: bool = False) -> list[Piece]:
        out: list[Piece] = []
        if b <= a:
            return out
        starts, ends, labels = self.over_start, self.over_end, self.over_label
        i = max(0, bisect.bisect_right(starts, a) - 1)
        cursor = a
        while i < len(starts) and starts[i] < b:
            s, e, label = max(starts[i], cursor), min(ends[i], b), labels[i]
            i += 1
            if e <= cursor or (skip_data and label == DATA):
                continue
            if s > cursor:
                _add(out, cursor, s, default)
            _add(out, s, e, label)
            cursor = e
        if cursor < b:
            _add(out, cursor, b, default)
        return out

    def window_pieces(self, w: int) -> list[Piece]:
        """The pieces of window ``w`` (productive and overhead), in time order."""
        pieces = self._carve(self.win_start[w], self.win_end[w], PRODUCTIVE,
                             skip_data=self.data_rule in (RULE_ASYNC, RULE_ASYNC_DEVICE))
        moved = self.data_moved.get(w)
        return relabel(pieces, moved, DATA, from_end=False) if moved else pieces

    def startup_pieces(self) -> list[Piece]:
        """Process start -> first step, labelled ``startup`` with the overhead as parts."""
        first = self.exec_t0[0] if self.exec_t0 else self.end
        pieces = self._carve(self.start, first, STARTUP)
        return [Piece(p.start, p.end, STARTUP, STARTUP_OTHER if p.label == STARTUP else p.label) for p in pieces]

    def tail_pieces(self) -> list[Piece]:
        return self._carve(self.last_end, self.end, self.tail_label)


def _add(pieces: list[Piece], s: int, e: int, label: str) -> None:
    if e <= s:
        return
    last = pieces[-1] if pieces else None
    if last is not None and last.label == label and last.end == s:
        last.end = e
    else:
        pieces.append(Piece(s, e, label))


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
            result[i] = [Piece(p.start, p.end, label, p.part)]
        elif from_end:
            result[i] = [Piece(p.start, p.end - take, PRODUCTIVE), Piece(p.end - take, p.end, label)]
        else:
            result[i] = [Piece(p.start, p.start + take, label), Piece(p.start + take, p.end, PRODUCTIVE)]
    out: list[Piece] = []
    for i, p in enumerate(pieces):
        out.extend(result.get(i, [p]))
    return out


def _flatten(
    rec: SessionRecords, categories: frozenset[str], blocking: frozenset[str], own_sync: _OwnSync, a: int, b: int
) -> tuple[array[int], array[int], list[str]]:
    """Disjoint (start, end, category) intervals of the main-thread overhead and data spans
    inside [a, b): among overhead spans the outermost wins (a partial overlap adds only its new
    part); data loading counts where no overhead span does. A blocking span that holds the sync
    point of the step it started in counts from that sync point on (it waited for the device).
    The loader gives spans sorted by (start, -end); one pass each for overhead and data."""
    overhead: list[tuple[int, int, str]] = []
    data: list[tuple[int, int]] = []
    resort = False
    for category, t0, t1 in zip(rec.span_category, rec.span_t0, rec.span_t1, strict=True):
        if t1 <= a or t0 >= b:
            continue
        if category == DATA:
            data.append((t0, t1))
        elif category in categories:
            if category in blocking:
                synced = own_sync(t0)
                if t0 < synced < t1:
                    t0, resort = synced, True
            overhead.append((t0, t1, category))
    if resort:
        overhead.sort(key=lambda x: (x[0], -x[1]))
    starts, ends, labels = array("q"), array("q"), []
    reach = NO_TIME
    for t0, t1, category in overhead:  # the outermost wins
        if t1 <= reach:
            continue
        starts.append(t0 if t0 > reach else reach)
        ends.append(t1)
        labels.append(category)
        reach = t1
    if not data:
        return starts, ends, labels
    # data loading where no overhead interval is: merge the two sorted lists
    out_s, out_e, out_l = array("q"), array("q"), []
    i, n = 0, len(starts)
    reach = NO_TIME
    for t0, t1 in data:
        if t1 <= reach:
            continue
        cursor = t0 if t0 > reach else reach
        reach = t1
        while i < n and ends[i] <= cursor:  # overhead intervals entirely before this data span
            out_s.append(starts[i])
            out_e.append(ends[i])
            out_l.append(labels[i])
            i += 1
        j = i
        while j < n and starts[j] < t1:
            if starts[j] > cursor:
                out_s.append(cursor)
                out_e.append(starts[j])
                out_l.append(DATA)
            if ends[j] > cursor:
                cursor = ends[j]
            j += 1
        if cursor < t1:
            out_s.append(cursor)
            out_e.append(t1)
            out_l.append(DATA)
    while i < n:
        out_s.append(starts[i])
        out_e.append(ends[i])
        out_l.append(labels[i])
        i += 1
    order = sorted(range(len(out_s)), key=out_s.__getitem__)
    return array("q", (out_s[k] for k in order)), array("q", (out_e[k] for k in order)), [out_l[k] for k in order]


class _OwnSync:
    """The sync point of the execution whose step context holds a time (NO_TIME if none)."""

    def __init__(self, t0s: Sequence[int], t1s: Sequence[int], times: Sequence[int]) -> None:
        self.t0s, self.t1s, self.times = t0s, t1s, times

    def __call__(self, t: int) -> int:
        i = bisect.bisect_right(self.t0s, t) - 1
        return self.times[i] if i >= 0 and t <= self.t1s[i] else NO_TIME


def _assign_syncs(rec: SessionRecords, seqs: array[int], numbers: array[int], t0s: array[int]) -> tuple[list[int], list[str], int]:
    """The sync time and how of each execution (NO_TIME: none); the count of sync records that
    name no execution or come before its entry."""
    n = len(seqs)
    times = [NO_TIME] * n
    hows = [""] * n
    index_of = {seq: i for i, seq in enumerate(seqs)}
    queue: dict[int, list[int]] = {}  # step number -> its executions without a sync, in order
    if any(s < 0 for s in rec.sync_seq):
        for i, number in enumerate(numbers):
            queue.setdefault(number, []).append(i)
    ignored = 0
    for seq, number, t, how in zip(rec.sync_seq, rec.sync_step, rec.sync_t, rec.sync_how, strict=True):
        if seq >= 0:
            i = index_of.get(seq, -1)
        else:  # older files: the k-th sync point of step n belongs to the k-th execution of n
            waiting = queue.get(number)
            i = waiting.pop(0) if waiting else -1
        if i < 0 or numbers[i] != number or t < t0s[i]:
            ignored += 1
            continue
        if times[i] == NO_TIME or t < times[i]:
            times[i], hows[i] = t, how
    return times, hows, ignored


def cut_session(
    info: SessionInfo,
    rec: SessionRecords,
    *,
    tail_label: str,
    close_trailing: bool,
    data_rule: str | None = None,
    overhead: frozenset[str] | None = None,
) -> SessionSteps:
    """Cut one session (see the module docstring). ``tail_label`` names the time after the
    last interval (``teardown``, ``disruption`` or ``in_progress``, by how the attempt ended);
    ``close_trailing``: executions after the last sync point are closed at their host exit
    (a normal end) rather than left incomplete (a crash)."""
    categories = (overhead or schema.OVERHEAD_CATEGORIES) | info.overhead_categories
    start = info.proc_start
    end = max(info.last_seen, start)
    seqs, numbers, t0s, t1s = rec.step_seq, rec.step_number, rec.step_t0, rec.step_t1
    keep = [i for i in range(len(seqs)) if t0s[i] >= start and t1s[i] <= end]
    if len(keep) != len(seqs):
        seqs = array("q", (seqs[i] for i in keep))
        numbers = array("q", (numbers[i] for i in keep))
        t0s = array("q", (t0s[i] for i in keep))
        t1s = array("q", (t1s[i] for i in keep))
    n = len(seqs)
    times, hows, ignored = _assign_syncs(rec, seqs, numbers, t0s)
    host_timed = n > 0 and all(t == NO_TIME for t in times)
    if host_timed:
        times, hows = list(t1s), [schema.SYNC_HOST] * n
    out = SessionSteps(info.index, start, end, RULE_UNKNOWN, host_timed, tail_label)
    out.exec_seq, out.exec_step, out.exec_t0, out.exec_t1 = seqs, numbers, t0s, t1s
    flags = array("q", bytes(8 * n))
    seen: set[int] = set()
    for i in range(n):
        number = numbers[i]
        if number in seen:
            flags[i] |= FLAG_REPEATED
        if i and number < numbers[i - 1]:
            flags[i] |= FLAG_DECREASING
        seen.add(number)
    window_of = array("q", [-1]) * n
    # Windows: each execution with an (increasing) sync point closes one.
    win_start, win_end, win_first, win_count, win_how = out.win_start, out.win_end, out.win_first, out.win_count, out.win_how
    cursor = t0s[0] if n else start
    first = 0
    for i in range(n):
        t = times[i]
        if t == NO_TIME:
            continue
        if t <= cursor:
            flags[i] |= FLAG_UNORDERED_SYNC
            ignored += 1
            continue
        for j in range(first, i + 1):
            window_of[j] = len(win_start)
        win_start.append(cursor)
        win_end.append(t)
        win_first.append(first)
        win_count.append(i + 1 - first)
        win_how.append(hows[i])
        cursor, first = t, i + 1
    if first < n and close_trailing:  # executions after the last sync point, at a normal end
        exit_t = max(t1s[first:])
        if exit_t > cursor:
            for j in range(first, n):
                window_of[j] = len(win_start)
                flags[j] |= FLAG_HOST_TIMED
            win_start.append(cursor)
            win_end.append(exit_t)
            win_first.append(first)
            win_count.append(n - first)
            win_how.append(HOST_EXIT)
        elif win_start:
            for j in range(first, n):
                window_of[j] = len(win_start) - 1
            win_count[-1] += n - first
    if host_timed:
        for i in range(n):
            flags[i] |= FLAG_HOST_TIMED
    out.exec_window, out.exec_flags, out.ignored_syncs = window_of, flags, ignored
    out.exec_compute = array("q", (rec.compute_ns.get(s, 0) for s in seqs))
    out.data_rule = data_rule or _data_rule(times, hows, t0s, host_timed)
    # the device-dated sync point of each execution (a blocking span may have waited for it)
    accepted = [NO_TIME if flags[i] & FLAG_UNORDERED_SYNC or hows[i] not in _DEVICE_DATED else times[i]
                for i in range(n)]
    out.over_start, out.over_end, out.over_label = _flatten(
        rec, categories, info.blocking_categories or schema.BLOCKING_CATEGORIES, _OwnSync(t0s, t1s, accepted),
        start, end,
    )
    _totals(out)
    if out.data_rule == RULE_ASYNC and schema.DEVICE_IDLE_METRIC in rec.device and _charge_device_idle(out, rec):
        out.data_rule = RULE_ASYNC_DEVICE
    return out


_DEVICE_DATED = frozenset({schema.SYNC_LAG, schema.SYNC_POLL, schema.SYNC_BLOCKING, schema.SYNC_FINISH})
_LOOKED_LATER = frozenset({schema.SYNC_LAG, schema.SYNC_POLL, schema.SYNC_BLOCKING, schema.SYNC_FINISH,
                           schema.SYNC_BARRIER})


def _data_rule(times: Sequence[int], hows: Sequence[str], t0s: Sequence[int], host_timed: bool) -> str:
    """Asynchronous when the host entered the next step before most steps were ready (on a
    tie, by how the sync point was taken: looked at later, or already complete at the step's
    end)."""
    if host_timed:
        return RULE_UNKNOWN
    ahead = behind = 0
    for i in range(len(times) - 1):
        if times[i] == NO_TIME:
            continue
        if t0s[i + 1] < times[i] or (t0s[i + 1] == times[i] and hows[i] in _LOOKED_LATER):
            ahead += 1
        else:
            behind += 1
    if ahead == 0 and behind == 0:
        return RULE_UNKNOWN
    return RULE_ASYNC if ahead > behind else RULE_SYNC


def _totals(out: SessionSteps) -> None:
    """Per window: overhead per category and the productive rest (one sweep over the overhead
    intervals; in an asynchronous loop in-step data loading is productive)."""
    skip_data = out.data_rule in (RULE_ASYNC, RULE_ASYNC_DEVICE)
    starts, ends, labels = out.over_start, out.over_end, out.over_label
    productive = array("q")
    overhead: dict[str, array[int]] = {}
    count = len(out.win_start)
    i = 0
    for w in range(count):
        a, b = out.win_start[w], out.win_end[w]
        while i < len(starts) and ends[i] <= a:
            i += 1
        j = i
        used = 0
        while j < len(starts) and starts[j] < b:
            label = labels[j]
            if not (skip_data and label == DATA):
                length = min(ends[j], b) - max(starts[j], a)
                if length > 0:
                    column = overhead.get(label)
                    if column is None:
                        column = overhead[label] = array("q", bytes(8 * count))
                    column[w] += length
                    used += length
            j += 1
        productive.append(b - a - used)
    out.win_productive, out.win_overhead = productive, overhead


def _charge_device_idle(out: SessionSteps, rec: SessionRecords) -> bool:
    """Asynchronous loop with CUDA device timing: the device-idle gap before a step, up to that
    step's data-loading time, becomes ``data`` in the step's interval. True when measured."""
    idle = {step: round(v * 1e9) for step, v in rec.device.get(schema.DEVICE_IDLE_METRIC, {}).items() if v > 0}
    loading: dict[int, int] = {}
    for category, t0, t1, step in zip(rec.span_category, rec.span_t0, rec.span_t1, rec.span_step, strict=True):
        if category == DATA and step != NO_TIME:
            loading[step] = loading.get(step, 0) + (t1 - t0)
    for w in range(len(out.win_start)):
        first = out.win_first[w]
        steps = out.exec_step[first:first + out.win_count[w]]
        amount = min(sum(min(idle.get(s, 0), loading.get(s, 0)) for s in steps), out.win_productive[w])
        if amount > 0:
            out.data_moved[w] = amount
            out.win_productive[w] -= amount
            column = out.win_overhead.get(DATA)
            if column is None:
                column = out.win_overhead[DATA] = array("q", bytes(8 * len(out.win_start)))
            column[w] += amount
    return True


def window_steps(out: SessionSteps, w: int) -> Iterable[int]:
    """Indexes of the executions sharing window ``w``."""
    first = out.win_first[w]
    return range(first, first + out.win_count[w])
