"""``goodtrace report`` and ``goodtrace compact`` run (in-process, tests/helpers/cli.py) on the golden run
directories (tests/data/runs, made by tests/data/make_golden.py); figures computed by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import goodtrace

pytestmark = pytest.mark.processes

DATA = Path(__file__).parent.parent / "data" / "runs"
RESTART = DATA / "restart_2ranks"


def report_json(*args: str) -> dict[str, Any]:
    done = goodtrace("report", *args, "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# Rank 0 of restart_2ranks, by hand: init 1 s; steps 0-2 (1 s each); checkpoint 0.5 s; steps
# 3-4 (re-done later: 2 s wasted); crash 0.5 s after; down until 10 s (3.5 s disruption in
# all); restore 1 s; steps 3-7 (5 s); 0.5 s teardown. 16.5 s, 8 s productive.
EXPECTED_S = {
    "productive": 8.0, "startup": 2.0, "checkpoint_save": 0.5, "wasted_progress": 2.0,
    "disruption": 3.5, "teardown": 0.5,
}


def test_console_report() -> None:
    done = goodtrace("report", str(RESTART))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Goodput 48.5% of 16.5 s job time" in out
    assert "wasted progress (re-done steps) │   2.000 │   12.12%" in out
    assert "total                           │  16.500 │  100.00%" in out
    assert "killed (rank 0: no finish record)" in out and "completed" in out
    assert "1.500 s │ 1.000 s productive + 0.500 s checkpoint_save" in out
    assert "straggler: rank 1 on node1" in out
    assert "torn line" in out
    assert "Traceback" not in done.stderr


def test_json_report() -> None:
    report = report_json(str(RESTART))
    buckets = {k: v["seconds"] for k, v in report["partition"]["buckets"].items() if v["ns"]}
    assert buckets == EXPECTED_S
    assert sum(v["ns"] for v in report["partition"]["buckets"].values()) == 16_500_000_000
    assert report["goodput"] == 8 / 16.5
    assert [a["ended"] for a in report["attempts"]] == ["killed", "completed"]
    assert report["attempts"][0]["ended_text"] == "killed (rank 0: no finish record)"
    assert [(s["step"], s["attempt"], s["counted"]) for s in report["steps"]][3:6] == [
        (3, 0, False), (4, 0, False), (3, 1, True)
    ]
    assert report["stragglers"][0]["rank"] == 1
    assert report["spread"]["goodput_min"] == 8 / 16.7
    assert report["host_overhead"]["rule"] == "sync points"


def test_window_option() -> None:
    report = report_json(str(RESTART), "--window", "5:12", "--rolling", "10", "--no-steps")
    window = {k: v["seconds"] for k, v in report["window"]["buckets"].items() if v["ns"]}
    # [5, 12): step 3 re-done (0.5 wasted) + step 4 (1 wasted), 0.5 crash, 3 down, restore 1, 1 step
    assert window == {"productive": 1.0, "wasted_progress": 1.5, "disruption": 3.5, "startup": 1.0}
    assert [r["productive_s"] for r in report["rolling"]] == [3.0, 5.0]
    assert "steps" not in report
    # the console: the window's buckets as shares of the window (7 s), the job's of the job
    done = goodtrace("report", str(RESTART), "--window", "5:12")
    assert done.returncode == 0, done.stderr
    job, window = done.stdout.split("Window 5.0 s - 12.0 s")
    assert "% of job" in job and "% of window" not in job
    assert "% of window" in window and "% of job" not in window
    assert "wasted progress" in window and "21.43%" in window  # 1.5 s of 7 s


def test_not_a_run_is_a_clear_error(tmp_path: Path) -> None:
    done = goodtrace("report", str(tmp_path))
    assert done.returncode == 2
    assert "not a goodtrace run directory" in done.stderr and "Traceback" not in done.stderr
    done = goodtrace("report", str(tmp_path / "missing"))
    assert done.returncode == 2 and "does not exist" in done.stderr
    done = goodtrace("report", str(RESTART), "--window", "banana")
    assert done.returncode == 2 and "not a duration" in done.stderr
    done = goodtrace("report", str(RESTART), "--accelerator", "abacus", "--flops-per-step", "1e12")
    assert done.returncode == 2 and "unknown accelerator" in done.stderr
    # a negative count was a slice from the end: "top -1" listed every step but one
    done = goodtrace("report", str(RESTART), "--top", "-1")
    assert done.returncode == 2 and "--top must be 0 or more, got -1" in done.stderr, done.stderr
    for flag, value, message in (("--ideal-step", "nan", "--ideal-step must be a positive number"),
                                 ("--devices-per-rank", "0", "--devices-per-rank must be at least 1"),
                                 ("--workers", "0", "workers must be at least 1")):
        done = goodtrace("report", str(RESTART), flag, value)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_compact_then_report_reads_parquet(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    done = goodtrace("compact", str(run))
    assert done.returncode == 0, done.stderr
    assert "80 records from 4 segment file(s)" in done.stdout
    report = report_json(str(run))
    assert report["form"] == "parquet"
    assert {k: v["seconds"] for k, v in report["partition"]["buckets"].items() if v["ns"]} == EXPECTED_S
    original = report_json(str(RESTART))
    assert report["steps"] == original["steps"] and report["spread"] == original["spread"]


def test_older_schema_golden_run() -> None:
    report = report_json(str(DATA / "schema_v0"))
    assert report["partition"]["buckets"]["productive"]["seconds"] == 3.0
    assert any("older schema version 0" in w for w in report["warnings"])


def test_html_option_writes_a_page(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    done = goodtrace("report", str(RESTART), "--html", str(target))
    assert done.returncode == 0, done.stderr
    assert "Goodput 48.5%" in done.stdout and f"wrote {target}" in done.stderr
    assert target.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")


def test_html_gantt_steps_option(tmp_path: Path) -> None:
    import re

    target = tmp_path / "report.html"
    done = goodtrace("report", str(RESTART), "--html", str(target), "--gantt-steps", "4:6")
    assert done.returncode == 0, done.stderr
    block = re.search(r'<script type="application/json" id="goodtrace-data">(.*?)</script>',
                      target.read_text(encoding="utf-8"), re.S)
    assert block is not None
    gantt = json.loads(block.group(1))["gantt"]
    assert gantt["steps"] == [4, 6] and gantt["attempt"] == 1  # steps 3-4 were re-done: the last attempt
    assert {item[5] for item in gantt["items"]} <= {3, 4, 5, 6}
    for bad, message in (("9:3", "'9:3': it is empty"), ("x:y", "'x:y': expected A:B"), ("1:2:3", "'1:2:3': expected")):
        done = goodtrace("report", str(RESTART), "--html", str(target), "--gantt-steps", bad)
        assert done.returncode == 2 and f"--gantt-steps: bad step range {message}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    done = goodtrace("report", str(RESTART), "--gantt-steps", "4:6")
    assert done.returncode == 2 and "add --html FILE" in done.stderr
    done = goodtrace("report", str(RESTART), "--html", str(target), "--gantt-steps", "500:")
    assert done.returncode == 0 and "goodtrace report: warning: --gantt-steps" in done.stderr and "holds no step of the run" in done.stderr


def test_a_peak_so_small_that_mfu_is_infinite_gives_no_mfu_and_a_warning_in_every_view(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    done = goodtrace("report", str(RESTART), "--flops-per-step", "1e12", "--peak-tflops", "1e-312",
                     "--html", str(page), "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["program"]["mfu"] is None
    assert any("MFU cannot be computed" in w for w in report["warnings"])
    assert page.stat().st_size > 0 and "Infinity" not in page.read_text(encoding="utf-8")
    console = goodtrace("report", str(RESTART), "--flops-per-step", "1e12", "--peak-tflops", "1e-312")
    assert console.returncode == 0 and "MFU cannot be computed" in console.stdout


def test_a_warning_is_one_line_of_the_command(tmp_path: Path) -> None:
    """What goodtrace warns of while a command reads (here a torn chunk of the segment cache) is
    one line of the command's, ``goodtrace report: warning: ...``, not Python's warning form
    (a module's path and line, then its source line); the report is the one before."""
    from goodtrace.read.environment import run_cache_dir
    from helpers.many_ranks import write_many_ranks

    run = write_many_ranks(tmp_path / "run", ranks=2)
    first = goodtrace("report", str(run), "--json")
    assert first.returncode == 0 and first.stderr == "", first.stderr
    cache = Path(run_cache_dir(str(run), "segments"))
    # the step table of the chunk of closed files (chunk names are random: the first by name
    # may be a table the next report does not read)
    chunks = [index.stem for index in cache.glob("*.json") if json.loads(index.read_text())["kind"] == "model"]
    assert len(chunks) == 1, "the first report kept no chunk of closed files"
    steps = cache / f"{chunks[0]}-seg_steps.parquet"
    steps.write_bytes(steps.read_bytes()[:100])  # torn
    done = goodtrace("report", str(run), "--json")
    assert done.returncode == 0 and done.stdout == first.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"goodtrace report: warning: the segment cache in {cache} "
                               "has a chunk that cannot be read ("), lines[0]
    assert lines[0].endswith("; ignored (the files are read again and it is rebuilt)"), lines[0]
