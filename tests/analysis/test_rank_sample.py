"""The sampled steps the cross-rank figures compare (docs/semantics.md section 7) are chosen once
per attempt, so that ranks whose step ranges differ (a rank killed a few steps before the
others, a crashed attempt) still share them."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from helpers.builders import Proc, load


def _ranks(run: Path, last_steps: tuple[int, int]) -> None:
    """Two ranks; rank 1 computes 25% slower (a little noise on each); rank r runs steps 0 to
    ``last_steps[r]``."""
    for rank, last in enumerate(last_steps):
        p = Proc(run, rank=rank, world=2, host=f"node{rank}")
        t = 1.0
        for k in range(last + 1):
            compute = 0.01 * (1.25 if rank == 1 else 1.0) * (1 + 0.01 * ((k * 7 + rank * 3) % 5))
            p.step(k, t, t + 0.001)
            p.span("data", t + 0.0002, t + 0.0006, step=k)
            p.span("forward_backward", t + 0.001, t + 0.001 + compute, cat="compute", step=k)
            t += 0.002 + compute
            p.sync(k, t, "lag")
        p.heartbeat(t + 0.5) if rank == 1 and last != last_steps[0] else p.finish(t + 0.5)
        p.write()


@pytest.mark.parametrize("last_steps", [(1000, 1000), (1000, 990), (990, 1000), (1000, 700)])
def test_a_slower_rank_is_named_whatever_step_its_records_end_at(tmp_path: Path, last_steps: tuple[int, int]) -> None:
    _ranks(tmp_path, last_steps)
    result = analyze(load(tmp_path), now_wall_ns=None)
    assert [s.rank for s in result.stragglers] == [1]
    assert "computes at 80% of the other ranks' speed" in result.stragglers[0].reason
    figure = {f.rank: f for f in result.spread.per_rank}[1]
    assert figure.compute_evidence is not None and figure.compute_evidence.samples >= 16
    assert figure.start_evidence is not None and figure.start_evidence.samples >= 16


def test_the_loaders_sample_of_a_session_holds_its_attempts() -> None:
    """The loader keeps a session's span starts at the multiples of its own range's stride;
    the analysis compares the ranks at the multiples of their attempt's: a session's range lies
    within its attempt's, so its stride divides the attempt's and the loader kept every step of
    the attempt's sample in the session's range."""
    from goodtrace.read.loaded import SAMPLE_STEPS, sample_stride

    for lo, hi in ((0, 1000), (0, 990), (-40, 3_000), (5, 20), (17, 100_017), (0, 63), (0, 64)):
        stride = sample_stride(lo, hi)
        assert stride & (stride - 1) == 0 and (hi - lo < 2 * SAMPLE_STEPS) == (stride == 1)
        assert SAMPLE_STEPS <= len(range(lo + (-lo) % stride, hi + 1, stride)) <= 2 * SAMPLE_STEPS or stride == 1
        for inner in ((lo, hi - 10), (lo + 10, hi), (lo + (hi - lo) // 2, hi)):
            assert stride % sample_stride(*inner) == 0
