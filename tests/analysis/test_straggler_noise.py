"""Naming a rank needs evidence beyond noise (docs/semantics.md section 7), on synthetic records
of the job tests/integrations/test_no_false_alarms.py runs for real: 4 ranks, 40 steps of
forward, backward and optimizer, a checkpoint every 10 steps and an eval (with an all-reduce)
every 15, the collective after the step (an all-reduce of the loss) or inside it (DDP's
all-reduce in ``backward``); compute is CPU work (matrix products, whose time varies with the
load) or a busy loop until a deadline (a device of known speed). The noise is what a loaded
2-core machine gives real ranks, drawn from a fixed seed: every span's time varies by a
lognormal factor (sigma 0.15 for CPU work, 0.02 on the device), a rank is now
and then preempted for 6-27 ms at the start of a span (the lateness into 'eval', 'checkpoint',
'optimizer' or 'gc' that the rule before evidence named), and a rank computes at 88% for a few
steps in a row. In each of many such runs a uniform job names nobody, and a rank doing 25% more
work is still named, for its compute speed or for entering 'backward' late."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from goodtrace.analysis import RunAnalysis, analyze
from helpers.builders import Proc, load

RANKS, STEPS = 4, 40
FORWARD_S, BACKWARD_S, OPTIMIZER_S, SLOWER = 0.040, 0.020, 0.002, 1.25


def _job(run: Path, seed: int, collective: str, kind: str = "spin", slow_rank: int = -1) -> RunAnalysis:
    rng = random.Random(seed)
    sigma = {"matmul": 0.15, "spin": 0.02}[kind]
    procs = [Proc(run, rank=r, world=RANKS, host=f"node{r // 2}") for r in range(RANKS)]
    now = [1.0 + 0.001 * r for r in range(RANKS)]  # each rank's clock, after init
    spell = {r: range(0) for r in range(RANKS)}  # steps a rank computes at 88% (a busy core)

    def work(rank: int, seconds: float, step: int) -> float:
        factor = rng.lognormvariate(0.0, sigma) * (SLOWER if rank == slow_rank else 1.0)
        return seconds * factor / (0.88 if step in spell[rank] else 1.0)

    def preempted() -> float:
        return rng.uniform(0.006, 0.027) if rng.random() < 0.08 else 0.0

    def span(rank: int, name: str, seconds: float, step: int | None) -> float:
        start = now[rank] + preempted()
        procs[rank].span(name, start, start + seconds, step=step)
        now[rank] = start + seconds
        return now[rank]

    def all_reduce(ranks_at: list[float]) -> list[float]:
        done = max(ranks_at) + 0.0005
        return [done + rng.uniform(0, 0.0003) for _ in ranks_at]

    for k in range(STEPS):
        for r in range(RANKS):
            if rng.random() < 0.03:
                spell[r] = range(k, k + rng.randint(3, 6))
        starts = list(now)
        for r in range(RANKS):
            span(r, "forward", work(r, FORWARD_S, k), k)
        if collective == "inside":  # DDP: each backward holds the all-reduce, so it ends with the last
            ready = [now[r] + preempted() + work(r, BACKWARD_S, k) for r in range(RANKS)]
            begins = list(now)
            for r, end in enumerate(all_reduce(ready)):
                procs[r].span("backward", begins[r], end, step=k)
                now[r] = end
        else:
            for r in range(RANKS):
                span(r, "backward", work(r, BACKWARD_S, k), k)
        for r in range(RANKS):
            span(r, "optimizer", work(r, OPTIMIZER_S, k), k)
            procs[r].step(k, starts[r], now[r])
            procs[r].sync(k, now[r], "lag")
        if collective == "after":
            now = all_reduce(now)
        if k % 10 == 9:
            for r in range(RANKS):
                span(r, "checkpoint", 0.004 * rng.lognormvariate(0.0, 0.3), None)
        if k % 15 == 14:
            for r in range(RANKS):
                span(r, "eval", work(r, FORWARD_S, k), None)
            now = all_reduce(now)
        for r in range(RANKS):
            if rng.random() < 0.3:
                span(r, "gc", 0.0005 * rng.lognormvariate(0.0, 0.5), None)
    for r in range(RANKS):
        procs[r].finish(now[r] + 0.01)
        procs[r].write()
    return analyze(load(run), now_wall_ns=None)


@pytest.mark.parametrize("kind", ["matmul", "spin"])
@pytest.mark.parametrize("collective", ["after", "inside"])
@pytest.mark.parametrize("seed", range(6))
def test_a_uniform_four_rank_job_names_nobody(tmp_path: Path, seed: int, collective: str, kind: str) -> None:
    result = _job(tmp_path, seed, collective, kind)
    # every rank was weighed (its compute and its start into each span on the sampled steps)...
    assert all(f.compute_evidence is not None and f.compute_evidence.samples >= 16 and f.start_evidence is not None
               for f in result.spread.per_rank)
    # ... and none is named
    assert [(s.rank, s.reason) for s in result.stragglers] == []
    assert [(s.rank, s.reason) for s in result.slowdowns] == []


@pytest.mark.parametrize("seed", range(5))
def test_a_rank_doing_25_percent_more_work_is_named_when_the_collective_comes_after(tmp_path: Path,
                                                                                  seed: int) -> None:
    result = _job(tmp_path, seed, "after", "spin", slow_rank=3)
    assert [s.rank for s in result.stragglers] == [3], [s.reason for s in result.stragglers]
    reason = result.stragglers[0].reason
    assert "computes at" in reason or "last to arrive" in reason
    figure = {f.rank: f for f in result.spread.per_rank}[3]
    assert figure.compute_evidence is not None
    assert figure.compute_evidence.consistency >= 0.8 and figure.compute_evidence.effect_s > 0


@pytest.mark.parametrize("seed", range(5))
def test_a_rank_doing_25_percent_more_work_is_named_when_the_collective_is_inside_the_step(tmp_path: Path,
                                                                                         seed: int) -> None:
    result = _job(tmp_path, seed, "inside", "spin", slow_rank=3)
    assert [s.rank for s in result.stragglers] == [3], [s.reason for s in result.stragglers]
    assert "enters 'backward'" in result.stragglers[0].reason
    figure = {f.rank: f for f in result.spread.per_rank}[3]
    assert figure.late_span == "backward" and figure.start_evidence is not None
    assert figure.start_evidence.beyond_noise()
