"""A rank's slowdown against its own history (analysis.slowdown): a sustained shift is named
with its onset and size; a spike, a short burst, noise, and a job-wide slowdown are not."""

from __future__ import annotations

import random
from array import array

import pytest

from goodtrace.analysis.cut import SessionCut
from goodtrace.analysis.slowdown import find_slowdowns
from goodtrace.read.loaded import SessionInfo

MS = 1_000_000


def _session(index: int, rank: int) -> SessionInfo:
    return SessionInfo(index=index, session=f"s{index}", rank=rank, world=2, host=f"h{rank}", pid=index, restart=None,
                       proc_start=0, init=0, submit_wall=None, wall_anchor=0, mono_anchor=0, last_seen=0)


def _cut(index: int, compute_ms: list[float]) -> SessionCut:
    n = len(compute_ms)
    return SessionCut(session=index, start=0, end=1, data_rule="async", host_timed=False, tail_label="teardown",
                        exec_step=array("q", range(n)), exec_interval=array("q", range(n)),
                        exec_compute=array("q", (round(c * MS) for c in compute_ms)))


def _noisy(n: int, level: float, seed: int, spread: float = 0.03) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def _find(*ranks: list[float]) -> list[tuple[int, int, float]]:
    sessions = [_session(i, i) for i in range(len(ranks))]
    cuts = {i: _cut(i, c) for i, c in enumerate(ranks)}
    return [(s.rank, s.onset_step, round(s.increase, 2)) for s in find_slowdowns(sessions, cuts, dict.fromkeys(cuts, 0))]


@pytest.mark.parametrize("seed", range(5))
def test_compute_30_percent_slower_from_step_15_is_named_at_its_onset(seed: int) -> None:
    slow = _noisy(15, 40.0, seed) + _noisy(25, 52.0, seed + 100)
    (found,) = _find(slow)
    rank, onset, increase = found
    assert rank == 0 and abs(onset - 15) <= 1 and increase == pytest.approx(0.3, abs=0.05)


def test_with_other_ranks_only_the_one_that_slowed_is_named() -> None:
    assert [r for r, _, _ in _find(_noisy(40, 40.0, 1), _noisy(15, 40.0, 2) + _noisy(25, 52.0, 3), _noisy(40, 40.0, 4))] == [1]


def test_a_job_wide_slowdown_names_nobody() -> None:
    ranks = [_noisy(15, 40.0, r) + _noisy(25, 52.0, r + 10) for r in range(3)]
    assert _find(*ranks) == []
    assert len(_find(ranks[0])) == 1  # alone, the same series is a slowdown of its own


@pytest.mark.parametrize("series", [
    [*_noisy(20, 40.0, 5), 400.0, *_noisy(19, 40.0, 6)],  # one spike
    _noisy(20, 40.0, 7) + _noisy(6, 80.0, 8) + _noisy(14, 40.0, 9),  # a burst that ended
    _noisy(32, 40.0, 10) + _noisy(8, 60.0, 11),  # 8 steps at the new level: 10 needed, 9 of them above
    _noisy(40, 40.0, 12, spread=0.4),  # noise, however large
    _noisy(15, 40.0, 13) + _noisy(25, 43.0, 14),  # 7.5%: below the margin
])
def test_spikes_bursts_short_tails_noise_and_small_shifts_are_not_slowdowns(series: list[float]) -> None:
    assert _find(series) == []
