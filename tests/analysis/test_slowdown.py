"""A rank's slowdown against its own history (analysis.slowdown): a sustained shift is named
with its onset and size; a spike, a short burst, noise, and a job-wide slowdown are not."""

from __future__ import annotations

import random
from array import array

import pytest

from goodtrace.analysis.cut import SessionCut
from goodtrace.analysis.slowdown import Series, SeriesStore, Slowdown, slowdowns_of
from goodtrace.read.loaded import SessionInfo
from goodtrace.record.live.change_point import change_at, its_own, own_slowdown
from helpers.all_at_once import find_slowdowns

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


def _one_pass(sessions: list[SessionInfo], series: dict[int, Series], attempt_of: dict[int, int]) -> list[Slowdown]:
    """The rule read literally: every slowed session compared with every other session's
    change at its onset, all series held at once."""
    out = []
    for info in sessions:
        measure, steps, x = series[info.index]
        own = own_slowdown(steps, x)
        if own is None:
            continue
        attempt = attempt_of[info.index]
        others = [c for j, (m, s, y) in series.items() if j != info.index and attempt_of[j] == attempt and m == measure
                  and (c := change_at(s, y, own.onset_step)) is not None]
        increase = own.after / own.before - 1
        named, median = its_own(increase, others)
        if named:
            out.append(Slowdown(info.rank, info.host, attempt, measure, own.onset_step, own.before, own.after,
                                increase, median))
    return sorted(out, key=lambda s: (s.attempt, s.onset_step, s.rank))


@pytest.mark.parametrize("seed", range(6))
def test_the_series_kept_in_a_file_give_the_slowdowns_of_the_rule_read_literally(seed: int) -> None:
    """Ranks of two attempts and both measures, some slowed at the same onset, some at their
    own, one at a job-wide onset; steps as ranges and as arrays, some series views with a
    stride (every other value of a longer column): the store (each series in a temporary file,
    read back twice) names the same slowdowns, to the bit, as the rule applied with every
    series in memory."""
    import numpy as np

    rng = random.Random(seed)
    sessions, series, attempt_of = [], {}, {}
    store = SeriesStore()
    for i in range(14):
        n = rng.randrange(30, 90)
        onset = rng.choice([15, 15, 20, rng.randrange(11, n - 11)])
        slowed = rng.random() < 0.5
        x = np.array(_noisy(onset, 40.0, seed * 100 + i) + _noisy(n - onset, 52.0 if slowed else 40.0, seed * 100 + i + 50))
        steps: range | object = range(3, 3 + n) if rng.random() < 0.5 else np.cumsum(np.array([rng.choice([1, 1, 2]) for _ in range(n)]))
        if i % 3 == 0:  # a strided view, not a contiguous array
            x = np.repeat(x, 2)[::2]
            if not isinstance(steps, range):
                steps = np.repeat(steps, 2)[::2]
        one = ("compute" if rng.random() < 0.7 else "step", steps, x)
        sessions.append(_session(i, i))
        series[i] = one
        attempt_of[i] = i % 2
        store.add(i, one)
    try:
        found = slowdowns_of(sessions, store, attempt_of)
        assert found == _one_pass(sessions, series, attempt_of)
        assert found  # the runs drawn do have slowdowns to compare
        for i, (measure, steps, x) in series.items():
            back = store[i]
            assert back[0] == measure and list(back[1]) == list(steps) and back[2].tobytes() == x.tobytes()
    finally:
        store.close()


def test_a_series_that_cannot_be_written_stays_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from goodtrace.analysis.spill import SpillFile

    store = SeriesStore()
    assert store.spill_failure is None

    def full(self: SpillFile, data: memoryview) -> tuple[int, int]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SpillFile, "_write", full)
    x = np.array(_noisy(15, 40.0, 1) + _noisy(25, 52.0, 2))
    store.add(0, ("compute", range(40), x))
    assert store[0][2] is x and len(store) == 1
    assert store.spill_failure is not None and store.spill_failure.endswith("No space left on device")
    assert [s.onset_step for s in slowdowns_of([_session(0, 0)], store, {0: 0})] == [15]
