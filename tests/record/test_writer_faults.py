"""The writer under stress and faults, in real processes: SIGKILL at high record rates and with
a system call per step, the buffer bound, a full disk, a deleted run directory, a process killed
in its first second. Timing bounds come from what each run measured (its writer's own chunk
times, the machine's sleep overshoot), never from a fixed number of milliseconds."""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.read.segments import list_segments
from goodtrace.read.sessions import read_run
from goodtrace.record import fastpath
from helpers.children import ReportingChild
from helpers.loops import oversleep

FLUSH_S = 0.5

# A loop recording `rate` records/s (a step and 19 spans per step), optionally with a 1-byte
# write per step (the system call that starved the old writer). Every 50 ms it prints the
# longest chunk its writer has needed so far (encode + storage call), for the parent's bound.
RATE_CHILD = textwrap.dedent(
    """
    import mmap, os, sys, time
    import goodtrace as gt
    run_dir, rate, per_step, flush = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    syscall = per_step != "-"
    with open(run_dir + ".progress", "w+b") as file:  # the steps it has ended, read after the kill
        file.write(bytes(8))
        file.flush()
        progress = mmap.mmap(file.fileno(), 8)
    rec = gt.init(run_dir, flush_interval_s=flush)
    stats = rec.writer.stats
    fd = os.open(os.devnull, os.O_WRONLY)
    if per_step == "f":  # an fsync per step: a write and a flush to the disk
        fd = os.open(os.path.join(os.path.dirname(run_dir), "fsynced"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    clock = time.perf_counter_ns
    span = gt.span
    start = clock()
    next_report = start
    n = step = 0
    while True:
        with gt.step(step):
            for _ in range(19):
                with span("fwd"):
                    pass
        n += 20
        step += 1
        progress[:8] = step.to_bytes(8, "little")  # steps 0 .. step - 1 have ended: their records appended
        if syscall:
            os.write(fd, b"x")
            if per_step == "f":
                os.fsync(fd)
        now = clock()
        if now >= next_report:
            next_report = now + 50_000_000
            print(f"{stats.max_chunk_seconds():.6f} {n}", flush=True)
        target = start + n * 1e9 / rate
        if target - now > 1_000_000:
            time.sleep((target - now) / 1e9)
        else:
            while clock() < target:
                pass
    """
)


def _longest_chunk(reports: list[str]) -> float:
    """The longest chunk the child's writer has needed so far (its reports: seconds, records)."""
    return max((float(line.split()[0]) for line in list(reports) if line.strip()), default=0.0)


def newest_step(run_dir: str) -> int:
    """The number of the newest complete step line (only the last segment's tail), -1 for none."""
    paths = sorted(glob.glob(f"{run_dir}/rank-*/*.jsonl"))
    assert paths, "no segment was written"
    with open(paths[-1], "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - (1 << 20)))
        tail = handle.read()
    newest = -1
    for line in tail.split(b"\n")[1:-1]:  # first may be cut by the seek, last may be torn
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("kind") == "step" and isinstance(record.get("step"), int):
                newest = max(newest, record["step"])
    return newest


def heartbeat_monos(run_dir: str) -> list[int]:
    """The monotonic times of every heartbeat of the run, in order (a byte scan, no JSON for the
    other lines: the 500 k runs write ~150 MB)."""
    monos = []
    for path in sorted(glob.glob(f"{run_dir}/rank-*/*.jsonl")):
        with open(path, "rb") as handle:
            for line in handle:
                if line.startswith(b'{"kind":"heartbeat"') and line.endswith(b"\n"):
                    monos.append(int(json.loads(line)["mono"]))
    return monos


@pytest.mark.parametrize(
    ("rate", "per_step"),
    [(2_500, "s"), (2_500, "f"), (140_000, "-"), (140_000, "s"), (500_000, "-")],
    ids=["2.5k-syscall", "2.5k-fsync", "140k", "140k-syscall", "500k"],
)
@pytest.mark.processes
def test_sigkill_loses_at_most_one_interval_plus_one_chunk(tmp_path: Path, rate: int, per_step: str) -> None:
    """Whatever the loop does per step (nothing, a system call, an fsync), the native writer
    loses nothing that reached its ring (recovered by the reader: every step the child had
    ended, as it counted them in a shared page), or the Python one, where it was not built, at
    most one interval plus one chunk; heartbeats keep their cadence either way."""
    rng = random.Random(rate + ord(per_step))
    for kill in range(2):
        run_dir = str(tmp_path / f"run-{kill}")
        # The child's interpreter start and import take seconds on a loaded machine: the run is
        # 3-5 flush intervals long from its first report (it is recording), not from the spawn.
        child = ReportingChild([sys.executable, "-c", RATE_CHILD, run_dir, str(rate), per_step, str(FLUSH_S)])
        reports = child.lines
        late = oversleep()
        recording = time.monotonic()
        hold = rng.uniform(3 * FLUSH_S, 5 * FLUSH_S)
        while time.monotonic() - recording < hold:  # the scheduler's lateness, sampled all along
            late = max(late, oversleep(5))
        # On a starved machine a chunk takes long: the run lasts at least two bounds (so that
        # two heartbeats are due even then), as measured so far, and at most a minute.
        while time.monotonic() - recording < min(60.0, 2 * (FLUSH_S + 2 * _longest_chunk(reports) + 2 * late)):
            late = max(late, oversleep(5))
        child.kill()
        chunk_s = max(float(line.split()[0]) for line in reports)
        records = int(reports[-1].split()[1])
        ended = int.from_bytes(Path(run_dir + ".progress").read_bytes()[:8], "little")  # steps 0 .. ended - 1
        on_disk = newest_step(run_dir)
        ring = glob.glob(f"{run_dir}/rank-*/*.ring")
        problems: list[str] = []
        list_segments(run_dir, problems, in_place=True)  # compact's recovery of the dead process's ring
        # What was lost, in the recording's own time: the steps that had ended (their records
        # appended) and are not in the files, at the child's rate of 20 records a step. Counted
        # in steps, not from the kill's time: a child the scheduler (or an fsync) held off
        # appended nothing meanwhile, and lost nothing.
        lost_steps = ended - 1 - newest_step(run_dir)
        lost_s = lost_steps * 20 / rate
        print(f"rate {rate}/s per step {per_step}: {records} records, {ended} steps ended, lost {lost_steps} "
              f"({lost_s:.3f} s; {ended - 1 - on_disk} before the ring's recovery)")
        assert bool(ring) == (fastpath.native is not None)
        # With the ring in a file (the native writer), whatever reached the ring is recovered:
        # every step that ended. Without it (the Python writer), at most one interval plus one
        # chunk (twice the longest this writer needed: the last one may be slower than any it
        # reported), plus the scheduler's lateness and a GIL hand-over each way, all measured here.
        slack = 2 * late + 2 * sys.getswitchinterval()
        if ring:
            assert lost_steps <= 0, f"lost {lost_steps} ended steps at {rate}/s although the ring held them"
        else:
            bound = FLUSH_S + 2 * chunk_s + slack
            assert lost_s <= bound, f"lost {lost_s:.3f} s of records at {rate}/s (bound {bound:.3f} s)"
        assert not glob.glob(f"{run_dir}/rank-*/*.ring")
        bound = FLUSH_S + 2 * chunk_s + slack
        # Heartbeats on time whatever the producer does: no gap between two longer than the same bound.
        beats = heartbeat_monos(run_dir)
        assert len(beats) >= 2
        gap = max(b - a for a, b in itertools.pairwise(beats)) / 1e9
        assert gap <= bound, f"heartbeats {gap:.3f} s apart at {rate}/s (bound {bound:.3f} s)"


BOUND_CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import goodtrace as gt
    from goodtrace.record import spans
    run_dir, limit, appends = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rec = gt.init(run_dir, max_buffer_records=limit, flush_interval_s=0.01)
    held = rec.writer._flush_lock  # the flusher waits for it: the writer stalls completely
    held.acquire()
    peak = 0
    for i in range(appends):
        with gt.span("fwd", attrs={"i": i}):
            pass
        peak = max(peak, len(rec.buffer))
    dropped = rec.dropped_records
    held.release()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = gt.finish()
    print(json.dumps({"peak": peak, "dropped": dropped, "ok": ok, "impl": spans.IMPLEMENTATION,
                      "warnings": [str(w.message) for w in caught]}))
    """
)


@pytest.mark.parametrize("impl", ["c", "python"])
@pytest.mark.processes
def test_buffer_bound_holds_on_every_append_and_every_drop_is_counted(tmp_path: Path, impl: str) -> None:
    limit, appends = 1000, 5000
    # the Python writer, stalled through its flush lock (the native ring's bound: test_native_writer.py)
    env = {**os.environ, "GOODTRACE_PURE_PYTHON": "1" if impl == "python" else "0", "GOODTRACE_NATIVE_WRITER": "0"}
    out = subprocess.run(
        [sys.executable, "-c", BOUND_CHILD, str(tmp_path), str(limit), str(appends)],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    ).stdout
    result = json.loads(out.splitlines()[-1])
    if impl == "c" and result["impl"] != "c":
        pytest.skip("the C extension is not built here")
    assert result["impl"] == impl
    assert result["peak"] <= limit  # never more, at any append
    assert result["dropped"] == appends - limit  # each refused append counted, exactly
    assert result["ok"] is False
    assert any(f"{appends - limit} records did not reach storage" in w for w in result["warnings"])
    (session,) = read_run(str(tmp_path)).sessions
    kept = [r["attrs"]["i"] for r in session.of_kind("span") if r["name"] == "fwd"]
    assert kept == list(range(limit))  # the first `limit` were kept, in order
    assert max(r["dropped"] for r in session.of_kind("heartbeat")) == appends - limit


@pytest.mark.processes
def test_a_process_killed_in_its_first_second_leaves_its_session(tmp_path: Path) -> None:
    code = "import sys, goodtrace as gt; gt.init(sys.argv[1], flush_interval_s=60); print('up', flush=True); " \
           "import time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "up"
    child.send_signal(signal.SIGKILL)  # long before the first flush
    child.wait(timeout=30)
    child.stdout.close()
    (session,) = read_run(str(tmp_path)).sessions
    assert session.header["pid"] == child.pid
    assert session.finish is None


# ---------------------------------------------------------------------------- full disk


@contextlib.contextmanager
def small_tmpfs(size_kib: int) -> Iterator[str]:
    """A tmpfs of ``size_kib`` KiB mounted for this test (root only), unmounted after."""
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("mounting a small tmpfs for the full-disk test needs root")
    mountpoint = tempfile.mkdtemp(prefix="goodtrace-full-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", mountpoint],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        os.rmdir(mountpoint)
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", mountpoint], check=False)
        os.rmdir(mountpoint)


def _fill(path: str) -> None:
    """Fill the filesystem of ``path`` completely."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:  # the last partial page
                os.write(fd, b"\0")
    finally:
        os.close(fd)


def _check_segments(run_dir: str) -> int:
    """Every line of every segment is whole JSON (a torn *last* line is allowed) and each segment
    starts with its one header. Returns how many segments there are."""
    paths = sorted(glob.glob(f"{run_dir}/rank-*/*.jsonl"))
    for path in paths:
        with open(path, "rb") as handle:
            lines = handle.read().split(b"\n")
        assert lines[-1] == b"", f"{path} ends with a partial line"
        kinds = [json.loads(line)["kind"] for line in lines[:-1]]  # raises on any partial line
        assert kinds[0] == "header" and kinds.count("header") == 1, f"{path}: headers {kinds.count('header')}"
    return len(paths)


@pytest.mark.processes
def test_a_full_disk_never_leaves_a_partial_line_and_counts_what_it_lost() -> None:
    with small_tmpfs(2048) as mount:
        run_dir = os.path.join(mount, "run")
        filler = os.path.join(mount, "filler")
        with pytest.warns(gt.GoodtraceWarning):
            rec = gt.init(run_dir, flush_interval_s=0.02, finish_timeout_s=10)
            sent = 0
            for phase in range(3):
                if phase == 1:
                    _fill(filler)  # the disk fills up mid-run
                if phase == 2:
                    os.unlink(filler)  # space comes back
                for _ in range(40):
                    for _ in range(50):
                        with gt.span("fwd", attrs={"pad": "x" * 100, "n": sent}):
                            pass
                        sent += 1
                    time.sleep(0.005)
                gt.flush()
            dropped_during = rec.dropped_records
            ok = gt.finish()
        assert dropped_during > 0 and ok is False
        _check_segments(run_dir)
        (session,) = read_run(run_dir).sessions
        kept = [r["attrs"]["n"] for r in session.of_kind("span") if r["name"] == "fwd"]
        assert len(kept) + rec.dropped_records == sent  # every record written or counted
        assert kept[-1] == sent - 1  # recording went on once there was space again
        assert max(r["dropped"] for r in session.of_kind("heartbeat")) == rec.dropped_records


@pytest.mark.processes
def test_a_disk_full_from_the_start_writes_one_header_per_segment() -> None:
    with small_tmpfs(256) as mount:
        run_dir = os.path.join(mount, "run")
        os.makedirs(os.path.join(run_dir, "rank-00000"))
        filler = os.path.join(mount, "filler")
        _fill(filler)
        with pytest.warns(gt.GoodtraceWarning):
            rec = gt.init(run_dir, flush_interval_s=0.01, finish_timeout_s=10)
            for k in range(20):  # many flushes fail, each would have written a header before
                gt.event("while-full", k=k)
                time.sleep(0.02)
            os.unlink(filler)
            gt.event("after")
            ok = gt.finish()
        assert ok is False and rec.dropped_records >= 20
        assert _check_segments(run_dir) == 1
        (session,) = read_run(run_dir).sessions
        assert [r["name"] for r in session.of_kind("event")][-1:] == ["after"]


# ---------------------------------------------------------------------------- deleted run dir


@pytest.mark.processes
def test_a_deleted_run_directory_is_recreated_and_the_loss_counted(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    code = textwrap.dedent(
        """
        import json, shutil, sys, warnings
        import goodtrace as gt
        run_dir = sys.argv[1]
        rec = gt.init(run_dir, flush_interval_s=60, storage_check_interval_s=0)
        for k in range(10):
            gt.event("before", k=k)
        gt.flush()
        shutil.rmtree(run_dir)  # someone deletes the run directory mid-run
        for k in range(10):
            gt.event("after", k=k)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gt.flush()
            for k in range(10, 20):
                gt.event("after", k=k)
            ok = gt.finish()
        print(json.dumps({"ok": ok, "lost": rec.writer.lost_records, "dropped": rec.dropped_records,
                          "warnings": [str(w.message) for w in caught]}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code, run_dir], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["ok"] is False
    assert result["lost"] >= 10 and result["dropped"] == result["lost"]  # the 10 "before" went with the dir
    assert any("deleted" in w and "recreated" in w for w in result["warnings"])
    (session,) = read_run(run_dir).sessions  # the recreated directory: a new segment, with its header
    assert session.header["segment"] >= 1
    assert [r["attrs"]["k"] for r in session.of_kind("event") if r["name"] == "after"] == list(range(20))
    assert max(r["dropped"] for r in session.of_kind("heartbeat")) == result["lost"]


def test_writer_threads_are_daemons_and_close_never_joins_without_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastpath, "native", None)  # the Python writer's threads
    rec = gt.init(str(tmp_path))
    writer: Any = rec.writer  # type: ignore[union-attr]
    assert writer._flusher.daemon and writer._io.daemon
    gt.finish()
    shutil.rmtree(tmp_path)


DELETE_CHILD = textwrap.dedent(
    """
    import sys, time
    import goodtrace as gt
    run_dir, flush = sys.argv[1], float(sys.argv[2])
    rec = gt.init(run_dir, flush_interval_s=flush)  # default 64 MiB segments: no rotation comes to help
    print(type(rec.writer).__name__, flush=True)
    step = 0
    while True:
        with gt.step(step):
            with gt.span("fwd"):
                pass
        step += 1
        time.sleep(0.001)
    """
)


@pytest.mark.parametrize("writer", ["native", "python"])
@pytest.mark.processes
def test_a_deleted_run_directory_is_back_within_two_intervals(tmp_path: Path, writer: str) -> None:
    """The directory deleted under a running process is recreated, header first, within two
    flush intervals (plus this machine's measured scheduling lateness), not at finish()."""
    flush = 0.2
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "GOODTRACE_NATIVE_WRITER": "1" if writer == "native" else "0"}
    child = subprocess.Popen([sys.executable, "-c", DELETE_CHILD, run_dir, str(flush)], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout is not None
        chosen = child.stdout.readline().strip()
        if writer == "native" and chosen != "NativeWriter":
            pytest.skip("the native writer is not built here")
        time.sleep(3 * flush)
        late = oversleep()
        shutil.rmtree(run_dir)
        deleted = time.monotonic()
        back = None
        while time.monotonic() - deleted < 30:
            paths = glob.glob(f"{run_dir}/rank-*/*.jsonl")
            if paths and os.path.getsize(paths[0]) > 0:
                back = time.monotonic() - deleted
                break
            time.sleep(0.005)
        assert back is not None, "the run directory was never recreated"
        bound = 2 * flush + 2 * late + 0.01
        assert back <= bound, f"recreated after {back:.3f} s (bound {bound:.3f} s)"
        time.sleep(2 * flush)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    (session,) = read_run(run_dir).sessions
    assert session.header["segment"] >= 1  # a new segment, with its header
    assert session.of_kind("step")


def test_memory_error_in_the_last_hand_off_makes_finish_return_false_with_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No allocation failure can be produced on demand here (freed tuples leave room), so the
    Python writer's encoder is made to run out of memory for the last chunk: finish() returns
    False and says how many records did not make it, instead of raising."""
    from goodtrace.record.io.encoding import _Encoder

    class OutOfMemory(_Encoder):
        def encode_many(self, records: Any, out: Any, on_error: Any) -> int:
            raise MemoryError

    monkeypatch.setattr(fastpath, "native", None)
    rec: Any = gt.init(str(tmp_path), flush_interval_s=60)
    for k in range(100):
        with gt.step(k):
            pass
    rec.writer._encoder = OutOfMemory()
    with pytest.warns(gt.GoodtraceWarning, match="did not reach storage") as caught:
        assert gt.finish() is False
    assert rec.dropped_records >= 101  # the steps and the finish record, all counted
    assert any(f"{rec.dropped_records} records" in str(w.message) for w in caught)
