"""``goodtrace watch RUN`` on real runs, as a subprocess: the goodput it shows is the report's,
it follows a running job until the job finishes, and it names a hung rank; a long run opens
from its ranks' tails and shows what reading it whole shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from goodtrace.analysis.watching import RECENT_STEPS, WatchState
from goodtrace.cli.analysed import alive_here
from goodtrace.cli.commands.watch import View
from goodtrace.read.follow import RunFollower
from goodtrace.renderers.watch import render_watch
from helpers.cli import goodtrace

pytestmark = pytest.mark.processes

ENV = {"COLUMNS": "200"}  # over helpers.cli.DEFAULT_ENV

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


def _job(tmp_path: Path, steps: int, hang_at: int = -1, rank: int = 0) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(steps), str(hang_at)], text=True,
                            env=os.environ | {"RANK": str(rank), "WORLD_SIZE": "2"})


def _watch(run_dir: Path, *options: str) -> str:
    done = goodtrace("watch", str(run_dir), *options, env=ENV)
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
    report = goodtrace("report", str(run_dir), "--json")
    goodput = json.loads(report.stdout)["goodput"]
    final = _watch(run_dir, "--once")
    assert abs(_goodput(final) - 100 * goodput) <= 0.1 + 1e-9, (final, goodput)
    assert "Worst recent steps" in final


def test_it_names_a_hung_rank(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _long_job(run_dir, 0, 40)  # rank 0 ran to its end
    job = _job(tmp_path, 80, hang_at=30, rank=1)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                b'"name":"hang"' in f.read_bytes() for f in run_dir.glob("rank-*/*.jsonl")):
            time.sleep(0.1)
        shown = _watch(run_dir, "--once")
    finally:
        job.kill()
        job.wait(timeout=30)
    assert re.search(r"hang: rank 1 \(host .*\) stuck in block_forever \(job\.py:\d+\), after 'forward', at step 30", shown), shown
    assert re.search(r"1 +│ .* +│ +30 │ .* │ hung", shown), shown  # it stopped after step 30
    # found from rank 1's last five steps too (rank 0's records are read whole, for its goodput)
    whole, _ = _read_whole(run_dir)
    frame = _frame(whole, run_dir)
    view = View(str(run_dir), tail_steps=5)
    assert "hang: rank 1" in frame and _frame(_read_view(view), run_dir) == frame
    assert all(view.follower.offsets[p] > 0 for p in map(str, run_dir.glob("rank-00001/*.jsonl")))  # a tail


LONG_JOB = textwrap.dedent('''
    import sys
    import goodtrace as gt
    from goodtrace.testing import FakeClock
    run, steps = sys.argv[1], int(sys.argv[2])
    clock = FakeClock()
    gt.init(run, clock=clock, segment_bytes=8192)
    for k in range(steps):
        with gt.step(k) as s:
            with gt.span("data"):
                clock.advance(0.01)
            with gt.span("forward"):  # a slower step now and then, and 40% slower at the end
                clock.advance(0.1 + (0.05 if k % 17 == 0 else 0) + (0.04 if k >= steps - 600 else 0))
            s.complete_on(1.0)
        gt.metric("loss", 1.0 / (k + 1), step=k)
        if k % 50 == 49:
            with gt.span("checkpoint"):
                clock.advance(0.3)
        if k % 100 == 99:
            gt.flush()  # a new segment (8 KiB) every 100 steps
    gt.finish()
''')


def _long_job(run_dir: Path, rank: int, steps: int) -> None:
    """One process of ``rank`` runs ``steps`` steps of LONG_JOB to its end (a fake clock: fast)."""
    subprocess.run([sys.executable, "-c", LONG_JOB, str(run_dir), str(steps)], check=True, timeout=120,
                   env=os.environ | {"RANK": str(rank), "WORLD_SIZE": "3"})


def _read_whole(run_dir: Path) -> tuple[WatchState, RunFollower]:
    """The view's state with every record of the run read, in one poll (what watch did first)."""
    follower, state = RunFollower(str(run_dir)), WatchState()
    state.alive = alive_here  # as the view's
    for _, header, record in follower.poll():
        state.add(header, record)
    return state, follower


def _read_view(view: View) -> WatchState:
    view.look()
    while view.follower.pending:
        view.look()
    return view.state


def _frame(state: WatchState, run_dir: Path) -> str:
    console = Console(record=True, width=200, file=open(os.devnull, "w"))  # noqa: SIM115
    last = max(s.last_seen_wall for s in state.sessions.values())
    console.print(render_watch(state, last + 10**9, str(run_dir)))
    console.file.close()
    return console.export_text()


def test_a_long_run_opens_from_its_tails_and_shows_what_reading_it_whole_shows(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for rank, steps in ((0, 2_500), (1, 300), (1, 2_500), (2, 20_000)):  # rank 1 restarted once
        _long_job(run_dir, rank, steps)
    whole, full = _read_whole(run_dir)
    view = View(str(run_dir), poll_bytes=64 * 1024)  # rank 0's history read 64 KiB a look
    view.look(history_s=None)  # one part of the other ranks' step times before their tails
    first = _frame(view.state, run_dir)  # a rank's past read so far is not shown as its present, nor alarmed on
    assert view.follower.pending and "reading the lowest rank's records of this attempt" in first
    assert re.search(r"0 +│ .* +│ +— │ +— │ reading its records: \d+%", first), first
    # the other ranks' present comes first (their last steps); their slowdowns wait for their step times
    assert re.search(r"1 +│ .* +│ +2499 │ .* │ finished", first) and re.search(r"2 +│ .* +│ +19999 │ .* │ finished", first)
    assert re.search(r"slowdowns: reading the last 2,000 step times of 2 rank\(s\): \d+%", first), first
    assert "Worst recent steps" not in first and "slowdown: " not in first
    looks = 1
    while view.follower.pending:
        view.look()
        looks += 1
    assert looks > 10
    frame = _frame(view.state, run_dir)
    assert frame == _frame(whole, run_dir)
    assert "goodput" in frame and "slowdown: rank 2" in frame and "Worst recent steps" in frame
    assert [r.last_step for r in view.state.ranks()] == [2_499, 2_499, 19_999]
    assert all(len(r.step_times) == RECENT_STEPS for r in view.state.ranks())
    # what it read: rank 0 whole, the others' last RECENT_STEPS steps (twice: found, then decoded), not
    # rank 1's first process, not rank 2's first 18,000 steps (70% of the run's bytes)
    assert view.follower.bytes_read < 0.6 * full.bytes_read, (view.follower.bytes_read, full.bytes_read)


def test_a_run_that_grows_while_its_history_is_read_is_followed(tmp_path: Path) -> None:
    """Processes that start while the view still reads rank 0's history are read from their start
    (a restart of a tailed rank, a rank that was not there): the view ends where a whole read is."""
    run_dir = tmp_path / "run"
    for rank in (0, 1):
        _long_job(run_dir, rank, 3_000)
    view = View(str(run_dir), poll_bytes=64 * 1024)
    view.look()
    assert view.follower.pending
    _long_job(run_dir, 1, 500)  # rank 1 restarted
    _long_job(run_dir, 2, 100)  # a rank that was not there
    while view.follower.pending:
        view.look()
    assert [(r.rank, r.last_step) for r in view.state.ranks()] == [(0, 2_999), (1, 499), (2, 99)]
    assert _frame(view.state, run_dir) == _frame(_read_whole(run_dir)[0], run_dir)


def test_what_it_could_not_read_is_said(tmp_path: Path) -> None:
    """A line that is not JSON and a file whose header is not one: the frame says how many
    problems there were and the latest, ``--once`` names each on stderr, and the rest is shown."""
    run_dir = tmp_path / "run"
    _long_job(run_dir, 0, 30)
    _long_job(run_dir, 1, 30)
    (last,) = sorted((run_dir / "rank-00001").glob("*.jsonl"))[-1:]
    with last.open("ab") as handle:
        handle.write(b'{"kind":"step",\n')  # cut short, then more records: not the torn last line
        handle.write(b'{"kind":"heartbeat","mono":1,"wall":1,"dropped":0}\n')
    (run_dir / "rank-00001" / "zz-not-a-header.00000.jsonl").write_text('{"kind":"span","t0":1,"t1":2}\n')
    done = goodtrace("watch", str(run_dir), "--once", env=ENV)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"2 problem\(s\) reading the run's files; the latest: rank-00001/.* is not valid JSON", done.stdout)
    assert re.search(r"(?m)^goodtrace watch: warning: rank-00001/.*\.jsonl: line \d+ is not valid JSON; skipped", done.stderr), done.stderr
    assert "goodtrace watch: warning: rank-00001/zz-not-a-header.00000.jsonl: does not start with a header record" in done.stderr
    assert re.search(r"1 +│ .* +│ +29 │ .* │ finished", done.stdout), done.stdout


def test_a_killed_rank_is_lost_and_the_table_puts_it_first(tmp_path: Path) -> None:
    """A rank killed hard (no finish record) is ``lost``, by the report's rule: at once when its
    process is gone from this host, else once its heartbeats are 5 flush intervals (and 10 s)
    older than now; with more ranks than rows, the table shows those that most need a look and
    counts the others."""
    run_dir = tmp_path / "run"
    _long_job(run_dir, 0, 40)
    _long_job(run_dir, 2, 40)
    job = _job(tmp_path, 100_000, rank=1)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(
                f.read_bytes().count(b'"kind":"sync"') for f in run_dir.glob("rank-00001/*.jsonl")) < 5:
            time.sleep(0.05)
    finally:
        job.kill()
        job.wait(timeout=30)
    shown = _watch(run_dir, "--once", "--rows", "1")
    assert "Ranks: the 1 of 3 that most need a look" in shown, shown
    assert re.search(r"^ +1 │ .* │ +\d+ │ .* │ lost \(no heartbeat since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", shown,
                     re.MULTILINE), shown
    assert "and 2 more: 2 finished (finish)" not in shown and "and 2 more: 2 finished" in shown, shown
    # a rank of another host cannot be probed: lost once its last sign of life is stale
    state, _ = _read_whole(run_dir)
    state.alive = None
    killed = next(s for s in state.ranks() if s.rank == 1)
    assert state.status(killed, killed.last_seen_wall + 9 * 10**9).text == "running"
    assert state.status(killed, killed.last_seen_wall + 11 * 10**9).text.startswith("lost (no heartbeat since ")
    shown, others = state.rank_rows(killed.last_seen_wall + 11 * 10**9, 3)
    assert [(s.rank, status and status.text) for s, status in shown] == [
        (0, "finished (finish)"), (1, state.status(killed, killed.last_seen_wall + 11 * 10**9).text),
        (2, "finished (finish)")] and others == []  # all of them fit: by rank


def test_a_history_it_cannot_read_is_said_and_left_out(tmp_path: Path) -> None:
    """A file of a rank's step history (before its tail) that is gone when the view reads it: the
    problem is named, the rank's present is shown, and the view does not wait for it forever."""
    run_dir = tmp_path / "run"
    _long_job(run_dir, 0, 50)
    _long_job(run_dir, 1, 3_000)  # a segment every 100 steps: its history spans 20 files
    view = View(str(run_dir))
    files = sorted((run_dir / "rank-00001").glob("*.jsonl"))
    files[-10].unlink()  # in the history: between its 2,001st-last and 64th-last step completions
    looks = 0
    while looks == 0 or view.follower.pending:
        view.look()
        looks += 1
        assert looks < 100
    assert any("its step times before the tail cannot be read" in p for p in view.state.problems), view.state.problems
    rank1 = next(r for r in view.state.ranks() if r.rank == 1)
    assert rank1.last_step == 2_999 and rank1.finished and not view.state.history
    assert len(rank1.step_times) < RECENT_STEPS  # what it could read: the tail's, and the history before the gap
