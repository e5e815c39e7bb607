"""A session's cut: its step executions and the intervals they close, the one derivation every
view draws. "Cut" names this one concept everywhere (``SessionCut``, ``cut_session``,
``RunAnalysis.cuts``, a variable ``cut``); an *execution* is one row of it (one run of a step).

:func:`cut_session` turns a session's records (executions, sync points, main-thread overhead
spans) into a :class:`SessionCut`: its startup, its step intervals (T_{k-1}, T_k] closed by
sync points (several executions share one when completion was sparse), the overhead of each,
and its tail. Every execution is its own row, numbered by ``seq`` (entry order), so repeated
and decreasing step numbers are timed right and flagged; a rewind (:mod:`goodtrace.analysis.rewinds`)
flags the executions it threw away. The rules (docs/semantics.md):

- a sync point belongs to one execution (the recorder names it; for older files the k-th sync
  point of step n belongs to the k-th execution of n); the earliest one counts;
- no sync point at all: each execution closes at its host exit (``host`` timing);
- sync points must not go back in execution order; one that does is ignored (flagged); two at
  the same instant (one poll found both) close a zero-length interval;
- a blocking span never includes the wait for its step: when a sync point falls inside a
  blocking span, the span counts from that sync point on;
- executions after the last sync point are closed at their host exit when the session ended
  normally; after a crash (or while running) they never completed: their time is the tail's;
- overhead spans are counted once (the outermost wins), and each (data loading too) only from
  where the device had run out of queued work: the sync point of the last execution that
  exited before it (:func:`goodtrace.analysis.overhead.flatten_overhead`); with CUDA device
  timing, in-step data loading by the measured device-idle gap.

Columns are arrays (a long run on thousands of ranks holds millions of executions).
"""

from __future__ import annotations

import bisect
import dataclasses
from array import array
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from goodtrace import schema
from goodtrace.analysis.overhead import flatten_overhead, overhead_per_interval
from goodtrace.analysis.rewinds import Rewind, charge_recovery, find_rewinds
from goodtrace.analysis.sync_match import assign_syncs, occurrence
from goodtrace.columns import Array, codes_in, int64s, int_array, ints, positions
from goodtrace.read.loaded import NO_TIME, Labels, SessionInfo, SessionRecords

__all__ = [
    "DATA_RULES",
    "DATA_RULE_TEXT",
    "FLAG_DECREASING",
    "FLAG_REPEATED",
    "FLAG_REWOUND",
    "FLAG_UNORDERED_SYNC",
    "HOST_EXIT",
    "NO_RELABELS",
    "RULE_ASYNC",
    "RULE_DEVICE_IDLE",
    "RULE_SYNC",
    "RULE_SYNC_POINTS",
    "Piece",
    "Relabels",
    "SessionCut",
    "cut_session",
    "label_totals",
]

PRODUCTIVE = schema.BUCKET_PRODUCTIVE
STARTUP = schema.BUCKET_STARTUP
DATA = schema.DATA
STARTUP_OTHER = "other"
HOST_EXIT = "exit"  # an interval closed at an execution's host exit (no sync point of its own)

RULE_SYNC_POINTS = "sync points"  # the one rule: host overhead counts where the device had run out of work
RULE_DEVICE_IDLE = "device idle"  # CUDA device timing: in-step data loading by the measured idle gap
RULE_ASYNC = "asynchronous"  # override (--data-rule): in-step data loading all productive
RULE_SYNC = "synchronous"  # override (--data-rule): in-step data loading all badput
DATA_RULES = (RULE_SYNC_POINTS, RULE_DEVICE_IDLE, RULE_ASYNC, RULE_SYNC)
DATA_RULE_TEXT = {
    RULE_SYNC_POINTS: "host time in overhead spans (data, compile, log, ...) counts as lost only where the device "
    "had run out of queued work (after the sync point of the last step dispatched before the span); while queued "
    "device work ran it is productive",
    RULE_DEVICE_IDLE: "device timing (CUDA events): in-step data loading counts as lost for the device-idle gap "
    "before its step; other overhead spans only where the device had run out of queued work",
    RULE_ASYNC: "in-step data loading counted as productive (--data-rule asynchronous); other overhead spans only "
    "where the device had run out of queued work",
    RULE_SYNC: "in-step data loading counted as lost (--data-rule synchronous); other overhead spans only where "
    "the device had run out of queued work",
}


FLAG_REPEATED = 1  # the step number ran before in this session
FLAG_DECREASING = 2  # the step number is lower than the previous execution's
FLAG_UNORDERED_SYNC = 4  # its sync point came before an earlier execution's: ignored
FLAG_HOST_TIMED = 8  # its interval closed at a host exit, not an observed sync point
FLAG_REWOUND = 16  # a later rewind in this session (a rollback) threw it away (analysis.rewinds)


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


def label_totals(pieces: Iterable[Piece], *, skip: str | None = None) -> dict[str, int]:
    """The pieces' length by label, in first-seen order (``skip``: a label left out): what a
    interval's overhead by label is, for every view."""
    out: dict[str, int] = {}
    for p in pieces:
        if p.label != skip:
            out[p.label] = out.get(p.label, 0) + p.length
    return out


class Relabels(NamedTuple):
    """What the attempt level relabels in a session's intervals (:func:`goodtrace.analysis.partition.assemble`):
    ``warmup_ns`` of its first interval is warm-up, and its executions of a step at or above
    ``redone_from`` (a later attempt, or a rollback the program named, started again there; None:
    nothing was redone) are wasted progress."""

    warmup_ns: int
    redone_from: int | None


NO_RELABELS = Relabels(0, None)


def _ints() -> array[int]:
    return array("q")


@dataclasses.dataclass
class SessionCut:
    """One session cut into startup, step intervals and a tail, on its own monotonic clock.

    Step intervals ``(interval_start[w], interval_end[w]]`` hold ``interval_count[w]`` executions
    from ``interval_first[w]`` on (more than one: sparse completion, each gets the average);
    ``interval_how[w]`` is how its closing sync point was taken (``exit``: a host exit).
    Executions ``exec_*`` are in entry order; ``exec_interval`` is -1 for one that never
    completed (dispatched before a crash). ``overhead`` holds the disjoint main-thread overhead
    intervals the pieces of every interval, the startup and the tail are cut from.
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
    exec_interval: array[int] = dataclasses.field(default_factory=_ints)
    exec_flags: array[int] = dataclasses.field(default_factory=_ints)
    exec_compute: array[int] = dataclasses.field(default_factory=_ints)  # outermost compute ns
    interval_start: array[int] = dataclasses.field(default_factory=_ints)
    interval_end: array[int] = dataclasses.field(default_factory=_ints)
    interval_first: array[int] = dataclasses.field(default_factory=_ints)
    interval_count: array[int] = dataclasses.field(default_factory=_ints)
    interval_how: Sequence[str] = dataclasses.field(default_factory=list)
    interval_productive: array[int] = dataclasses.field(default_factory=_ints)  # ns, before attempt relabels
    interval_overhead: dict[str, array[int]] = dataclasses.field(default_factory=dict)  # category -> ns per interval
    over_start: array[int] = dataclasses.field(default_factory=_ints)
    over_end: array[int] = dataclasses.field(default_factory=_ints)
    over_label: list[str] = dataclasses.field(default_factory=list)
    data_moved: dict[int, int] = dataclasses.field(default_factory=dict)  # interval -> device-idle data ns
    recovered: dict[int, int] = dataclasses.field(default_factory=dict)  # interval -> a rewind's recovery ns
    ignored_syncs: int = 0
    overlapped_ns: int = 0  # overhead span time in the intervals that overlapped queued device work (productive)
    uncertain_ns: int = 0  # overhead charged after untraced host time of its own step (the rule cannot see)
    rewinds: list[Rewind] = dataclasses.field(default_factory=list)  # rollbacks inside the session

    @property
    def skips_data(self) -> bool:
        """In-step data loading is left out of the intervals' overhead (productive, or charged
        afterwards by the measured device-idle gap)."""
        return self.data_rule in (RULE_ASYNC, RULE_DEVICE_IDLE)

    @property
    def intervals(self) -> int:
        return len(self.interval_start)

    @property
    def last_end(self) -> int:
        """Where the tail begins: the last interval's end (the first step's entry without one)."""
        if self.interval_end:
            return self.interval_end[-1]
        return self.exec_t0[0] if self.exec_t0 else self.end

    def executions_of(self, w: int) -> range:
        """The executions (indexes in ``exec_*``) that interval ``w`` holds, in entry order."""
        first = self.interval_first[w]
        return range(first, first + self.interval_count[w])

    def step_ns(self) -> Array:
        """Each interval's step time in ns (float): its length shared equally by its executions
        (the one derivation of an execution's step time; index it by ``exec_interval``)."""
        return (int64s(self.interval_end) - int64s(self.interval_start)) / int64s(self.interval_count)

    def intervals_ns(self) -> int:
        """The time of all its step intervals together (the step time of its executions)."""
        return int(int64s(self.interval_end).sum() - int64s(self.interval_start).sum())

    def repeat_index(self) -> Array:
        """Each execution's run of its step in the session: 0 the first, 1 the second, ..."""
        return occurrence(int64s(self.exec_step))

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

    def carve_columns(self, a: int, b: int) -> tuple[Array, Array, Array, list[str]]:
        """:meth:`carve` of a long stretch (a run of many intervals) as columns: the pieces'
        starts, ends and labels (codes into the list of names returned last), in numpy rather
        than a Python step per piece. The same pieces as :meth:`carve`, which a single interval
        uses (a few pieces: cheaper without numpy); a test holds the two equal."""
        import numpy as np

        starts, ends = int64s(self.over_start), int64s(self.over_end)
        names = [PRODUCTIVE]  # code 0: the time between overhead intervals
        if b <= a:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), names
        i = max(0, int(np.searchsorted(starts, a, side="right")) - 1)
        j = max(i, int(np.searchsorted(starts, b, side="left")))
        s0, e0 = starts[i:j], np.minimum(ends[i:j], b)
        labels = self.over_label[i:j]
        codes = np.zeros(len(labels), dtype=np.int32)
        found = [name for name in dict.fromkeys(labels) if name != PRODUCTIVE]
        if found:
            objects = np.array(labels, dtype=object)
            for name in found:  # a few categories: one comparison each
                codes[objects == name] = len(names)
                names.append(name)
            del objects
        if self.skips_data and DATA in names:
            keep = codes != names.index(DATA)
            s0, e0, codes = s0[keep], e0[keep], codes[keep]
        # the cursor before each overhead interval: where the pieces before it end
        reach = np.maximum.accumulate(e0) if len(e0) else e0
        cursor = np.maximum(np.concatenate(([np.int64(a)], reach[:-1])), a)
        kept = e0 > cursor
        s0, e0, codes, cursor = s0[kept], e0[kept], codes[kept], cursor[kept]
        s = np.maximum(s0, cursor)
        del s0, kept
        last = max(a, int(reach[-1])) if len(reach) else a
        del reach
        n = len(s)
        # each interval as (the gap before it, itself), then the gap after the last: 2n + 1 pieces
        out_s = np.empty(2 * n + 1, dtype=np.int64)
        out_e = np.empty(2 * n + 1, dtype=np.int64)
        out_l = np.zeros(2 * n + 1, dtype=np.int32)
        out_s[0:2 * n:2], out_e[0:2 * n:2] = cursor, s
        out_s[1:2 * n:2], out_e[1:2 * n:2], out_l[1:2 * n:2] = s, e0, codes
        del s, e0, codes, cursor
        out_s[2 * n], out_e[2 * n] = last, b
        real = out_e > out_s
        if not real.all():
            out_s, out_e, out_l = out_s[real], out_e[real], out_l[real]
        del real
        if not len(out_s):
            return out_s, out_e, out_l, names
        # merged where adjacent and alike, as _add merges them one by one
        new = np.ones(len(out_s), dtype=bool)
        new[1:] = (out_l[1:] != out_l[:-1]) | (out_s[1:] != out_e[:-1])
        firsts = np.flatnonzero(new)
        lasts = np.concatenate((firsts[1:] - 1, [len(out_s) - 1]))
        return out_s[firsts], out_e[lasts], out_l[firsts], names

    def carve(self, a: int, b: int) -> list[Piece]:
        """[a, b) inside the step intervals cut at the overhead (productive elsewhere; in an
        asynchronous loop, in-step data loading too): the pieces of the intervals there
        before any relabel, merged where adjacent and alike."""
        return self._carve(a, b, PRODUCTIVE, skip_data=self.skips_data)

    def interval_pieces(self, w: int) -> list[Piece]:
        """The pieces of interval ``w`` (productive and overhead), in time order."""
        pieces = self.carve(self.interval_start[w], self.interval_end[w])
        moved = self.data_moved.get(w)
        pieces = relabel(pieces, moved, DATA, from_end=False) if moved else pieces
        recovered = self.recovered.get(w)  # before the rewind that this interval's first execution follows
        return relabel(pieces, recovered, schema.BUCKET_DISRUPTION, from_end=False) if recovered else pieces

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


_DEVICE_DATED = frozenset({schema.SYNC_LAG, schema.SYNC_POLL, schema.SYNC_BLOCKING, schema.SYNC_FINISH})


def cut_session(
    info: SessionInfo,
    rec: SessionRecords,
    *,
    tail_label: str,
    close_trailing: bool,
    data_rule: str | None = None,
    overhead: frozenset[str] | None = None,
) -> SessionCut:
    """Cut one session (see the module docstring). ``tail_label`` names the time after the
    last interval (``teardown``, ``disruption`` or ``in_progress``, by how the attempt ended);
    ``close_trailing``: executions after the last sync point are closed at their host exit
    (a normal end) rather than left incomplete (a crash)."""
    import numpy as np

    categories = (overhead or schema.OVERHEAD_CATEGORIES) | info.overhead_categories
    start = info.proc_start
    end = max(info.last_seen, start)
    seqs, numbers, t0s, t1s = int64s(rec.step_seq), int64s(rec.step_number), int64s(rec.step_t0), int64s(rec.step_t1)
    keep = (t0s >= start) & (t1s <= end)
    if not keep.all():
        seqs, numbers, t0s, t1s = seqs[keep], numbers[keep], t0s[keep], t1s[keep]
    del keep
    n = len(seqs)
    # A session's columns are as long as its run (millions of executions): each result is
    # stored once it is made and viewed from there, and what is not needed any more is
    # released, so that the cut's temporaries stay a few columns at a time.
    times, hows, how_names, ignored = assign_syncs(rec, seqs, numbers, t0s)
    host_timed = n > 0 and bool((times == NO_TIME).all())
    if host_timed:
        times, hows, how_names = t1s.copy(), np.zeros(n, dtype=np.intc), (schema.SYNC_HOST,)
    out = SessionCut(info.index, start, end, RULE_SYNC_POINTS, host_timed, tail_label)
    flags = ints(n)
    flags[occurrence(numbers) > 0] |= FLAG_REPEATED
    if n > 1:
        flags[1:][numbers[1:] < numbers[:-1]] |= FLAG_DECREASING
    thrown, out.rewinds = find_rewinds(numbers, t0s, rec.events)
    flags[thrown] |= FLAG_REWOUND
    del thrown
    # Intervals: each execution whose sync point comes after every earlier one closes one.
    has = np.flatnonzero(times != NO_TIME)
    first_start = int(t0s[0]) if n else start
    if len(has):
        at = times[has]
        # a tie (two completions one poll found) is a zero-length interval, not an unordered sync point
        in_order = (at >= np.maximum.accumulate(np.concatenate(([np.int64(first_start)], at[:-1])))) & (
            at > first_start)
        del at
    else:
        in_order = np.zeros(0, dtype=bool)
    accepted = has[in_order]
    flags[has[~in_order]] |= FLAG_UNORDERED_SYNC
    ignored += len(has) - len(accepted)
    del has, in_order
    closing = len(accepted)  # each column made where it is kept (ints), not made and copied
    interval_end = np.take(times, accepted, out=ints(closing))
    interval_start, interval_first = ints(closing), ints(closing)
    if closing:
        interval_start[0] = first_start
        interval_start[1:] = interval_end[:-1]
        np.add(accepted[:-1], 1, out=interval_first[1:])
    interval_count = np.subtract(accepted, interval_first, out=ints(closing))
    interval_count += 1
    interval_how = array("i", hows[accepted].tobytes()) if closing else array("i")
    interval_of = ints(n)
    interval_of.fill(-1)
    if closing:  # the interval of each execution: how many intervals closed before it
        last = int(accepted[-1]) + 1
        if last == closing:  # each its own (the common case)
            interval_of[:last] = np.arange(last)
        else:
            closed = np.zeros(last, dtype=np.int64)
            closed[accepted[:-1] + 1] = 1
            np.cumsum(closed, out=interval_of[:last])
            del closed
    trailing = int(accepted[-1]) + 1 if closing else 0
    del accepted
    cursor = int(interval_end[-1]) if len(interval_end) else first_start
    if trailing < n and close_trailing:  # executions after the last sync point, at a normal end
        exit_t = int(t1s[trailing:].max())
        if exit_t > cursor:
            interval_of[trailing:] = len(interval_end)
            flags[trailing:] |= FLAG_HOST_TIMED
            interval_start = np.concatenate((interval_start, [cursor]))
            interval_end = np.concatenate((interval_end, [exit_t]))
            interval_first = np.concatenate((interval_first, [trailing]))
            interval_count = np.concatenate((interval_count, [n - trailing]))
            interval_how.append(len(how_names))  # HOST_EXIT
        elif len(interval_end):
            interval_of[trailing:] = len(interval_end) - 1
            interval_count[-1] += n - trailing
    if host_timed:
        flags |= FLAG_HOST_TIMED
    out.exec_seq, out.exec_step, out.exec_t0 = int_array(seqs), int_array(numbers), int_array(t0s)
    out.exec_interval, out.ignored_syncs = int_array(interval_of), int(ignored)
    del interval_of
    out.exec_flags = int_array(flags)
    flags = int64s(out.exec_flags)
    out.interval_start, out.interval_end = int_array(interval_start), int_array(interval_end)
    out.interval_first, out.interval_count = int_array(interval_first), int_array(interval_count)
    del interval_first, interval_count
    interval_start, interval_end = int64s(out.interval_start), int64s(out.interval_end)
    out.exec_compute = int_array(_compute_of(rec, seqs))
    out.interval_how = Labels(interval_how, (*how_names, HOST_EXIT))
    device_idle = schema.DEVICE_IDLE_METRIC in rec.device
    out.data_rule = data_rule or (RULE_DEVICE_IDLE if device_idle else RULE_SYNC_POINTS)
    # the device-dated sync point of each execution (a blocking span may have waited for it), and
    # each counted sync point (the host-overhead rule: until then the device had the step's work)
    counted = (flags & FLAG_UNORDERED_SYNC) == 0
    dated = codes_in(hows, how_names, _DEVICE_DATED)
    del hows
    device_dated = np.where(dated & counted, times, NO_TIME)
    synced = np.where(counted & (times != NO_TIME), times, NO_TIME)
    del dated, times, flags, counted
    steps_range = (int(first_start), int(interval_end[-1])) if len(interval_end) else None
    mode = "skip" if out.skips_data else "keep" if out.data_rule == RULE_SYNC else "clip"
    flat = flatten_overhead(
        rec, categories, info.blocking_categories or schema.BLOCKING_CATEGORIES, t0s, t1s, device_dated, synced,
        start, end, data_mode=mode, steps_range=steps_range,
    )
    del device_dated, synced
    out.over_start, out.over_end, out.over_label = int_array(flat.starts), int_array(flat.ends), flat.labels
    out.overlapped_ns = flat.overlapped_ns
    out.uncertain_ns = 0 if host_timed else flat.uncertain_ns
    labels = flat.labels
    del flat
    out.interval_productive, out.interval_overhead = overhead_per_interval(
        out.skips_data, interval_start, interval_end, int64s(out.over_start), int64s(out.over_end), labels)
    if out.data_rule == RULE_DEVICE_IDLE:
        _charge_device_idle(out, rec)
    if out.rewinds:
        charge_recovery(out)
    return out


def _compute_of(rec: SessionRecords, seqs: Array) -> Array:
    """Each execution's outermost compute ns (0: none), from the records' (seq, ns) pairs."""
    import numpy as np

    if not len(rec.compute_ns) or not len(seqs):
        return ints(len(seqs))
    keys = np.frombuffer(rec.compute_seq, dtype=np.int64)
    values = np.frombuffer(rec.compute_ns, dtype=np.int64)
    if not bool((keys[1:] >= keys[:-1]).all()):  # the loader sorts them by seq: no copy then
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        del order
    at = positions(keys, seqs)
    out: Array = np.take(values, np.maximum(at, 0), out=ints(len(seqs)))
    out[at < 0] = 0
    return out


def _charge_device_idle(out: SessionCut, rec: SessionRecords) -> None:
    """CUDA device timing: the device-idle gap before a step, up to that step's data-loading
    time, becomes ``data`` in the step's interval."""
    idle = {step: round(v * 1e9) for step, v in rec.device.get(schema.DEVICE_IDLE_METRIC, {}).items() if v > 0}
    loading: dict[int, int] = {}
    for category, t0, t1, step in zip(rec.span_category, rec.span_t0, rec.span_t1, rec.span_step, strict=True):
        if category == DATA and step != NO_TIME:
            loading[step] = loading.get(step, 0) + (t1 - t0)
    for w in range(len(out.interval_start)):
        steps = [out.exec_step[i] for i in out.executions_of(w)]
        amount = min(sum(min(idle.get(s, 0), loading.get(s, 0)) for s in steps), out.interval_productive[w])
        if amount > 0:
            out.data_moved[w] = amount
            out.interval_productive[w] -= amount
            column = out.interval_overhead.get(DATA)
            if column is None:
                column = out.interval_overhead[DATA] = array("q", bytes(8 * len(out.interval_start)))
            column[w] += amount
