"""``goodtrace watch RUN`` on real runs, as a subprocess: the goodput it shows is the report's,
it follows a running job until the job finishes, and it names a hung rank."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ENV = os.environ | {"COLUMNS": "200"}

JOB = textwrap.dedent('''
    import sys, threading, time
    import goodtrace as gt
    gt.init(sys.argv[1], flush_interval_s=0.1)
    gt.detect_hangs(floor_s=0.3, check_interval_s=0.02)
    for step in range(int(sys.argv[2])):
        with gt.step(step) as s:
            with gt.span("data"):
                time.sleep(0.005)
            with gt.span("forward"):
                time.sleep(0.02)
            s.complete_on(1.0)
        if step % 20 == 19:
            with gt.span("checkpoint"):
                time.sleep(0.05)
        if step == int(sys.argv[3]):
            def block_forever():
                threading.Event().wait()
            block_forever()
    time.sleep(0.1)
    gt.finish()
''')


def _job(tmp_path: Path, steps: int, hang_at: int = -1) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(steps), str(hang_at)], text=True)


def _watch(run_dir: Path, *options: str, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-m", "goodtrace", "watch", str(run_dir), *options],
                          capture_output=True, text=True, timeout=timeout, env=ENV)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _goodput(text: str) -> float:
    found = re.search(r"goodput (\d+\.\d)%", text)
    assert found is not None, text
    return float(found.group(1))


def test_it_follows_a_running_job_to_its_end_and_shows_the_reports_goodput(tmp_path: Path) -> None:
    job = _job(tmp_path, 80)
    run_dir = tmp_path / "run"
    deadline = time.monotonic() + 60
    while not list(run_dir.glob("rank-*/*.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.05)
    watched = _watch(run_dir, "--interval", "0.2")  # ends by itself when the job finished
    assert job.wait(timeout=60) == 0
    assert "finished (finish)" in watched
    report = subprocess.run([sys.executable, "-m", "goodtrace", "report", str(run_dir), "--json"],
                            capture_output=True, text=True, timeout=120)
    goodput = json.loads(report.stdout)["goodput"]
    final = _watch(run_dir, "--once")
    assert abs(_goodput(final) - 100 * goodput) <= 0.1 + 1e-9, (final, goodput)
    assert "Worst recent steps" in final


def test_it_names_a_hung_rank(tmp_path: Path) -> None:
    job = _job(tmp_path, 80, hang_at=30)
    run_dir = tmp_path / "run"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                b'"name":"hang"' in f.read_bytes() for f in run_dir.glob("rank-*/*.jsonl")):
            time.sleep(0.1)
        shown = _watch(run_dir, "--once")
    finally:
        job.kill()
        job.wait(timeout=30)
    assert re.search(r"hang: rank 0 \(host .*\) stuck in block_forever \(job\.py:\d+\), after 'forward', at step 30", shown), shown
    assert re.search(r"0 +│ .* +│ +30 │ .* │ hung", shown), shown  # it stopped after step 30
