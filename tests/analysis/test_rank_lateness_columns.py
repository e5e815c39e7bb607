"""The per-rank lateness figures are computed on columns (numpy, linear in ranks); they must
equal, to the last bit, the plain definition: per sync point (or span start) the median of the
other ranks, per rank the median of its differences. Random inputs with repeated keys (a later
value replaces an earlier one), groups of one, ties and several attempts."""

from __future__ import annotations

import dataclasses
import random
import statistics

import numpy as np
import pytest

from goodtrace.analysis.evidence import Evidence
from goodtrace.analysis.ranks import NS, _arrival_lateness, _effects, _groups, _leave_one_out, _sorted_within
from goodtrace.columns import MAD_TO_SIGMA


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


def _plain_effects(rows: list[tuple[int, int, int, int, int]]) -> dict[tuple[int, int], Evidence]:
    """Per (rank, code): the differences from the other ranks' median at each shared step, and
    the rank's own values at those steps, by the plain definition."""
    values: dict[tuple[int, int, int], dict[int, int]] = {}
    for attempt, step, code, rank, ns in rows:
        values.setdefault((attempt, step, code), {})[rank] = ns
    diffs: dict[tuple[int, int], list[float]] = {}
    own: dict[tuple[int, int], list[float]] = {}
    for (_, _, code), ranks in values.items():
        if len(ranks) < 2:
            continue
        others = _leave_one_out({r: float(t) for r, t in ranks.items()})
        for r, t in ranks.items():
            diffs.setdefault((r, code), []).append((t - others[r]) / NS)
            own.setdefault((r, code), []).append(float(t))
    out = {}
    for key, d in diffs.items():
        mine = own[key]
        centre = statistics.median(mine)
        mad = statistics.median([abs(v - centre) for v in mine])
        out[key] = Evidence(effect_s=statistics.median(d), consistency=sum(x > 0 for x in d) / len(d),
                            samples=len(d), noise_s=MAD_TO_SIGMA * mad / NS)
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
def test_effects_on_columns_equal_the_plain_definition(seed: int) -> None:
    rng = random.Random(1000 + seed)
    codes = rng.randint(1, 6)
    rows = [(rng.randint(0, 1), rng.randint(0, 9), rng.randrange(codes), rng.randint(0, 30), rng.randint(-5, 50) * 10**5)
            for _ in range(rng.randint(1, 800))]
    got = _effects(_columns(rows, rng.randint(1, 8)))
    want = _plain_effects(rows)
    assert got.keys() == want.keys()
    for key, evidence in want.items():  # the noise is a sum of floats in another order: to rounding
        assert dataclasses.replace(got[key], noise_s=0.0) == dataclasses.replace(evidence, noise_s=0.0)
        assert got[key].noise_s == pytest.approx(evidence.noise_s, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("seed", range(8))
def test_values_sorted_within_their_groups_as_one_sort_by_group_and_value(seed: int) -> None:
    """Each group's values sorted on their own (a table of rows, or one sort where one group is
    far larger than the others) are the sort by (group, value), NaN last in its group."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 30, rng.integers(10, 50))
    if seed % 2:
        sizes[0] = 40 * int(sizes.sum())  # one long group: past the table's limit
    group = np.repeat(np.arange(len(sizes)), sizes)
    values = rng.choice([0.5, -1.0, 2.0, np.nan, 3.25, 0.0], len(group)) if seed % 4 < 2 else rng.normal(size=len(group))
    first, size, pos = _groups(group)
    want = values[np.lexsort((values, group))]
    np.testing.assert_array_equal(_sorted_within(values, first, size, pos), want)
    assert len(_sorted_within(values[:0], *(a[:0] for a in (first, size, pos)))) == 0


def test_no_rows_no_figures() -> None:
    assert _arrival_lateness([]) == ({}, {})
    assert _effects([]) == {}


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
