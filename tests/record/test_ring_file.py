"""The native writer's ring in a file beside the segments (record/io/native_writer.c) and its
recovery (read/ring.py): the ring decodes to the bytes the writer writes, a write cut anywhere
by a kill is completed exactly, a SIGKILLed process loses nothing it had appended, a live ring
is left alone, a reader reads a dead one into its cache and leaves it, only a writer proven
gone has its ring removed (by compact), a clean finish deletes it, and where no file can be
made the ring stays in memory with one warning. Real processes for the kills."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from goodtrace import schema
from goodtrace.read import io_pool
from goodtrace.read import ring as ring_module
from goodtrace.read.ring import decode_lines, pending_lines, read_ring, recover_ring
from goodtrace.read.segments import list_segments
from goodtrace.read.sessions import read_run
from goodtrace.record import fastpath
from goodtrace.record.config import Config
from goodtrace.record.io.native import NativeWriter
from goodtrace.record.io.storage import LocalStorage
from goodtrace.record.spans import span_key
from helpers.children import ReportingChild
from helpers.cli import goodtrace

pytestmark = [pytest.mark.processes, pytest.mark.skipif(fastpath.native is None, reason="the native writer is not built here")]

_TAIL_AT = 96  # RingShared.tail's offset in the file (native_writer.h)


def _header(segment: int, wall: int, mono: int) -> dict[str, Any]:
    return {"kind": "header", "schema": schema.SCHEMA_VERSION, "session": "s", "rank": 0, "segment": segment,
            "wall": wall, "mono": mono}


def _writer(root: Path, **config: Any) -> NativeWriter:
    return NativeWriter(fastpath.native, LocalStorage(str(root)), Config(**config), _header, "rank-00000/s")


def _records() -> list[tuple[Any, ...]]:
    fwd, data = span_key("fwd", "compute"), span_key("d\u00e9j\u00e0 \"vu\"\n", "data")
    tid = 140082279353216
    floats = [0.1, 1 / 3, 1e16, 1e15, 1e-5, 1e-4, -0.0, 5e-324, 1.7976931348623157e308, float("nan"),
              float("inf"), -2.5e-7, 2.0**53]
    return [
        (fwd, 10, 20, 3, tid, None, None),
        (fwd, 10, 20, None, 2**63 + 5, None, None),  # no step; a thread id past int64
        (data, 11, 21, 4, tid, None, None),
        (fwd, 12, 22, 5, tid, {"a": [1, 2]}, None),  # attributes: bytes in the ring
        (schema.STEP, 7, 100, 200, 0),
        (schema.STEP, 8, 100, 200),
        (schema.SYNC, 7, 300, schema.SYNC_HOST, 0, 250),
        (schema.SYNC, None, 300, schema.SYNC_HOST),
        (schema.TAG, 7, "eval \u2713", 400),
        *[(schema.METRIC, "loss", 7, value, "mean", 500 + i) for i, value in enumerate(floats)],
        (schema.METRIC, "n", -1, -(2**63), "sum", 600),
        (schema.METRIC, "n", 8, None, "max", 601),
        (schema.EVENT, "preempted", 700, 8, {"signal": 15}),
    ]


def _dead_ring(run_dir: str, steps: int) -> str:
    """The ring file a real process left in ``run_dir``: ``steps`` steps, then an exit without
    ``finish`` and before its flush interval."""
    code = ("import os, sys, goodtrace as gt\n"
            "gt.init(sys.argv[1], flush_interval_s=60)\n"
            "for i in range(int(sys.argv[2])):\n"
            "    with gt.step(i): pass\n"
            "os._exit(3)\n")
    assert subprocess.run([sys.executable, "-c", code, run_dir, str(steps)], timeout=120).returncode == 3
    (ring,) = glob.glob(f"{run_dir}/rank-*/*.ring")
    return ring


def _record_lines(paths: list[str]) -> list[bytes]:
    """Every complete record line of these segment files, in order (no header, no heartbeat)."""
    lines: list[bytes] = []
    for path in paths:
        with open(path, "rb") as handle:
            for line in handle:
                if line.endswith(b"\n") and not line.startswith((b'{"kind":"header"', b'{"kind":"heartbeat"')):
                    lines.append(line)
    return lines


def test_the_ring_file_decodes_to_the_bytes_the_writer_wrote(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    assert writer.ring_file == str(tmp_path / "rank-00000" / "s.ring")
    writer.start()
    records = _records() * 50
    for record in records:
        writer.buffer.append(record)
    assert writer.flush(10.0)
    ring = read_ring(writer.ring_file)
    assert ring.tail == ring.head > 0 and ring.segment == 0
    decoded = [line for _, line in decode_lines(ring, 0, ring.head)]  # the ring never wrapped
    written = _record_lines(sorted(glob.glob(str(tmp_path / "rank-00000" / "*.jsonl"))))
    assert len(written) == len(records)
    assert decoded == written
    assert pending_lines(ring) == ([], None)  # everything is on disk
    assert writer.close(5.0)
    assert not os.path.exists(tmp_path / "rank-00000" / "s.ring")  # a clean finish deletes it


@pytest.mark.parametrize("rotate", [False, True], ids=["same-segment", "new-segment"])
def test_a_write_cut_anywhere_by_a_kill_is_completed_exactly(tmp_path: Path, rotate: bool) -> None:
    """The state a kill during the last write leaves (the tail not yet moved, the segment cut at
    any byte of the write), made from a real writer's files: after recovery every record is in
    the segments exactly once, in order."""
    live = tmp_path / "live"
    # no heartbeat of its own (a long interval): the last write is the last flush's; with the
    # smallest segments every write of records starts a new segment
    writer = _writer(live, flush_interval_s=60.0, segment_bytes=1024 if rotate else 1 << 30)
    writer.start()
    first = _records() * 20
    for record in first:
        writer.buffer.append(record)
    assert writer.flush(10.0)
    last = _records() * 3
    for record in last:
        writer.buffer.append(record)
    assert writer.flush(10.0)
    shutil.copyfile(writer.ring_file or "", tmp_path / "ring")
    segments = sorted(glob.glob(str(live / "rank-00000" / "*.jsonl")))
    expected = _record_lines(segments)
    ring = read_ring(str(tmp_path / "ring"))
    assert ring.j_start < ring.j_end == ring.tail and bool(ring.j_header) == rotate
    assert ring.j_segment == len(segments) - 1 and (len(segments) > 2) == rotate
    cut_file = segments[ring.j_segment]
    write_end = ring.j_offset + ring.j_len
    assert os.path.getsize(cut_file) == write_end
    writer.close(5.0)
    rng = random.Random(7)
    cuts = sorted({0, 1, ring.j_len - 1, ring.j_len, *rng.sample(range(ring.j_len), 12)})
    data = Path(cut_file).read_bytes()
    boundaries = [i + 1 for i, byte in enumerate(data[ring.j_offset:write_end]) if byte == ord("\n")]
    for cut in sorted({*cuts, *boundaries[:5], *boundaries[-3:]}):
        run = tmp_path / f"cut-{cut}"
        shutil.copytree(live, run)
        ring_path = run / "rank-00000" / "s.ring"
        shutil.copyfile(tmp_path / "ring", ring_path)
        with open(ring_path, "r+b") as handle:  # the kill came before the tail moved
            handle.seek(_TAIL_AT)
            handle.write(ring.j_start.to_bytes(8, "little"))
        with open(run / "rank-00000" / os.path.basename(cut_file), "r+b") as handle:
            handle.truncate(ring.j_offset + cut)
        if rotate and cut == 0:
            os.unlink(run / "rank-00000" / os.path.basename(cut_file))  # not even created
        problems: list[str] = []
        recovered = recover_ring(str(ring_path), problems)
        assert recovered is not None and not ring_path.exists()
        after = _record_lines(sorted(glob.glob(str(run / "rank-00000" / "*.jsonl"))))
        assert after == expected, f"cut at byte {cut} of {ring.j_len}"


KILL_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import goodtrace as gt
    run_dir, rate, flush = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    gt.init(run_dir, flush_interval_s=flush)
    clock = time.perf_counter_ns
    start = clock()
    step = 0
    while True:
        with gt.step(step):
            for _ in range(9):
                with gt.span("fwd"):
                    pass
        os.write(1, b"%d\\n" % step)  # after the step's records were appended
        step += 1
        target = start + step * 10 * 1e9 / rate
        while clock() < target:
            if target - clock() > 2_000_000:
                time.sleep(0.001)
    """
)


@pytest.mark.parametrize("rate", [2_500, 100_000])
def test_a_sigkill_loses_nothing_the_process_had_appended(tmp_path: Path, rate: int) -> None:
    """Killed at random moments, a process's every step it reported appended (and the 9 spans
    of each) is in the segments after the reader's recovery, none twice; the report counts them."""
    rng = random.Random(rate)
    for kill in range(3):
        run_dir = str(tmp_path / f"run-{kill}")
        child = ReportingChild([sys.executable, "-c", KILL_CHILD, run_dir, str(rate), "0.5"])
        time.sleep(rng.uniform(0.2, 1.5))
        child.kill()
        last = int(child.lines[-1])
        problems: list[str] = []
        list_segments(run_dir, problems, in_place=True)  # compact's recovery, into the run
        assert not glob.glob(f"{run_dir}/rank-*/*.ring")
        lines = _record_lines(sorted(glob.glob(f"{run_dir}/rank-*/*.jsonl")))
        steps = [json.loads(line)["step"] for line in lines if line.startswith(b'{"kind":"step"')]
        spans = [line for line in lines if line.startswith(b'{"kind":"span"')]
        assert steps == list(range(len(steps))), "a step twice, or out of order"
        assert len(steps) > last, f"step {last} was appended before the kill and is not on disk ({len(steps)})"
        assert len(set(spans)) == len(spans) >= 9 * (last + 1)
        run = read_run(run_dir)
        (session,) = run.sessions
        assert sum(1 for r in session.records if r.get("kind") == "step") == len(steps)
        out = goodtrace("report", run_dir, "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["step_stats"]["count"] == len(steps)


def test_a_live_ring_is_left_alone_by_a_reader(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    child = subprocess.Popen([sys.executable, "-c", KILL_CHILD, run_dir, "2000", "60"], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        (ring,) = glob.glob(f"{run_dir}/rank-*/*.ring")
        problems: list[str] = []
        segments = list_segments(run_dir, problems)
        assert os.path.exists(ring) and len(segments) == 1 and problems == []  # only the header segment
        assert recover_ring(ring) is None
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert recover_ring(ring) and not os.path.exists(ring)  # dead now: recovered


FALLBACK_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys, warnings
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # no room for a ring file
    import goodtrace as gt
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = gt.init(sys.argv[1])
        for i in range(100):
            with gt.step(i):
                pass
        ok = gt.finish()
    print(json.dumps({"ok": ok, "writer": type(rec.writer).__name__, "ring_file": rec.writer.ring_file,
                      "warnings": [str(w.message) for w in caught]}))
    """
)


def test_where_no_ring_file_can_be_made_the_ring_stays_in_memory_with_one_warning(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    out = subprocess.run([sys.executable, "-c", FALLBACK_CHILD, run_dir], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["ok"] and result["writer"] == "NativeWriter" and result["ring_file"] is None
    ring_warnings = [w for w in result["warnings"] if "ring" in w]
    assert len(ring_warnings) == 1 and "File too large" in ring_warnings[0], result["warnings"]
    assert not glob.glob(f"{run_dir}/rank-*/*.ring")
    steps = [r for r in read_run(run_dir).sessions[0].records if r.get("kind") == "step"]
    assert len(steps) == 100


def test_a_process_that_exits_without_finish_leaves_its_ring_for_the_reader(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    ring = _dead_ring(run_dir, 50)
    before = sorted(glob.glob(f"{run_dir}/rank-*/*"))
    problems: list[str] = []
    (_, first), (_, recovered) = list_segments(run_dir, problems)
    assert os.path.dirname(first) == os.path.dirname(ring) and recovered.endswith(".00001.jsonl")
    assert not recovered.startswith(run_dir) and os.path.exists(ring)  # in the reader's cache; the ring left
    assert len(problems) == 1 and "recovered from its ring" in problems[0]
    steps = [r["step"] for r in read_run(run_dir).sessions[0].records if r.get("kind") == "step"]
    assert steps == list(range(50))
    again: list[str] = []
    assert [path for _, path in list_segments(run_dir, again)] == [first, recovered] and again == problems
    assert sorted(glob.glob(f"{run_dir}/rank-*/*")) == before
    assert recover_ring(ring) == 50 and not os.path.exists(ring)  # compact's: its writer is gone
    assert [os.path.dirname(path) for _, path in list_segments(run_dir)] == [os.path.dirname(first)] * 2


def test_hostile_ring_files_are_named_never_a_traceback_or_a_wait(tmp_path: Path) -> None:
    """Files named ``*.ring`` that are not a dead writer's ring: random bytes, a truncated or
    damaged ring, a directory, a FIFO (opening one for reading would wait for a writer)."""
    live = tmp_path / "live"
    writer = _writer(live)
    writer.start()
    for record in _records() * 10:
        writer.buffer.append(record)
    real = Path(writer.ring_file or "").read_bytes()
    assert writer.close(5.0)
    rank = tmp_path / "run" / "rank-00000"
    rank.mkdir(parents=True)
    header = json.dumps(_header(0, 1, 1)).encode() + b"\n"
    for name in ("random", "truncated", "damaged", "directory", "fifo", "empty"):
        (rank / f"{name}.00000.jsonl").write_bytes(header)
    (rank / "random.ring").write_bytes(random.Random(1).randbytes(10_000))
    (rank / "truncated.ring").write_bytes(real[:5000])
    damaged = bytearray(real)
    damaged[_TAIL_AT:_TAIL_AT + 8] = bytes(8)  # nothing written yet, as if killed at once
    entry = int.from_bytes(real[24:32], "little")  # the ring's first entry: a nonsense size
    damaged[entry:entry + 4] = (12345).to_bytes(4, "little")
    (rank / "damaged.ring").write_bytes(bytes(damaged))
    (rank / "directory.ring").mkdir()
    os.mkfifo(rank / "fifo.ring")
    (rank / "empty.ring").write_bytes(b"")
    problems: list[str] = []
    segments = list_segments(str(tmp_path / "run"), problems)
    assert len(segments) == 6  # nothing recovered, nothing else lost
    text = "\n".join(problems)
    assert "random.ring: not a goodtrace ring file" in text
    assert "truncated.ring: its sizes and offsets do not agree" in text
    assert "damaged.ring: damaged after 0 records" in text
    assert "directory.ring: not a regular file" in text and "fifo.ring: not a regular file" in text
    assert "empty.ring: not a goodtrace ring file" in text
    assert sorted(p.name for p in rank.glob("*.ring")) == [f"{name}.ring" for name in sorted(
        ("random", "truncated", "damaged", "directory", "fifo", "empty"))]  # each left as it is


def test_on_a_fuse_filesystem_the_ring_stays_in_memory_and_the_process_lives(nfs: Any, tmp_path: Path) -> None:
    """A store into a shared mapping that a FUSE filesystem could not back killed the process
    with SIGBUS here: the ring goes into a file only on filesystems known to be safe."""
    run_dir = os.path.join(nfs.mountpoint, tmp_path.name)
    code = ("import json, sys, warnings\n"
            "import goodtrace as gt\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    rec = gt.init(sys.argv[1])\n"
            "    for i in range(20):\n"
            "        with gt.step(i): pass\n"
            "    ok = gt.finish()\n"
            "print(json.dumps({'ok': ok, 'ring_file': rec.writer.ring_file,\n"
            "                  'warnings': [str(w.message) for w in caught]}))\n")
    out = subprocess.run([sys.executable, "-c", code, run_dir], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    result = json.loads(out.stdout)
    assert result["ok"] and result["ring_file"] is None
    assert [w for w in result["warnings"] if "ring" in w and "not one where a shared file mapping" in w]
    assert not glob.glob(f"{run_dir}/rank-*/*.ring")


def test_a_ring_from_another_host_is_read_late_and_never_removed_where_locks_say_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On NFS mounted without a lock service a live writer on another host holds no lock that a
    reader here can see: a reader reads its ring only once its last heartbeat is 5 intervals (and
    10 s) old, into its cache, and nothing removes it (a writer stalled in a write, or a skewed
    clock, is not proof that it is gone). Where locks work (a local filesystem: a container of
    this kernel) a free lock is that proof. Made from a real dead process's ring, its host and
    heartbeat rewritten."""
    run_dir = str(tmp_path / "run")
    ring_path = _dead_ring(run_dir, 30)
    assert read_ring(ring_path).host  # this host's name, as the writer saw it
    beat_at, host_at = 184, 200  # RingShared.beat_wall and .host (native_writer.h)

    def heard(seconds_ago: float) -> None:
        with open(ring_path, "r+b") as handle:
            handle.seek(host_at)
            handle.write(b"another-host".ljust(64, b"\0"))
            handle.seek(beat_at)
            handle.write((time.time_ns() - int(seconds_ago * 1e9)).to_bytes(8, "little"))

    mounts = tmp_path / "mounts"
    mounts.write_text(f"server:/export {os.path.realpath(tmp_path)} nfs rw,vers=3,nolock,proto=tcp 0 0\n")
    monkeypatch.setattr(io_pool, "MOUNT_TABLE", str(mounts))
    rank_files = sorted(glob.glob(f"{run_dir}/rank-*/*"))
    for seconds_ago in (0, 11):  # heard from just now; 11 s ago, interval 60 s: 5 intervals are 300 s
        heard(seconds_ago)
        assert recover_ring(ring_path) is None and os.path.exists(ring_path)
        assert len(list_segments(run_dir)) == 1
    heard(301)
    assert recover_ring(ring_path) is None and os.path.exists(ring_path)  # compact: not proven gone
    assert len(list_segments(run_dir)) == 2 and os.path.exists(ring_path)  # a reader: read, left
    steps = [r["step"] for r in read_run(run_dir).sessions[0].records if r.get("kind") == "step"]
    assert steps == list(range(30)) and sorted(glob.glob(f"{run_dir}/rank-*/*")) == rank_files
    monkeypatch.undo()  # a local filesystem: its locks are the kernel's, for every container of it
    heard(0)
    assert recover_ring(ring_path) == 30 and not os.path.exists(ring_path)


def test_a_writer_of_this_host_is_gone_when_its_pid_ended_or_is_another_process_s(tmp_path: Path) -> None:
    writer = _writer(tmp_path, flush_interval_s=60.0)
    writer.start()
    assert writer.flush(10.0)
    ring = read_ring(writer.ring_file or "")
    assert writer.close(5.0) and ring.pid == os.getpid() and ring.wall <= time.time_ns()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert ring_module._pid_gone(dataclasses.replace(ring, pid=int(ended.stdout)))
    assert not ring_module._pid_gone(dataclasses.replace(ring, pid=os.getpid()))  # started before it wrote
    assert ring_module._pid_gone(dataclasses.replace(ring, pid=os.getpid(), wall=0))  # started after: reused
