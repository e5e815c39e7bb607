"""Run a loop shape of ``helpers/loops.py`` in a real child process on the simulated device and
check ``goodtrace report --json`` against the device's log (see ``test_loop_shapes``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.cli import goodtrace

LOOPS = Path(__file__).resolve().parent / "loops.py"
MS = 1_000_000


def run_shape(shape: str, tmp: Path, attempt: int = 0) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Run a loop shape in a child; (run dir, ground truth, report --json)."""
    run_dir, log = tmp / f"{shape}-{attempt}", tmp / f"{shape}-{attempt}.json"
    child = subprocess.run([sys.executable, str(LOOPS), shape, str(run_dir), str(log)],
                           capture_output=True, text=True, timeout=120)
    truth = json.loads(log.read_text())
    truth["returncode"], truth["stderr"] = child.returncode, child.stderr
    done = goodtrace("report", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    return run_dir, truth, json.loads(done.stdout)


def bound_ns(truth: dict[str, Any]) -> int:
    return int(truth["poll_ns"]) + int(truth["slack_ns"]) + 2 * MS


def retried(shape: str, tmp: Path, check: Any) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Run ``shape`` until ``check(truth, report)`` returns no misses (at most three runs)."""
    misses: list[str] = []
    for attempt in range(3):
        run_dir, truth, report = run_shape(shape, tmp, attempt)
        misses = check(truth, report)
        if not misses:
            return run_dir, truth, report
    raise AssertionError(f"{shape}: " + "; ".join(misses))


def buckets(report: dict[str, Any]) -> dict[str, int]:
    return {k: v["ns"] for k, v in report["partition"]["buckets"].items() if v["ns"]}


def done_ns(truth: dict[str, Any]) -> list[int]:
    return [k["done_ns"] for k in truth["device"]]
