"""A DataLoader with forked worker processes neither corrupts nor duplicates the parent's records."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.read.sessions import read_run

pytestmark = pytest.mark.processes

torch = pytest.importorskip("torch")


class _Records(torch.utils.data.Dataset):  # type: ignore[misc]
    """Each item also calls goodtrace inside the worker (a no-op there: workers never write)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> Any:
        with gt.span("decode", attrs={"index": index}):
            gt.metric("worker_metric", float(index), "mean")
            gt.event("worker_event", index=index)
            return torch.full((4,), float(index))


def test_forked_workers_do_not_corrupt_or_duplicate_records(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    gt.init(run_dir, flush_interval_s=0.02)  # the writer is busy while workers fork
    loader = torch.utils.data.DataLoader(
        _Records(), batch_size=4, num_workers=2, multiprocessing_context="fork", persistent_workers=False
    )
    step = 0
    seen: list[int] = []
    for _epoch in range(3):  # workers are forked anew each epoch
        iterator = iter(loader)
        while True:
            step += 1
            with gt.step(step) as s:
                with gt.span("data"):
                    batch = next(iterator, None)
                if batch is None:
                    break
                seen.extend(int(v) for v in batch[:, 0])
                loss = batch.sum()
                s.complete_on(loss)
                gt.metric("loss", loss, "mean")
    assert gt.finish() is True
    assert sorted(seen) == sorted(list(range(64)) * 3)

    run = read_run(run_dir)
    assert run.problems == []
    assert [s.rank for s in run.sessions] == [0]  # no session from any worker
    session = run.sessions[0]
    assert session.header["pid"] == os.getpid() and session.torn_lines == 0
    rank_dirs = [p.name for p in run_dir.iterdir() if p.name.startswith("rank-")]
    assert rank_dirs == ["rank-00000"]
    steps = [r["step"] for r in session.of_kind("step")]
    assert steps == list(range(1, step + 1))  # each step exactly once, in order
    data_spans = [r for r in session.of_kind("span") if r["name"] == "data"]
    assert len(data_spans) == step and len({(r["t0"], r["t1"]) for r in data_spans}) == step
    assert not [r for r in session.of_kind("span") if r["name"] == "decode"]
    names = {r["name"] for r in session.of_kind("metric")}
    assert names == {"loss"}
    losses = [r for r in session.of_kind("metric") if r["name"] == "loss"]
    assert len(losses) == 3 * 16 and len({r["step"] for r in losses}) == 3 * 16
    assert not [r for r in session.of_kind("event") if r["name"] == "worker_event"]
    assert [r["completed"] for r in session.of_kind("finish")] == [True]
