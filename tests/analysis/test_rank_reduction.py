"""Each rank is reduced as its last session is cut (analysis.reduce.cut_and_reduce): with
``keep_cuts=False`` the cuts of every rank but the reference are dropped before the next rank
is cut, and every number of the report must stay the same to the byte. A run with two
attempts (a rank's sessions far apart in the loader's order), a rank that computes slower, a
rank that slows down mid-attempt and one that enters its data span late."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from helpers.all_at_once import find_slowdowns, rank_figures
from helpers.builders import Proc, load

RANKS = 4


def _attempt(run: Path, restart: int, start: float, steps: range, *, crash: bool) -> None:
    for rank in range(RANKS):
        p = Proc(run, rank=rank, world=RANKS, restart=restart, start=start, host=f"node{rank // 2}")
        p.clock(2_000 * rank, start + 0.1)
        t = start + 1.0
        for k in steps:
            compute = 0.5 * (1.3 if rank == 2 else 1.0) * (1.4 if rank == 3 and restart == 1 and k >= 60 else 1.0)
            compute *= 1 + 0.01 * ((k * 7 + rank * 3) % 5)  # a little noise, different per rank
            late = 0.05 if rank == 1 else 0.0
            p.step(k, t, t + 0.01)
            p.span("data", t + late, t + late + 0.02, step=k)
            p.span("forward_backward", t + 0.05, t + 0.05 + compute, cat="compute", step=k)
            t += 0.1 + compute
            p.sync(k, t, "lag")
        if crash:
            p.heartbeat(t + 0.5)
        else:
            p.finish(t + 0.5)
        p.write()


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    _attempt(run, 0, 0.0, range(40), crash=True)
    _attempt(run, 1, 60.0, range(30, 110), crash=False)
    return run


def test_dropping_other_ranks_cuts_changes_no_number(tmp_path: Path) -> None:
    run = _run(tmp_path)
    loaded = load(run)
    kept = analyze(loaded, now_wall_ns=None, release_records=True)
    reduced = analyze(load(run), now_wall_ns=None, release_records=True, keep_cuts=False)
    assert json.dumps(reduced.to_dict(), sort_keys=True) == json.dumps(kept.to_dict(), sort_keys=True)
    # the run exercises every cross-rank figure: two attempts, a slow rank, a slowdown, a late span
    assert len(kept.attempts) == 2 and len(kept.cuts) == 2 * RANKS
    assert [s.rank for s in kept.stragglers] == [1, 2]
    assert [(s.rank, s.attempt) for s in kept.slowdowns] == [(3, 1)]
    assert all(f.goodput is not None and f.lateness_median_s is not None for f in kept.spread.per_rank)
    # what stays is the reference rank's cuts (the step table's timeline), not every rank's
    assert sorted(reduced.cuts) == sorted(a.reference_session for a in reduced.attempts)
    assert set(reduced.relabels) <= set(reduced.cuts)
    # ... and the rank-by-rank reduction is the all-at-once definition over every cut
    sessions = [kept.sessions[i] for i in kept.cuts]
    goodputs = {f.rank: f.goodput for f in kept.spread.per_rank if f.goodput is not None}
    assert rank_figures(sessions, kept.cuts, loaded.session_records, kept.attempt_of, kept.clocks,
                        goodputs) == list(kept.spread.per_rank)
    assert find_slowdowns(sessions, kept.cuts, kept.attempt_of) == list(kept.slowdowns)


def test_the_events_listed_are_the_first_of_all_of_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report lists the first MAX_EVENTS events, earliest first (ties by rank, then in the
    job's order), and counts them all, holding only those it lists."""
    import goodtrace.analysis as analysis

    run = tmp_path / "run"
    for rank in range(3):
        p = Proc(run, rank=rank, world=3, restart=0, start=0.0, host="node")
        t = 1.0
        for k in range(30):
            p.step(k, t, t + 0.01).sync(k, t + 0.02)
            if k % 3 == rank or k % 7 == 0:  # every rank at the same instant every 7th step
                p.event(f"e{k % 4}", t + 0.015, step=k)
            t += 0.05
        p.finish(t).write()
    every = analyze(load(run))
    assert every.events_total == len(every.events) > 12
    monkeypatch.setattr(analysis, "MAX_EVENTS", 12)
    first = analyze(load(run))
    assert first.events == every.events[:12] and first.events_total == every.events_total
    assert [(e.time_s, e.rank) for e in every.events] == sorted((e.time_s, e.rank) for e in every.events)


def test_the_median_helper_is_numpys_to_the_bit() -> None:
    """``columns.median`` replaces ``np.median`` on the per-session arrays (its machinery cost
    more than the arithmetic at thousands of ranks): the same float, odd and even lengths,
    integers far past 2**53, float64, NaN, and the dtypes it leaves to numpy."""
    import numpy as np

    from goodtrace.columns import median

    rng = np.random.default_rng(7)
    for n in [*range(1, 25), 999, 1000]:
        for values in (rng.integers(-(10**15), 10**15, n), rng.integers(0, 2**62, n), rng.integers(0, 3, n),
                       rng.normal(size=n) * 1e9, rng.normal(size=n).astype(np.float32), rng.integers(0, 9, n).astype(np.uint8)):
            assert median(values.copy()) == float(np.median(values)), (n, values.dtype)
    with_nan = rng.normal(size=9)
    with_nan[2] = np.nan
    assert np.isnan(median(with_nan))


def test_a_rank_seconds_late_is_named_in_seconds(tmp_path: Path) -> None:
    """A rank that reaches every sync point 2.5 s after the others (ranks that drifted apart on
    a long run) is named with its lateness in seconds, not thousands of milliseconds; one 50 ms
    late, in milliseconds."""
    for late_s, text in ((2.5, "2.5 s after the other ranks"), (0.05, "50.0 ms after the other ranks")):
        run_dir = tmp_path / f"late-{late_s}"
        for rank in range(3):
            proc = Proc(run_dir, rank=rank, world=3, start=0.0)
            t = proc.loop(range(40), 1.0 + (late_s if rank == 2 else 0.0))
            proc.finish(t)
            proc.write()
        stragglers = analyze(load(run_dir)).stragglers
        assert [s.rank for s in stragglers] == [2]
        assert text in stragglers[0].reason, stragglers[0].reason
