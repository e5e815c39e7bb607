"""Goodput analysis: pure functions from a ``LoadedRun`` to result dataclasses (no I/O).

Entry point for renderers and tools::

    from goodtrace.loading import load_run
    from goodtrace.analysis import analyze
    result = analyze(load_run("runs/exp1"), window=(0.0, 3600.0))
    result.partition.goodput            # productive share of the job's time (0..1)
    result.partition.buckets_ns         # every bucket, integer ns, summing to total_ns exactly
    result.to_dict()                    # the JSON form (``goodtrace report --json``)

``RunAnalysis`` holds: ``attempts`` (launches of the reported job, how each ended), ``jobs``
(more than one when an unrelated job reused the run directory), ``partition`` (DESIGN.md
section 4 on the reference rank: rank 0 unless it is missing), ``window`` / ``rolling``
(interval goodput), ``steps`` (the step table: one ``StepRow`` per execution with its
interval, overhead split, productive time, tags and metrics), ``step_stats``, ``ideal_step_s``,
``anomalies``, ``spread`` and ``stragglers`` (per rank), ``rank_steps`` (the step table of
every rank analysed in full, by rank; not in the JSON), ``program`` (MFU, scheduling, runtime
and ML-productivity goodput), ``data_rule`` (how in-step data loading was counted),
``timeline`` (the labelled pieces that tile the job on the wall clock, for gantt/trace
renderers) and ``warnings``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from goodtrace import schema
from goodtrace.analysis.attempts import Attempt, discover_attempts
from goodtrace.analysis.partition import (
    DATA_RULE_TEXT,
    PRODUCTIVE,
    RULE_ASYNC,
    RULE_ASYNC_DEVICE,
    RULE_SYNC,
    RULE_UNKNOWN,
    SessionCut,
    Timeline,
    apply_compile,
    assemble,
    cut_session,
    ideal_step_ns,
)
from goodtrace.analysis.ranks import (
    RankFigure,
    RankSpread,
    Straggler,
    find_stragglers,
    rank_figures,
    spread_of,
)
from goodtrace.analysis.steps import Anomaly, StepRow, StepStats, find_anomalies, step_rows, step_stats
from goodtrace.loading import LoadedRun, SessionInfo

__all__ = [
    "AnalysisError",
    "Anomaly",
    "Attempt",
    "Partition",
    "ProgramGoodput",
    "RankFigure",
    "RankSpread",
    "RunAnalysis",
    "StepRow",
    "StepStats",
    "Straggler",
    "Timeline",
    "WindowGoodput",
    "analyze",
    "interval_partition",
    "rolling_goodput",
]

NS = 1e9
STARTUP_PARTS = (schema.INIT, schema.CHECKPOINT_RESTORE, schema.DATA, schema.COMPILE, "other")


class AnalysisError(ValueError):
    """The loaded run cannot be analysed (no sessions, no such job)."""


@dataclasses.dataclass(frozen=True)
class Partition:
    """Every nanosecond of [start, end) in exactly one bucket; ``productive`` is goodput."""

    start_wall_ns: int
    end_wall_ns: int
    buckets_ns: dict[str, int]
    startup_parts_ns: dict[str, int]

    @property
    def total_ns(self) -> int:
        return self.end_wall_ns - self.start_wall_ns

    @property
    def goodput(self) -> float:
        return self.buckets_ns.get(PRODUCTIVE, 0) / self.total_ns if self.total_ns > 0 else 0.0

    def seconds(self, bucket: str) -> float:
        return self.buckets_ns.get(bucket, 0) / NS

    def fraction(self, bucket: str) -> float:
        return self.buckets_ns.get(bucket, 0) / self.total_ns if self.total_ns > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_wall_ns": self.start_wall_ns,
            "end_wall_ns": self.end_wall_ns,
            "total_s": self.total_ns / NS,
            "goodput": self.goodput,
            "buckets": {
                name: {"ns": ns, "seconds": ns / NS, "fraction": self.fraction(name)}
                for name, ns in self.buckets_ns.items()
            },
            "startup_parts": {name: {"ns": ns, "seconds": ns / NS} for name, ns in self.startup_parts_ns.items()},
        }


def _ordered(buckets: dict[str, int]) -> dict[str, int]:
    out = {name: buckets.get(name, 0) for name in schema.BASE_BUCKETS}
    for name in sorted(buckets):
        if name not in out:
            out[name] = buckets[name]
    return out


def interval_partition(timeline: Timeline, a_ns: int | None = None, b_ns: int | None = None) -> Partition:
    """The partition clipped to the wall-clock window [a, b) (the whole job by default)."""
    lo = timeline.start if a_ns is None else max(a_ns, timeline.start)
    hi = timeline.end if b_ns is None else min(b_ns, timeline.end)
    hi = max(hi, lo)
    buckets, parts = timeline.totals(lo, hi)
    return Partition(lo, hi, _ordered(buckets), {p: parts.get(p, 0) for p in STARTUP_PARTS} | parts)


@dataclasses.dataclass(frozen=True)
class WindowGoodput:
    start_s: float  # relative to the job start
    end_s: float
    goodput: float
    productive_s: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rolling_goodput(timeline: Timeline, width_s: float) -> list[WindowGoodput]:
    """Interval goodput over consecutive windows of ``width_s`` tiling the job (the last one
    may be shorter)."""
    if width_s <= 0:
        raise AnalysisError("the rolling window width must be positive")
    width = max(1, round(width_s * NS))
    out = []
    a = timeline.start
    while a < timeline.end:
        b = min(a + width, timeline.end)
        p = interval_partition(timeline, a, b)
        out.append(
            WindowGoodput((a - timeline.start) / NS, (b - timeline.start) / NS, p.goodput, p.seconds(PRODUCTIVE))
        )
        a = b
    return out


@dataclasses.dataclass(frozen=True)
class ProgramGoodput:
    """MFU and the goodput product (DESIGN.md section 4). Fields are None when unknown."""

    flops_per_step: float | None
    flops_source: str | None
    peak_flops_per_device: float | None
    accelerator: str | None
    devices: int
    counted_steps: int
    mfu: float | None  # program goodput: model FLOP/s over productive time / peak FLOP/s
    scheduling_goodput: float | None  # time since the first process start / time since submission
    runtime_goodput: float  # productive / time since the first process start
    ml_productivity_goodput: float | None  # scheduling x runtime x program

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RunAnalysis:
    path: str
    job: int
    jobs: int
    attempts: tuple[Attempt, ...]
    reference_rank: int
    partition: Partition
    window: Partition | None
    rolling: tuple[WindowGoodput, ...]
    steps: tuple[StepRow, ...]
    step_stats: StepStats
    ideal_step_s: float | None
    anomalies: tuple[Anomaly, ...]
    anomaly_threshold_s: float | None
    spread: RankSpread
    stragglers: tuple[Straggler, ...]
    program: ProgramGoodput
    data_rule: str
    timeline: Timeline
    warnings: tuple[str, ...]
    form: str
    records: int
    # the step table of every rank analysed in full (rank 0 and the detail sample), by rank
    rank_steps: dict[int, tuple[StepRow, ...]] = dataclasses.field(default_factory=dict)

    @property
    def data_rule_text(self) -> str:
        return DATA_RULE_TEXT[self.data_rule]

    def slowest_steps(self, n: int = 10) -> list[StepRow]:
        return sorted(self.steps, key=lambda r: -r.step_time_s)[:n]

    def to_dict(self, *, include_steps: bool = True) -> dict[str, Any]:
        start = self.partition.start_wall_ns
        out: dict[str, Any] = {
            "schema": "goodtrace.report/1",
            "path": self.path,
            "job": self.job,
            "jobs": self.jobs,
            "reference_rank": self.reference_rank,
            "form": self.form,
            "records": self.records,
            "goodput": self.partition.goodput,
            "partition": self.partition.to_dict(),
            "window": None if self.window is None else self.window.to_dict() | {
                "start_s": (self.window.start_wall_ns - start) / NS,
                "end_s": (self.window.end_wall_ns - start) / NS,
            },
            "rolling": [w.to_dict() for w in self.rolling],
            "attempts": [a.to_dict() for a in self.attempts],
            "data_rule": {"rule": self.data_rule, "text": self.data_rule_text},
            "ideal_step_s": self.ideal_step_s,
            "step_stats": self.step_stats.to_dict(),
            "slowest_steps": [r.to_dict() | {"explain": r.explain()} for r in self.slowest_steps()],
            "anomalies": [a.to_dict() for a in self.anomalies],
            "anomaly_threshold_s": self.anomaly_threshold_s,
            "spread": self.spread.to_dict(),
            "stragglers": [s.to_dict() for s in self.stragglers],
            "program": self.program.to_dict(),
            "warnings": list(self.warnings),
        }
        if include_steps:
            out["steps"] = [r.to_dict() for r in self.steps]
        return out


def _rank_timeline(
    run: LoadedRun,
    attempts: Sequence[Attempt],
    rank: int | None,
    *,
    data_rule: str | None,
    ideal_override_ns: float | None,
    submit_wall: int | None,
    running: frozenset[int] = frozenset(),
) -> tuple[Timeline, float | None, list[str]] | None:
    """The job timeline of one rank across the job's attempts (None without its records);
    ``rank=None``: each attempt's reference session (rank 0, or its lowest rank present)."""
    by_index = {s.index: s for s in run.sessions}
    items: list[tuple[int, SessionInfo, SessionCut]] = []
    rules: list[str] = []
    for a in attempts:
        for index in a.sessions:
            info = by_index[index]
            chosen = index == a.reference_session if rank is None else info.rank == rank
            if chosen and index in run.timelines:
                cut = cut_session(info, run.timelines[index], data_rule=data_rule, running=a.index in running)
                items.append((a.index, info, cut))
                rules.append(cut.data_rule)
    if not items:
        return None
    ideal = ideal_override_ns if ideal_override_ns is not None else ideal_step_ns([c for _, _, c in items])
    for _, _, cut in items:
        apply_compile(cut, ideal)
    return assemble(items, submit_wall=submit_wall), ideal, rules


def _model_figures(run: LoadedRun, sessions: Sequence[int]) -> tuple[float | None, float | None]:
    """(FLOPs per step of one rank, peak FLOP/s of its device) as the framework integration
    recorded them: a ``flops_per_step`` metric and a ``model`` event (goodtrace.integrations)."""
    values = [
        value
        for index in sessions if index in run.timelines
        for name, _, value, _ in run.timelines[index].metrics
        if name in ("model_flops_per_step", "flops_per_step") and value is not None
    ]
    peaks = [
        float(peak) for index in sessions if index in run.timelines
        for peak in (run.timelines[index].model.get("peak_flops"),)
        if isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0
    ]
    return (statistics.median(values) if values else None), (statistics.median(peaks) if peaks else None)


def analyze(
    run: LoadedRun,
    *,
    window: tuple[float, float] | None = None,
    rolling_s: float | None = None,
    job: int | None = None,
    ideal_step_s: float | None = None,
    data_rule: str | None = None,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    accelerator: str | None = None,
    devices_per_rank: int = 1,
    anomaly_k: float = 5.0,
    now_wall_ns: int | None = None,
) -> RunAnalysis:
    """Analyse one job of a loaded run (the last one by default).

    ``window`` = (a, b) in seconds from the job start (negative values count from its end);
    ``rolling_s`` adds interval goodput over consecutive windows of that width. ``data_rule``
    ("asynchronous"/"synchronous") overrides the detected loop kind. MFU needs
    ``flops_per_step`` (model FLOPs of one optimizer step, all devices together; else the
    framework integration's per-rank ``flops_per_step`` metric times the world size) and a
    peak per device (``peak_flops``, else ``accelerator`` from the table, else the peak the
    integration recorded in its ``model`` event). ``now_wall_ns`` (the current time) lets a
    last attempt that is still alive count as ``running``: its time after the last sync point
    is ``in_progress`` instead of ``disruption``.
    """
    if not run.sessions:
        raise AnalysisError("the run has no sessions")
    if data_rule not in (None, RULE_ASYNC, RULE_ASYNC_DEVICE, RULE_SYNC, RULE_UNKNOWN):
        raise AnalysisError(f"data_rule must be {RULE_ASYNC!r} or {RULE_SYNC!r}, got {data_rule!r}")
    warnings = list(run.warnings)
    all_attempts = discover_attempts(run.sessions, warnings, now_wall_ns=now_wall_ns)
    jobs = max(a.job for a in all_attempts) + 1
    chosen = jobs - 1 if job is None else job
    if not 0 <= chosen < jobs:
        raise AnalysisError(f"the run directory holds {jobs} job(s); there is no job {job}")
    attempts = [a for a in all_attempts if a.job == chosen]
    by_index = {s.index: s for s in run.sessions}
    reference_rank = min(by_index[a.reference_session].rank for a in attempts)
    submits = [by_index[a.reference_session].submit_wall for a in attempts]
    submit_wall = submits[0]
    ideal_override = None if ideal_step_s is None else ideal_step_s * NS
    running = frozenset(a.index for a in attempts if a.ended == "running")
    built = _rank_timeline(
        run, attempts, None, data_rule=data_rule, ideal_override_ns=ideal_override, submit_wall=submit_wall,
        running=running,
    )
    if built is None:
        raise AnalysisError(f"rank {reference_rank} has no records loaded")
    timeline, ideal_ns, rules = built
    rule = data_rule or (max(set(rules), key=rules.count) if rules else RULE_UNKNOWN)
    if len(set(rules)) > 1:
        warnings.append(f"attempts differ in loop kind ({', '.join(sorted(set(rules)))}); data rule per attempt")
    partition = interval_partition(timeline)
    job_start = timeline.start
    window_partition = None
    if window is not None:
        lo_s, hi_s = window
        a_ns = _window_edge(lo_s, job_start, timeline.end)
        b_ns = _window_edge(hi_s, job_start, timeline.end)
        if b_ns <= a_ns:
            raise AnalysisError(f"empty window {lo_s}:{hi_s}")
        window_partition = interval_partition(timeline, a_ns, b_ns)
    rolling = tuple(rolling_goodput(timeline, rolling_s)) if rolling_s else ()
    rows = step_rows(timeline, run.timelines, job_start)
    ideal_s = None if ideal_ns is None else ideal_ns / NS
    anomalies, threshold = find_anomalies(rows, timeline.windows, run.timelines, k=anomaly_k)
    # per-rank spread
    job_sessions = [by_index[i] for a in attempts for i in a.sessions]
    detail_ranks = sorted({s.rank for s in job_sessions if s.index in run.timelines})
    goodput_by_rank: dict[int, float] = {}
    rank_steps: dict[int, tuple[StepRow, ...]] = {}
    if all(by_index[a.reference_session].rank == reference_rank for a in attempts):
        goodput_by_rank[reference_rank] = partition.goodput  # the reference timeline is this rank's
        rank_steps[reference_rank] = tuple(rows)
    for rank in detail_ranks:
        if rank in goodput_by_rank:
            continue
        other = _rank_timeline(
            run, attempts, rank, data_rule=data_rule, ideal_override_ns=ideal_override, submit_wall=submit_wall,
            running=running,
        )
        if other is not None:
            goodput_by_rank[rank] = interval_partition(other[0]).goodput
            rank_steps[rank] = tuple(step_rows(other[0], run.timelines, other[0].start))
    figures = rank_figures(job_sessions, run.rank_summaries, goodput_by_rank)
    spread = spread_of(figures)
    stragglers = find_stragglers(figures, ideal_s)
    for a in attempts:
        if a.ranks < a.world:
            warnings.append(f"attempt {a.index}: {a.world - a.ranks} of {a.world} ranks have no records")
    program = _program_goodput(
        run, attempts, timeline, partition, flops_per_step, peak_flops, accelerator, devices_per_rank, submit_wall
    )
    if any(r.shared > 1 for r in rows):
        warnings.append("some steps have no sync point of their own: their time is the average of the "
                        "interval they share (sparse completion)")
    if any(c.host_timed for c in timeline.cuts):
        warnings.append("no sync points were recorded: step intervals are host-timed (step exit times), "
                        "which under asynchronous dispatch measure dispatch, not device time")
    return RunAnalysis(
        path=run.path,
        job=chosen,
        jobs=jobs,
        attempts=tuple(attempts),
        reference_rank=reference_rank,
        partition=partition,
        window=window_partition,
        rolling=rolling,
        steps=tuple(rows),
        step_stats=step_stats(rows, ideal_s),
        ideal_step_s=ideal_s,
        anomalies=tuple(anomalies),
        anomaly_threshold_s=threshold,
        spread=spread,
        stragglers=tuple(stragglers),
        program=program,
        data_rule=rule,
        timeline=timeline,
        warnings=tuple(dict.fromkeys(warnings)),
        form=run.form,
        records=run.records,
        rank_steps=rank_steps,
    )


def _window_edge(seconds: float, start: int, end: int) -> int:
    """Seconds from the job start (negative: from its end; infinite: the end itself)."""
    if math.isinf(seconds):
        return end if seconds > 0 else start
    return start + round(seconds * NS) if seconds >= 0 else end + round(seconds * NS)


def _program_goodput(
    run: LoadedRun,
    attempts: Sequence[Attempt],
    timeline: Timeline,
    partition: Partition,
    flops_per_step: float | None,
    peak_flops: float | None,
    accelerator: str | None,
    devices_per_rank: int,
    submit_wall: int | None,
) -> ProgramGoodput:
    devices = max(1, attempts[-1].world) * max(1, devices_per_rank)
    source = "given" if flops_per_step is not None else None
    rank_flops, recorded_peak = _model_figures(run, [a.reference_session for a in attempts])
    if flops_per_step is None and rank_flops is not None:
        # the integration records one rank's FLOPs per step: the job's is world size times that
        flops_per_step = rank_flops * max(1, attempts[-1].world)
        source = "flops_per_step metric of rank 0 x world size"
    if peak_flops is None and accelerator is None and recorded_peak is not None:
        peak_flops = recorded_peak / max(1, devices_per_rank)
    if peak_flops is None and accelerator is not None:
        from goodtrace.accelerators import peak_flops as lookup

        try:
            peak_flops = lookup(accelerator)
        except KeyError as exc:
            raise AnalysisError(str(exc.args[0])) from None
    counted = sum(w.counted_steps for w in timeline.windows)
    productive_s = partition.seconds(PRODUCTIVE)
    mfu = None
    if flops_per_step is not None and peak_flops and productive_s > 0:
        mfu = flops_per_step * counted / productive_s / (peak_flops * devices)
    since_start = timeline.end - (submit_wall if submit_wall is not None and submit_wall < timeline.start
                                  else timeline.start)
    held = partition.total_ns - partition.buckets_ns.get(schema.BUCKET_SCHEDULING, 0)
    runtime = partition.buckets_ns.get(PRODUCTIVE, 0) / held if held > 0 else 0.0
    scheduling = held / since_start if submit_wall is not None and since_start > 0 else None
    product = None
    if mfu is not None:
        product = (scheduling if scheduling is not None else 1.0) * runtime * mfu
    return ProgramGoodput(
        flops_per_step=flops_per_step,
        flops_source=source,
        peak_flops_per_device=peak_flops,
        accelerator=accelerator,
        devices=devices,
        counted_steps=counted,
        mfu=mfu,
        scheduling_goodput=scheduling,
        runtime_goodput=runtime,
        ml_productivity_goodput=product,
    )
