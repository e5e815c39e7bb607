"""Two ``jax.distributed`` processes on localhost (CPU): rank/world discovery, live metric
reduction through JAX's multi-host utilities, and clock offsets measured on a background thread.

The test spawns this file twice as a worker (``python test_jax_distributed.py worker ...``);
each worker trains a few steps with known per-rank metric values and writes what it saw.
Both processes share the host's monotonic clock, so the true offset between them is zero:
the measured one must be within its own error bound (rtt / 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.processes

STEPS = 7
LOG_EVERY = 2


def _worker(process_id: int, port: int, run_dir: str, out: str) -> None:
    import jax
    import jax.numpy as jnp

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
        initialization_timeout=40,
    )
    import goodtrace as gt
    from goodtrace.integrations import jax as gj

    gt.init(run_dir, flush_interval_s=0.2)
    lines: list[str] = []
    integration = gj.instrument(log_every=LOG_EVERY, clock_sync_every=4, printer=lines.append)

    @jax.jit
    def train_step(x: Any, step: Any) -> Any:
        return (x * 0.0).sum() + 10.0 * step + jax.process_index()

    x = jnp.ones((64, 64))
    for step in range(STEPS):
        with gt.step(step) as s:
            loss = train_step(x, step)
            s.complete_on(loss)
            gt.metric("loss", loss, reduce="mean")
            gt.metric("ones", 1.0, reduce="sum")
    aggregator = integration.aggregator
    ok = gt.finish(completed=True)
    result = {
        "ok": ok,
        "process_index": jax.process_index(),
        "lines": lines,
        "summaries": [
            {"step": line.step, "ranks": line.ranks,
             "metrics": {name: {"value": m.value, "count": m.count} for name, m in line.metrics.items()}}
            for line in (aggregator.lines if aggregator is not None else [])
        ],
        "offsets": [[o.offset_ns, o.rtt_ns] for o in integration.clock_offsets],
    }
    Path(out).write_text(json.dumps(result))
    jax.distributed.shutdown()


def test_two_processes_aggregate_metrics_and_measure_clock_offsets(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    from goodtrace import schema
    from goodtrace.read.sessions import read_run
    from helpers.ranks import free_port  # here, not at the top: this file is also the ranks' script

    run_dir = tmp_path / "run"
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)  # one CPU device per process
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(i), str(port), str(run_dir), str(tmp_path / f"out{i}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    logs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail("jax.distributed workers did not finish within 90 s")
        logs.append(output)
    for proc, log in zip(procs, logs, strict=True):
        if proc.returncode != 0 and "distributed" in log and "initialize" in log and "Error" in log:
            pytest.skip(f"jax.distributed could not start on CPU here:\n{log[-2000:]}")
        assert proc.returncode == 0, log[-4000:]
    results = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    assert all(r["ok"] for r in results)

    # Rank and world size came from jax.distributed, not from arguments or the environment.
    run = read_run(run_dir)
    headers = sorted((s.header for s in run.sessions), key=lambda h: h[schema.H_RANK])
    assert [h[schema.H_RANK] for h in headers] == [0, 1]
    assert all(h[schema.H_WORLD] == 2 and h["rank_source"] == "jax.distributed" for h in headers)

    # Live reduction on process 0: every log step, both processes' values, reduced correctly.
    lines = results[0]["summaries"]
    assert results[1]["summaries"] == []  # only process 0 reports
    assert [line["step"] for line in lines] == [0, 2, 4, 6]
    previous = None
    for line in lines:
        interval = range(0 if previous is None else previous + 1, line["step"] + 1)
        expected = [10.0 * k + rank for k in interval for rank in (0, 1)]
        assert line["ranks"] == 2
        assert line["metrics"]["loss"]["value"] == pytest.approx(sum(expected) / len(expected))
        assert line["metrics"]["loss"]["count"] == len(expected)
        assert line["metrics"]["ones"]["value"] == pytest.approx(len(expected))
        previous = line["step"]
    assert len([t for t in results[0]["lines"] if not t.startswith("goodtrace: finished")]) == 4

    # Clock offsets: at start-up and at step 4; recorded as clock records; true offset is 0.
    offsets = results[1]["offsets"]
    assert len(offsets) == 2
    for offset_ns, rtt_ns in offsets:
        assert 0 < rtt_ns < 50_000_000
        assert abs(offset_ns) <= rtt_ns // 2 + 20_000
    assert results[0]["offsets"] == [[0, 0], [0, 0]]
    clock_records = [(s.rank, r) for s in run.sessions for r in s.of_kind(schema.CLOCK)]
    assert sorted(rank for rank, _ in clock_records) == [0, 0, 1, 1]
    assert [[r[schema.F_OFFSET], r[schema.F_RTT]] for rank, r in clock_records if rank == 1] == offsets
    # measured on a background thread: the training thread spent no span on it
    assert [r for s in run.sessions for r in s.of_kind(schema.SPAN) if r["name"] == "clock_sync"] == []


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
