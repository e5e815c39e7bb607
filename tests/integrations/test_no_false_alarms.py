"""Naming a rank needs evidence beyond noise (docs/semantics.md section 7), on real gloo ranks
on this 2-core machine, where 4 ranks share 2 cores and the other tests' load adds its own
noise. Compute is either CPU work (matrix products, whose time varies with the load) or a busy
loop until a deadline (a device of known speed: how a slow rank is made 25% slower):

- a uniform 4-rank job (same work on every rank, a checkpoint every 10 steps and an eval every
  15, as the demo does; DDP's all-reduce inside ``backward``, CPU work) names nobody (nor slower
  than it was, unless its measured step bodies show the machine made it so:
  helpers/step_truth.py).

A rank that slows down is named, with its onset, on real ranks in
tests/integrations/test_live_slowdown.py (by the live line and the report alike), and at 30%
on synthetic series in tests/analysis/test_slowdown.py.

The rule itself (many uniform runs, the collective after and inside the step, CPU work and a
device, each naming nobody; a rank doing 25% more work named for its compute or its late start
into ``backward``) is tested on synthetic records of this job with the noise of a loaded
machine (tests/analysis/test_straggler_noise.py), where a threshold is a rule and not a race; a
slower real gloo rank is named in tests/integrations/test_stragglers.py.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import step_truth
from helpers.ranks import leave_group, run_ranks

pytestmark = pytest.mark.processes

torch = pytest.importorskip("torch")

STEPS = 40
FORWARD_S, BACKWARD_S, SLOWER = 0.040, 0.020, 1.25
PRODUCTS_PER_S = 4000  # matrix products a second on one idle core (~0.25 ms each)


def _work(seconds: float, kind: str) -> torch.Tensor:
    """``seconds`` of compute: matrix products (CPU work: 4 ranks share 2 cores, so its time
    varies with their load) or a busy loop until a deadline (a device of known speed)."""
    x = torch.ones(64, 256)
    if kind == "spin":
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
        return x
    w = torch.full((256, 256), 1 / 256)
    for _ in range(round(seconds * PRODUCTS_PER_S)):
        x = torch.tanh(x @ w)
    return x


def _worker(rank: int, world: int, port: int, run_dir: str, slow_rank: int, collective: str, kind: str,
            slower: float, slow_from: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import goodtrace as gt
    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world)
    instrument(live=False, memory=False, clock_sync_every=0)
    model = DistributedDataParallel(torch.nn.Linear(64, 64)) if collective == "inside" else torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dist.barrier()
    bodies: list[float] = []  # how long each step's body really took (the ground truth)
    for step in range(STEPS):
        scale = slower if rank == slow_rank and step >= slow_from else 1.0
        with gt.step(step) as s:
            t0 = time.perf_counter()
            with gt.span("forward"):
                hidden = _work(FORWARD_S * scale, kind)
                loss = model(hidden[:, :64]).sum()
            with gt.span("backward"):
                _work(BACKWARD_S * scale, kind)
                loss.backward()  # "inside": DDP's all-reduce, the fast ranks wait here
            with gt.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            bodies.append(time.perf_counter() - t0)
            s.complete_on(loss.detach())
        if collective == "after":
            dist.all_reduce(loss.detach())  # the fast ranks wait here, after their step
        if step % 10 == 9:
            with gt.span("checkpoint"):
                torch.save(model.state_dict(), Path(run_dir) / f"model-{rank}.pt")
        if step % 15 == 14:
            with gt.span("eval"):
                average = _work(FORWARD_S, kind).mean()
                dist.all_reduce(average)
        gc.collect(0)  # young collections, as a real loop has them
    gt.finish()
    step_truth.write(run_dir, rank, bodies)
    del model, optimizer, loss  # DDP's reducer, before the group goes
    leave_group()


def _named(tmp_path: Path, world: int, slow_rank: int, collective: str, kind: str = "spin",
           slower: float = SLOWER, slow_from: int = 0) -> tuple[list[tuple[int, str]], Any, Path]:
    from goodtrace.analysis import analyze
    from goodtrace.read.load import load_run

    run_dir = tmp_path / f"run-{world}-{slow_rank}-{collective}"
    run_ranks(_worker, world, str(run_dir), slow_rank, collective, kind, slower, slow_from, timeout=240)
    result = analyze(load_run(run_dir))
    return [(s.rank, s.reason) for s in result.stragglers], result, run_dir


def test_a_uniform_four_rank_job_names_nobody(tmp_path: Path) -> None:
    """DDP's all-reduce inside the step and CPU work, the noisiest of the forms. (The rule
    before evidence was required named a rank in 7 of 10 real runs of this job: late into 'eval',
    'checkpoint', 'optimizer' or 'gc' by 6-27 ms, or computing at 88%.)"""
    collective, kind = "inside", "matmul"
    world = 4
    stragglers, result, run_dir = _named(tmp_path, world, -1, collective, kind)
    assert stragglers == []
    # nor did any rank become slower than it was, unless the machine really made it so (its
    # measured step bodies: helpers/step_truth.py)
    for slowdown in result.slowdowns:
        truly = step_truth.slower_than_others(run_dir, world, slowdown.rank, slowdown.onset_step)
        assert truly >= step_truth.MARGIN, (slowdown.reason, truly)
