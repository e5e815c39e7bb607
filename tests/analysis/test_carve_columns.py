"""A long stretch of step intervals is carved in numpy (``SessionCut.carve_columns``, what the
timeline of a long run is built from) and a single interval piece by piece (``carve``): the
two give the same pieces on any overhead layout, and a timeline built from the columns gives
the same totals as its pieces added up one by one."""

from __future__ import annotations

import itertools
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.analysis.cut import RULE_ASYNC, RULE_SYNC, SessionCut
from goodtrace.analysis.partition import Timeline
from goodtrace.analysis.pieces import PieceBuilder, PieceColumns

LABELS = ["data", "checkpoint_save", "eval", "gc", "compile"]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[SessionCut, int, int]:
    """Disjoint overhead intervals in order (touching, zero-length, alike or not), and a range."""
    t = draw(st.integers(0, 5))
    starts, ends, labels = [], [], []
    for _ in range(draw(st.integers(0, 40))):
        t += draw(st.integers(0, 4))  # 0: touching the one before
        length = draw(st.integers(0, 5))  # 0: an empty interval
        starts.append(t)
        ends.append(t + length)
        labels.append(draw(st.sampled_from(LABELS)))
        t += length
    rule = draw(st.sampled_from([RULE_SYNC, RULE_ASYNC]))
    cut = SessionCut(session=0, start=0, end=t + 10, data_rule=rule, host_timed=False, tail_label="teardown",
                     over_start=array("q", starts), over_end=array("q", ends), over_label=labels)
    a = draw(st.integers(-3, t + 3))
    b = draw(st.integers(a - 2, t + 8))
    return cut, a, b


@settings(max_examples=400, deadline=None)
@given(layouts())
@pytest.mark.slow
def test_the_columns_are_the_pieces(layout: tuple[SessionCut, int, int]) -> None:
    cut, a, b = layout
    starts, ends, labels, names = cut.carve_columns(a, b)
    assert [(p.start, p.end, p.label) for p in cut.carve(a, b)] == list(
        zip(starts.tolist(), ends.tolist(), [names[k] for k in labels.tolist()], strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.sampled_from([*LABELS, "productive"]),
                          st.sampled_from(["", "", "other", "compile"]), st.booleans()), max_size=30),
       st.integers(-2, 60), st.integers(-2, 60))
def test_totals_from_columns_are_the_pieces_added_up(
    steps: list[tuple[int, int, str, str, bool]], a: int, b: int,
) -> None:
    builder = PieceBuilder()
    t = 0
    run: tuple[list[int], list[int], list[str]] = ([], [], [])

    def add_run() -> None:
        names = list(dict.fromkeys(run[2]))
        builder.add_run(np.array(run[0]), np.array(run[1]), np.array([names.index(x) for x in run[2]]), names)

    for gap, length, label, part, in_run in steps:
        t += gap
        if in_run and not part:  # a run of pieces (as a carved stretch adds them), merged among themselves
            if run[0] and run[1][-1] == t and run[2][-1] == label:
                run[1][-1] = t + length
            elif length:
                run[0].append(t)
                run[1].append(t + length)
                run[2].append(label)
        else:
            if run[0]:
                add_run()
                run = ([], [], [])
            if length:
                builder.add(t, t + length, label, part)
        t += length
    if run[0]:
        add_run()
    columns: PieceColumns = builder.columns()
    timeline = Timeline(0, t, columns, None, [])  # type: ignore[arg-type]
    pieces = timeline.pieces
    for p, q in itertools.pairwise(pieces):  # merged where adjacent and alike
        assert p.end <= q.start and not (p.end == q.start and p.label == q.label and p.part == q.part)
    lo, hi = max(a, 0), min(b, t)
    buckets: dict[str, int] = {}
    parts: dict[str, int] = {}
    for p in pieces:
        length = min(p.end, hi) - max(p.start, lo)
        if length > 0:
            buckets[p.label] = buckets.get(p.label, 0) + length
            if p.part:
                parts[p.part] = parts.get(p.part, 0) + length
    found = timeline.totals(a, b)
    assert found == (buckets, parts)
    assert list(found[0]) == list(buckets) and list(found[1]) == list(parts)  # first-seen order, as the report lists them
