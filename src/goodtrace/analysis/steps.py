"""The step table, step-time statistics and step-time anomalies (pure functions).

One row per step execution of the reference rank, in time order (``seq`` numbers executions
within a session; a repeated or decreasing step number is flagged, never merged). Step time is
the whole interval T_k - T_{k-1}; when several executions share an interval (sparse
completion) each gets the window average and ``shared`` is set; ``host_timed`` marks intervals
closed by a host exit rather than an observed sync point. Anomalies: productive time above
median + k * 1.4826 * MAD (floored at 5% of the median), each with what overlapped it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from goodtrace import schema
from goodtrace.analysis.executions import FLAG_DECREASING, FLAG_REPEATED, HOST_EXIT
from goodtrace.analysis.partition import PRODUCTIVE, WARMUP, WASTED, Timeline, Window
from goodtrace.read.loaded import SessionTimeline

NS = 1e9


@dataclasses.dataclass(frozen=True)
class StepRow:
    """One execution of one step on the reference rank. Times in seconds; ``start_s`` is
    relative to the job start."""

    step: int
    attempt: int
    start_s: float
    step_time_s: float
    productive_s: float
    overhead_s: dict[str, float]
    shared: int  # number of executions sharing the interval (1 = per-step truth)
    host_timed: bool
    first_of_attempt: bool
    counted: bool  # counts toward the final progress (False: re-done after a restart)
    seq: int = 0  # the execution within its session (entry order)
    start_ns: int = 0  # the interval (start_ns, end_ns] on the wall clock (shared when sparse)
    end_ns: int = 0
    sync: str = ""  # how the interval's closing sync point was taken
    repeated: bool = False  # this step number ran before in the same session
    decreasing: bool = False  # lower than the previous execution's step number
    tags: tuple[str, ...] = ()
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    device_s: float | None = None
    compute_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"tags": list(self.tags)}

    def explain(self) -> str:
        """``3.420 s = 0.610 s productive + 2.810 s checkpoint_save``."""
        parts = [f"{self.productive_s:.3f} s productive"]
        parts += [f"{v:.3f} s {k}" for k, v in sorted(self.overhead_s.items(), key=lambda kv: -kv[1]) if v > 0]
        return f"{self.step_time_s:.3f} s = " + " + ".join(parts)


def _marks(session_timelines: dict[int, SessionTimeline]) -> tuple[
    dict[tuple[int, int], list[str]], dict[tuple[int, int], dict[str, float]]
]:
    tags: dict[tuple[int, int], list[str]] = {}
    metrics: dict[tuple[int, int], dict[str, float]] = {}
    for session, tl in session_timelines.items():
        for step, name, _ in tl.tags:
            if step is not None:
                tags.setdefault((session, step), []).append(name)
        for name, step, value, _ in tl.metrics:
            if step is not None and value is not None:
                metrics.setdefault((session, step), {})[name] = value
    return tags, metrics


def step_rows(timeline: Timeline, session_timelines: dict[int, SessionTimeline], job_start: int) -> list[StepRow]:
    """Rows of the step table from the reference timeline's windows."""
    tags, metrics = _marks(session_timelines)
    rows: list[StepRow] = []
    for w in timeline.windows:
        rows.extend(_rows_of_window(w, tags, metrics, job_start))
    return rows


def _rows_of_window(
    w: Window, tags: dict[tuple[int, int], list[str]], metrics: dict[tuple[int, int], dict[str, float]],
    job_start: int,
) -> list[StepRow]:
    cut = w.cut
    executions = w.executions
    n = len(executions)
    overhead = w.overhead()
    wasted = overhead.pop(WASTED, 0)
    productive = w.total(PRODUCTIVE) + wasted
    how = cut.win_how[w.index]
    rows = []
    for position, i in enumerate(executions):
        step = cut.exec_step[i]
        flags = cut.exec_flags[i]
        values = metrics.get((cut.session, step), {})
        rows.append(
            StepRow(
                step=step,
                attempt=w.attempt,
                start_s=(w.start - job_start) / NS,
                step_time_s=w.length / n / NS,
                productive_s=productive / n / NS,
                overhead_s={k: v / n / NS for k, v in overhead.items()},
                shared=n,
                host_timed=cut.host_timed or how == HOST_EXIT,
                first_of_attempt=w.first_of_attempt and position == 0,
                counted=i not in w.lost,
                seq=cut.exec_seq[i],
                start_ns=w.start,
                end_ns=w.end,
                sync=how,
                repeated=bool(flags & FLAG_REPEATED),
                decreasing=bool(flags & FLAG_DECREASING),
                tags=tuple(tags.get((cut.session, step), ())),
                metrics=values,
                device_s=_device_seconds(values),
                compute_s=cut.exec_compute[i] / NS if cut.exec_compute[i] else None,
            )
        )
    return rows


def _device_seconds(values: dict[str, float]) -> float | None:
    """Device-busy time of the step where the framework measured it (CUDA events)."""
    for key in (schema.DEVICE_BUSY_METRIC, "device_time_s"):
        if key in values:
            return values[key]
    return None


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


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def step_stats(rows: Sequence[StepRow], ideal_s: float | None) -> StepStats:
    times = sorted(r.step_time_s for r in rows)
    return StepStats(
        count=len(rows),
        mean_s=statistics.fmean(times) if times else 0.0,
        median_s=_quantile(times, 0.5),
        p90_s=_quantile(times, 0.9),
        p99_s=_quantile(times, 0.99),
        max_s=times[-1] if times else 0.0,
        ideal_s=ideal_s,
        shared_steps=sum(1 for r in rows if r.shared > 1),
        host_timed_steps=sum(1 for r in rows if r.host_timed),
        repeated_steps=sum(1 for r in rows if r.repeated),
        decreasing_steps=sum(1 for r in rows if r.decreasing),
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
        return dataclasses.asdict(self) | {"overlapped": list(self.overlapped)}


def find_anomalies(
    rows: Sequence[StepRow],
    windows: Sequence[Window],
    session_timelines: dict[int, SessionTimeline],
    *,
    k: float = 5.0,
) -> tuple[list[Anomaly], float | None]:
    """Steps (not the first of an attempt) whose productive time exceeds median + k*MAD."""
    steady = [r.productive_s for r in rows if not r.first_of_attempt]
    if len(steady) < 3:
        return [], None
    median = statistics.median(steady)
    mad = statistics.median(abs(v - median) for v in steady)
    threshold = median + max(k * 1.4826 * mad, 0.05 * median)
    by_key = {(w.attempt, w.cut.exec_seq[i]): w for w in windows for i in w.executions}
    usual: dict[int, _SessionMarks] = {}
    found = []
    for r in rows:
        if r.first_of_attempt or r.productive_s <= threshold:
            continue
        w = by_key.get((r.attempt, r.seq))
        found.append(
            Anomaly(r.step, r.attempt, r.productive_s, threshold, r.step_time_s,
                    _overlapping(w, session_timelines, r.tags, usual), r.seq)
        )
    return found, threshold


class _SessionMarks:
    """One session's spans per name and step (the anomaly table names only spans that took
    unusually long in the slow step, or appeared only there), events and device-idle time by
    step: indexed once, so that each anomaly costs only its own steps."""

    def __init__(self, tl: SessionTimeline) -> None:
        per_step: dict[str, dict[int, int]] = {}
        steps: set[int] = set()
        for name, _, t0, t1, step, _, _ in tl.spans:
            if step is None:
                continue
            steps.add(step)
            by_step = per_step.setdefault(name, {})
            by_step[step] = by_step.get(step, 0) + (t1 - t0)
        self.per_step = per_step
        self.median_ns = {
            name: statistics.median([by_step.get(k, 0) for k in steps]) for name, by_step in per_step.items()
        }
        self.events: dict[int, list[str]] = {}
        for name, _, step, _ in tl.events:
            if step is not None:
                self.events.setdefault(step, []).append(name)
        self.idle: dict[int, float] = {}
        for name, step, value, _ in tl.metrics:
            if name == schema.DEVICE_IDLE_METRIC and step is not None and value:
                self.idle[step] = self.idle.get(step, 0.0) + value

    def unusual(self, steps: Sequence[int]) -> list[str]:
        found = []
        for name, by_step in self.per_step.items():
            took = sum(by_step.get(k, 0) for k in steps)
            usual = self.median_ns[name] * len(steps)
            if took > 1.5 * usual and took - usual >= 0.001 * NS:
                found.append((took - usual, f"span:{name} {took / NS:.3f}s (usually {usual / NS:.3f}s)"))
        return [label for _, label in sorted(found, key=lambda x: -x[0])[:5]]


def _overlapping(
    w: Window | None, timelines: dict[int, SessionTimeline], tags: tuple[str, ...],
    marks: dict[int, _SessionMarks],
) -> tuple[str, ...]:
    found = [f"tag:{t}" for t in tags]
    if w is None or w.cut.session not in timelines:
        return tuple(found)
    session = w.cut.session
    for label, length in sorted(w.overhead().items(), key=lambda kv: -kv[1]):
        if label not in (WASTED, WARMUP):
            found.append(f"{label}:{length / NS:.3f}s")
    if session not in marks:
        marks[session] = _SessionMarks(timelines[session])
    m = marks[session]
    steps = sorted({w.cut.exec_step[i] for i in w.executions})
    found.extend(m.unusual(steps))
    found.extend(f"event:{name}" for step in steps for name in m.events.get(step, ()))
    idle = sum(m.idle.get(step, 0.0) for step in steps)
    if idle > 0:
        found.append(f"device_idle:{idle:.3f}s")
    return tuple(dict.fromkeys(found))
