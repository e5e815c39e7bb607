"""A session's span time per name and step (``StepDetail``), which an anomaly's "unusually long
spans" read: the median per name over the steps with any span, and the totals over a few steps,
equal to the plain computation (a zero-filled column per name and ``np.median``; every name
summed) on any columns, although they no longer make a column per name (a run may name a span
after its step: as many names as steps)."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.analysis import step_detail as detail_module
from goodtrace.analysis.step_detail import StepDetail
from goodtrace.read.loaded import SessionDetail


@st.composite
def details(draw: st.DrawFn) -> SessionDetail:
    names = tuple(sorted(draw(st.sets(st.text("abcxyz", min_size=1, max_size=3), min_size=1, max_size=6))))
    cells = draw(st.lists(st.tuples(st.integers(-3, 12), st.integers(0, len(names) - 1),
                                    st.sampled_from([-7, 0, 1, 2, 5, 10**9, 2**62 + 1])), max_size=40))
    rows = sorted({(step, code): ns for step, code, ns in cells}.items())  # one row per (step, name)
    steps = [step for (step, _), _ in rows]
    codes = [code for (_, code), _ in rows]
    span_names = tuple(dict.fromkeys(names[code] for code in draw(st.permutations(codes))))
    return SessionDetail(names=names, span_step=array("q", steps), span_name=array("i", codes),
                           span_ns=array("q", [ns for _, ns in rows]), span_names=span_names)


@settings(max_examples=300, deadline=None)
@given(details(), st.lists(st.integers(-3, 12), max_size=4, unique=True))
@pytest.mark.slow
def test_span_medians_and_totals_equal_the_plain_computation(tl: SessionDetail, asked: list[int]) -> None:
    detail = StepDetail(tl)
    steps = np.frombuffer(tl.span_step, dtype=np.int64)
    distinct = sorted(set(steps.tolist()))
    expected: dict[str, float] = {}
    for name in tl.span_names:
        column = np.zeros(len(distinct), dtype=np.int64)
        for step, code, ns in zip(tl.span_step, tl.span_name, tl.span_ns, strict=True):
            if tl.names[code] == name:
                column[distinct.index(step)] = ns
        expected[name] = float(np.median(column)) if len(column) else 0.0
    assert detail.span_medians() == expected
    assert list(detail.span_medians()) == list(tl.span_names)
    few = detail_module._FEW_NAMES
    try:  # the path of many names: one sort of every row, not a pass per name
        detail_module._FEW_NAMES = 0
        assert StepDetail(tl).span_medians() == expected
    finally:
        detail_module._FEW_NAMES = few

    totals = dict.fromkeys(tl.span_names, 0)
    for step, code, ns in zip(tl.span_step, tl.span_name, tl.span_ns, strict=True):
        if step in asked:
            totals[tl.names[code]] += ns
    found = detail.span_totals(sorted(asked))
    # the names with a span in those steps, in order of first appearance
    assert list(found) == [name for name in tl.span_names if name in found]
    assert found == {name: ns for name, ns in totals.items() if name in found}
    present = {tl.names[code] for step, code in zip(tl.span_step, tl.span_name, strict=True) if step in asked}
    assert set(found) == present


def test_a_checkpoint_after_the_step_s_completion_goes_with_its_time(tmp_path: Path) -> None:
    """A checkpoint inside step 4's block, after its completion (torchtitan's trainer; any loop
    that saves after complete_on): its time is step 5's interval (semantics, section 2), and so
    are its tag and its span in the anomalies; step 4's own slow compute stays step 4's."""
    from goodtrace.analysis import analyze
    from helpers.builders import Proc, load

    proc = Proc(tmp_path / "run")
    t = 0.0
    for k in range(10):
        compute = 0.9 if k == 4 else 0.5  # step 4: slow (an anomaly)
        proc.step(k, t, t + 0.1 + compute)
        proc.span("fwd", t + 0.1, t + 0.1 + compute, cat="compute", step=k)
        proc.sync(k, t + 0.1 + compute + 0.4, how="poll")
        end = t + 0.1 + compute + 0.4
        if k == 4:  # saved after the completion was settled, still inside step 4's block
            proc.span("checkpoint", end + 0.01, end + 0.31, cat="checkpoint_save", step=4)
            proc.tag(4, "checkpoint_save", end + 0.02)
            proc.tag(4, "slow_batch", t + 0.2)  # recorded inside step 4's interval: stays
            end += 0.31
        t = end
    proc.finish(t + 0.1).write()
    analysis = analyze(load(tmp_path / "run"))
    rows = {row.step: row for row in analysis.steps}
    assert rows[5].overhead_s["checkpoint_save"] == pytest.approx(0.3)
    assert rows[5].tags == ("checkpoint_save",) and rows[4].tags == ("slow_batch",)
    (anomaly,) = analysis.anomalies
    assert anomaly.step == 4
    assert not any("checkpoint" in label for label in anomaly.overlapped), anomaly.overlapped
    assert any(label.startswith("span:fwd 0.900s") for label in anomaly.overlapped), anomaly.overlapped
    assert "tag:slow_batch" in anomaly.overlapped


def test_a_tag_at_the_end_of_its_step_s_own_checkpoint_stays_with_it(tmp_path: Path) -> None:
    """Host-timed steps (torchtitan's logs): the checkpoint inside step 4's span, its tag on its
    last record, at the instant step 4 ends. The span starts in step 4's interval: the tag stays."""
    from goodtrace.analysis import analyze
    from helpers.builders import Proc, load

    proc = Proc(tmp_path / "run")
    for k in range(6):
        t = float(k)
        end = t + (0.9 if k == 4 else 0.5)
        if k == 4:
            proc.span("checkpoint", t + 0.5, end, cat="checkpoint_save", step=4)
            proc.tag(4, "checkpoint_save", end)
        proc.step(k, t, end)
        proc.sync(k, end, how="exit")
    proc.finish(6.0).write()
    rows = {row.step: row for row in analyze(load(tmp_path / "run")).steps}
    assert rows[4].overhead_s["checkpoint_save"] == pytest.approx(0.4)
    assert rows[4].tags == ("checkpoint_save",) and rows[5].tags == ()
