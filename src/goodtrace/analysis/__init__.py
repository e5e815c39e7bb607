"""Goodput analysis: pure functions from a ``LoadedRun`` to result dataclasses (no I/O).

Entry point for renderers and tools::

    from goodtrace.read.load import load_run
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
from collections.abc import Sequence
from typing import Any

from goodtrace.analysis.attempts import Attempt, discover_attempts
from goodtrace.analysis.goodput import (
    NS,
    AnalysisError,
    Partition,
    WindowGoodput,
    interval_partition,
    rolling_goodput,
)
from goodtrace.analysis.partition import (
    DATA_RULE_TEXT,
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
from goodtrace.analysis.program import ProgramGoodput, program_goodput
from goodtrace.analysis.ranks import (
    RankFigure,
    RankSpread,
    Straggler,
    find_stragglers,
    rank_figures,
    spread_of,
)
from goodtrace.analysis.steps import Anomaly, StepRow, StepStats, find_anomalies, step_rows, step_stats
from goodtrace.read.loaded import LoadedRun, SessionInfo

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
    program = program_goodput(
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
