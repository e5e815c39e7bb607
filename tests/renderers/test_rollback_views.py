"""Every view shows a rollback inside an attempt, drawn from the analysis's one derivation
(``RunAnalysis.rewinds``): the console's attempts section (the CLI as a subprocess), the trace
(an instant on the steps track, at the rewind's time on the aligned clock), the HTML page (in
real headless Chromium) and the sinks' summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from goodtrace.renderers.html import render_html, report_data
from goodtrace.renderers.perfetto import PerfettoRenderer
from goodtrace.sinks import summary_values
from helpers.browser import PageLog, new_page
from helpers.builders import Proc
from helpers.cli import goodtrace

TEXT = "rolled back from step 8 to 4 at +11.0 s, 4 steps re-done (4.00 s wasted; inferred from the step numbers)"


def _run(tmp_path: Path) -> Path:
    """Steps 0-8 (1 s each from 1 s), a 1 s restore, then 5-11: one inferred rollback."""
    p = Proc(tmp_path)
    t = p.loop(range(9), 1.0)
    p.span("restore", t, t + 1.0)
    p.loop(range(5, 12), t + 1.0)
    p.finish(19.0)
    p.write()
    return tmp_path


@pytest.mark.processes
def test_the_console_lists_the_rollback_under_the_attempts(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    done = goodtrace("report", str(run_dir), env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"attempt 0: {TEXT}" in out
    assert out.index("Attempts") < out.index(TEXT)


def test_the_trace_has_an_instant_at_the_rollback(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    loaded = load_run(run_dir)
    analysis = analyze(loaded)
    (rewind,) = analysis.rewinds
    trace = json.loads(PerfettoRenderer().render(analysis, loaded))
    (event,) = [e for e in trace["traceEvents"] if e.get("cat") == "rollback"]
    assert event["ph"] == "i" and event["name"] == "rollback to step 4"
    assert {k: event["args"][k] for k in ("from_step", "to_step", "resume_step", "redone", "explicit")} == {
        "from_step": 8, "to_step": 4, "resume_step": 5, "redone": 4, "explicit": False}
    origin = trace["otherData"]["origin_wall_ns"]
    assert round(float(event["ts"]) * 1000) + origin == analysis.to_wall(rewind.session, rewind.t)


def test_the_sinks_summary_names_the_rollback(tmp_path: Path) -> None:
    analysis = analyze(load_run(_run(tmp_path)))
    numbers, texts = summary_values(analysis)
    assert numbers["goodtrace/summary/rollbacks"] == 1.0
    assert numbers["goodtrace/summary/wasted_progress_s"] == 4.0
    assert texts["goodtrace/summary/rollback_0"] == f"attempt 0: {TEXT}"


@pytest.mark.browser
@pytest.mark.processes
def test_the_html_page_notes_the_rollback(chromium: Any, tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "run")
    loaded = load_run(run_dir)
    analysis = analyze(loaded)
    assert report_data(analysis, loaded)["summary"]["rewinds"][0]["text"] == TEXT
    path = tmp_path / "report.html"
    path.write_text(render_html(analysis, loaded), encoding="utf-8")
    log = PageLog()
    url = path.resolve().as_uri()
    page = new_page(chromium, url, log)
    page.goto(url, wait_until="load")
    page.wait_for_function("() => window.goodtraceReady === true", timeout=60_000)
    assert f"Attempt 0: {TEXT}" in page.inner_text("#notes")
    assert log.errors == [] and log.console_errors == []
