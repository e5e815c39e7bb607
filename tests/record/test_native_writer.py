"""The native writer (record/io/native.py over _native.c): the same bytes as the Python encoder,
the ring's bound with every refused record counted, and a loop that holds the GIL starving
nothing, in a real process."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from goodtrace import schema
from goodtrace.read.sessions import read_run
from goodtrace.record import fastpath
from goodtrace.record.config import Config
from goodtrace.record.io.encoding import _Encoder
from goodtrace.record.io.native import NativeWriter
from goodtrace.record.io.storage import LocalStorage
from goodtrace.record.spans import span_key
from helpers.loops import oversleep

pytestmark = pytest.mark.skipif(fastpath.native is None, reason="the native writer is not built here")


def _header(segment: int, wall: int, mono: int) -> dict[str, Any]:
    return {"kind": "header", "schema": schema.SCHEMA_VERSION, "segment": segment, "wall": wall, "mono": mono}


def _writer(tmp_path: Path, **config: Any) -> NativeWriter:
    return NativeWriter(fastpath.native, LocalStorage(str(tmp_path)), Config(**config), _header, "rank-00000/s")


def _lines(tmp_path: Path) -> list[bytes]:
    (path,) = sorted(tmp_path.glob("rank-00000/*.jsonl"))
    return path.read_bytes().splitlines(keepends=True)


def test_the_native_writer_writes_what_the_python_encoder_writes(tmp_path: Path) -> None:
    fwd, data = span_key("fwd", "compute"), span_key("d\u00e9j\u00e0 \"vu\"\n", "data")
    tid = 140082279353216
    floats = [0.1, 1 / 3, 1e16, 1e15, 1e-5, 1e-4, -0.0, 123456789.123, 5e-324, 1.7976931348623157e308,
              float("nan"), float("inf"), -2.5e-7, 100.0, 2.0**53]
    records: list[tuple[Any, ...]] = [
        (fwd, 10, 20, 3, tid, None, None),
        (fwd, 10, 20, None, tid, None, None),  # no step
        (data, 11, 21, 4, tid, None, None),
        (fwd, 12, 22, 5, tid, {"a": [1, 2]}, None),  # attributes: through Python, in order
        (fwd, 13, 23, 5, tid, None, ValueError),  # an error: through Python
        (schema.STEP, 7, 100, 200, 0),
        (schema.STEP, 8, 100, 200),
        (schema.SYNC, 7, 300, schema.SYNC_HOST, 0, 250),
        (schema.SYNC, None, 300, schema.SYNC_HOST),
        (schema.SYNC, 7, 300, schema.SYNC_HOST, 1, None),
        (schema.TAG, 7, "eval \u2713", 400),
        (schema.TAG, None, "x", 401),
        *[(schema.METRIC, "loss", 7, value, "mean", 500 + i) for i, value in enumerate(floats)],
        (schema.METRIC, "n", None, 2**62, "sum", 600),
        (schema.METRIC, "n", -1, -(2**63), "sum", 600),  # the smallest int64, a negative step
        (schema.METRIC, "n", 0, -42, "sum", 0),
        (schema.METRIC, "n", 8, None, "max", 601),
        (schema.METRIC, "flag", 8, True, "max", 602),  # a bool: through Python
        (schema.METRIC, "big", 8, 2**70, "max", 603),  # past int64: through Python
        (schema.EVENT, "preempted", 700, 8, {"signal": 15}),
        (schema.CLOCK, -5, 40, 0, 800),
        (schema.FINISH, True, 900, "finish"),
    ]
    writer = _writer(tmp_path)
    writer.start()
    for record in records:
        writer.buffer.append(record)
    assert writer.close(5.0)
    written = [line for line in _lines(tmp_path) if not line.startswith((b'{"kind":"header"', b'{"kind":"heartbeat"'))]
    out: list[bytes] = []
    assert _Encoder().encode_many(records, out, lambda exc: pytest.fail(repr(exc))) == len(records)
    expected = b"".join(out).splitlines(keepends=True)
    assert written == expected
    assert writer.written_records == len(records) and writer.dropped_records == 0


def test_the_ring_keeps_its_bound_and_counts_every_refused_record(tmp_path: Path) -> None:
    limit, appends = 1000, 5000
    writer = _writer(tmp_path, max_buffer_records=limit, flush_interval_s=0.05)
    key = span_key("fwd", "compute")
    peak = 0
    for i in range(appends):  # not started yet: nothing drains, as with a writer that is stuck
        writer.buffer.append((key, i, i + 1, i, 1, None, None))
        peak = max(peak, len(writer.buffer))
    assert peak == limit and writer.buffer.dropped == appends - limit
    writer.buffer.append_always((schema.FINISH, False, appends, "finish"))  # past the bound
    writer.start()
    with pytest.warns(Warning, match=f"{appends - limit} records did not reach storage"):
        assert writer.close(5.0) is False
    records = [json.loads(line) for line in _lines(tmp_path)]
    assert [r["t0"] for r in records if r["kind"] == "span"] == list(range(limit))  # the first ones, in order
    assert [r["kind"] for r in records].count("finish") == 1
    assert max(r["dropped"] for r in records if r["kind"] == "heartbeat") == appends - limit


BUSY_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import goodtrace as gt
    run_dir, seconds, flush = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    rec = gt.init(run_dir, flush_interval_s=flush)
    fd = os.open(os.devnull, os.O_WRONLY)
    clock = time.perf_counter_ns
    end = clock() + int(seconds * 1e9)
    produced = peak = step = 0
    while clock() < end:
        with gt.step(step):
            for _ in range(15):
                with gt.span("fwd"):
                    pass
            busy = clock() + 200_000
            while clock() < busy:
                pass
        os.write(fd, b"x")
        produced += 16
        step += 1
        peak = max(peak, len(rec.buffer))
    chunk_s = rec.writer.stats.max_chunk_seconds()
    print(json.dumps({"produced": produced, "peak": peak, "ok": gt.finish(), "chunk_s": chunk_s,
                      "writer": type(rec.writer).__name__}))
    """
)


@pytest.mark.processes
def test_a_busy_loop_with_a_system_call_per_step_starves_nothing(tmp_path: Path) -> None:
    """200 us of Python work and a system call per step (the GIL convoy that starved the Python
    writer): every record written, the buffer under one chunk, heartbeats on the cadence."""
    flush = 0.1
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD, str(tmp_path), "3", str(flush)],
                             stdout=subprocess.PIPE, text=True)
    late = 0.0
    while child.poll() is None:  # the scheduler's lateness while the child runs, sampled all along
        late = max(late, oversleep(5))
    stdout, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["writer"] == "NativeWriter"
    assert result["ok"] is True
    (session,) = read_run(str(tmp_path)).sessions
    written = len(session.of_kind("span")) + len(session.of_kind("step"))
    assert written >= result["produced"]  # every one (gc spans may come on top)
    assert result["peak"] < 32_768  # never more than a chunk waiting
    beats = [r["mono"] for r in session.of_kind("heartbeat")]
    gap = max(b - a for a, b in itertools.pairwise(beats)) / 1e9
    bound = flush + 2 * result["chunk_s"] + 2 * late + 2 * sys.getswitchinterval()
    assert gap <= bound, f"heartbeats {gap:.3f} s apart (bound {bound:.3f} s)"


def test_the_native_writer_is_chosen_for_local_runs_and_not_for_fake_clocks(tmp_path: Path) -> None:
    from goodtrace.record.io.choice import open_writer
    from goodtrace.record.io.writer import Writer

    storage = LocalStorage(str(tmp_path))
    _, native = open_writer(storage, Config(), _header, "rank-00000/s", time.perf_counter_ns)
    _, python = open_writer(storage, Config(), _header, "rank-00000/s", lambda: 0)
    assert isinstance(native, NativeWriter) and isinstance(python, Writer)
    # nothing started, no segment written: only the native writer's ring file, made with it
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()] == ["rank-00000/s.ring"]
