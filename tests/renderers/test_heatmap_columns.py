"""The heat map is summed on columns; every cell must equal, to the last bit, the plain loop over
each session's executions in order (the definition), binned or not, across restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import RunAnalysis, analyze
from goodtrace.read.load import load_run
from goodtrace.renderers import html_charts
from goodtrace.renderers.html_charts import Heatmap

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = [DATA / "runs" / "restart_2ranks", DATA / "golden_trace_small" / "run"]


def _plain(analysis: RunAnalysis, width_limit: int) -> dict[str, Any]:
    sessions = sorted(analysis.cuts)
    executions = {}
    for i in sessions:
        cut = analysis.cuts[i]
        seen: dict[int, int] = {}
        rows = []
        for e in range(len(cut.exec_step)):
            w, step = cut.exec_interval[e], cut.exec_step[e]
            k = seen.get(step, 0)
            seen[step] = k + 1
            if w >= 0:
                rows.append(((analysis.attempt_of.get(i, -1), step, k),
                             (cut.interval_end[w] - cut.interval_start[w]) // cut.interval_count[w], cut.exec_compute[e]))
        executions[i] = rows
    keys = sorted({key for rows in executions.values() for key, _, _ in rows})
    ranks = sorted({analysis.sessions[i].rank for i in sessions})
    width = max(1, -(-len(keys) // width_limit))
    n = -(-len(keys) // width)
    sums = {name: [[0.0] * n for _ in ranks] for name in ("step", "compute")}
    counts = [[0] * n for _ in ranks]
    for i in sessions:
        row = ranks.index(analysis.sessions[i].rank)
        for key, step_ns, compute_ns in executions[i]:
            col = keys.index(key) // width
            sums["step"][row][col] += step_ns / 1e6
            sums["compute"][row][col] += compute_ns / 1e6
            counts[row][col] += 1
    return {"ranks": ranks, "width": width, "sums": sums, "counts": counts}


@pytest.mark.parametrize("limit", [240, 3], ids=["one-column-each", "binned"])
@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.parent.name if p.name == "run" else p.name)
def test_heatmap_cells_equal_the_plain_loop(run: Path, limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    analysis = analyze(load_run(run))
    monkeypatch.setattr(html_charts, "MAX_HEATMAP_COLUMNS", limit)
    heat = Heatmap(analysis)
    plain = _plain(analysis, limit)
    assert heat.ranks == plain["ranks"] and heat.width == plain["width"]
    assert heat.sums == plain["sums"] and heat.counts == plain["counts"]
    assert len(heat.columns) == len(plain["counts"][0])
    assert sum(map(sum, heat.counts)) > 0


@pytest.mark.parametrize("far", [0, 2**31, -(2**31) - 1, 2**62], ids=["packed", "step-2^31", "step-below", "step-2^62"])
def test_the_keys_are_the_distinct_rows_and_each_execution_finds_its_own(far: int) -> None:
    """The heat map's distinct (attempt, step, k) keys, packed in one integer each while they fit
    and as rows of three once one does not (a step beyond +-2**31), gathered session by session:
    the same keys in the same order as ``np.unique(axis=0)`` of them all, and each execution's
    index its key's place."""
    import numpy as np

    rng = np.random.default_rng(7)
    sessions = []
    for s in range(4):
        n = 500
        attempt = np.full(n, s // 2 - 1, dtype=np.int64)  # -1: a session in no attempt
        step = rng.integers(-5, 200, n).astype(np.int64)
        if s == 2 and far:
            step[::50] = far
        k = rng.integers(0, 3, n).astype(np.int64)
        sessions.append((attempt, step, k))
    keys = html_charts._Keys()
    for columns in sessions:
        keys.add(*columns)
    assert (keys.rows is None) == (far == 0)
    table = keys.table()
    expected = np.unique(np.concatenate([np.stack(c, axis=1) for c in sessions]), axis=0)
    assert table.tolist() == expected.tolist()
    for columns in sessions:
        index = keys.index(*columns)
        assert table[index].tolist() == np.stack(columns, axis=1).tolist()
