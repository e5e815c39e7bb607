"""Crash safety, hung storage, forks, rotation, object stores: records survive or are counted."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import goodtrace as gt
from goodtrace.read.sessions import read_run

CHILD_RECORDS = textwrap.dedent(
    """
    import sys, time
    import goodtrace as gt
    gt.init(sys.argv[1], flush_interval_s=0.05)
    i = 0
    while True:
        with gt.span("work", attrs={"i": i}):
            pass
        i += 1
        if i % 500 == 0:
            gt.flush(timeout=10)
            print(i, flush=True)  # everything up to i is on disk now
    """
)


@pytest.mark.processes
def test_sigkill_mid_run_keeps_every_flushed_record(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_RECORDS, run_dir], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    flushed = 0
    for line in child.stdout:
        flushed = int(line)
        if flushed >= 3000:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    run = read_run(run_dir)
    (session,) = run.sessions
    indices = [r["attrs"]["i"] for r in session.of_kind("span") if r["name"] == "work"]
    assert set(range(flushed)) <= set(indices)  # nothing flushed before the kill is lost
    assert indices == sorted(indices) and len(indices) == len(set(indices))
    assert session.finish is None  # killed: no finish record, last sign of life instead
    assert session.of_kind("heartbeat")


def test_torn_last_line_is_ignored_not_an_error(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    gt.init(run_dir)
    for k in range(3):
        with gt.step(k) as s:
            s.complete_on(1.0)
    gt.finish()
    (segment,) = glob.glob(f"{run_dir}/rank-*/*.jsonl")
    with open(segment, "ab") as handle:
        handle.write(b'{"kind":"span","name":"torn","cat":"comp')  # killed mid-write
    run = read_run(run_dir)
    assert run.problems == []
    assert run.sessions[0].torn_lines == 1
    assert len(run.sessions[0].of_kind("sync")) == 3


def test_corrupt_line_in_the_middle_is_reported(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    gt.init(run_dir)
    gt.event("before")
    gt.flush()
    (segment,) = glob.glob(f"{run_dir}/rank-*/*.jsonl")
    with open(segment, "ab") as handle:
        handle.write(b"\x00garbage\n")
    gt.event("after")
    gt.finish()
    run = read_run(run_dir)
    assert len(run.problems) == 1 and "not valid JSON" in run.problems[0]
    assert [r["name"] for r in run.sessions[0].of_kind("event")] == ["before", "after"]


class HangingFS(MemoryFileSystem):
    """An object store whose uploads block until ``release`` is set (or forever)."""

    protocol = "hangtest"
    release = threading.Event()
    attempts = 0

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        type(self).attempts += 1
        self.release.wait()
        super().pipe_file(path, value, **kwargs)


@pytest.fixture
def hanging_fs() -> Any:
    fsspec.register_implementation("hangtest", HangingFS, clobber=True)
    HangingFS.release = threading.Event()
    HangingFS.attempts = 0
    yield HangingFS
    HangingFS.release.set()


@pytest.mark.slow
def test_hung_storage_never_blocks_the_loop_and_counts_drops(hanging_fs: Any) -> None:
    limit = 256 * 1024
    gt.init(
        "hangtest://hung-run", flush_interval_s=0.02, remote_upload_interval_s=0.02,
        max_pending_bytes=limit, finish_timeout_s=0.5,
    )
    rec = gt.recorder()
    tracemalloc.start()
    started = time.monotonic()
    peak_pending = 0
    for k in range(60):
        with gt.step(k) as s:
            for _ in range(400):
                with gt.span("fwd"):
                    pass
            s.complete_on(0.0)
        time.sleep(0.005)
        peak_pending = max(peak_pending, rec.writer._io_pending_bytes)  # type: ignore[union-attr]
    _, peak_traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert hanging_fs.attempts >= 1  # the upload really is stuck
    assert rec.dropped_records > 0
    assert peak_pending <= limit  # bounded: queued bytes never exceed the limit
    assert peak_traced < 64 * 1024 * 1024
    with pytest.warns(gt.GoodtraceWarning, match="did not accept|dropping"):
        ok = gt.finish()
    assert ok is False  # finish gave up after finish_timeout_s instead of hanging
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_storage_that_recovers_gets_the_drop_count(hanging_fs: Any) -> None:
    gt.init(
        "hangtest://recovering-run", flush_interval_s=0.02, remote_upload_interval_s=0.02,
        max_pending_bytes=64 * 1024, finish_timeout_s=10,
    )
    rec = gt.recorder()
    with pytest.warns(gt.GoodtraceWarning, match="dropping"):
        for k in range(30):
            with gt.step(k):
                for _ in range(300):
                    with gt.span("fwd"):
                        pass
            time.sleep(0.01)
    assert rec.dropped_records > 0
    hanging_fs.release.set()  # storage comes back
    with pytest.warns(gt.GoodtraceWarning, match="records did not reach storage") as caught:
        assert gt.finish() is False  # something was dropped: finish says so, and how many
    dropped = rec.dropped_records
    assert f" {dropped} records did not reach storage" in str(caught[-1].message)
    run = read_run("hangtest://recovering-run")
    beats = [r for r in run.sessions[0].records if r["kind"] == "heartbeat"]
    assert beats[-1]["dropped"] == dropped  # the count reached storage once it could
    assert run.sessions[0].finish is not None


def test_memory_url_round_trip_and_rotation() -> None:
    url = "memory://goodtrace-tests/rotating"
    gt.init(url, remote_segment_bytes=4096, remote_upload_interval_s=0.05, flush_interval_s=0.02)
    for k in range(50):
        with gt.step(k) as s:
            with gt.span("fwd", attrs={"k": k}):
                pass
            s.complete_on(float(k))
        if k % 10 == 0:
            time.sleep(0.03)
    assert gt.finish() is True
    run = read_run(url)
    (session,) = run.sessions
    assert session.segments > 1
    assert [r["attrs"]["k"] for r in session.of_kind("span") if r["name"] == "fwd"] == list(range(50))


def test_local_rotation_keeps_order_and_a_header_per_segment(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    gt.init(run_dir, segment_bytes=4096, flush_interval_s=0.01)
    for k in range(200):
        with gt.span("fwd", attrs={"k": k}):
            pass
        if k % 20 == 0:
            gt.flush()
    gt.finish()
    segments = sorted(glob.glob(f"{run_dir}/rank-*/*.jsonl"))
    assert len(segments) > 2
    for path in segments:
        with open(path) as handle:
            assert handle.readline().startswith('{"kind":"header"')
    run = read_run(run_dir)
    assert [r["attrs"]["k"] for r in run.sessions[0].of_kind("span")] == list(range(200))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_neither_writes_nor_deadlocks(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    gt.init(run_dir, flush_interval_s=0.001)  # the writer thread is busy: locks often held
    pids = []
    for _round in range(20):
        for _ in range(200):
            with gt.span("parent"):
                pass
        pid = os.fork()
        if pid == 0:  # child, like a DataLoader worker
            try:
                for _ in range(100):
                    with gt.span("child"):
                        pass
                gt.event("child-event")
                gt.flush(timeout=1)
            finally:
                os._exit(0)
        pids.append(pid)
    deadline = time.monotonic() + 60
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                break
            assert time.monotonic() < deadline, "a forked child deadlocked"
            time.sleep(0.01)
    gt.finish()
    run = read_run(run_dir)
    assert len(run.sessions) == 1
    names = {r["name"] for r in run.sessions[0].records if r["kind"] in ("span", "event")}
    assert "child" not in names and "child-event" not in names
    assert sum(1 for r in run.sessions[0].of_kind("span") if r["name"] == "parent") == 20 * 200


@pytest.mark.processes
def test_sigterm_records_preemption_and_flushes(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    code = textwrap.dedent(
        """
        import sys, time
        import goodtrace as gt
        gt.init(sys.argv[1], flush_interval_s=60)  # nothing flushed by the timer
        for k in range(5):
            with gt.step(k) as s:
                s.complete_on(1.0)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code, run_dir], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM  # it still dies of the signal
    child.stdout.close()
    (session,) = read_run(run_dir).sessions
    assert [r["step"] for r in session.of_kind("sync")] == [0, 1, 2, 3, 4]
    assert [r["name"] for r in session.of_kind("event")] == ["preempted"]
    assert session.finish is not None
    assert (session.finish["completed"], session.finish["reason"]) == (False, "signal")


@pytest.mark.parametrize("where", ["main", "thread"])
@pytest.mark.processes
def test_sigterm_during_finish_waits_for_that_finish(tmp_path: Any, where: str) -> None:
    """SIGTERM while finish() runs (a slow finish listener holds it open), in the main thread
    (the handler interrupts it: the signal is delivered again once it is done) or in another
    thread (the handler waits for it, bounded): the finish record and every step are on disk,
    and the process still dies of the signal."""
    run_dir = str(tmp_path / "run")
    code = textwrap.dedent(
        """
        import signal, sys, threading, time
        import goodtrace as gt
        rec = gt.init(sys.argv[1], flush_interval_s=60)
        for k in range(2000):
            with gt.step(k):
                with gt.span("fwd"):
                    pass
        rec.finish_listeners.append(lambda completed, reason: (print("finishing", flush=True), time.sleep(1.0)))
        if sys.argv[2] == "main":
            gt.finish()
        else:
            def finish():  # this program's own thread leaves SIGTERM to the main thread, as goodtrace's do
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                gt.finish()
            threading.Thread(target=finish).start()
        time.sleep(30)
        print("survived", flush=True)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code, run_dir, where], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "finishing"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == -signal.SIGTERM  # it dies of the signal, after the finish
    assert child.stdout.read() == ""
    child.stdout.close()
    (session,) = read_run(run_dir).sessions
    assert session.finish is not None and session.finish["reason"] == "finish"
    assert [r["step"] for r in session.of_kind("step")] == list(range(2000))
    assert [r["name"] for r in session.of_kind("event")] == []  # not a second ending


@pytest.mark.processes
def test_goodtrace_s_threads_leave_the_program_s_signals_to_it(tmp_path: Any) -> None:
    """Every thread goodtrace starts (the writer's, readiness, hang watchdog, a sink's) blocks
    SIGTERM and SIGINT, so the kernel hands a preemption to the program's main thread: a signal
    that lands on another thread waits until the main thread next runs Python code."""
    code = textwrap.dedent(
        """
        import os, sys, threading, time
        import goodtrace as gt
        class Quiet:
            name, ranks = "quiet", "all"
            def open(self, run): pass
            def write(self, line): pass
            def close(self, finished): pass
        gt.init(sys.argv[1], flush_interval_s=0.05, sinks=[Quiet()])
        gt.detect_hangs()
        for k in range(50):
            with gt.step(k):
                with gt.span("fwd"):
                    pass
        time.sleep(0.3)
        me = threading.get_native_id()
        for tid in sorted(os.listdir("/proc/self/task")):
            with open(f"/proc/self/task/{tid}/status") as status:
                blocked = int(next(l for l in status if l.startswith("SigBlk:")).split()[1], 16)
            print(tid == str(me), blocked >> 14 & 1, blocked >> 1 & 1)  # SIGTERM is 15, SIGINT 2
        gt.finish()
        """
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["True", "0", "0"] in rows  # the main thread takes them
    others = [row for row in rows if row[0] == "False"]
    assert len(others) >= 4, rows  # the native writer (or the flusher and I/O threads), readiness, hangs, the sink
    assert all(row[1:] == ["1", "1"] for row in others), rows
