"""``--since``/``--until``/``--every`` run (in-process, tests/helpers/cli.py) on a hand-written run with known
hourly buckets (tests/helpers/builders.py ``hourly_run``: 22:30 to 00:16:40 UTC), and the one
parser of their forms."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from goodtrace.cli.time_range import parse_edge
from helpers.builders import H0, Proc, hourly_run
from helpers.cli import Ran
from helpers.cli import goodtrace as run_goodtrace

DATA = Path(__file__).parent.parent / "data" / "runs"


def goodtrace(*args: str) -> Ran:
    return run_goodtrace(*args, env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(hourly_run(tmp_path_factory.mktemp("hourly") / "run"))


def report_json(*args: str) -> dict[str, Any]:
    done = goodtrace("report", *args, "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_parse_edge_forms() -> None:
    assert parse_edge("step:1200").step == 1200
    assert parse_edge("2h").offset_s == 7200.0 and parse_edge("-30m").offset_s == -1800.0
    moment = 1_700_000_000 * 10**9  # 2023-11-14T22:13:20Z
    assert parse_edge("2023-11-14T22:13:20Z").wall_ns == moment
    assert parse_edge("2023-11-14T22:13:20").wall_ns == moment  # UTC unless it names a zone
    assert parse_edge("2023-11-14 23:13:20+01:00").wall_ns == moment
    assert parse_edge("2023-11-14T22:13:20.5Z").wall_ns == moment + 500_000_000
    assert parse_edge("2023-11-14").wall_ns == moment - (22 * 3600 + 13 * 60 + 20) * 10**9
    for bad in ("banana", "step:", "step:1.5", "23:59", ""):
        with pytest.raises(ValueError, match="--since"):
            parse_edge(bad)


@pytest.mark.processes
def test_json_has_goodput_per_utc_hour(run_dir: str) -> None:
    report = report_json(run_dir, "--no-steps", "--every", "1h")
    hours = report["goodput_over_time"]
    assert [(h["start"], h["end"], h["partial"]) for h in hours] == [
        ("2023-11-14T22:30:00Z", "2023-11-14T23:00:00Z", True),
        ("2023-11-14T23:00:00Z", "2023-11-15T00:00:00Z", False),
        ("2023-11-15T00:00:00Z", "2023-11-15T00:16:40Z", True),
    ]
    assert [h["goodput"] for h in hours] == [1200 / 1800, 3300 / 3600, 0.9]
    assert [h["worst"] for h in hours] == [1, 2, 3] and [h["lost_s"] for h in hours] == [600.0, 300.0, 100.0]
    assert [{k: v["seconds"] for k, v in h["buckets"].items()} for h in hours] == [
        {"productive": 1200.0, "startup": 600.0}, {"productive": 3300.0, "checkpoint_save": 300.0},
        {"productive": 900.0, "teardown": 100.0}]
    assert report["window"] is None


@pytest.mark.processes
def test_since_until_restrict_the_step_views(run_dir: str) -> None:
    report = report_json(run_dir, "--since", "2023-11-14T23:00Z", "--until", "step:61", "--every", "30m")
    # 23:00 is step 20's start; step 61 ends at job time 4,620 s (23:47)
    assert report["window"]["start_s"] == 1800.0 and report["window"]["end_s"] == 1800.0 + 42 * 60 + 300
    assert {k: v["seconds"] for k, v in report["window"]["buckets"].items() if v["ns"]} == {
        "productive": 2520.0, "checkpoint_save": 300.0}
    assert [s["step"] for s in report["steps"]] == list(range(20, 62))
    assert report["step_stats"]["count"] == 42
    assert report["slowest_steps"][0]["step"] == 60
    assert report["goodput"] == 5400 / 6400  # the headline stays the job's
    assert [h["start"][11:16] for h in report["goodput_over_time"]] == ["23:00", "23:30"]
    assert report["goodput_over_time"][-1]["end"] == "2023-11-14T23:47:00Z"
    # --window A:B gives the same window's buckets, and leaves the rest of the report the job's
    same = report_json(run_dir, "--window", "1800:4620", "--every", "30m")
    assert same["window"] == report["window"] and len(same["steps"]) == 90 and len(same["goodput_over_time"]) == 4


@pytest.mark.processes
def test_console_names_the_worst_hours(run_dir: str) -> None:
    done = goodtrace("report", run_dir, "--every", "1h")
    assert done.returncode == 0, done.stderr
    assert ("worst hours (UTC): 11-14 22:30-23:00 66.7% (startup 33.3%), 11-14 23:00-00:00 91.7% "
            "(checkpoint_save 8.3%), 11-15 00:00-00:16:40 90.0% (teardown 10.0%)") in done.stdout
    done = goodtrace("report", run_dir, "--since", "2023-11-14T23:00", "--every", "20m")
    assert done.returncode == 0, done.stderr
    assert "time range 2023-11-14T23:00:00Z to 2023-11-15T00:16:40Z (--since/--until)" in done.stdout
    assert "worst periods of 20m (UTC): 11-14 23:40-00:00 75.0% (checkpoint_save 25.0%)" in done.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--since", "banana"), "--since 'banana': expected a UTC time"),
    (("--until", "step:x"), "--until 'step:x': a step is step:N"),
    (("--since", "3h"), "--since 3h is at or after the end of the job (2023-11-15T00:16:40Z, 6400 s after its start)"),
    (("--since", "2030-01-01"), "is at or after the end of the job"),
    (("--until", "2020-01-01"), "is at or before the start of the job (2023-11-14T22:30:00Z)"),
    (("--since", "step:100"), "--since step:100: no step at or after 100 ran (the highest step is 89)"),
    (("--since", "1h", "--until", "30m"), "the time range is empty"),
    (("--every", "0"), "--every must be a positive duration"),
    (("--every", "0.1s"), "choose a wider period"),
    (("--window", "0:10", "--since", "1s"), "give one or the other"),
])
@pytest.mark.processes
def test_bad_time_ranges_are_one_line_errors(run_dir: str, args: tuple[str, ...], message: str) -> None:
    done = goodtrace("report", run_dir, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.processes
def test_trace_keeps_the_steps_in_the_time_range(run_dir: str, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    done = goodtrace("trace", run_dir, "-o", str(out), "--since", "step:58", "--until", "step:61")
    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert sorted({e["name"] for e in events if e.get("name", "").startswith("step ")}) == [
        "step 58", "step 59", "step 60", "step 61"]
    done = goodtrace("trace", run_dir, "-o", str(out), "--since", "1h", "--steps", "1:2")
    assert done.returncode == 2 and "give one" in done.stderr


@pytest.mark.processes
def test_export_replays_the_steps_in_the_time_range(run_dir: str, tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    done = goodtrace("export", run_dir, "--to", "tensorboard", str(tmp_path / "tb"), "--since", "step:80")
    assert done.returncode == 0, done.stderr
    assert "exported 10 step rows" in done.stdout
    reader = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    reader.Reload()
    assert [e.step for e in reader.Scalars("goodtrace/step_time_s")] == list(range(80, 90))
    (goodput,) = reader.Scalars("goodtrace/summary/goodput")  # the summary stays the job's
    assert math.isclose(goodput.value, 5400 / 6400, rel_tol=1e-6)
    done = goodtrace("export", run_dir, "--to", "tensorboard", str(tmp_path / "tb2"), "--until", "nope")
    assert done.returncode == 2 and "--until 'nope'" in done.stderr


@pytest.mark.processes
def test_since_until_in_seconds_give_the_window_of_the_golden_run() -> None:
    report = report_json(str(DATA / "restart_2ranks"), "--since", "5", "--until", "12", "--no-steps",
                         "--every", "1h")
    assert {k: v["seconds"] for k, v in report["window"]["buckets"].items() if v["ns"]} == {
        "productive": 1.0, "wasted_progress": 1.5, "disruption": 3.5, "startup": 1.0}
    assert len(report["goodput_over_time"]) == 1 and report["goodput_over_time"][0]["partial"]


@pytest.mark.processes
def test_records_counts_the_records_in_the_time_range(run_dir: str) -> None:
    done = goodtrace("records", run_dir, "--since", "step:80", "--json")
    assert done.returncode == 0, done.stderr
    (session,) = json.loads(done.stdout)["sessions"]
    assert session["records"] == 184 and session["records_in_range"] == 20  # steps 80-89: entry + sync
    # from 00:00 UTC: steps 75-89 (15 entries), the sync points at or after it (16), finish, heartbeat
    done = goodtrace("records", run_dir, "--since", "2023-11-15T00:00Z")
    assert done.returncode == 0 and "(33 in the time range)" in done.stdout, done.stderr
    done = goodtrace("records", run_dir, "--since", "5h")
    assert done.returncode == 2 and "after the run's last record" in done.stderr
    done = goodtrace("records", run_dir)
    assert "in the time range" not in done.stdout and "records_in_range" not in goodtrace("records", run_dir, "--json").stdout
    # the same counts on two worker processes; a count of none is refused in one line
    done = goodtrace("records", run_dir, "--since", "step:80", "--json", "--workers", "2")
    assert done.returncode == 0, done.stderr
    (session,) = json.loads(done.stdout)["sessions"]
    assert session["records"] == 184 and session["records_in_range"] == 20
    done = goodtrace("records", run_dir, "--workers", "0")
    assert done.returncode == 2 and "--workers must be at least 1, got 0" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.processes
def test_html_report_of_a_time_range(run_dir: str, tmp_path: Path) -> None:
    target = tmp_path / "range.html"
    done = goodtrace("report", run_dir, "--html", str(target), "--since", "step:50", "--until", "step:70",
                     "--every", "1h")
    assert done.returncode == 0, done.stderr
    page = target.read_text(encoding="utf-8")
    data = json.loads(page.split('id="goodtrace-data">', 1)[1].split("</script>", 1)[0])
    assert data["steps"]["steps"] == list(range(50, 71))
    assert data["over_time"]["start"] == ["2023-11-14T23:30:00Z"]  # steps 50-70 lie in 23:30-00:00
    assert data["summary"]["time_range"]["start"] == "2023-11-14T23:30:00Z"
    assert data["summary"]["time_range"]["end"] == "2023-11-14T23:56:00Z" and data["summary"]["time_range"]["goodput"] == 1260 / 1560


@pytest.mark.processes
def test_an_hour_between_attempts_is_the_worst(tmp_path: Path) -> None:
    a0 = Proc(tmp_path, restart=0, start=H0 - 600)
    a0.loop(range(10), H0 - 600, step_s=60.0)
    a0.heartbeat(H0 + 60)  # killed a minute after its last step
    a0.write()
    a1 = Proc(tmp_path, restart=1, start=H0 + 4800)
    a1.loop(range(10, 20), H0 + 4800, step_s=60.0)
    a1.finish(H0 + 5400)
    a1.write()
    done = goodtrace("report", str(tmp_path), "--every", "1h")
    assert done.returncode == 0, done.stderr
    assert ("worst hours (UTC): 11-14 23:00-00:00 0.0% (disruption 100.0%), 11-15 00:00-00:30 33.3% "
            "(disruption 66.7%)") in done.stdout
