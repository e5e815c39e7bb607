"""A session's step detail: its tags and metric values, its events, and its spans' time per
name and step (the step table's rows and their anomalies read them), as columns sorted by step.

A tag, or a span's time, belongs to the step it was recorded in, except where it lies inside an
overhead span after that step's interval ended (a checkpoint inside step N's block, after its
completion, is in step N+1's interval: semantics, section 2): it then goes with the step whose
interval holds it, so a row's tags and its overhead, and an anomaly's spans and its interval,
agree (:func:`placed_steps`)."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from goodtrace import schema
from goodtrace.read.loaded import SessionDetail

if TYPE_CHECKING:
    from goodtrace.analysis.cut import SessionCut

__all__ = ["StepDetail", "placed_steps"]

_DEVICE_KEYS = (schema.DEVICE_BUSY_METRIC, "device_time_s")


class StepDetail:
    """One session's tags and metric values by step (columns sorted by step, time order kept
    within a step), and its spans' time per name and step, for the step table and anomalies."""

    def __init__(self, tl: SessionDetail, cut: SessionCut | None = None) -> None:
        import numpy as np

        self.tl = tl
        tag_steps = placed_steps(tl.tag_step, tl.tag_t, cut)
        self._tag_order = np.argsort(tag_steps, kind="stable")
        self._tag_steps = tag_steps[self._tag_order]
        metric_steps = np.frombuffer(tl.metric_step, dtype=np.int64)
        self._metric_order = np.argsort(metric_steps, kind="stable")
        self._metric_steps = metric_steps[self._metric_order]
        self._span_steps = np.frombuffer(tl.span_step, dtype=np.int64)  # the medians: by the step recorded
        placed = placed_steps(tl.span_step, tl.span_first, cut)  # the totals: by where the time lies
        self._placed_span_order = np.argsort(placed, kind="stable")
        self._placed_span_steps = placed[self._placed_span_order]
        self._span_medians: dict[str, float] | None = None
        self._events: dict[int, list[str]] | None = None
        self._rank: dict[int, int] | None = None

    def events(self, step: int) -> list[str]:
        """The names of the events recorded with ``step``, in time order (indexed once: an
        anomaly asks for its own steps', and a run may record an event every step)."""
        if self._events is None:
            self._events = {}
            for name, _, at, _ in self.tl.events:
                if at is not None:
                    self._events.setdefault(at, []).append(name)
        return self._events.get(step, [])

    def tags(self, step: int) -> tuple[str, ...]:
        """The tags of ``step``, in time order."""
        return self._tags_in(*self._range(self._tag_steps, step))

    def metrics(self, step: int) -> dict[str, float]:
        """The metric values recorded for ``step`` (the last one of a name it has twice)."""
        return self._metrics_in(*self._range(self._metric_steps, step))

    def tags_of(self, steps: Any) -> list[tuple[str, ...]]:
        """:meth:`tags` of each of ``steps`` (an integer column), found in one search."""
        return [self._tags_in(lo, hi) if hi > lo else () for lo, hi in self._ranges(self._tag_steps, steps)]

    def metrics_of(self, steps: Any) -> list[dict[str, float]]:
        """:meth:`metrics` of each of ``steps`` (an integer column), found in one search."""
        return [self._metrics_in(lo, hi) if hi > lo else {} for lo, hi in self._ranges(self._metric_steps, steps)]

    def _tags_in(self, lo: int, hi: int) -> tuple[str, ...]:
        names, codes = self.tl.names, self.tl.tag_name
        return tuple(names[codes[j]] for j in self._tag_order[lo:hi].tolist())

    def _metrics_in(self, lo: int, hi: int) -> dict[str, float]:
        names, codes, values = self.tl.names, self.tl.metric_name, self.tl.metric_value
        return {names[codes[j]]: values[j] for j in self._metric_order[lo:hi].tolist()}

    @property
    def tag_steps(self) -> Any:
        """The steps with tags (sorted, repeated where a step has several)."""
        return self._tag_steps

    def has_device_seconds(self) -> bool:
        """Whether the session recorded a device time per step (a metric of :data:`_DEVICE_KEYS`)."""
        return any(key in self.tl.names for key in _DEVICE_KEYS)

    def device_seconds(self, steps: Any) -> Any:
        """The device-busy time of each of ``steps`` where the framework measured it (NaN where
        not): per step the last value of the first metric of :data:`_DEVICE_KEYS` it has."""
        import numpy as np

        out = np.full(len(steps), np.nan)
        found = np.zeros(len(steps), dtype=bool)
        codes = np.frombuffer(self.tl.metric_name, dtype=np.int32)[self._metric_order]
        values = np.frombuffer(self.tl.metric_value, dtype=np.float64)[self._metric_order]
        for key in _DEVICE_KEYS:
            if key not in self.tl.names:
                continue
            mine = codes == self.tl.names.index(key)
            at_steps, at_values = self._metric_steps[mine], values[mine]
            last = np.concatenate((at_steps[1:] != at_steps[:-1], [True])) if len(at_steps) else np.zeros(0, dtype=bool)
            at_steps, at_values = at_steps[last], at_values[last]  # the last value of each step
            where = np.minimum(np.searchsorted(at_steps, steps), max(len(at_steps) - 1, 0))
            hit = ~found & (at_steps[where] == steps) if len(at_steps) else np.zeros(len(steps), dtype=bool)
            out[hit] = at_values[where[hit]]
            found |= hit
        return out

    def metric_sum(self, step: int, name: str) -> float:
        """The sum of every value of metric ``name`` recorded for ``step``."""
        lo, hi = self._range(self._metric_steps, step)
        total = 0.0
        for j in self._metric_order[lo:hi].tolist():
            if self.tl.names[self.tl.metric_name[j]] == name and self.tl.metric_value[j]:
                total += self.tl.metric_value[j]
        return total

    def span_totals(self, steps: Sequence[int]) -> dict[str, int]:
        """Summed span time per name over ``steps``, of the names with a span there (in order of
        first appearance: a run may have as many names as steps, so not all of them each time)."""
        took: dict[int, int] = {}
        for step in steps:
            lo, hi = self._range(self._placed_span_steps, step)
            for j in self._placed_span_order[lo:hi].tolist():
                code = self.tl.span_name[j]
                took[code] = took.get(code, 0) + self.tl.span_ns[j]
        rank = self._name_rank()
        return {self.tl.names[code]: took[code] for code in sorted(took, key=rank.__getitem__)}

    def _name_codes(self) -> list[int]:
        """The code of each span name (in order of first appearance): its first place in ``names``."""
        code_of: dict[str, int] = {}
        for k, name in enumerate(self.tl.names):
            code_of.setdefault(name, k)
        return [code_of[name] for name in self.tl.span_names]

    def _name_rank(self) -> dict[int, int]:
        """Each span name's code -> its place in the order of first appearance."""
        if self._rank is None:
            self._rank = {code: k for k, code in enumerate(self._name_codes())}
        return self._rank

    def span_medians(self) -> dict[str, float]:
        """Per span name, its median time per step over the steps that have any span (a step
        without the name counts 0): from the values sorted per name, the zeros counted, not
        made (a run may have as many names as steps)."""
        import numpy as np

        if self._span_medians is None:
            sorted_steps = self._span_steps  # sorted by step (SessionDetail)
            count = int(np.count_nonzero(sorted_steps[1:] != sorted_steps[:-1])) + 1 if len(sorted_steps) else 0
            codes = np.frombuffer(self.tl.span_name, dtype=np.int32)
            totals = np.frombuffer(self.tl.span_ns, dtype=np.int64)
            present = np.flatnonzero(np.bincount(codes)) if len(codes) else np.zeros(0, dtype=np.int64)
            if len(present) <= _FEW_NAMES:  # a pass per name, no sort of every row (millions: one per step and name)
                by_code = {code: _median_with_zeros_unsorted(totals[codes == code], count)
                           for code in present.tolist()}
                self._span_medians = {name: by_code.get(code, 0.0) if count else 0.0
                                      for name, code in zip(self.tl.span_names, self._name_codes(), strict=True)}
                return self._span_medians
            order = np.lexsort((totals, codes))  # by name, then by value
            codes, totals = codes[order], totals[order]
            bounds: dict[int, tuple[int, int]] = {}  # code -> its rows
            if len(codes):
                firsts = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
                ends = np.concatenate((firsts[1:], [len(codes)]))
                bounds = {code: (lo, hi) for code, lo, hi in
                          zip(codes[firsts].tolist(), firsts.tolist(), ends.tolist(), strict=True)}
            self._span_medians = {}
            for name, code in zip(self.tl.span_names, self._name_codes(), strict=True):
                lo, hi = bounds.get(code, (0, 0))
                self._span_medians[name] = _median_with_zeros(totals[lo:hi], count) if count else 0.0
        return self._span_medians

    @staticmethod
    def _range(sorted_steps: Any, step: int) -> tuple[int, int]:
        lo = int(sorted_steps.searchsorted(step, side="left"))
        hi = int(sorted_steps.searchsorted(step, side="right"))
        return lo, hi

    @staticmethod
    def _ranges(sorted_steps: Any, steps: Any) -> Iterator[tuple[int, int]]:
        """:meth:`_range` of each of ``steps``."""
        lo = sorted_steps.searchsorted(steps, side="left")
        hi = sorted_steps.searchsorted(steps, side="right")
        return zip(lo.tolist(), hi.tolist(), strict=True)


def placed_steps(steps: Any, times: Any, cut: SessionCut | None) -> Any:
    """The step each mark goes with (an int64 column; ``steps`` as recorded, ``times`` when the
    mark was recorded, or its span's first start): its own, but where the mark lies inside one
    of ``cut``'s main-thread overhead spans, and that span starts in a step interval after the
    interval of the execution the mark was recorded in (its step, entered last before it), the
    step of the interval that holds the span's start (a span starting at an interval's end is
    the next interval's). A mark in the host's lead (before its step's interval) keeps its step."""
    import numpy as np

    placed = np.array(_ints_of(steps))  # a copy
    if cut is None or not len(placed) or not len(cut.over_start) or not cut.intervals or len(times) != len(placed):
        return placed
    t = _ints_of(times)
    over_start, over_end = _ints_of(cut.over_start), _ints_of(cut.over_end)
    o = np.searchsorted(over_start, t, side="right") - 1
    inside = (o >= 0) & (t <= over_end[np.maximum(o, 0)])
    candidates = np.flatnonzero(inside)
    if not len(candidates):
        return placed
    t = t[candidates]
    start = over_start[o[candidates]]  # the overhead span the mark lies in: where it starts
    interval_start, interval_end = _ints_of(cut.interval_start), _ints_of(cut.interval_end)
    holding = np.searchsorted(interval_end, start, side="right")
    holding_ok = holding < len(interval_end)
    holding = np.minimum(holding, len(interval_end) - 1)
    holding_ok &= interval_start[holding] <= start
    exec_t0, exec_step, exec_interval = _ints_of(cut.exec_t0), _ints_of(cut.exec_step), _ints_of(cut.exec_interval)
    entered = np.searchsorted(exec_t0, t, side="right") - 1
    entered_ok = entered >= 0
    entered = np.maximum(entered, 0)
    own = exec_interval[entered]
    move = (holding_ok & entered_ok & (exec_step[entered] == placed[candidates]) & (own >= 0)
            & (holding > own))
    if bool(move.any()):
        first = _ints_of(cut.interval_first)
        placed[candidates[move]] = exec_step[first[holding[move]]]
    return placed


def _ints_of(column: Any) -> Any:
    import numpy as np

    return np.frombuffer(column, dtype=np.int64) if isinstance(column, array) else np.asarray(column, dtype=np.int64)


_FEW_NAMES = 16  # span names up to which their medians are taken name by name (else from one sort)


def _median_with_zeros_unsorted(values: Any, count: int) -> float:
    """:func:`_median_with_zeros` of ``values`` in any order: the two places it reads, from a
    partition of them."""
    import numpy as np

    zeros = count - len(values)
    below = int(np.count_nonzero(values < 0))  # the values sorted before the zeros
    lo, hi = (count - 1) // 2, count // 2
    places = sorted({p if p < below else p - zeros for p in (lo, hi) if not below <= p < below + zeros})
    part = np.partition(values, places) if places else values
    return _median_with_zeros(part, count, below)


def _median_with_zeros(values: Any, count: int, below: int | None = None) -> float:
    """``np.median`` of ``values`` (sorted, or partitioned at the places read; ``below``: how many
    are negative) with ``count - len(values)`` zeros beside them, to the bit: the middle
    element, or the float64 mean of the middle two."""
    import numpy as np

    zeros = count - len(values)
    if below is None:
        below = int(np.searchsorted(values, 0, side="left"))  # the values sorted before the zeros

    def at(position: int) -> Any:
        if position < below:
            return values[position]
        if position < below + zeros:
            return np.int64(0)
        return values[position - zeros]

    lo, hi = (count - 1) // 2, count // 2
    return float(np.mean(np.array([at(lo), at(hi)], dtype=np.int64))) if lo != hi else float(np.mean(np.array([at(lo)])))
