"""``goodtrace demo`` in a reduced configuration, run through the CLI as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from goodtrace.read.sessions import read_run
from helpers.cli import goodtrace
from helpers.views import assert_views_agree

pytestmark = pytest.mark.processes

pytest.importorskip("torch")

STEPS, CRASH_AT, CHECKPOINT_EVERY, EVAL_EVERY = 10, 7, 4, 5


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    result = subprocess.run(
        [sys.executable, "-m", "goodtrace", "demo", "--ranks", "2", "--steps", str(STEPS), "--crash-at",
         str(CRASH_AT), "--checkpoint-every", str(CHECKPOINT_EVERY), "--eval-every", str(EVAL_EVERY),
         "--log-every", "2", "--workers", "1", "--out", str(run_dir)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, result.stdout


def test_demo_records_two_attempts_checkpoints_evals_and_redone_steps(demo_run: tuple[Path, str]) -> None:
    run_dir, stdout = demo_run
    run = read_run(run_dir)
    attempts = run.attempts()
    assert len(attempts) == 2
    assert all(sorted(s.rank for s in sessions) == [0, 1] for sessions in attempts)
    # attempt 0 ran up to the crash (the crashed rank may lose its last flush interval)
    first_steps = {r["step"] for s in attempts[0] if s.rank == 0 for r in s.of_kind("step")}
    second_steps = {r["step"] for s in attempts[1] if s.rank == 0 for r in s.of_kind("step")}
    assert max(first_steps) >= CRASH_AT
    assert min(second_steps) == CHECKPOINT_EVERY + 1 and max(second_steps) == STEPS
    assert set(range(CHECKPOINT_EVERY + 1, CRASH_AT + 1)) <= first_steps & second_steps  # re-done steps
    spans = [(s.attempt, r["cat"]) for s, r in run.records("span")]
    assert (0, "checkpoint_save") in spans and (0, "eval") in spans
    assert (1, "checkpoint_restore") in spans and (1, "checkpoint_save") in spans
    finishes = [s.finish for s in attempts[1]]
    assert all(f is not None and f["completed"] is True for f in finishes)
    # live lines on rank 0's console: one per log step, with the step time split and throughput
    live = [line for line in stdout.splitlines() if re.match(r"step \d+ \| ", line)]
    assert live and all("s/step" in line and "tok/s" in line for line in live)
    assert "rank 1 exited with code 17" in stdout and "attempt 1" in stdout


def _report_json(run_dir: Path) -> dict[str, Any]:
    result = goodtrace("report", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_demo_report_has_the_buckets_of_a_crash_and_a_restart(demo_run: tuple[Path, str]) -> None:
    run_dir, stdout = demo_run
    try:
        import goodtrace.cli.commands.report  # noqa: F401
    except ImportError:
        pytest.skip("needs 'goodtrace report --json' (goodtrace.cli.commands.report) which is not installed")
    report = _report_json(run_dir)
    buckets = report["partition"]["buckets"]
    for name in ("wasted_progress", "disruption", "checkpoint_save", "eval"):
        assert buckets[name]["ns"] > 0, name
    assert 0.0 < report["goodput"] < 1.0
    assert sum(b["ns"] for b in buckets.values()) == pytest.approx(
        report["partition"]["total_s"] * 1e9, rel=1e-6)
    assert len(report["attempts"]) == 2
    assert f"Verdict: {report['verdict']['text']}; " in stdout  # under the goodput line, in words
    assert_views_agree(run_dir)  # --json, the HTML page's data and the trace: the same executions
    assert (run_dir / "report.txt").read_text().startswith("goodtrace report")
    assert (run_dir / "trace.json").exists()
    assert f"console report:  {run_dir / 'report.txt'}" in stdout
