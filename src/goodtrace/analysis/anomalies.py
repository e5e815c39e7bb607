"""Step-time statistics and step-time anomalies over the step table
(:class:`~goodtrace.analysis.steps.StepTable`; pure functions). Anomalies: productive time
above median + k * 1.4826 * MAD (floored at 5% of the median), each with what overlapped it:
tags, overhead, unusually long spans, events and a device-idle gap."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from goodtrace import schema
from goodtrace.analysis.cut import FLAG_DECREASING, FLAG_REPEATED
from goodtrace.analysis.partition import WARMUP, WASTED, StepInterval
from goodtrace.analysis.step_detail import StepDetail
from goodtrace.analysis.steps import NS, StepTable
from goodtrace.columns import median
from goodtrace.record.live.change_point import interpolate

__all__ = ["Anomaly", "StepStats", "find_anomalies", "step_stats"]


@dataclasses.dataclass(frozen=True)
class StepStats:
    count: int
    mean_s: float
    median_s: float
    p90_s: float
    p99_s: float
    max_s: float
    ideal_s: float | None
    shared_steps: int
    host_timed_steps: int
    repeated_steps: int = 0
    decreasing_steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_QUANTILES = (0.5, 0.9, 0.99)  # the step statistics' median, p90 and p99


def _quantile(sorted_values: Any, q: float) -> float:
    """The ``q`` quantile (linear between the two places around it) of values sorted at least
    at those two places (a partition there will do)."""
    if not len(sorted_values):
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return interpolate(float(sorted_values[lo]), float(sorted_values[hi]), pos - lo)


def step_stats(table: StepTable, ideal_s: float | None) -> StepStats:
    import numpy as np

    times = table.step_time_s
    n = len(times)
    if n:
        # the places the quantiles read, in sorted order: a partition, not a sort of the run
        places = sorted({p for q in _QUANTILES for p in (int(q * (n - 1)), min(int(q * (n - 1)) + 1, n - 1))} | {n - 1})
        times = np.partition(times, places)
    return StepStats(
        count=n,
        # exact: the order does not matter; over the array's float64 values as they lie (a list of
        # a million floats took 0.1 s)
        mean_s=math.fsum(np.ascontiguousarray(times, dtype=np.float64).data) / n if n else 0.0,
        median_s=_quantile(times, 0.5),
        p90_s=_quantile(times, 0.9),
        p99_s=_quantile(times, 0.99),
        max_s=float(times[-1]) if len(times) else 0.0,
        ideal_s=ideal_s,
        shared_steps=int((table.shared > 1).sum()),
        host_timed_steps=int(table.host_timed.sum()),
        repeated_steps=int(((table.flags & FLAG_REPEATED) != 0).sum()),
        decreasing_steps=int(((table.flags & FLAG_DECREASING) != 0).sum()),
    )


@dataclasses.dataclass(frozen=True)
class Anomaly:
    step: int
    attempt: int
    productive_s: float
    threshold_s: float
    step_time_s: float
    overlapped: tuple[str, ...]  # tags, overhead, unusually long spans, events, device-idle gap
    seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        # every field is a number but ``overlapped``: no deep copy (dataclasses.asdict took 50 us
        # an anomaly, seconds for a noisy loop's hundred thousand)
        return {f.name: getattr(self, f.name) for f in _FIELDS} | {"overlapped": list(self.overlapped)}


_FIELDS = dataclasses.fields(Anomaly)


def find_anomalies(table: StepTable, *, k: float = 5.0) -> tuple[list[Anomaly], float | None]:
    """Steps (not the first of an attempt) whose productive time exceeds median + k*MAD."""
    import numpy as np

    steady = table.productive_s[~table.first_of_attempt]
    if len(steady) < 3:
        return [], None
    middle = median(steady)
    mad = median(np.abs(steady - middle))
    threshold = middle + max(k * 1.4826 * mad, 0.05 * middle)
    found = []
    rows = np.flatnonzero(~table.first_of_attempt & (table.productive_s > threshold))
    # the row's own columns, not its StepRow (its metrics and overhead per step are not read here)
    for i, productive_s, step_time_s in zip(rows.tolist(), table.productive_s[rows].tolist(),
                                            table.step_time_s[rows].tolist(), strict=True):
        interval, execution = table.execution_at(i)
        step, seq = interval.cut.exec_step[execution], interval.cut.exec_seq[execution]
        detail = table.detail_of(interval.cut.session)
        tags = detail.tags(step) if detail is not None else ()
        found.append(Anomaly(step, interval.attempt, productive_s, threshold, step_time_s,
                             _overlapping(interval, table, tags), seq))
    return found, threshold


def _unusual(detail: StepDetail, steps: Sequence[int]) -> list[str]:
    """The spans that took unusually long in ``steps``: more than 1.5x their usual time per
    step, and at least 1 ms more (the five largest excesses)."""
    found = []
    medians = detail.span_medians()
    for name, took in detail.span_totals(steps).items():
        usual = medians[name] * len(steps)
        if took > 1.5 * usual and took - usual >= 0.001 * NS:
            found.append((took - usual, f"span:{name} {took / NS:.3f}s (usually {usual / NS:.3f}s)"))
    return [label for _, label in sorted(found, key=lambda x: -x[0])[:5]]


def _overlapping(w: StepInterval, table: StepTable, tags: tuple[str, ...]) -> tuple[str, ...]:
    found = [f"tag:{t}" for t in tags]
    detail = table.detail_of(w.cut.session)
    if detail is None:
        return tuple(found)
    for label, length in sorted(w.overhead().items(), key=lambda kv: -kv[1]):
        if label not in (WASTED, WARMUP):
            found.append(f"{label}:{length / NS:.3f}s")
    steps = sorted({w.cut.exec_step[i] for i in w.executions})
    found.extend(_unusual(detail, steps))
    found.extend(f"event:{name}" for step in steps for name in detail.events(step))
    idle = sum(detail.metric_sum(step, schema.DEVICE_IDLE_METRIC) for step in steps)
    if idle > 0:
        found.append(f"device_idle:{idle:.3f}s")
    return tuple(dict.fromkeys(found))
