"""The live line's traffic on real gloo ranks (docs/semantics.md section 9): every vector goes
to rank 0 only, so what a rank without sinks sends and receives per log step, measured by the
kernel (TCP_INFO of the process's sockets, helpers/tcp_bytes.py), does not grow with the number
of ranks, and ``instrument()`` opens one gloo mesh, not two; while rank 0's line still has
every rank's figures and a sink on another rank still gets the merged line."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.ranks import leave_group, run_ranks
from helpers.tcp_bytes import tcp_bytes

pytestmark = pytest.mark.processes

torch = pytest.importorskip("torch")

LOG_EVERY, WARM, MEASURED = 2, 6, 12  # steps: warm-up, then 6 log steps measured


def _worker(rank: int, world: int, port: int, run_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    import goodtrace as gt
    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world)
    sink_lines: list[Any] = []
    if rank == 1:  # what a sink on another host's local rank 0 hooks (live/sink_hub.py)
        gt.recorder().line_listeners.append(sink_lines.append)
    before = tcp_bytes()
    integration = instrument(log_every=LOG_EVERY, memory=False, clock_sync_every=0, printer=lambda text: None)
    opened = tcp_bytes().sockets - before.sockets
    dist.barrier()
    marks = {}
    for step in range(1, WARM + MEASURED + 1):
        with gt.step(step):
            time.sleep(0.02)
            gt.metric("r", float(rank), "sum")
        if step in (WARM, WARM + MEASURED):
            marks[step] = tcp_bytes()
    start, end = marks[WARM], marks[WARM + MEASURED]
    gt.finish()
    aggregator = integration.aggregator
    assert aggregator is not None
    lines = aggregator.lines if rank == 0 else sink_lines
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "opened": opened,
        "sent": (end.sent - start.sent) / (MEASURED / LOG_EVERY),
        "received": (end.received - start.received) / (MEASURED / LOG_EVERY),
        "lines": [{"step": line.step, "ranks": line.ranks, "r": line.metrics["r"].value,
                   "count": line.metrics["r"].count, "host_ranks": list(line.host_ranks),
                   "rank_step_s": [s for s in line.rank_step_s if not math.isnan(s)]}
                  for line in lines if "r" in line.metrics],
    }))
    leave_group()


def _run(tmp_path: Path, world: int) -> list[dict[str, Any]]:
    out = tmp_path / f"out{world}"
    out.mkdir()
    run_ranks(_worker, world, str(tmp_path / f"run{world}"), str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_a_rank_without_sinks_sends_and_receives_the_same_per_log_step_at_3_and_6_ranks(tmp_path: Path) -> None:
    figures = {world: _run(tmp_path, world) for world in (3, 6)}
    for world, ranks in figures.items():
        rank0, rank1 = ranks[0], ranks[1]
        # rank 0's line has every rank's figures: the sum of the ranks' numbers over each log interval
        assert [line["step"] for line in rank0["lines"]][:3] == [2, 4, 6]
        for line in rank0["lines"]:
            assert line["ranks"] == world and line["r"] == LOG_EVERY * sum(range(world))
            assert line["count"] == LOG_EVERY * world and len(line["rank_step_s"]) == world
        # a sink on rank 1 gets the merged line, its host's ranks (all ranks here) with their step times
        assert [line["step"] for line in rank1["lines"]] == [line["step"] for line in rank0["lines"]]
        for mine, zero in zip(rank1["lines"], rank0["lines"], strict=True):
            assert (mine["ranks"], mine["r"], mine["count"]) == (zero["ranks"], zero["r"], zero["count"])
            assert mine["host_ranks"] == list(range(world)) and len(mine["rank_step_s"]) == world
        # one gloo mesh: a socket to each other rank (and at most a listening one), not two meshes
        for rank in ranks:
            assert rank["opened"] <= world, [r["opened"] for r in ranks]
    # the last rank has no sink: its traffic per log step does not grow with the ranks (an
    # all-gather's does: each rank forwards the others' vectors, (N - 1) of them, 2.5x from 3 to 6)
    small, large = figures[3][-1], figures[6][-1]
    assert large["sent"] < 1.5 * small["sent"], (small, large)
    assert large["received"] < 1.5 * small["received"], (small, large)
