"""Each number is derived once, in analysis/cut.py, and every view calls it: the step
table, the rank figures and the heat map show the same step time per execution, and no module
outside the cut computes an interval's length per execution again or borrows its private helpers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import goodtrace
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
