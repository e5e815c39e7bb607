"""Per-rank spread and stragglers (pure functions over every rank's cut sessions).

Every rank is analysed: its goodput (its own partition, in totals), its step times and its
outermost compute time per execution come from the same cut as the reference rank's. A rank is
compared with the median of the *other* ranks, never with a median that includes itself (with
two ranks that would hide the slow one):

- relative compute speed = the other ranks' median compute time per execution ÷ this rank's;
- arrival lateness at sync points: when its steps became ready on the aligned clock, minus the
  other ranks' median, and how often it was the last;
- span-start lateness: how long after entering a sampled step it entered each span of that step,
  minus the other ranks' median, per span name. With a collective inside the step every rank
  finishes (and starts the next step) together, but the slow rank enters the span that holds the
  collective late. Offsets within the rank's own step need no clock alignment, so ranks that run
  independently and drift apart are not named for it.

Each is also measured step by step (:func:`_effects`), and a rank is named only where the
difference is evidence beyond noise (:mod:`goodtrace.analysis.evidence`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from goodtrace.analysis.clock import SessionClock
from goodtrace.analysis.cut import SessionCut
from goodtrace.analysis.evidence import Evidence
from goodtrace.columns import MAD_TO_SIGMA, median, order_of, quantile, robust_noise
from goodtrace.read.loaded import SessionInfo, SessionRecords, sample_stride

NS = 1e9
SLOW_SPEED = 0.9  # a rank computing at < 90% of the other ranks' speed is named
LATE_FRACTION = 0.5  # ... or one that is the last to arrive at more than half the sync points


@dataclasses.dataclass(frozen=True)
class RankFigure:
    rank: int
    host: str
    goodput: float | None
    step_time_median_s: float | None
    step_time_p90_s: float | None
    compute_median_s: float | None
    relative_speed: float | None  # the other ranks' median compute time / this rank's
    lateness_median_s: float | None  # sync points, vs the other ranks' median
    late_fraction: float | None  # share of sync points where this rank was the last
    start_lateness_s: float | None = None  # the largest median span-start lateness, by span name
    late_span: str | None = None  # ... of this span
    # the evidence behind each figure (docs/semantics.md section 7): per sampled step, against
    # the other ranks' median; None where the rank shares no sampled step with another
    compute_evidence: Evidence | None = None  # compute time per step
    arrival_evidence: Evidence | None = None  # arrival at sync points (noise: its step times')
    start_evidence: Evidence | None = None  # entry into ``late_span``

    def to_dict(self) -> dict[str, Any]:
        # asdict's deep copy took ~100 us a rank (a second of 10,000 ranks' report): every
        # field is a number, a string, None or an Evidence of numbers
        return {f.name: (v.to_dict() if isinstance(v := getattr(self, f.name), Evidence) else v)
                for f in _FIGURE_FIELDS}


_FIGURE_FIELDS = dataclasses.fields(RankFigure)


@dataclasses.dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RankSpread:
    ranks: int
    analysed: int  # ranks whose partition was computed (all of them)
    goodput_min: float | None
    goodput_median: float | None
    goodput_max: float | None
    step_time_median_min_s: float | None
    step_time_median_max_s: float | None
    per_rank: tuple[RankFigure, ...]

    def to_dict(self) -> dict[str, Any]:
        # the ranks' figures converted once, in their place among the fields (not by asdict first)
        return {f.name: [r.to_dict() for r in self.per_rank] if f.name == "per_rank" else getattr(self, f.name)
                for f in dataclasses.fields(self)}


def _leave_one_out(values: dict[int, float]) -> dict[int, float]:
    """Per key, the median of the other keys' values (keys with a value only, at least two)."""
    import numpy as np

    if len(values) < 2:
        return {}
    keys = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
    v = np.fromiter(values.values(), dtype=np.float64, count=len(values))
    order = np.argsort(v, kind="stable")
    s = v[order]
    n = len(s) - 1  # the others
    i = np.arange(len(s))

    def at(j: int) -> Any:  # element j of the sorted values without position i, for every i
        return np.where(j < i, s[j], s[min(j + 1, len(s) - 1)])

    others = at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
    return dict(zip(keys[order].tolist(), others.tolist(), strict=True))


def sample_strides(sessions: Iterable[SessionInfo], attempt_of: Mapping[int, int]) -> dict[int, int]:
    """Per attempt, the stride of the steps its ranks are compared at (:func:`sample_stride` of
    the attempt's step range, its sessions' together): chosen once per attempt, so that ranks
    whose records end (or begin) at different steps share the sample."""
    ranges: dict[int, tuple[int, int]] = {}
    for s in sessions:
        attempt = attempt_of.get(s.index)
        if attempt is None or s.first_step is None or s.last_step is None:
            continue
        lo, hi = ranges.get(attempt, (s.first_step, s.last_step))
        ranges[attempt] = (min(lo, s.first_step), max(hi, s.last_step))
    return {attempt: sample_stride(lo, hi) for attempt, (lo, hi) in ranges.items()}


def _groups(*keys: Any) -> tuple[Any, Any, Any]:
    """For rows keyed by the arrays ``keys`` (sorted by them, see :func:`_last_per_key`): each
    row's group start, group size and position in its group."""
    import numpy as np

    n = len(keys[0])
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
        for k in keys:
            change[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(change)
    sizes = np.diff(np.append(starts, n))
    first = np.repeat(starts, sizes)
    return first, np.repeat(sizes, sizes), np.arange(n) - first


def _sorted_within(values: Any, first: Any, size: Any, pos: Any) -> Any:
    """``values`` (floats, rows grouped as :func:`_groups` says) sorted within each group, NaN
    last: as a sort by (group, value) orders them, but each group sorted on its own, as a row of
    a table (a rank's samples are tens of rows; 10,000 ranks make millions, whose one sort
    took most of the rank figures' time). Falls back to that one sort where the largest group
    would make the table four times the rows or more."""
    import numpy as np

    n = len(values)
    if not n:
        return values
    heads = np.flatnonzero(pos == 0)
    width = int(size.max())
    if len(heads) * width > 4 * n:
        group = np.repeat(np.arange(len(heads)), size[heads])
        return values[np.lexsort((values, group))]
    row = np.repeat(np.arange(len(heads)), size[heads])
    table = np.full((len(heads), width), np.nan)
    table[row, pos] = values
    table.sort(axis=1)  # NaN last: a row's own values first, its padding after them
    return table[row, pos]


def _last_per_key(keys: list[Any], values: list[Any]) -> tuple[list[Any], list[Any]]:
    """Rows sorted by ``keys`` (the last key varies fastest), one per distinct key: the last
    one given (as a dict assignment per row would keep)."""
    import numpy as np

    order = order_of(*keys)  # stable: equal keys stay in the order given
    keys, values = [k[order] for k in keys], [v[order] for v in values]
    n = len(order)
    last = np.ones(n, dtype=bool)
    if n:
        same = np.ones(n - 1, dtype=bool)
        for k in keys:
            same &= k[1:] == k[:-1]
        last[:-1] = ~same
    return [k[last] for k in keys], [v[last] for v in values]


def _others_median(first: Any, size: Any, pos: Any, ordered: Any) -> Any:
    """Per row, the median of the other rows of its group (``ordered``: values sorted within
    each group; NaN for a group of one). The arithmetic of :func:`_leave_one_out`."""
    import numpy as np

    n = size - 1

    def at(j: Any) -> Any:
        return np.where(j < pos, ordered[first + j], ordered[first + np.minimum(j + 1, size - 1)])

    half = n // 2
    odd = at(half)
    even = (at(np.maximum(half - 1, 0)) + at(half)) / 2
    return np.where(size < 2, np.nan, np.where(n % 2 == 1, odd, even))


def _group_medians(first: Any, size: Any, pos: Any, ordered: Any) -> Any:
    """The median of each group (rows sorted by value within groups), at its first row: the
    arithmetic of ``statistics.median``."""
    import numpy as np

    heads = np.flatnonzero(pos == 0)
    start, n = first[heads], size[heads]
    mid = start + n // 2
    return heads, np.where(n % 2 == 1, ordered[mid], (ordered[np.maximum(mid - 1, start)] + ordered[mid]) / 2)


def _arrival_lateness(parts: list[tuple[Any, ...]]) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank, the median of (its arrival - the median arrival of the other ranks) over the
    sampled sync points every two or more ranks reached, in seconds, and the fraction of them
    it reached last. ``parts``: (attempt, step, rank, aligned time) columns."""
    import numpy as np

    if not parts:
        return {}, {}
    attempt, step, rank, t = (np.concatenate(c) for c in zip(*parts, strict=True))
    (attempt, step, rank), (t,) = _last_per_key([attempt, step, rank], [t])  # one per rank and step
    order = np.lexsort((t, step, attempt))  # by sync point, then by time within it
    attempt, step, rank, t = attempt[order], step[order], rank[order], t[order]
    first, size, pos = _groups(attempt, step)
    keep = size >= 2
    others = _others_median(first, size, pos, t.astype(np.float64))
    latest = t[first + size - 1]
    late_s = (t.astype(np.float64) - others) / NS
    rank, late_s, is_last = rank[keep], late_s[keep], (t == latest)[keep]
    order = np.lexsort((late_s, rank))
    rank, late_s, is_last = rank[order], late_s[order], is_last[order]
    first, size, pos = _groups(rank)
    heads, medians = _group_medians(first, size, pos, late_s)
    counts = np.add.reduceat(is_last.astype(np.int64), heads) if len(heads) else np.zeros(0, dtype=np.int64)
    ranks = rank[heads].tolist()
    return (dict(zip(ranks, medians.tolist(), strict=True)),
            dict(zip(ranks, (counts / size[heads]).tolist(), strict=True)))


def _effects(parts: list[tuple[Any, ...]]) -> dict[tuple[int, int], Evidence]:
    """Per (rank, code), the evidence of its values against the other ranks' at the same sampled
    steps: the median over steps of (its value - the other ranks' median), the share of steps
    where that is positive, how many steps, and 1.4826 x the MAD of its own values (its
    step-to-step noise). ``parts``: (attempt, step, code, rank, value in ns) columns; a later row
    of the same key replaces an earlier one."""
    import numpy as np

    if not parts:
        return {}
    attempt, step, code, rank, ns = (np.concatenate(c) for c in zip(*parts, strict=True))
    (attempt, step, code, rank), (ns,) = _last_per_key([attempt, step, code, rank], [ns])
    value = ns.astype(np.float64)
    order = np.lexsort((value, code, step, attempt))
    attempt, step, code, rank, value = attempt[order], step[order], code[order], rank[order], value[order]
    first, size, pos = _groups(attempt, step, code)
    keep = size >= 2
    diff = (value - _others_median(first, size, pos, value)) / NS
    rank, code, diff, value = rank[keep], code[keep], diff[keep], value[keep]
    # per (rank, code): its differences, its own values and their deviations, each sorted
    # within the group (groups of about SAMPLE_STEPS rows: a sort of each, not of them all)
    order = order_of(rank, code)
    rank, code = rank[order], code[order]
    first, size, pos = _groups(rank, code)
    diff = _sorted_within(diff[order], first, size, pos)
    heads, medians = _group_medians(first, size, pos, diff)
    if not len(heads):
        return {}
    behind = np.add.reduceat((diff > 0).astype(np.int64), heads)
    own = _sorted_within(value[order], first, size, pos)
    _, own_median = _group_medians(first, size, pos, own)
    deviation = _sorted_within(np.abs(own - np.repeat(own_median, size[heads])), first, size, pos)
    _, mad = _group_medians(first, size, pos, deviation)
    ranks, codes = rank[heads].tolist(), code[heads].tolist()
    return {
        (r, c): Evidence(effect_s=m, consistency=b / n, samples=n, noise_s=MAD_TO_SIGMA * d / NS)
        for r, c, m, b, n, d in zip(ranks, codes, medians.tolist(), behind.tolist(), size[heads].tolist(),
                                    mad.tolist(), strict=True)
    }


def _latest_span(effects: dict[tuple[int, int], Evidence], names: dict[int, str]) -> dict[int, tuple[Evidence, str]]:
    """Per rank, the span it enters latest: the largest median lateness among the spans whose
    lateness is beyond its noise (no floor), else among all; ties go to the first name
    alphabetically."""
    best: dict[int, tuple[bool, float, str, Evidence]] = {}
    for (r, c), e in sorted(effects.items(), key=lambda item: (item[0][0], names[item[0][1]])):
        key = (e.beyond_noise(), e.effect_s, names[c], e)
        if r not in best or key[:2] > best[r][:2]:
            best[r] = key
    return {r: (e, name) for r, (_, _, name, e) in best.items()}


@dataclasses.dataclass(frozen=True)
class RankSample:
    """What the rank figures keep of one rank once its sessions are cut (:func:`sample_rank`):
    its own step-time and compute figures, and per session the columns of its sampled steps
    (about :data:`~goodtrace.read.loaded.SAMPLE_STEPS` rows each), so that its cuts can be released before the next
    rank is cut. Arrival times are on the session's own clock (:func:`figures_of` aligns them)."""

    rank: int
    host: str
    step_time_median_s: float | None
    step_time_p90_s: float | None
    step_noise_s: float  # robust noise of its step times (:func:`robust_noise`)
    compute_ns: float | None  # median compute time per execution
    arrivals: tuple[tuple[Any, ...], ...] = ()  # (session, attempt, step, rank, end on its own clock)
    computes: tuple[tuple[Any, ...], ...] = ()  # (attempt, step, 0, rank, ns)
    starts: tuple[tuple[Any, ...], ...] = ()  # (attempt, step, span name code, rank, ns after the step's entry)


def sample_rank(
    rank: int,
    members: Sequence[SessionInfo],
    cuts: Mapping[int, SessionCut],
    records: Mapping[int, SessionRecords],
    attempt_of: Mapping[int, int],
    name_codes: dict[str, int],
    strides: Mapping[int, int],
) -> RankSample:
    """One rank's part of the rank figures, from its sessions' cuts (``members``, in the job's
    order; span names coded in ``name_codes``, shared by every rank), at the sampled steps of
    each attempt (the multiples of its stride in ``strides``, :func:`sample_strides`)."""
    import numpy as np

    times: list[Any] = []
    per_execution: list[Any] = []
    arrivals: list[tuple[Any, ...]] = []
    starts: list[tuple[Any, ...]] = []
    computes: list[tuple[Any, ...]] = []
    for s in members:
        cut = cuts.get(s.index)
        if cut is None:
            continue
        attempt = attempt_of[s.index]
        ends_w, counts_w, firsts_w, steps_e = cut.interval_end, cut.interval_count, cut.interval_first, cut.exec_step
        counts = np.frombuffer(counts_w, dtype=np.int64)
        if len(counts):
            times.append(np.repeat(cut.step_ns() / NS, counts))
        stride = strides.get(attempt, 1)
        if len(counts):
            w_step = np.frombuffer(steps_e, dtype=np.int64)[np.frombuffer(firsts_w, dtype=np.int64)]
            sampled = np.flatnonzero((counts == 1) & (w_step % stride == 0))
            ends = np.frombuffer(ends_w, dtype=np.int64)[sampled]
            arrivals.append((s.index, np.full(len(sampled), attempt, dtype=np.int64), w_step[sampled],
                             np.full(len(sampled), rank, dtype=np.int64), ends))
        if len(cut.exec_compute):
            ns = np.frombuffer(cut.exec_compute, dtype=np.int64)
            per_execution.append(ns[ns > 0])
            numbers = np.frombuffer(steps_e, dtype=np.int64)
            chosen = np.flatnonzero((ns > 0) & (numbers % stride == 0))
            computes.append((np.full(len(chosen), attempt, dtype=np.int64), numbers[chosen],
                             np.zeros(len(chosen), dtype=np.int64), np.full(len(chosen), rank, dtype=np.int64),
                             ns[chosen]))
        rec = records.get(s.index)
        if rec is not None and len(rec.starts_step) and len(steps_e):
            # each sampled step's entry: its first execution's (np.unique keeps the first index)
            numbers = np.frombuffer(steps_e, dtype=np.int64)
            if len(numbers) > 1 and not bool((numbers[1:] > numbers[:-1]).all()):
                numbers, first = np.unique(numbers, return_index=True)
                entered = np.frombuffer(cut.exec_t0, dtype=np.int64)[first]
            else:  # every step once, in order (the common case): no sort
                entered = np.frombuffer(cut.exec_t0, dtype=np.int64)
            wanted = np.frombuffer(rec.starts_step, dtype=np.int64)
            at = np.minimum(np.searchsorted(numbers, wanted), len(numbers) - 1)
            # (the loader's sample of the session's own range holds the attempt's: its steps)
            found = (numbers[at] == wanted) & (wanted % stride == 0)
            codes = np.array([name_codes.setdefault(n, len(name_codes)) for n in rec.starts_name], dtype=np.int64)
            late_ns = np.frombuffer(rec.starts_t0, dtype=np.int64) - entered[at]
            starts.append((np.full(int(found.sum()), attempt, dtype=np.int64), wanted[found], codes[found],
                           np.full(int(found.sum()), rank, dtype=np.int64), late_ns[found]))
    step_times = np.concatenate(times) if times else np.zeros(0)
    joined = np.concatenate(per_execution) if per_execution else np.zeros(0, dtype=np.int64)
    return RankSample(
        rank=rank,
        host=members[-1].host,
        step_time_median_s=median(step_times) if len(step_times) else None,
        step_time_p90_s=quantile(step_times, 0.9) if len(step_times) else None,
        step_noise_s=robust_noise(step_times),
        compute_ns=median(joined) if len(joined) else None,
        arrivals=tuple(arrivals),
        computes=tuple(computes),
        starts=tuple(starts),
    )


def figures_of(
    samples: Sequence[RankSample],
    clocks: Mapping[int, SessionClock],
    goodput_by_rank: Mapping[int, float],
    name_codes: Mapping[str, int],
) -> list[RankFigure]:
    """Every rank's figure from the ranks' samples (in the job's order of ranks): the cross-rank
    parts (relative speed, lateness, the evidence) over the sampled steps only."""
    import numpy as np

    arrivals: list[tuple[Any, ...]] = []
    for sample in samples:
        for session, attempt, step, rank, ends in sample.arrivals:
            clock = clocks.get(session)
            if clock is not None:
                ends = np.fromiter((clock.to_reference(t) for t in ends.tolist()), dtype=np.int64, count=len(ends))
            arrivals.append((attempt, step, rank, ends))
    compute = {s.rank: s.compute_ns for s in samples if s.compute_ns is not None}
    others_compute = _leave_one_out(compute)
    late, last_fraction = _arrival_lateness(arrivals)
    arrival_effects = _effects([(a, st, np.zeros(len(st), dtype=np.int64), r, t) for a, st, r, t in arrivals])
    compute_effects = _effects([part for s in samples for part in s.computes])
    worst_start = _latest_span(_effects([part for s in samples for part in s.starts]),
                               {code: name for name, code in name_codes.items()})
    by_rank = {s.rank: s for s in samples}
    figures = []
    for rank in sorted(by_rank):
        sample = by_rank[rank]
        c = compute.get(rank)
        reference = others_compute.get(rank)
        worst = worst_start.get(rank)
        figures.append(
            RankFigure(
                rank=rank,
                host=sample.host,
                goodput=goodput_by_rank.get(rank),
                step_time_median_s=sample.step_time_median_s,
                step_time_p90_s=sample.step_time_p90_s,
                compute_median_s=None if c is None else c / NS,
                relative_speed=None if c is None or reference is None or c <= 0 else reference / c,
                lateness_median_s=late.get(rank),
                late_fraction=last_fraction.get(rank),
                start_lateness_s=None if worst is None else worst[0].effect_s,
                late_span=None if worst is None else worst[1],
                compute_evidence=compute_effects.get((rank, 0)),
                arrival_evidence=_with_noise(arrival_effects.get((rank, 0)), sample.step_noise_s),
                start_evidence=None if worst is None else worst[0],
            )
        )
    return figures


def _with_noise(evidence: Evidence | None, noise_s: float) -> Evidence | None:
    """Arrival times have no step-to-step noise of their own: the rank's step times' is used."""
    return None if evidence is None else dataclasses.replace(evidence, noise_s=noise_s)


def spread_of(figures: Sequence[RankFigure]) -> RankSpread:
    goodputs = [f.goodput for f in figures if f.goodput is not None]
    medians = [f.step_time_median_s for f in figures if f.step_time_median_s is not None]
    return RankSpread(
        ranks=len(figures),
        analysed=len(goodputs),
        goodput_min=min(goodputs) if goodputs else None,
        goodput_median=statistics.median(goodputs) if goodputs else None,
        goodput_max=max(goodputs) if goodputs else None,
        step_time_median_min_s=min(medians) if medians else None,
        step_time_median_max_s=max(medians) if medians else None,
        per_rank=tuple(figures),
    )

def _late_text(seconds: float) -> str:
    """A rank's lateness as evidence names it: ``4.1 ms``, and from a second on ``502.5 s``
    (ranks that drift apart over a long run are seconds or minutes late, not millions of ms)."""
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if abs(ms) < 999.95 else f"{seconds:.1f} s"


def find_stragglers(figures: Sequence[RankFigure], ideal_step_s: float | None) -> list[Straggler]:
    """Ranks that compute slower than the others, arrive last at most sync points, or enter a
    span later than the others, each only where the difference is evidence beyond noise:
    consistent over the sampled steps and large against the rank's own step-to-step noise
    (:meth:`Evidence.beyond_noise`)."""
    if len(figures) < 2:
        return []
    floor = max(0.001, 0.02 * (ideal_step_s or 0.0))
    found = []
    for f in figures:
        reasons = []
        compute = f.compute_evidence
        if (f.relative_speed is not None and f.relative_speed < SLOW_SPEED
                and compute is not None and compute.beyond_noise()):
            reasons.append(f"computes at {f.relative_speed:.0%} of the other ranks' speed")
        arrival = f.arrival_evidence
        if (
            f.late_fraction is not None and f.late_fraction > LATE_FRACTION
            and f.lateness_median_s is not None and arrival is not None and arrival.beyond_noise(floor)
        ):
            reasons.append(
                f"last to arrive at {f.late_fraction:.0%} of sync points, "
                f"{_late_text(f.lateness_median_s)} after the other ranks (median)"
            )
        start = f.start_evidence
        if start is not None and start.beyond_noise(max(floor, 0.05 * (ideal_step_s or 0.0))):
            reasons.append(f"enters {f.late_span!r} {_late_text(start.effect_s)} after the other ranks (median)")
        if reasons:
            found.append(Straggler(f.rank, f.host, "; ".join(reasons)))
    return found
