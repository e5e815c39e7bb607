"""Goodput analysis: pure functions from a ``LoadedRun`` to result dataclasses (no I/O).

Entry point for renderers and tools::

    from goodtrace.read.load import load_run
    from goodtrace.analysis import analyze
    result = analyze(load_run("runs/exp1"), window=(0.0, 3600.0))
    result.partition.goodput            # productive share of the job's time (0..1)
    result.partition.buckets_ns         # every bucket, integer ns, summing to total_ns exactly
    result.to_dict()                    # the JSON form (``goodtrace report --json``)

One run model: every session of the job is cut once (:mod:`goodtrace.analysis.cut`:
its step executions, intervals and overhead, ``RunAnalysis.cuts``), and every number and view
(the console, ``--json``, the HTML report, the Perfetto trace) draws from those cuts and from
one mapping of each session's clock (``RunAnalysis.clocks``). A rank is reduced to its figures
as soon as its last session is cut and its cuts are dropped, the reference rank's kept (what
the numbers need); the views of every rank read the others through ``RunAnalysis.cuts``
(:class:`SessionCuts`), which keeps those beyond a bound in a temporary file and reads one back
when asked for (``analyze(keep_cuts=False)``: the reference rank's alone).

``RunAnalysis`` holds: ``attempts`` (launches of the reported job, how each ended), ``jobs``
(more than one when an unrelated job reused the run directory), ``partition`` (on the
reference rank: rank 0 unless it is missing), ``window`` / ``rolling`` (interval goodput),
``over_time`` (goodput per period fitted to the run's length, or the chosen one, and the worst ones), ``time_range``
(the ``since``/``until`` range the step views keep to), ``steps`` (the step table: one
``StepRow`` per execution of the reference rank), ``step_stats``, ``ideal_step_s``,
``anomalies``, ``spread`` and ``stragglers`` (every rank), ``program`` (MFU, scheduling,
runtime and ML-productivity goodput), ``host_overhead`` (how host time in overhead spans was counted),
``events``, ``timeline`` (the labelled pieces that tile the job on the wall clock) and
``warnings``.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from goodtrace.analysis.anomalies import Anomaly, StepStats, find_anomalies, step_stats
from goodtrace.analysis.attempts import Attempt, Liveness, discover_attempts
from goodtrace.analysis.clock import SessionClock, loaded_clocks
from goodtrace.analysis.cut import (
    DATA_RULE_TEXT,
    DATA_RULES,
    FLAG_DECREASING,
    FLAG_REPEATED,
    RULE_DEVICE_IDLE,
    RULE_SYNC_POINTS,
    Relabels,
    SessionCut,
)
from goodtrace.analysis.goodput import (
    NS,
    AnalysisError,
    Partition,
    PeriodGoodput,
    interval_partition,
    rolling_goodput,
)
from goodtrace.analysis.hangs import Hang, describe_hangs, find_hangs
from goodtrace.analysis.over_time import GoodputOverTime, Period, goodput_over_time
from goodtrace.analysis.partition import Timeline
from goodtrace.analysis.program import ProgramGoodput, program_goodput
from goodtrace.analysis.ranks import (
    RankFigure,
    RankSpread,
    Straggler,
    figures_of,
    find_stragglers,
    spread_of,
)
from goodtrace.analysis.reduce import cut_and_reduce, rank_timeline
from goodtrace.analysis.rewinds import RewindRow, rewind_rows, rewind_warning
from goodtrace.analysis.session_cuts import SessionCuts
from goodtrace.analysis.slowdown import Slowdown, slowdowns_of
from goodtrace.analysis.steps import StepRow, StepTable
from goodtrace.analysis.time_range import RangeEdge, resolve_range, restrict_to_range
from goodtrace.analysis.verdict import Verdict, verdict_of
from goodtrace.read.loaded import LoadedRun, SessionInfo, SessionRecords

__all__ = [
    "AnalysisError",
    "Anomaly",
    "Attempt",
    "EventRow",
    "GoodputOverTime",
    "HostOverhead",
    "Partition",
    "Period",
    "PeriodGoodput",
    "ProgramGoodput",
    "RangeEdge",
    "RankFigure",
    "RankSpread",
    "RewindRow",
    "RunAnalysis",
    "SessionCuts",
    "StepRow",
    "StepStats",
    "Straggler",
    "Timeline",
    "Verdict",
    "analyze",
    "interval_partition",
    "rolling_goodput",
]

MAX_EVENTS = 1000  # events listed in the report (all are in the trace)


@dataclasses.dataclass(frozen=True)
class EventRow:
    """A ``gt.event`` of the job, on its rank's clock relative to the job start."""

    rank: int
    attempt: int
    name: str
    time_s: float
    step: int | None
    attrs: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class HostOverhead:
    """How host time in overhead spans was counted (docs/semantics.md 3.4) on the reference
    timeline: the rule (``sync points``; ``device idle`` with CUDA device timing; or the
    ``--data-rule`` override), how much span time overlapped queued device work and so stayed
    productive, and how much of the time charged depends on the rule's assumption that a step
    had dispatched nothing before its span (the sync points cannot see such work)."""

    rule: str
    overlapped_ns: int
    uncertain_ns: int

    @property
    def text(self) -> str:
        return DATA_RULE_TEXT[self.rule]

    def sentences(self) -> list[str]:
        """The rule and its two figures, as the report says them."""
        out = [self.text]
        if self.overlapped_ns:
            out.append(f"{self.overlapped_ns / NS:.3f} s of overhead-span time overlapped queued device work and "
                       "counts as productive")
        if self.uncertain_ns:
            out.append(f"{self.uncertain_ns / NS:.3f} s counted as lost followed untraced host time of its own "
                       "step, which may have dispatched device work the sync points cannot see (taken as none)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "text": self.text, "overlapped_s": self.overlapped_ns / NS,
                "uncertain_s": self.uncertain_ns / NS}


def host_overhead_of(cuts: Sequence[SessionCut], override: str | None) -> HostOverhead:
    """The reference timeline's :class:`HostOverhead`: the rule its sessions were cut with (the
    override, else device idle where any session had CUDA device timing) and their figures."""
    rules = {c.data_rule for c in cuts}
    rule = override or (RULE_DEVICE_IDLE if RULE_DEVICE_IDLE in rules else RULE_SYNC_POINTS)
    return HostOverhead(rule, sum(c.overlapped_ns for c in cuts), sum(c.uncertain_ns for c in cuts))


@dataclasses.dataclass(frozen=True)
class RunAnalysis:
    path: str
    job: int
    jobs: int
    attempts: tuple[Attempt, ...]
    reference_rank: int
    partition: Partition
    window: Partition | None
    rolling: tuple[PeriodGoodput, ...]
    steps: StepTable
    step_stats: StepStats
    ideal_step_s: float | None
    anomalies: tuple[Anomaly, ...]
    anomaly_threshold_s: float | None
    spread: RankSpread
    stragglers: tuple[Straggler, ...]
    program: ProgramGoodput
    host_overhead: HostOverhead
    verdict: Verdict
    timeline: Timeline
    warnings: tuple[str, ...]
    form: str
    records: int
    events: tuple[EventRow, ...] = ()
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # lines read as no record, by reason
    events_total: int = 0
    # the run model every view draws from: each session of the job cut once, its clock mapping
    sessions: tuple[SessionInfo, ...] = ()
    cuts: Mapping[int, SessionCut] = dataclasses.field(default_factory=dict)
    clocks: dict[int, SessionClock] = dataclasses.field(default_factory=dict)
    attempt_of: dict[int, int] = dataclasses.field(default_factory=dict)
    relabels: dict[int, Relabels] = dataclasses.field(default_factory=dict)
    hangs: tuple[Hang, ...] = ()  # ranks whose training thread stopped (analysis.hangs)
    slowdowns: tuple[Slowdown, ...] = ()  # ranks slower than they were (analysis.slowdown)
    rewinds: tuple[RewindRow, ...] = ()  # rollbacks inside an attempt (reference rank), in time order
    over_time: GoodputOverTime | None = None  # goodput per period (hour) of the job or the time range
    time_range: tuple[int, int] | None = None  # --since/--until on the wall clock: what the step views show
    # per attempt, the distinct step numbers any of its sessions executed (closed in an
    # interval), sorted: what a view of a few steps chooses them from (analysis.selection)
    executed_steps: Mapping[int, Any] = dataclasses.field(default_factory=dict)

    def slowest_steps(self, n: int = 10) -> list[StepRow]:
        return self.steps.slowest(n)

    def attempts_by_index(self) -> dict[int, Attempt]:
        return {a.index: a for a in self.attempts}

    def to_wall(self, session: int, t: int) -> int:
        """A session's monotonic ``t`` on the job's aligned wall clock (the one mapping)."""
        clock = self.clocks.get(session)
        return clock.wall_ns(t) if clock is not None else self.sessions[session].wall(t)

    def wall_of(self, session: int) -> Callable[[int], int]:
        """:meth:`to_wall` of one session, as a function of its time, for a view that maps many:
        where the mapping is one shift (no measured offsets: the reference session, one aligned
        by its anchor, or one without a clock), that shift added (``to_wall`` of time 0), not
        the mapping's calls a time; else the clock's mapping itself."""
        clock = self.clocks.get(session)
        if clock is not None and clock.times:  # measured offsets, interpolated between samples
            return clock.wall_ns
        return functools.partial(operator.add, self.to_wall(session, 0))

    def to_dict(self, *, include_steps: bool = True) -> dict[str, Any]:
        start = self.partition.start_wall_ns
        out: dict[str, Any] = {
            "schema": "goodtrace.report/2",
            "path": self.path,
            "job": self.job,
            "jobs": self.jobs,
            "reference_rank": self.reference_rank,
            "form": self.form,
            "records": self.records,
            "skipped_lines": dict(self.skipped),
            "goodput": self.partition.goodput,
            "verdict": self.verdict.to_dict(),
            "partition": self.partition.to_dict(),
            "window": None if self.window is None else self.window.to_dict() | {
                "start_s": (self.window.start_wall_ns - start) / NS,
                "end_s": (self.window.end_wall_ns - start) / NS,
            },
            "rolling": [w.to_dict() for w in self.rolling],
            "goodput_over_time": [] if self.over_time is None else self.over_time.to_list(start),
            "attempts": [a.to_dict() for a in self.attempts],
            "host_overhead": self.host_overhead.to_dict(),
            "ideal_step_s": self.ideal_step_s,
            "step_stats": self.step_stats.to_dict(),
            "slowest_steps": [r.to_dict() | {"explain": r.explain()} for r in self.slowest_steps()],
            "anomalies": [a.to_dict() for a in self.anomalies],
            "anomaly_threshold_s": self.anomaly_threshold_s,
            "spread": self.spread.to_dict(),
            "stragglers": [s.to_dict() for s in self.stragglers],
            "hangs": [h.to_dict() for h in self.hangs],
            "slowdowns": [s.to_dict() for s in self.slowdowns],
            "program": self.program.to_dict(),
            "events": [e.to_dict() for e in self.events],
            "events_total": self.events_total,
            "warnings": list(self.warnings),
        }
        if self.rewinds:  # only when the job rewound: reports of other runs keep their bytes
            out["rewinds"] = [r.to_dict() for r in self.rewinds]
        if include_steps:
            out["steps"] = [r.to_dict() for r in self.steps]
        return out


def _events(run: LoadedRun, attempts: Sequence[Attempt], job_start: int,
            records_of: Mapping[int, SessionRecords]) -> tuple[list[EventRow], int]:
    """The job's first :data:`MAX_EVENTS` events, earliest first (attributes from the reference
    sessions' step detail; the others' as the analysis took them when it cut each session), and
    how many there are: only those kept are held (a week of 10,000 ranks has millions of events)."""
    total = 0

    def rows() -> Iterator[EventRow]:
        nonlocal total
        for a in attempts:
            for index in a.sessions:
                info = run.sessions[index]
                session_detail = run.details.get(index)
                if session_detail is not None:
                    for name, t, step, attrs in session_detail.events:
                        total += 1
                        yield EventRow(info.rank, a.index, name, (info.wall(t) - job_start) / NS, step, attrs)
                    continue
                records = records_of.get(index)
                for name, t, step in records.events if records is not None else ():
                    total += 1
                    yield EventRow(info.rank, a.index, name, (info.wall(t) - job_start) / NS, step)

    first = heapq.nsmallest(MAX_EVENTS, rows(), key=lambda e: (e.time_s, e.rank))  # = sorted(...)[:MAX_EVENTS]
    return first, total


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
    alive: Liveness | None = None,
    release_records: bool = False,
    keep_cuts: bool = True,
    since: RangeEdge | None = None,
    until: RangeEdge | None = None,
    every_s: float | None = None,
) -> RunAnalysis:
    """Analyse one job of a loaded run (the last one by default).

    ``window`` = (a, b) in seconds from the job start (negative values count from its end);
    ``rolling_s`` adds interval goodput over consecutive periods of that width. ``data_rule``
    ("asynchronous"/"synchronous") overrides the detected loop kind. MFU needs
    ``flops_per_step`` (model FLOPs of one optimizer step, all devices together; else the
    framework integration's per-rank ``flops_per_step`` metric times the world size) and a
    peak per device (``peak_flops``, else ``accelerator`` from the table, else the peak the
    integration recorded in its ``model`` event). ``now_wall_ns`` (the current time) and
    ``alive(host, pid)`` (a process probe) tell a last attempt that still runs (its time after
    the last sync point is ``in_progress``) from one that was lost. ``release_records`` frees
    the loaded records the cut has consumed as it goes (for a caller that analyses ``run``
    once: a released run cannot be analysed again). Every other rank's cut is dropped once its
    figures are reduced; with ``keep_cuts`` (the default) ``RunAnalysis.cuts`` still gives every
    session's cut to the views (the heat map, the gantt chart, the trace): kept in memory from
    the first cut within :data:`~goodtrace.analysis.session_cuts.KEEP_CUTS_BYTES`, the others in a
    temporary file, read back when asked for (so the records can be released either way).
    ``keep_cuts=False`` gives the reference sessions' alone (a caller that needs no per-rank
    view); the numbers are the same. ``since``/``until`` select a time range
    (:mod:`goodtrace.analysis.time_range`): its partition is ``window``, and the step table,
    its statistics, the anomalies and goodput over time (per ``every_s`` seconds; by default a
    period that cuts the span into 10-30: ``over_time.default_every_s``) keep to it.
    """
    if not run.sessions:
        raise AnalysisError("the run has no sessions")
    if run.released:
        raise AnalysisError("this loaded run was analysed with release_records=True: load it again")
    if data_rule not in (None, *DATA_RULES):
        raise AnalysisError(f"data_rule must be one of {', '.join(map(repr, DATA_RULES))}, got {data_rule!r}")
    warnings = list(run.warnings)
    all_attempts = discover_attempts(run.sessions, warnings, now_wall_ns=now_wall_ns, alive=alive)
    jobs = max(a.job for a in all_attempts) + 1
    chosen = jobs - 1 if job is None else job
    if not 0 <= chosen < jobs:
        raise AnalysisError(f"the run directory holds {jobs} job(s); there is no job {job}")
    attempts = [a for a in all_attempts if a.job == chosen]
    by_index = {s.index: s for s in run.sessions}
    reference_rank = min(by_index[a.reference_session].rank for a in attempts)
    submit_wall = by_index[attempts[0].reference_session].submit_wall
    ideal_override = None if ideal_step_s is None else ideal_step_s * NS
    reduced = cut_and_reduce(run, attempts, data_rule, release_records, keep_cuts,
                              ideal_override_ns=ideal_override, submit_wall=submit_wall)
    cuts = reduced.cuts
    attempt_of = {i: a.index for a in attempts for i in a.sessions}
    built = rank_timeline(run, attempt_of, cuts, [a.reference_session for a in attempts],
                           ideal_override_ns=ideal_override, submit_wall=submit_wall, pieces=True)
    if built is None:
        raise AnalysisError(f"rank {reference_rank} has no records loaded")
    timeline, ideal_ns = built
    host_overhead = host_overhead_of(timeline.cuts, data_rule)
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
    rows = StepTable(timeline.intervals, run.details, job_start)
    ideal_s = None if ideal_ns is None else ideal_ns / NS
    anomalies, threshold = find_anomalies(rows, k=anomaly_k)
    time_range = None
    if since is not None or until is not None:
        if window is not None:
            raise AnalysisError("give a window or a since/until time range, not both")
        time_range = resolve_range(since, until, job_start, timeline.end, rows)
        window_partition = interval_partition(timeline, *time_range)
        rows, anomalies = restrict_to_range(rows, anomalies, time_range)
    over_time = goodput_over_time(timeline, every_s, a=None if time_range is None else time_range[0],
                                  b=None if time_range is None else time_range[1])
    # every rank: its own partition (totals), step times, compute, lateness on the aligned clock
    job_sessions = [by_index[i] for a in attempts for i in a.sessions]
    clocks = loaded_clocks(run, [a.sessions for a in attempts], reduced.records)
    relabels = reduced.relabels
    relabels.update(timeline.relabels)  # the reference timeline's, as its step table shows them
    figures = figures_of(reduced.samples, clocks, reduced.goodput_by_rank, reduced.name_codes)
    spread = spread_of(figures)
    stragglers = find_stragglers(figures, ideal_s)
    for a in attempts:
        if a.ranks < a.world:
            warnings.append(f"attempt {a.index}: {a.world - a.ranks} of {a.world} ranks have no records")
    program = program_goodput(
        run, attempts, timeline, partition, flops_per_step, peak_flops, accelerator, devices_per_rank, submit_wall,
        warnings,
    )
    _explain(rows, timeline, reduced.ignored_syncs, warnings)
    events, events_total = _events(run, attempts, job_start, reduced.records)
    hangs = find_hangs(job_sessions, run.hang_events, attempt_of, clocks, job_start)
    warnings.extend(f"hang: {line}" for line in describe_hangs(hangs))
    slowdowns = slowdowns_of(job_sessions, reduced.series, attempt_of)
    reduced.series.close()
    for failure in dict.fromkeys(f for f in (cuts.spill_failure, reduced.series.spill_failure) if f):
        warnings.append(f"the temporary directory could not take what the analysis puts aside ({failure}): held "
                        "in memory instead (the numbers are the same); for a run this long, set TMPDIR to a "
                        "disk with room")
    stats = step_stats(rows, ideal_s)
    step_ns = sum(c.intervals_ns() for c in timeline.cuts)
    verdict = verdict_of(partition.buckets_ns, partition.total_ns, step_ns, stragglers, figures,
                         stats.median_s if stats.count else None)
    rewinds = rewind_rows(timeline.cuts, timeline.relabels, attempt_of, run.sessions, job_start)
    if rewinds:
        warnings.append(rewind_warning(rewinds))
    return RunAnalysis(
        path=run.path,
        job=chosen,
        jobs=jobs,
        attempts=tuple(attempts),
        reference_rank=reference_rank,
        partition=partition,
        window=window_partition,
        rolling=rolling,
        steps=rows,
        step_stats=stats,
        ideal_step_s=ideal_s,
        anomalies=tuple(anomalies),
        anomaly_threshold_s=threshold,
        spread=spread,
        stragglers=tuple(stragglers),
        program=program,
        host_overhead=host_overhead,
        verdict=verdict,
        timeline=timeline,
        warnings=tuple(dict.fromkeys(warnings)),
        form=run.form,
        records=run.records,
        skipped=dict(run.skipped),
        events=tuple(events),
        events_total=events_total,
        sessions=tuple(run.sessions),
        cuts=cuts,
        clocks=clocks,
        attempt_of=attempt_of,
        relabels=relabels,
        hangs=tuple(hangs),
        slowdowns=tuple(slowdowns),
        rewinds=tuple(rewinds),
        over_time=over_time,
        time_range=time_range,
        executed_steps=reduced.executed,
    )


def _explain(rows: StepTable, timeline: Timeline, ignored: int, warnings: list[str]) -> None:
    """Warnings for step tables that are not per-step truth, or that had to drop records."""
    if (rows.shared > 1).any():
        warnings.append("some steps have no sync point of their own: their time is the average of the "
                        "interval they share (sparse completion)")
    if any(c.host_timed for c in timeline.cuts):
        warnings.append("no sync points were recorded (no complete_on): step intervals are host-timed (step "
                        "entry to exit), which under asynchronous dispatch measure dispatch, not device time")
    repeated = int(((rows.flags & FLAG_REPEATED) != 0).sum())
    decreasing = int(((rows.flags & FLAG_DECREASING) != 0).sum())
    if repeated or decreasing:
        warnings.append(f"step numbers repeat ({repeated} executions) or go back ({decreasing}) within a session: "
                        "each execution is timed on its own (see the seq column)")
    if ignored:
        warnings.append(f"{ignored} sync point(s) were ignored: they named no execution of their step, came before "
                        "its entry, or came before an earlier execution's")
    if timeline.intervals.any_warmup():
        warnings.append("warm-up is inferred: the first step of an attempt took longer than the ideal step beyond "
                        "noise with no compile span to explain it")


def _window_edge(seconds: float, start: int, end: int) -> int:
    """Seconds from the job start (negative: from its end; infinite: the end itself)."""
    if math.isinf(seconds):
        return end if seconds > 0 else start
    return start + round(seconds * NS) if seconds >= 0 else end + round(seconds * NS)
