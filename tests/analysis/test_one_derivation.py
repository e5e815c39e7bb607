"""Each number is derived once, in analysis/cut.py, and every view calls it: the step
table, the rank figures and the heat map show the same step time per execution, and no module
outside the cut computes an interval's length per execution again or borrows its private helpers."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import goodtrace
from goodtrace import schema
from goodtrace.analysis import analyze
from goodtrace.read.load import load_run

PACKAGE = Path(goodtrace.__file__).parent
RUN = Path(__file__).resolve().parents[1] / "data" / "runs" / "restart_2ranks"
THE_CUT = {PACKAGE / "analysis" / "cut.py", PACKAGE / "analysis" / "overhead.py"}
INTERVAL_LENGTH = re.compile(r"interval_end\b.*-.*\binterval_start\b")
PRIVATE_IMPORT = re.compile(r"from goodtrace\.analysis[\w.]* import .*\b_\w+")


def test_no_module_outside_the_cut_derives_an_interval_length_or_borrows_its_private_helpers() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            if path not in THE_CUT and INTERVAL_LENGTH.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
            if path.parent.name != "analysis" and PRIVATE_IMPORT.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, "derived again outside analysis/cut.py:\n" + "\n".join(found)


def test_the_step_table_and_the_rank_figures_show_the_cut_s_step_time() -> None:
    analysis = analyze(load_run(RUN))
    ref = [i for i in analysis.cuts if analysis.sessions[i].rank == analysis.reference_rank]
    expected = np.concatenate([
        analysis.cuts[i].step_ns()[np.frombuffer(analysis.cuts[i].exec_interval, dtype=np.int64)[
            np.frombuffer(analysis.cuts[i].exec_interval, dtype=np.int64) >= 0]] / 1e9
        for i in sorted(ref, key=lambda i: analysis.sessions[i].start_wall)
    ])
    assert len(analysis.steps) == len(expected) > 0
    assert analysis.steps.step_time_s.tolist() == expected.tolist()
    assert [row.step_time_s for row in analysis.steps] == expected.tolist()
    for figure in analysis.spread.per_rank:
        cuts = [c for i, c in analysis.cuts.items() if analysis.sessions[i].rank == figure.rank]
        per_execution = np.concatenate([np.repeat(c.step_ns() / 1e9, np.frombuffer(c.interval_count, dtype=np.int64))
                                        for c in cuts])
        assert figure.step_time_median_s == float(np.median(per_execution))


def _rich_run(run_dir: Path) -> Path:
    """Two attempts of one rank: a slow first step (warm-up), checkpoint saves and evals,
    tags, device-busy times, two executions sharing an interval, and a restart that re-does
    steps 6 and 7 (wasted progress)."""
    from tests.helpers.builders import Proc

    first = Proc(run_dir, start=0.0)
    t = 1.0
    for k in range(8):
        length = 6.0 if k == 0 else 1.0
        first.step(k, t, t + length)
        if k == 3:
            first.span("save", t + 0.2, t + 0.6, cat="checkpoint_save", step=k)
        if k == 4:
            first.span("evaluate", t + 0.1, t + 0.3, cat="eval", step=k)
        if k % 3 == 0:
            first.tag(k, "phase", t + 0.1).tag(k, "lr_drop", t + 0.2)
        first.metric("device_time_s", k, 0.25 + k / 100, t + length)
        if k != 4:  # step 4 shares the interval of step 5 (no sync point of its own)
            first.sync(k, t + length, "ready")
        t += length
    first.write()
    second = Proc(run_dir, start=t + 5.0, restart=1)
    t += 6.0
    for k in range(6, 12):
        second.step(k, t, t + 1.0).sync(k, t + 1.0, "ready")
        second.metric(schema.DEVICE_BUSY_METRIC, k, 0.5, t + 1.0).metric("device_time_s", k, 9.0, t + 1.0)
        t += 1.0
    second.finish(t)
    second.write()
    return run_dir


def test_the_step_table_s_columns_are_its_rows(tmp_path: Path) -> None:
    for run in (RUN, _rich_run(tmp_path / "rich")):
        table = analyze(load_run(run)).steps
        rows = list(table)
        columns = table.columns()
        assert len(rows) == len(columns.step) > 0
        assert columns.step.tolist() == [r.step for r in rows]
        assert columns.seq.tolist() == [r.seq for r in rows]
        assert columns.attempt.tolist() == [r.attempt for r in rows]
        assert columns.shared.tolist() == [r.shared for r in rows]
        assert columns.start_ns.tolist() == [r.start_ns for r in rows]
        assert columns.end_ns.tolist() == [r.end_ns for r in rows]
        assert columns.productive_s.tolist() == [r.productive_s for r in rows]
        assert [{c: v[i] for c, v in columns.overhead_s.items() if v[i]} for i in range(len(rows))] == \
            [r.overhead_s for r in rows]
        assert [None if np.isnan(v) else v for v in columns.device_s.tolist()] == [r.device_s for r in rows]
        assert columns.tags == [(i, r.tags) for i, r in enumerate(rows) if r.tags]
        if run != RUN:  # the rich run has every part the columns carry
            assert {"checkpoint_save", "eval", "warmup"} <= set(columns.overhead_s)
            assert max(columns.shared) == 2 and columns.tags and not np.isnan(columns.device_s).all()
            assert 0.5 in columns.device_s.tolist()  # the device-busy metric before device_time_s


def test_a_row_read_alone_is_the_row_the_table_walk_makes(tmp_path: Path) -> None:
    # the walk looks its rows' tags and metrics up a block at a time and makes each row from
    # its fields; a row read by index looks them up alone: the same rows, every field in order
    from goodtrace.analysis.steps import StepRow

    names = [f.name for f in dataclasses.fields(StepRow)]
    for run in (RUN, _rich_run(tmp_path / "rich")):
        table = analyze(load_run(run)).steps
        rows = list(table)
        assert rows == [table[i] for i in range(len(table))] == table[:]
        assert all(list(vars(row)) == names and row == StepRow(**vars(row)) for row in rows)
        if run != RUN:
            assert any(row.tags for row in rows) and all(row.metrics for row in rows)


def test_a_session_s_wall_mapping_for_many_times_is_its_one_mapping_to_the_wall_clock(tmp_path: Path) -> None:
    """``RunAnalysis.wall_of`` (a session's ``to_wall`` as a function, for a view that maps many
    of its times) gives ``to_wall``'s time for every time: a shift where the mapping is one
    number (the reference rank, a rank aligned by its anchor), the clock's own mapping where
    measured clock offsets make it vary (a rank with clock samples, skewed against its wall
    anchor)."""
    import functools

    from helpers.builders import Proc

    run_dir = tmp_path / "run"
    for rank in range(3):
        proc = Proc(run_dir, rank=rank, world=3, start=0.0, wall_skew=0.25 * rank)
        if rank == 2:  # measured: the offset drifts from 1 ms to 3 ms
            proc.clock(1_000_000, 1.0).clock(3_000_000, 20.0)
        t = proc.loop(range(20), 1.0)
        proc.finish(t)
        proc.write()
    analysis = analyze(load_run(run_dir))
    mappings = {i: analysis.wall_of(i) for i in range(len(analysis.sessions))}
    shifted = {analysis.sessions[i].rank: isinstance(wall, functools.partial) for i, wall in mappings.items()}
    assert shifted == {0: True, 1: True, 2: False}
    for i, wall in mappings.items():
        info = analysis.sessions[i]
        for t in (info.proc_start, info.proc_start + 5 * 10**9, info.last_seen, info.last_seen + 10**12):
            assert wall(t) == analysis.to_wall(i, t)
    measured = next(i for i, wall in mappings.items() if not isinstance(wall, functools.partial))
    info = analysis.sessions[measured]
    spread = {analysis.to_wall(measured, t) - t for t in (info.proc_start, info.last_seen)}
    assert len(spread) == 2  # no one shift would do


def _uneven_run(run_dir: Path) -> Path:
    """Two ranks, two attempts: rank 1 runs a step rank 0 does not and repeats two steps (a
    rollback: 3, 4, then 3, 4 again), the first attempt crashes with executions after its last
    sync point (never closed), the second re-does steps."""
    from tests.helpers.builders import Proc

    t_end = 0.0
    for rank in (0, 1):
        proc = Proc(run_dir, rank=rank, world=2, start=0.0)
        steps = [0, 1, 2, 3, 4, 5, 6, 7] if rank == 0 else [0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8]
        t = 1.0
        for k, step in enumerate(steps):
            proc.step(step, t, t + 1.0)
            if k < len(steps) - 2:  # the last two were dispatched when the process died
                proc.sync(step, t + 1.0, "ready")
            t += 1.0
        proc.write()
        t_end = max(t_end, t)
    for rank in (0, 1):
        proc = Proc(run_dir, rank=rank, world=2, start=t_end + 2.0, restart=1)
        t = t_end + 3.0
        for step in range(5, 10):
            proc.step(step, t, t + 1.0).sync(step, t + 1.0, "ready")
            t += 1.0
        proc.finish(t)
        proc.write()
    return run_dir


def test_the_steps_a_view_chooses_from_are_every_cut_s_executed_steps(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``RunAnalysis.executed_steps`` (joined as each session is cut) holds per attempt the
    distinct steps of every session's executions that closed in an interval, as read from the
    cuts themselves; also with every cut but the reference ones in the temporary file."""
    from goodtrace.analysis import session_cuts

    for bound in (session_cuts.KEEP_CUTS_BYTES, 1):
        monkeypatch.setattr(session_cuts, "KEEP_CUTS_BYTES", bound)
        for run in (RUN, _uneven_run(tmp_path / f"uneven{bound}")):
            analysis = analyze(load_run(run))
            expected: dict[int, set[int]] = {}
            for i, cut in analysis.cuts.items():
                closed = np.frombuffer(cut.exec_interval, dtype=np.int64) >= 0
                expected.setdefault(analysis.attempt_of[i], set()).update(
                    np.frombuffer(cut.exec_step, dtype=np.int64)[closed].tolist())
            got = {a: s.tolist() for a, s in analysis.executed_steps.items()}
            assert got == {a: sorted(s) for a, s in expected.items()}
            if run != RUN:
                assert got == {0: [0, 1, 2, 3, 4, 5, 6], 1: [5, 6, 7, 8, 9]}
