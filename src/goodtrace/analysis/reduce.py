"""Every session of the job cut once, and each rank reduced to its figures as soon as its
last session is cut (:func:`cut_and_reduce`); one rank's job timeline across the job's
attempts (:func:`rank_timeline`). What stays is :class:`Reduced`: the per-rank figures and
the cuts the views read (:class:`~goodtrace.analysis.session_cuts.SessionCuts`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from goodtrace.analysis.attempts import Attempt, rank_processes
from goodtrace.analysis.cut import Relabels, SessionCut, cut_session
from goodtrace.analysis.partition import (
    DISRUPTION,
    IN_PROGRESS,
    PRODUCTIVE,
    TEARDOWN,
    Timeline,
    assemble,
    ideal_step_ns,
    noise_threshold_ns,
    steady_steps,
)
from goodtrace.analysis.ranks import RankSample, sample_rank, sample_strides
from goodtrace.analysis.session_cuts import SessionCuts
from goodtrace.analysis.slowdown import SeriesStore, slowdown_series
from goodtrace.columns import distinct_sorted, int64s
from goodtrace.read.loaded import LoadedRun, SessionRecords

__all__ = ["Reduced", "cut_and_reduce", "rank_timeline"]


def _tail_label(attempt: Attempt) -> str:
    if attempt.ended == "running":
        return IN_PROGRESS
    return TEARDOWN if attempt.normal else DISRUPTION


@dataclasses.dataclass
class Reduced:
    """What the analysis keeps of the job's sessions once each rank is cut and reduced."""

    cuts: SessionCuts  # what views read: every session's, or the reference sessions' alone
    samples: list[RankSample]  # per rank, in the job's order of ranks
    name_codes: dict[str, int]
    goodput_by_rank: dict[int, float]
    relabels: dict[int, Relabels]
    series: SeriesStore  # per session, what the slowdown rule compares (in a temporary file)
    ignored_syncs: int
    # per session, the columns read after the cut (the clock alignment, the event list): taken
    # as each session is cut, so that no later pass fetches a session again (a run of many
    # sessions would fetch them one by one)
    records: dict[int, SessionRecords] = dataclasses.field(default_factory=dict)
    # per attempt, the distinct step numbers its sessions executed in an interval, sorted:
    # O(steps), joined as each session is cut (a view that chooses steps to draw read every
    # rank's cut back for them: O(ranks x steps))
    executed: dict[int, Any] = dataclasses.field(default_factory=dict)


def cut_and_reduce(
    run: LoadedRun, attempts: Sequence[Attempt], data_rule: str | None, release: bool, keep_cuts: bool, *,
    ideal_override_ns: float | None, submit_wall: int | None,
) -> Reduced:
    """Every session of the job, cut once (an empty record set when none was loaded), in the
    loader's order (it fetches a block of sessions at a time), the reference sessions last:
    their cuts are kept to the end, so no other session's cut is made while they are held. As
    soon as a rank's every session is cut, its figures are reduced (its goodput, its
    :class:`RankSample`, each session's slowdown series) and the cuts of its sessions other
    than the reference ones leave memory: handed to the views' :class:`SessionCuts` with
    ``keep_cuts`` (which keeps some in memory and writes the others to a temporary file), else
    dropped; what stays in memory per session is O(sampled steps), not O(steps). With
    ``release``, each session's step, sync, span and compute columns and its device metrics
    are dropped from ``run`` as soon as it is cut (nothing after the cut reads them). The order of cutting changes nothing the analysis
    reports: what is reduced is looked up by session or rank, and the samples are kept in the
    job's order of ranks."""
    cuts: dict[int, SessionCut] = {}
    attempt_for = {index: a for a in attempts for index in a.sessions}
    attempt_of = {index: a.index for index, a in attempt_for.items()}
    reference = {a.reference_session for a in attempts}
    sessions_of: dict[int, list[int]] = {}
    for index in (i for a in attempts for i in a.sessions):
        sessions_of.setdefault(run.sessions[index].rank, []).append(index)
    # a rank's figures are its one process per attempt's (processes claiming a rank twice at
    # once: the first; discover_attempts warns about the others)
    standing = rank_processes([run.sessions[i] for a in attempts for i in a.sessions], attempt_of)
    left = {rank: len(members) for rank, members in sessions_of.items()}  # sessions not cut yet
    job_order = [index for a in attempts for index in a.sessions]
    views = SessionCuts(job_order if keep_cuts else [i for i in job_order if i in reference])
    reduced = Reduced(views, [], {}, {}, {}, SeriesStore(), 0)
    samples: dict[int, RankSample] = {}
    strides = sample_strides((run.sessions[i] for i in attempt_for), attempt_of)  # the sample, once per attempt
    starts: dict[int, SessionRecords] = {}
    order = sorted(attempt_for, key=lambda i: (i in reference, i))
    for index in order:
        a = attempt_for[index]
        records = run.session_records.get(index) or SessionRecords()
        if release and index == order[-1]:
            run.close()  # every session is fetched: the run model's buffers go before the last cut
        cut = cuts[index] = _cut(run, a, index, data_rule, records)
        reduced.ignored_syncs += cut.ignored_syncs
        _add_executed(reduced.executed, a.index, cut)
        reduced.records[index] = SessionRecords(clock=records.clock, events=records.events)
        # the span-start sample the rank figures read (a rank's earlier session is not fetched again)
        starts[index] = SessionRecords(starts_step=records.starts_step, starts_name=records.starts_name,
                                       starts_t0=records.starts_t0)
        found = slowdown_series(cut)
        if found is not None:
            reduced.series.add(index, found)
        if release and index in run.session_records:
            run.session_records[index] = SessionRecords(  # device metrics by step: read by the cut alone
                clock=records.clock, starts_step=records.starts_step, starts_name=records.starts_name,
                starts_t0=records.starts_t0, events=records.events)
        del records, cut  # held in cuts[index] alone: dropped there once its rank is reduced
        rank = run.sessions[index].rank
        left[rank] -= 1
        if left[rank]:
            continue
        members = sessions_of[rank]
        own = [i for i in members if i in standing]
        other = rank_timeline(run, attempt_of, cuts, own, ideal_override_ns=ideal_override_ns,
                               submit_wall=submit_wall, pieces=False)
        if other is not None:
            reduced.relabels.update(other[0].relabels)
            if other[0].end > other[0].start:
                reduced.goodput_by_rank[rank] = other[0].buckets.get(PRODUCTIVE, 0) / (other[0].end - other[0].start)
        del other  # its timeline holds the rank's cuts
        samples[rank] = sample_rank(rank, [run.sessions[i] for i in own], cuts, starts, attempt_of,
                                    reduced.name_codes, strides)
        for i in members:
            if i in views:
                views.hold(i, cuts[i], always=i in reference)
            del cuts[i], starts[i]
    if release:
        run.released = True
        run.close()
    reduced.samples = [samples[rank] for rank in sessions_of]
    if not keep_cuts:
        reduced.relabels = {i: r for i, r in reduced.relabels.items() if i in views}
    return reduced


def _cut(run: LoadedRun, attempt: Attempt, index: int, data_rule: str | None,
         records: SessionRecords | None) -> SessionCut:
    """The cut of one session of ``attempt`` (an empty record set when none was loaded)."""
    return cut_session(run.sessions[index], records or SessionRecords(), tail_label=_tail_label(attempt),
                       close_trailing=attempt.normal, data_rule=data_rule)


def _add_executed(executed: dict[int, Any], attempt: int, cut: SessionCut) -> None:
    """Join the distinct step numbers of ``cut``'s executions that closed in an interval to
    ``executed[attempt]`` (sorted): no sort where they are already in order, nothing made
    where the attempt has them all (every rank executes the same steps)."""
    import numpy as np

    steps = int64s(cut.exec_step)[int64s(cut.exec_interval) >= 0]
    if len(steps) > 1 and not bool((steps[1:] > steps[:-1]).all()):
        steps = distinct_sorted(steps)
    known = executed.get(attempt)
    if known is None:
        executed[attempt] = steps
    elif not np.array_equal(known, steps):
        executed[attempt] = distinct_sorted(np.concatenate((known, steps)))


def rank_timeline(
    run: LoadedRun, attempt_of: dict[int, int], cuts: Mapping[int, SessionCut], sessions: Sequence[int], *,
    ideal_override_ns: float | None, submit_wall: int | None, pieces: bool,
) -> tuple[Timeline, float | None] | None:
    """The job timeline of one rank (``sessions``: its sessions in the job) across the job's
    attempts; None without sessions."""
    items = [(attempt_of[i], run.sessions[i], cuts[i]) for i in sessions]
    if not items:
        return None
    chosen = [c for _, _, c in items]
    steady = steady_steps(chosen)
    ideal = ideal_override_ns if ideal_override_ns is not None else ideal_step_ns(chosen, steady)
    timeline = assemble(items, ideal=ideal, noise=noise_threshold_ns(chosen, steady), submit_wall=submit_wall,
                        pieces=pieces)
    return timeline, ideal
