"""``goodtrace compact`` killed halfway: its work files stay inside the run's own compact
directory (never in the system's temporary directory), and the next compaction removes them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodtrace.read.compact import COMPACT_DIR, WORK_PREFIX
from helpers.builders import Proc
from helpers.cli import goodtrace


def _big_run(run: Path, ranks: int = 2, steps: int = 40_000) -> None:
    for rank in range(ranks):
        proc = Proc(run, rank=rank, world=ranks)
        t = proc.loop(range(steps), 1.0, step_s=0.01, data_s=0.001)
        proc.finish(t + 0.1)
        proc.write()


@pytest.mark.processes
def test_a_killed_compaction_leaves_its_files_in_the_run_and_the_next_one_removes_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _big_run(run)
    out = run / COMPACT_DIR
    child = subprocess.Popen([sys.executable, "-m", "goodtrace", "compact", str(run)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and child.poll() is None:
            if out.is_dir() and any(n.startswith(WORK_PREFIX) for n in os.listdir(out)):
                break
            time.sleep(0.01)
        assert child.poll() is None, "compaction ended before it could be killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    left = [n for n in os.listdir(out) if n.startswith(WORK_PREFIX)]
    assert left, "the killed compaction worked (DuckDB's files) in the run's compact directory"
    done = goodtrace("compact", str(run))
    assert done.returncode == 0, done.stderr
    remaining = os.listdir(out)
    assert not [n for n in remaining if n.startswith(WORK_PREFIX) or n.endswith(".partial")], remaining
    report = goodtrace("report", str(run), "--json", "--no-steps")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["form"] == "parquet"


def test_a_segment_deleted_while_the_report_reads_it_is_named(tmp_path: Path) -> None:
    """The loader's own progress says when a batch of files has been read: the test deletes a
    segment of the next batch then, as someone cleaning up a run directory would."""
    from goodtrace.read.load import load_run

    run = tmp_path / "run"
    for rank in range(40):  # more files than one batch of the loader (32)
        proc = Proc(run, rank=rank, world=40)
        proc.finish(proc.loop(range(20), 1.0, step_s=0.01) + 0.1)
        proc.write()
    victim = sorted(run.glob("rank-00039/*.jsonl"))[0]
    seen: list[str] = []

    def progress(what: str, done: int, total: int) -> None:
        seen.append(what)
        if what == "reading rank files" and victim.exists():
            victim.unlink()

    loaded = load_run(run, progress=progress)
    assert "reading rank files" in seen and not victim.exists()
    named = [w for w in loaded.warnings if "rank-00039" in w and "deleted while the report read it" in w]
    assert named, loaded.warnings
