"""A real rollback in real processes: two gloo ranks train a small DDP model, save a
``torch.save`` checkpoint every 4 steps, and when the loss goes to NaN (a poisoned batch at
step 11, on every rank through an all-reduce) reload the last checkpoint with ``torch.load``
and run steps 9-11 again. The report must show the rollback: the first pass of 9-11
is ``wasted_progress``, the reload is ``checkpoint_restore``, each step counts once, and the
live goodput drops when it happens; the model after it must be the one a clean run trains.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from helpers.cli import goodtrace
from helpers.ranks import leave_group, run_ranks

pytestmark = pytest.mark.processes

torch = pytest.importorskip("torch")

STEPS = 16
SPIKE = 11  # the step whose batch is poisoned (once)
EVERY = 4  # checkpoint after steps 0, 4, 8, 12
# Each step also waits this long (a stand-in for real compute): the time a rollback throws away
# is then large against how much two live estimates of one window differ on a loaded machine.
COMPUTE_S = 0.03


def _batch(step: int) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def _worker(rank: int, world: int, port: int, run_dir: str, out_dir: str, said: bool, spike: bool) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world)
    lines: list[str] = []
    integration = instrument(log_every=1, memory=False, clock_sync_every=0, printer=lines.append)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpoint = Path(out_dir, f"ckpt-{rank}.pt")
    poisoned = not spike
    step = 0
    while step < STEPS:
        with gt.step(step) as s:
            x, y = _batch(step)
            time.sleep(COMPUTE_S)
            loss = torch.nn.functional.mse_loss(model(x), y)
            if step == SPIKE and not poisoned:
                poisoned = True
                loss = loss * float("nan")  # the bad batch
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            s.complete_on(loss)
        seen = loss.detach().clone()
        dist.all_reduce(seen)  # every rank sees a NaN on any rank
        if not torch.isfinite(seen):
            with gt.span("restore"):
                state = torch.load(checkpoint)
                model.module.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
            if said:
                gt.event("rollback", to_step=state["step"])
            step = state["step"] + 1
            continue
        if step % EVERY == 0:
            with gt.span("checkpoint"):
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                           checkpoint)
        step += 1
    gt.finish(completed=True)
    aggregator = integration.aggregator
    assert aggregator is not None
    result = {
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
        "productive_s": [line.productive_s for line in aggregator.lines],
        "window_productive_s": [(line.train_s or 0.0) * line.steps for line in aggregator.lines],
        "line_steps": [line.step for line in aggregator.lines],
        "goodput": [line.goodput for line in aggregator.lines],
        "final_goodput": aggregator.final_goodput,
        "printed": lines,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    leave_group()


def _report(run_dir: Path) -> dict[str, Any]:
    done = goodtrace("report", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("said", [True, False], ids=["said", "inferred"])
def test_a_loss_check_that_reloads_the_last_checkpoint(tmp_path: Path, said: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run_ranks(_worker, 2, str(tmp_path / "run"), str(out), said, True)
    clean = tmp_path / "clean"
    clean.mkdir()
    run_ranks(_worker, 2, str(tmp_path / "clean-run"), str(clean), said, False)
    rank0 = json.loads((out / "rank0.json").read_text())
    rank1 = json.loads((out / "rank1.json").read_text())
    # the rollback really healed the model: what a run without the bad batch trains, on both ranks
    assert rank0["weights"] == rank1["weights"] == json.loads((clean / "rank0.json").read_text())["weights"]

    report = _report(tmp_path / "run")
    (rewind,) = report["rewinds"]
    assert (rewind["from_step"], rewind["to_step"], rewind["resume_step"], rewind["redone"], rewind["explicit"]) == (
        SPIKE, 8, 9, 3, said)
    rows = report["steps"]
    assert [r["step"] for r in rows] == [*range(SPIKE + 1), *range(9, STEPS)]
    assert [r["step"] for r in rows if not r["counted"]] == [9, 10, SPIKE]
    assert sorted(r["step"] for r in rows if r["counted"]) == list(range(STEPS))  # each step once
    buckets = {k: v["ns"] for k, v in report["partition"]["buckets"].items()}
    assert buckets["wasted_progress"] > 0 and buckets["checkpoint_restore"] > 0
    wasted = sum(r["productive_s"] for r in rows if not r["counted"])
    assert abs(buckets["wasted_progress"] / 1e9 - wasted) < 1e-6
    clean_report = _report(tmp_path / "clean-run")
    assert "rewinds" not in clean_report and "wasted_progress" not in {
        k for k, v in clean_report["partition"]["buckets"].items() if v["ns"]}

    # The live line takes the thrown-away time back, once, when the rollback happens: at finish
    # its goodput is the report's (which counts the first pass of 9-11 as wasted; without the
    # take-back the live figure would be higher by that time over the attempt's), and its
    # productive time goes down at most once, around the rollback (never on the
    # clean run). Whether it goes down there depends on how long the redone window took.
    # The two live estimates of the redone window (when it ran, and when it is taken back) differ
    # by more on a loaded machine, so the bound is the take-back's own size as this run measured
    # it: the live figure must be four times nearer the report's than it would be without it.
    elapsed_s = report["partition"]["total_s"]
    take_back = wasted / elapsed_s
    assert take_back > 0.002
    assert abs(rank0["final_goodput"] - report["partition"]["goodput"]) < take_back / 4, (
        rank0["final_goodput"], report["partition"]["goodput"], take_back)
    # (a line is completed a gather later than its step: the lines of the first pass of 9-11
    # and the first line after the rollback are the ones completed around it)
    productive, at = rank0["productive_s"], rank0["line_steps"]
    assert at == [*range(SPIKE + 1), *range(9, STEPS)]
    around = {9, 10, SPIKE, SPIKE + 1}  # line indices
    drops = [i for i in range(1, len(productive)) if productive[i] < productive[i - 1]]
    assert len(drops) <= 1 and set(drops) <= around, (drops, productive)
    clean_productive = json.loads((clean / "rank0.json").read_text())["productive_s"]
    assert all(b >= a for a, b in itertools.pairwise(clean_productive))
