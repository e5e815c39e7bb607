"""The per-rank lateness figures are computed on columns (numpy, linear in ranks); they must
equal, to the last bit, the plain definition: per sync point (or span start) the median of the
other ranks, per rank the median of its differences. Random inputs with repeated keys (a later
value replaces an earlier one), groups of one, ties and several attempts."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from goodtrace.analysis.ranks import NS, _arrival_lateness, _leave_one_out, _start_lateness


def _plain_arrivals(rows: list[tuple[int, int, int, int]]) -> tuple[dict[int, float], dict[int, float]]:
    arrivals: dict[tuple[int, int], dict[int, int]] = {}
    for attempt, step, rank, t in rows:
        arrivals.setdefault((attempt, step), {})[rank] = t
    late: dict[int, list[float]] = {}
    last: dict[int, list[bool]] = {}
    for ranks in arrivals.values():
        if len(ranks) < 2:
            continue
        others = _leave_one_out({r: float(t) for r, t in ranks.items()})
        latest = max(ranks.values())
        for r, t in ranks.items():
            late.setdefault(r, []).append((t - others[r]) / NS)
            last.setdefault(r, []).append(t == latest)
    return ({r: statistics.median(v) for r, v in late.items()},
            {r: sum(f) / len(f) for r, f in last.items()})


def _plain_starts(rows: list[tuple[int, int, str, int, int]]) -> dict[int, tuple[float, str]]:
    starts: dict[tuple[int, int, str], dict[int, int]] = {}
    for attempt, step, name, rank, ns in rows:
        starts.setdefault((attempt, step, name), {})[rank] = ns
    start_late: dict[int, dict[str, list[float]]] = {}
    for (_, _, name), ranks in starts.items():
        if len(ranks) < 2:
            continue
        others = _leave_one_out({r: float(t) for r, t in ranks.items()})
        for r, t in ranks.items():
            start_late.setdefault(r, {}).setdefault(name, []).append((t - others[r]) / NS)
    out = {}
    for r, by_name in start_late.items():
        worst: tuple[float, str] | None = None
        for name, values in sorted(by_name.items()):
            median = statistics.median(values)
            if worst is None or median > worst[0]:
                worst = (median, name)
        assert worst is not None
        out[r] = worst
    return out


def _columns(rows: list[tuple[int, ...]], parts: int) -> list[tuple[np.ndarray, ...]]:
    """The rows as columns, cut into ``parts`` pieces (as sessions hand them over)."""
    cuts = sorted(random.Random(len(rows)).sample(range(1, len(rows)), min(parts - 1, len(rows) - 1)))
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        piece = rows[a:b]
        out.append(tuple(np.array(col, dtype=np.int64) for col in zip(*piece, strict=True)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_arrival_lateness_on_columns_equals_the_plain_definition(seed: int) -> None:
    rng = random.Random(seed)
    ranks, steps = rng.randint(1, 40), rng.randint(1, 12)
    rows = []
    for _ in range(rng.randint(1, 600)):
        t = 10**12 + rng.choice([0, 5, 5, 7]) * 10**6 + rng.randint(0, 3) * (10**6 if seed % 2 else 1)
        rows.append((rng.randint(0, 2), rng.randint(0, steps), rng.randint(0, ranks), t))
    assert _arrival_lateness(_columns(rows, rng.randint(1, 8))) == _plain_arrivals(rows)


@pytest.mark.parametrize("seed", range(12))
def test_start_lateness_on_columns_equals_the_plain_definition(seed: int) -> None:
    rng = random.Random(1000 + seed)
    names = ["data", "h2d", "forward", "opt", "a", "b"][: rng.randint(1, 6)]
    rows = [(rng.randint(0, 1), rng.randint(0, 9), rng.choice(names), rng.randint(0, 30), rng.randint(-5, 50) * 10**5)
            for _ in range(rng.randint(1, 800))]
    codes = {name: i for i, name in enumerate(names)}
    coded = [(a, s, codes[n], r, ns) for a, s, n, r, ns in rows]
    got = _start_lateness(_columns(coded, rng.randint(1, 8)), {i: n for n, i in codes.items()})
    assert got == _plain_starts(rows)


def test_no_rows_no_figures() -> None:
    assert _arrival_lateness([]) == ({}, {})
    assert _start_lateness([], {}) == {}


def test_releasing_the_loaded_records_changes_no_figure_and_refuses_a_second_analysis() -> None:
    from pathlib import Path

    from goodtrace.analysis import AnalysisError, analyze
    from goodtrace.read.load import load_run

    run = Path(__file__).resolve().parents[1] / "data" / "runs" / "restart_2ranks"
    kept = analyze(load_run(run)).to_dict()
    loaded = load_run(run)
    released = analyze(loaded, release_records=True).to_dict()
    assert released == kept
    assert loaded.released and all(len(r.step_t0) == 0 and len(r.span_t0) == 0 for r in loaded.session_records.values())
    with pytest.raises(AnalysisError, match="load it again"):
        analyze(loaded)
