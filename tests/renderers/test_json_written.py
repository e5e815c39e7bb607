"""The JSON report written a piece at a time (``report --json``'s step table a block of rows at a
time) is ``json.dumps`` of the report object, to the byte."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import render_json
from helpers.browser import write_small_run


@pytest.mark.parametrize("indent", [2, None, 4])
@pytest.mark.parametrize("include_steps", [True, False])
def test_the_json_written_row_by_row_is_json_dumps_of_the_report(tmp_path: Path, indent: int | None,
                                                                 include_steps: bool) -> None:
    """``report --json`` writes the step table a row at a time (a week of steps is never held as
    one string): the pieces joined are ``json.dumps`` of the report object, to the byte."""
    import io

    from goodtrace.renderers.json_report import report_object, write_json

    analysis = analyze(load_run(write_small_run(tmp_path / "run")))
    expected = json.dumps(report_object(analysis, include_steps=include_steps), indent=indent, allow_nan=False)
    out = io.StringIO()
    write_json(analysis, out, include_steps=include_steps, indent=indent)
    assert out.getvalue() == expected
    assert render_json(analysis, include_steps=include_steps, indent=indent) == expected
    if include_steps:
        assert len(json.loads(expected)["steps"]) == len(analysis.steps) > 1


RESTARTED = Path(__file__).resolve().parents[1] / "data" / "runs" / "restart_2ranks"


@pytest.mark.parametrize("block", [1, 3, 4096])
def test_the_step_table_written_a_block_of_rows_at_a_time_is_json_dumps_of_its_rows(
        tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JSON step table is written from the table's blocks of columns (a template of the
    row's keys filled a block at a time, not a row made and encoded each): the same text as
    ``json.dumps`` of the report, whatever the block size, on a run with tags, metrics and
    overhead and on one whose first attempt's last steps were redone (rows not counted)."""
    from goodtrace.renderers import json_report

    monkeypatch.setattr(json_report, "_TEXT_BLOCK", block)
    small, restarted = (analyze(load_run(run)) for run in (write_small_run(tmp_path / "run"), RESTARTED))
    assert any(row.overhead_s for row in small.steps) and any(row.tags for row in small.steps)
    assert any(row.metrics for row in small.steps)
    assert any(not row.counted for row in restarted.steps)
    for analysis in (small, restarted):
        written = json_report.render_json(analysis)
        assert written == json.dumps(json_report.report_object(analysis), indent=2, allow_nan=False)
        assert json.loads(written)["steps"] == [row.to_dict() for row in analysis.steps]


def _row_json(row: dict[str, object]) -> str:
    """A step row's text in the report's step table (at the line break ``"\\n    "``)."""
    from goodtrace.renderers.json_report import finite

    return json.dumps(finite(row), indent=2, allow_nan=False).replace("\n", "\n    ")


def test_a_block_with_a_float_json_cannot_hold_is_written_row_by_row_with_null(tmp_path: Path) -> None:
    """A non-finite float in a block's columns (none reaches the rows from the reader; the
    writer keeps its output valid JSON whatever a field holds) makes that block's rows written
    one by one, the float as null; an object with other than text keys and float values (an
    int metric, a number as a key) is written as ``json.dumps`` writes it."""
    import math

    from goodtrace.analysis.steps import StepRow
    from goodtrace.renderers.json_report import _block_text

    analysis = analyze(load_run(write_small_run(tmp_path / "run")))
    columns = next(analysis.steps.blocks())
    names = [f.name for f in dataclasses.fields(StepRow)]

    def expected() -> list[str]:
        return [_row_json(StepRow(*row).to_dict()) for row in zip(*columns, strict=True)]

    assert len(columns[0]) > 2 and _block_text(columns, 2, "\n    ") == expected()
    columns[names.index("metrics")][0] = {"loss": 3, 7: 1.5}
    made = _block_text(columns, 2, "\n    ")
    assert made == expected() and '"loss": 3,' in made[0] and '"7": 1.5' in made[0]
    columns[names.index("overhead_s")][1] = {"eval": math.inf}
    columns[names.index("step_time_s")][2] = math.nan
    made = _block_text(columns, 2, "\n    ")
    assert made == expected() and '"eval": null' in made[1] and '"step_time_s": null' in made[2]


def test_a_step_row_s_object_is_its_fields_in_order_and_a_copy(tmp_path: Path) -> None:
    """A step row's object (what the JSON step table writes) holds every field in declaration
    order, as ``dataclasses.asdict`` made it (without its deep copy of every value), its
    containers copies of the row's."""
    import dataclasses

    analysis = analyze(load_run(write_small_run(tmp_path / "run")))
    rows = list(analysis.steps)
    assert any(row.tags for row in rows) and any(row.metrics for row in rows) and any(row.overhead_s for row in rows)
    for row in rows:
        made = row.to_dict()
        assert list(made.items()) == list((dataclasses.asdict(row) | {"tags": list(row.tags)}).items())
        assert made["metrics"] is not row.metrics and made["overhead_s"] is not row.overhead_s
