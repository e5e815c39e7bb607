"""The self-contained HTML report: its data, its escaping, a golden file, and the page itself
opened in headless Chromium (no console errors, no network, charts drawn, hover, no injection)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import RunAnalysis, analyze
from goodtrace.read.load import load_run
from goodtrace.read.loaded import LoadedRun
from goodtrace.renderers import html, html_charts
from goodtrace.renderers.html import embed_json, render_html, report_data
from helpers.browser import EVIL, PageLog, artifact, hover_tooltip, new_page, write_small_run
from helpers.cli import goodtrace

GOLDEN = Path(__file__).parent.parent / "data" / "golden_trace_small"
UPDATE = os.environ.get("GOODTRACE_UPDATE_GOLDEN") == "1"


def _analysed(run_dir: Path) -> tuple[RunAnalysis, LoadedRun]:
    loaded = load_run(run_dir)
    return analyze(loaded), loaded


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_run(tmp_path_factory.mktemp("small") / "run")


@pytest.fixture(scope="module")
def evil_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_run(tmp_path_factory.mktemp("evil") / "run", evil=True)


# ------------------------------------------------------------------------------ data and escaping


def test_embedded_json_cannot_close_the_script_element() -> None:
    text = embed_json({"name": "</script><script>alert(1)</script>", "amp": "&", "ls": "\u2028\u2029"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"name": "</script><script>alert(1)</script>", "amp": "&", "ls": "\u2028\u2029"}


def test_report_data_from_the_analysis(small_run: Path) -> None:
    analysis, loaded = _analysed(small_run)
    data = report_data(analysis, loaded)
    summary = data["summary"]
    assert summary["ranks"] == 3 and summary["attempts"] == 2 and summary["hosts"] == 2
    # each step loads its batch for 10 ms right after the previous step became ready: with no
    # device work queued, data badput (7 x 10 ms of productive, 10 ms of wasted progress and 10
    # ms of the crash's disruption), not productive
    assert summary["goodput"] == pytest.approx(0.63 / 2.59)
    buckets = {name: seconds for name, seconds, _ in data["buckets"]}
    assert buckets["productive"] == pytest.approx(0.63) and buckets["checkpoint_save"] == pytest.approx(0.08)
    assert buckets["data"] == pytest.approx(0.09)
    steps = data["steps"]
    assert steps["steps"] == [0, 1, 2, 3, 3, 4, 5, 6] and steps["attempts"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert steps["series"]["checkpoint_save"][5] == pytest.approx(0.04)
    assert [b[:2] for b in steps["bands"]] == [[0, 3], [4, 7]]
    assert steps["bands"][0][2] == "attempt 0 (killed (rank 0: no finish record))"
    assert steps["bands"][1][2] == "attempt 1 (completed)"
    # the step executions are the analysis's, to the nanosecond
    assert steps["start_ns"] == [r.start_ns for r in analysis.steps]
    assert steps["end_ns"] == [r.end_ns for r in analysis.steps] and steps["seq"] == [r.seq for r in analysis.steps]
    assert summary["events"][0]["name"] == "loss spike" and summary["events_total"] == 3
    assert "checkpoint_save" in data["legend"] and "disruption" in data["legend"]
    # The heat map shows the slow rank: rank 2 computes 80 ms per step, the others 50 ms.
    heat = data["heatmap"]
    assert heat["ranks"] == [0, 1, 2] and len(heat["columns"]) == 8
    assert {v for v in heat["compute_ms"][2] if v is not None} == {80.0}
    assert {v for v in heat["compute_ms"][0] if v is not None} == {50.0}
    # Default gantt range: the steps around the slowest step (step 4 of attempt 1, checkpoint).
    gantt = data["gantt"]
    assert gantt["attempt"] == 1 and gantt["steps"] == [3, 6]
    assert gantt["rows"] == ["rank 0 (node-a)", "rank 1 (node-a)", "rank 2 (node-b)"]
    forward = gantt["names"].index("forward")
    durations = {(row, round(t1 - t0, 3)) for row, t0, t1, name, *_ in gantt["items"] if name == forward}
    assert durations == {(0, 50.0), (1, 50.0), (2, 80.0)}
    # Aligned clock: every rank's first span of the range starts at the same time.
    firsts = {row: min(t0 for r, t0, *_ in gantt["items"] if r == row) for row in range(3)}
    assert set(firsts.values()) == {0.0}


def test_report_data_with_a_chosen_range(small_run: Path) -> None:
    analysis, loaded = _analysed(small_run)
    data = report_data(analysis, loaded, gantt_steps=(1, 2))
    assert data["gantt"]["attempt"] == 0 and data["gantt"]["steps"] == [1, 2]
    assert {item[5] for item in data["gantt"]["items"]} == {1, 2}
    open_ended = report_data(analysis, loaded, gantt_steps=(5, None))["gantt"]
    assert open_ended["attempt"] == 1 and open_ended["steps"] == [5, 6]
    redone = report_data(analysis, loaded, gantt_steps=(3, 3), gantt_attempt=0)["gantt"]
    assert redone["attempt"] == 0 and redone["steps"] == [3, 3]
    assert report_data(analysis, loaded, gantt_steps=(50, 60))["gantt"] is None


def test_a_long_step_table_is_drawn_as_bars_of_consecutive_rows(
    small_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_STEP_BARS rows the step chart draws bars of consecutive rows of one attempt
    (their mean): the page stays small however long the run, and nothing is lost from a bar's
    rows (count x mean gives back their sum, the slowest row, tags and anomalies stay)."""
    analysis, loaded = _analysed(small_run)
    whole = report_data(analysis, loaded)["steps"]
    monkeypatch.setattr(html, "MAX_STEP_BARS", 3)
    bars = report_data(analysis, loaded)["steps"]
    # 8 rows, 4 of each attempt, at most 3 a bar (ceil(8 / 3)), never across the attempts
    assert bars["bin"] == 3 and bars["counts"] == [3, 1, 3, 1]
    assert bars["steps"] == [0, 3, 3, 6] and bars["last_steps"] == [2, 3, 5, 6]
    assert bars["attempts"] == [0, 0, 1, 1] and bars["seq"] == [whole["seq"][i] for i in (0, 3, 4, 7)]
    assert bars["start_ns"] == [whole["start_ns"][i] for i in (0, 3, 4, 7)]
    assert bars["end_ns"] == [whole["end_ns"][i] for i in (2, 3, 6, 7)]
    assert [b[:2] for b in bars["bands"]] == [[0, 1], [2, 3]] and bars["bands"][1][2] == whole["bands"][1][2]
    bar_of = [0, 0, 0, 1, 2, 2, 2, 3]
    assert set(bars["series"]) == set(whole["series"])
    for name, values in whole["series"].items():
        for b, count in enumerate(bars["counts"]):
            rows = [v for i, v in enumerate(values) if bar_of[i] == b]
            assert bars["series"][name][b] * count == pytest.approx(sum(rows), abs=1e-5), (name, b)
    totals = [sum(values[i] for values in whole["series"].values()) for i in range(8)]
    assert bars["max_s"] == pytest.approx([max(t for i, t in enumerate(totals) if bar_of[i] == b) for b in range(4)])
    assert sorted(a[0] for a in bars["anomalies"]) == sorted(bar_of[a[0]] for a in whole["anomalies"])
    for i, tags in enumerate(whole["tags"]):
        assert set(tags) <= set(bars["tags"][bar_of[i]])


@pytest.mark.parametrize("release", [True, False], ids=["records-released", "records-kept"])
def test_views_read_every_rank_s_cut_back_from_the_temporary_file_when_it_is_not_kept(
    small_run: Path, monkeypatch: pytest.MonkeyPatch, release: bool,
) -> None:
    """Past KEEP_CUTS_BYTES the analysis keeps the reference sessions' cuts alone in memory and
    writes the others to a temporary file, from which the views read them back (a long run of
    many ranks; the records released as each session is cut, as the commands do, or kept): the
    page and the trace are the same as with every cut in memory, and only the last cut read
    back is held."""
    from goodtrace.analysis import session_cuts
    from goodtrace.renderers.perfetto import PerfettoRenderer

    kept, loaded = _analysed(small_run)
    page, trace = report_data(kept, loaded), PerfettoRenderer().render(kept, loaded)
    monkeypatch.setattr(session_cuts, "KEEP_CUTS_BYTES", 0)
    loaded = load_run(small_run)
    analysis = analyze(loaded, release_records=release)
    assert loaded.released == release
    cuts = analysis.cuts
    assert isinstance(cuts, session_cuts.SessionCuts) and list(cuts) == list(kept.cuts)
    references = {a.reference_session for a in analysis.attempts}
    others = [i for i in cuts if i not in references]
    assert set(cuts._held) == references and others and set(cuts._spilled) == set(others)
    assert report_data(analysis, loaded) == page
    assert PerfettoRenderer().render(analysis, loaded) == trace
    assert len(cuts._read) == 1  # the last one read back, alone
    assert cuts[others[0]] is cuts[others[0]]  # asked twice in a row: read once
    assert cuts[others[0]] == kept.cuts[others[0]]


def _without(data: Any, warning: str | None) -> Any:
    """The page's data without ``warning`` wherever it is listed."""
    if isinstance(data, dict):
        return {k: _without(v, warning) for k, v in data.items()}
    if isinstance(data, list):
        return [_without(v, warning) for v in data if v != warning]
    return data


def test_a_cut_that_cannot_be_written_stays_in_memory(small_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk: the cuts past KEEP_CUTS_BYTES are held in memory, the page the same but
    for one warning that says so (a run that long wants a temporary directory with room)."""
    from goodtrace.analysis import session_cuts, spill

    kept, loaded = _analysed(small_run)
    page = report_data(kept, loaded)
    monkeypatch.setattr(session_cuts, "KEEP_CUTS_BYTES", 0)

    def full(self: spill.SpillFile, data: memoryview) -> tuple[int, int]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill.SpillFile, "_write", full)
    loaded = load_run(small_run)
    analysis = analyze(loaded, release_records=True)
    cuts = analysis.cuts
    assert isinstance(cuts, session_cuts.SessionCuts)
    assert not cuts._spilled and set(cuts._held) == set(cuts)
    (warning,) = [w for w in analysis.warnings if w not in kept.warnings]
    assert "could not take what the analysis puts aside" in warning and "No space left on device" in warning
    assert "TMPDIR" in warning
    data = report_data(analysis, loaded)
    assert json.dumps(data).replace(json.dumps(warning)[1:-1], "") != json.dumps(data)  # the page says it
    assert _without(data, warning) == _without(page, None)


def test_golden_report_data() -> None:
    """The page's data for the golden run. A missing golden file fails the test (write it with
    GOODTRACE_UPDATE_GOLDEN=1 after an intended change, and check its diff)."""
    data = report_data(*_analysed(GOLDEN / "run"))
    data["summary"]["run"] = "run"
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    golden = GOLDEN / "report_data.json"
    if UPDATE:
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden} is missing: run with GOODTRACE_UPDATE_GOLDEN=1 and check it"
    assert text == golden.read_text(encoding="utf-8"), "set GOODTRACE_UPDATE_GOLDEN=1 after an intended change"


def test_a_loop_without_steps_says_why_there_are_no_intervals(tmp_path: Path) -> None:
    import goodtrace as gt

    gt.init(tmp_path / "run", rank=0, world_size=1)
    with gt.span("work"):
        pass
    gt.finish()
    data = report_data(*_analysed(tmp_path / "run"))
    assert data["steps"]["steps"] == [] and "never entered gt.step" in data["steps"]["why_empty"]
    assert data["gantt"] is None


def test_gantt_past_its_limit_keeps_the_lowest_ranks(small_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    analysis, loaded = _analysed(small_run)
    full = report_data(analysis, loaded, gantt_steps=(3, 6))["gantt"]
    per_row = [sum(1 for item in full["items"] if item[0] == row) for row in range(3)]
    monkeypatch.setattr(html_charts, "MAX_GANTT_ITEMS", per_row[0] - 1)  # rank 0's spans pass it
    read: list[list[int]] = []
    original = html.session_records

    def session_records(run: Any, wanted: Any, **options: Any) -> Any:
        read.append(sorted(wanted))
        return original(run, wanted, **options)

    monkeypatch.setattr(html, "session_records", session_records)
    for rows_at_once in (1, 512):  # read a row at a time, or all three rows together
        monkeypatch.setattr(html_charts, "READ_ROWS", rows_at_once)
        read.clear()
        gantt = report_data(analysis, loaded, gantt_steps=(3, 6))["gantt"]
        assert gantt["truncated"] is True and gantt["rows"] == full["rows"][:1]
        assert gantt["items"] == full["items"][:per_row[0]] and gantt["marks"] == full["marks"]
        # the rows past the limit are not read at all when read a row at a time
        assert len(read) == 1 and len(read[0]) == (1 if rows_at_once == 1 else 3)


LONG_SESSION = """
import sys
import goodtrace as gt
from goodtrace.testing import FakeClock
clock = FakeClock()
gt.init(sys.argv[1], clock=clock, segment_bytes=4096)
epoch = None
for k in range(400):
    if k == 100:
        epoch = gt.span("epoch")  # from step 100 to step 300: written in a file after the window's
        epoch.__enter__()
    with gt.step(k) as s:
        with gt.span("forward"):
            clock.advance(0.1)
        s.complete_on(1.0)
    if k == 300:
        epoch.__exit__(None, None, None)
    if k % 20 == 19:
        gt.flush()  # a new segment (4 KiB) every 20 steps or so
gt.finish()
"""


@pytest.mark.processes
def test_the_gantt_of_a_few_steps_reads_only_the_files_around_them(tmp_path: Path) -> None:
    """The gantt of a few steps of a long session reads the files whose records' times reach
    its range (each file's earliest and latest time, as loaded), not every file of the session,
    and draws the same spans as a read of every file: a span that began long before the range
    and ended long after it (written in a later file) among them."""
    import subprocess
    import sys

    from goodtrace.read import raw

    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-c", LONG_SESSION, str(run_dir)], check=True, timeout=120)
    analysis, loaded = _analysed(run_dir)
    files = loaded.files[0]
    assert len(files) >= 10 and set(loaded.file_ranges) <= set(files) and len(loaded.file_ranges) >= len(files) - 1
    window = _clock_range(analysis, 200, 204)
    chosen = raw._files_for(loaded, 0, window, (200, 204), None, True)
    # the range's file(s), the file the epoch span ends in, the first (no timed record) and the last
    assert files[-1] in chosen and len(chosen) <= 6, (len(chosen), len(files))
    assert raw._files_for(loaded, 0, window, None, None, False) == files  # every mark of any step: every file
    gantt = report_data(analysis, loaded, gantt_steps=(200, 204))["gantt"]
    assert {"epoch", "forward"} <= set(gantt["names"]), gantt["names"]
    ranges, loaded.file_ranges = loaded.file_ranges, {}  # no ranges: every file read
    assert raw._files_for(loaded, 0, window, (200, 204), None, True) == files
    assert report_data(analysis, loaded, gantt_steps=(200, 204))["gantt"] == gantt
    loaded.file_ranges = ranges


def _clock_range(analysis: RunAnalysis, first: int, last: int) -> tuple[int, int]:
    from goodtrace.analysis.intervals import session_intervals

    intervals = session_intervals(analysis, 0, (first, last))
    return intervals[0].start, intervals[-1].end


def test_page_is_self_contained_and_run_text_is_inert(evil_run: Path) -> None:
    html = render_html(*_analysed(evil_run))
    assert html.count("</script") == 3  # the data block, ECharts, the page script
    assert EVIL not in html and "<script>alert" not in html and "<svg" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert csp is not None and "default-src 'none'" in csp.group(1) and "unsafe-inline" not in csp.group(1).split(";")[1]


# ------------------------------------------------------------------------------ in the browser

JS_CANVAS_INK = """(id) => {
  const canvas = document.querySelector('#' + id + ' canvas');
  if (!canvas) return -1;
  const ctx = canvas.getContext('2d');
  const img = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let ink = 0;
  for (let i = 0; i < img.length; i += 16) if (img[i] < 200 || img[i + 1] < 200 || img[i + 2] < 200) ink++;
  return ink;
}"""

JS_BAR_POINT = """([name, row]) => {
  const chart = window.goodtraceCharts.gantt;
  const option = chart.getOption();
  const items = option.series[0].data;
  const names = JSON.parse(document.getElementById('goodtrace-data').textContent).gantt.names;
  const want = names.indexOf(name);
  const item = items.find(v => v[3] === want && v[0] === row && v[6] === 0 && v[7] === 0);
  const point = chart.convertToPixel({seriesIndex: 0}, [(item[1] + item[2]) / 2, item[0]]);
  const box = document.getElementById('gantt').getBoundingClientRect();
  return {x: box.left + point[0], y: box.top + point[1], cx: point[0], cy: point[1]};
}"""

JS_PIXEL = """([id, x, y]) => {
  const canvas = document.querySelector('#' + id + ' canvas');
  const ratio = canvas.width / canvas.clientWidth;
  return Array.from(canvas.getContext('2d').getImageData(Math.round(x * ratio), Math.round(y * ratio), 1, 1).data);
}"""


def _open(chromium: Any, path: Path) -> tuple[Any, PageLog]:
    log = PageLog()
    url = path.resolve().as_uri()
    page = new_page(chromium, url, log)
    page.goto(url, wait_until="load")
    page.wait_for_function("() => window.goodtraceReady === true", timeout=60_000)
    return page, log


def _hover(page: Any, name: str, row: int = 0) -> str:
    page.evaluate("() => document.getElementById('gantt').scrollIntoView({block: 'start'})")
    return hover_tooltip(page, "gantt", page.evaluate(JS_BAR_POINT, [name, row]), name)


@pytest.mark.browser
@pytest.mark.processes
def test_report_opens_offline_draws_and_hovers(chromium: Any, small_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    analysed = _analysed(small_run)
    path.write_text(render_html(*analysed), encoding="utf-8")
    page, log = _open(chromium, path)
    assert log.errors == [] and log.console_errors == [] and log.dialogs == []
    assert log.blocked == [] and log.requests == [path.resolve().as_uri()]
    for chart in ("buckets", "steps", "heatmap", "gantt"):
        assert page.evaluate(JS_CANVAS_INK, chart) > 200, f"{chart} chart drew nothing"
    assert page.title() == "goodtrace: run"
    assert "24.3%" in page.inner_text("#headline")
    assert page.inner_text("#verdict") == analysed[0].verdict.line  # under the headline, as the console says it
    assert "checkpoint_save" in page.inner_text("#bucket-table")
    # The gantt bar of 'forward' is drawn in the compute colour where the mouse will hover.
    point = page.evaluate(JS_BAR_POINT, ["forward", 0])
    assert page.evaluate(JS_PIXEL, ["gantt", point["cx"], point["cy"]])[:3] == [84, 112, 198]
    tooltip = _hover(page, "forward")
    assert "category: compute" in tooltip and "duration: 50.00 ms" in tooltip and "step: 3" in tooltip
    page.screenshot(path=str(artifact("html-report-small.png")), full_page=True)
    # The heat map shows each rank relative to the median rank: the slow rank 2 at 1.6x.
    cells = page.evaluate("() => window.goodtraceCharts.heatmap.getOption().series[0].data")
    ratios = {(row, ratio) for _, row, ratio, _ in cells}
    assert ratios == {(0, 1.0), (1, 1.0), (2, 1.6)}
    # It switches between compute and step time (every rank waits for the slow one: all 1.0x).
    page.click("#heat-step")
    cells = page.evaluate("() => window.goodtraceCharts.heatmap.getOption().series[0].data")
    assert {ratio for _, _, ratio, _ in cells} == {1.0}
    assert page.get_attribute("#heat-step", "aria-pressed") == "true"
    assert log.errors == [] and log.console_errors == []


def test_step_bars_of_several_rows_draw_and_say_so_on_hover(
    chromium: Any, small_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(html, "MAX_STEP_BARS", 3)
    path = tmp_path / "report.html"
    path.write_text(render_html(*_analysed(small_run)), encoding="utf-8")
    page, log = _open(chromium, path)
    assert page.evaluate(JS_CANVAS_INK, "steps") > 200
    assert "Each bar is up to 3 consecutive executions" in page.inner_text("#steps-note")
    assert "8 step execution(s)" in page.inner_text("#steps-note")
    page.evaluate("() => document.getElementById('steps').scrollIntoView({block: 'start'})")
    point = page.evaluate("""() => {
      const chart = window.goodtraceCharts.steps;
      const p = chart.convertToPixel({xAxisIndex: 0, yAxisIndex: 0}, ['0', 0.01]);
      const box = document.getElementById('steps').getBoundingClientRect();
      return {x: box.left + p[0], y: box.top + p[1]};
    }""")
    tooltip = hover_tooltip(page, "steps", point, "steps 0-2")
    assert "3 executions" in tooltip and "mean step time" in tooltip and "slowest" in tooltip
    assert log.errors == [] and log.console_errors == []


def test_two_ranks_heat_map_shows_the_slow_one_red_and_the_fast_one_blue(
    chromium: Any, small_run: Path, tmp_path: Path
) -> None:
    # Ranks 1 (50 ms of compute) and 2 (80 ms) only: the median of two is their mean (65 ms),
    # so the slow rank is above 1.00 and the fast one below (the upper one as the median made
    # the slow rank the grey reference).
    run_dir = tmp_path / "two"
    shutil.copytree(small_run, run_dir)
    shutil.rmtree(run_dir / "rank-00000")
    path = tmp_path / "report.html"
    path.write_text(render_html(*_analysed(run_dir)), encoding="utf-8")
    page, log = _open(chromium, path)
    cells = page.evaluate("() => window.goodtraceCharts.heatmap.getOption().series[0].data")
    ratios = {(row, ratio) for _, row, ratio, _ in cells}
    assert ratios == {(0, round(50 / 65, 4)), (1, round(80 / 65, 4))}
    assert log.errors == [] and log.console_errors == []


def test_hostile_names_are_shown_as_text(chromium: Any, evil_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "evil.html"
    path.write_text(render_html(*_analysed(evil_run)), encoding="utf-8")
    page, log = _open(chromium, path)
    tooltip = _hover(page, EVIL, row=2)  # rank 2, on the host named <script>...
    page.wait_for_timeout(300)
    assert EVIL in tooltip  # shown literally, as text
    assert "<script>alert(2)</script>" in tooltip  # the host name, literally
    assert log.dialogs == [] and log.errors == [] and log.console_errors == []
    assert log.blocked == []  # an injected <img src=x> would have requested file:///.../x
    assert page.evaluate("() => document.querySelectorAll('img, svg, iframe, object, embed').length") == 0
    assert page.evaluate("() => document.querySelectorAll('script').length") == 3
    page.screenshot(path=str(artifact("html-report-hostile.png")), full_page=True)


@pytest.mark.processes
def test_report_command_writes_the_page(evil_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.html"
    done = goodtrace("report", str(evil_run), "--html", str(out))
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")
    block = re.search(r'<script type="application/json" id="goodtrace-data">(.*?)</script>', page, re.S)
    assert block is not None
    data = json.loads(block.group(1))
    assert EVIL in data["gantt"]["names"] and EVIL not in page
    assert data["summary"]["analysed"] is True and data["buckets"]
