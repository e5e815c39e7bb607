"""A session without a finish record reads ``running`` while its process is alive on this host.
Containers restart with the same host name and hand out small pids again, so a dead attempt's
pid may belong to another process now: the probe compares that process's start time (the OS's)
with the session's (its header's), and a pid held by a process started later reads as gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import goodtrace as gt
from goodtrace.analysis import analyze
from goodtrace.cli.analysed import alive_here
from goodtrace.read.load import load_run
from helpers.builders import WALL0, Proc


@pytest.mark.processes
def test_a_pid_reused_by_a_later_process_reads_as_gone(tmp_path: Path) -> None:
    # A real process now holds the pid the dead attempt recorded, but it started later: the
    # attempt's process started a minute before it (its header), heartbeats until moments ago.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)  # a live process, started after the recorded one
        now = time.time_ns()
        start = (now - 60 * 10**9 - WALL0) / 1e9  # seconds on the builder's job clock
        p = Proc(tmp_path, host=socket.gethostname(), start=start)
        p.header["pid"] = other.pid
        p.step(0, start + 1, start + 2).sync(0, start + 2).heartbeat(start + 59.5)
        p.write()
        assert alive_here(socket.gethostname(), other.pid) is True  # the pid alone says alive
        (attempt,) = analyze(load_run(tmp_path), now_wall_ns=now, alive=alive_here).attempts
        assert attempt.ended == "lost"
    finally:
        other.kill()
        other.wait()


def test_the_recording_process_itself_reads_running(tmp_path: Path) -> None:
    """The real recorder's header names this process and its OS start time: the same process."""
    gt.init(tmp_path, rank=0, world_size=1)
    try:
        with gt.step(0) as s:
            s.complete_on(1.0)
        assert gt.flush(10)
        (attempt,) = analyze(load_run(tmp_path), now_wall_ns=time.time_ns(), alive=alive_here).attempts
        assert attempt.ended == "running" and attempt.ending.detail == ""
        info = load_run(tmp_path).sessions[0]
        assert info.pid == os.getpid()
        assert alive_here(info.host, info.pid, info.start_wall) is True
    finally:
        gt.finish()
