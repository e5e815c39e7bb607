"""The HTML report's goodput-over-time chart: its data from the analysis's periods, and the page
opened in headless Chromium (drawn, the worst periods marked, the tooltip names each bucket)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import RangeEdge, analyze
from goodtrace.read.load import load_run
from goodtrace.renderers.html import render_html, report_data
from helpers.browser import PageLog, artifact, hover_tooltip, new_page
from helpers.builders import hourly_run

JS_INK = """(id) => {
  const canvas = document.querySelector('#' + id + ' canvas');
  if (!canvas) return -1;
  const img = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let ink = 0;
  for (let i = 0; i < img.length; i += 16) if (img[i] < 200 || img[i + 1] < 200 || img[i + 2] < 200) ink++;
  return ink;
}"""

JS_POINT = """([label, value]) => {
  const chart = window.goodtraceCharts['over-time'];
  const node = document.getElementById('over-time');
  node.scrollIntoView({block: 'center'});
  const p = chart.convertToPixel({xAxisIndex: 0, yAxisIndex: 0}, [label, value]);
  const box = node.getBoundingClientRect();
  return {x: box.left + p[0], y: box.top + p[1]};
}"""


def test_chart_data_is_the_analysis_periods(tmp_path: Path) -> None:
    loaded = load_run(hourly_run(tmp_path / "run"))
    data = report_data(analyze(loaded, every_s=3600.0), loaded)["over_time"]
    assert data["start"] == ["2023-11-14T22:30:00Z", "2023-11-14T23:00:00Z", "2023-11-15T00:00:00Z"]
    assert data["end"][-1] == "2023-11-15T00:16:40Z" and data["partial"] == [True, False, True]
    assert list(data["series"]) == ["productive", "startup", "checkpoint_save", "teardown"]
    assert data["series"]["productive"] == [round(1200 / 1800, 6), round(3300 / 3600, 6), 0.9]
    assert data["series"]["checkpoint_save"] == [0.0, round(300 / 3600, 6), 0.0]
    assert data["worst"] == [0, 1, 2] and data["lost_s"] == [600.0, 300.0, 100.0]


@pytest.mark.browser
@pytest.mark.processes
def test_chart_draws_and_its_tooltip_names_the_buckets(chromium: Any, tmp_path: Path) -> None:
    loaded = load_run(hourly_run(tmp_path / "run"))
    path = tmp_path / "report.html"
    path.write_text(render_html(analyze(loaded, every_s=3600.0), loaded), encoding="utf-8")
    log = PageLog()
    url = path.resolve().as_uri()
    page = new_page(chromium, url, log)
    page.goto(url, wait_until="load")
    page.wait_for_function("() => window.goodtraceReady === true", timeout=60_000)
    assert page.evaluate(JS_INK, "over-time") > 200, "the goodput-over-time chart drew nothing"
    option = page.evaluate("() => window.goodtraceCharts['over-time'].getOption()")
    labels = option["xAxis"][0]["data"]
    assert labels == ["11-14 22:30-23:00", "11-14 23:00-00:00", "11-15 00:00-00:16:40"]
    worst = next(s for s in option["series"] if s["name"] == "worst")
    assert [point[0] for point in worst["data"]] == labels
    assert "3 period(s) of 1.00 h" in page.inner_text("#over-time-note")
    point = page.evaluate(JS_POINT, [labels[1], 50])
    tooltip = hover_tooltip(page, "over-time", point, "goodput 91.7%")
    assert "2023-11-14T23:00:00Z" in tooltip and "checkpoint_save: 8.3%" in tooltip and "worst #2" in tooltip
    page.screenshot(path=str(artifact("html-report-over-time.png")), full_page=True)
    assert log.errors == [] and log.console_errors == [] and log.blocked == []


def test_a_time_range_is_named_and_the_chart_keeps_to_it(chromium: Any, tmp_path: Path) -> None:
    loaded = load_run(hourly_run(tmp_path / "run"))
    analysis = analyze(loaded, since=RangeEdge(step=50), until=RangeEdge(step=70), every_s=3600.0)
    path = tmp_path / "range.html"
    path.write_text(render_html(analysis, loaded), encoding="utf-8")
    log = PageLog()
    url = path.resolve().as_uri()
    page = new_page(chromium, url, log)
    page.goto(url, wait_until="load")
    page.wait_for_function("() => window.goodtraceReady === true", timeout=60_000)
    assert "Time range 2023-11-14T23:30:00Z to 2023-11-14T23:56:00Z (UTC, --since/--until): goodput 80.8%" in page.inner_text("#notes")
    option = page.evaluate("() => window.goodtraceCharts['over-time'].getOption()")
    assert option["xAxis"][0]["data"] == ["11-14 23:30-23:56"]
    steps = page.evaluate("() => window.goodtraceCharts.steps.getOption().xAxis[0].data.length")
    assert steps == 21 and page.evaluate(JS_INK, "over-time") > 200
    assert log.errors == [] and log.console_errors == []
