"""The all-at-once definitions of what the analysis reduces rank by rank (and with its cuts
released): every rank's figures and every session's slowdown computed from every cut at once.
Tests hold the analysis's reductions to them; the analysis itself never holds every cut."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from goodtrace.analysis.clock import SessionClock
from goodtrace.analysis.cut import SessionCut
from goodtrace.analysis.ranks import RankFigure, figures_of, sample_rank, sample_strides
from goodtrace.analysis.slowdown import Slowdown, _series, slowdowns_of
from goodtrace.read.loaded import SessionInfo, SessionRecords


def rank_figures(
    sessions: Sequence[SessionInfo],
    cuts: dict[int, SessionCut],
    records: Mapping[int, SessionRecords],
    attempt_of: dict[int, int],
    clocks: dict[int, SessionClock],
    goodput_by_rank: dict[int, float],
) -> list[RankFigure]:
    """One figure per rank over the given sessions (a rank's sessions combined): every rank
    sampled (``sample_rank``), then compared (``figures_of``)."""
    by_rank: dict[int, list[SessionInfo]] = {}
    for s in sessions:
        by_rank.setdefault(s.rank, []).append(s)
    name_codes: dict[str, int] = {}
    strides = sample_strides(sessions, attempt_of)
    samples = [sample_rank(rank, members, cuts, records, attempt_of, name_codes, strides)
               for rank, members in by_rank.items()]
    return figures_of(samples, clocks, goodput_by_rank, name_codes)


def find_slowdowns(
    sessions: Sequence[SessionInfo], cuts: Mapping[int, SessionCut], attempt_of: Mapping[int, int],
) -> list[Slowdown]:
    """The sessions whose own time per execution rose by a sustained margin, with the onset."""
    series = {info.index: found for info in sessions
              if (cut := cuts.get(info.index)) is not None and (found := _series(cut)) is not None}
    return slowdowns_of(sessions, series, attempt_of)
