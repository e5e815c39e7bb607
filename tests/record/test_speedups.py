"""The optional C fast path of spans (``goodtrace._speedups``) against the pure-Python reference.

Both implementations run the same script in fresh interpreters (``GOODTRACE_PURE_PYTHON=1``
selects the Python one) and must produce the same records, byte for byte after removing what
differs between any two runs (session ids, pids, thread ids, wall times).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.record import spans as _recorder
from goodtrace.testing import FakeClock, capture

SCRIPT = r'''
import json, sys, tempfile, threading
import goodtrace as gt
from goodtrace.record import spans as _recorder
from goodtrace.read.sessions import read_run
from goodtrace.testing import FakeClock

@gt.span
def bare_decorated():
    clock.advance(0.001)

@gt.span("named_before_init", category="eval")
def named_before_init():
    clock.advance(0.002)

clock = FakeClock()
run_dir = tempfile.mkdtemp()
gt.init(run_dir, clock=clock, record_gc=False, overhead_categories=("upload",))
outcomes = []
for step in range(3):
    with gt.step(step):
        with gt.span("data"):
            clock.advance(0.010)
        with gt.span("forward", attrs={"layers": step}) as s:
            outcomes.append([s.name, s.category, type(s).__name__])
            clock.advance(0.020)
            with gt.span("attention", "compute"):
                clock.advance(0.005)
        with gt.span(name="backward", category="compute", attrs=None):
            clock.advance(0.030)
        with gt.span("push", category="upload"):
            clock.advance(0.001)
        try:
            with gt.span("fails"):
                clock.advance(0.003)
                raise ValueError("boom")
        except ValueError:
            outcomes.append("reraised")
        with gt.span(["unhashable", step]):
            clock.advance(0.004)
        bare_decorated()
        named_before_init()
    if step == 1:
        with gt.span("checkpoint"):
            clock.advance(0.050)
for bad in ((), {"colour": "red"}, {"name": "x", "name2": 1}):
    try:
        gt.span("x", "compute", None, "extra") if bad == () else gt.span(**bad)
    except TypeError as exc:
        outcomes.append(["TypeError", type(exc).__name__])
def worker():
    with gt.span("in_thread"):
        clock.advance(0.007)
t = threading.Thread(target=worker)
t.start(); t.join()
gt.finish()
threads = {}
out = []
for _, r in read_run(run_dir).records("span"):
    r = dict(r)
    r["tid"] = threads.setdefault(r.get("tid"), len(threads))
    out.append(r)
print(json.dumps({"implementation": _recorder.IMPLEMENTATION, "spans": out, "outcomes": outcomes},
                 sort_keys=True))
'''


def _run(pure: bool) -> dict[str, Any]:
    env = dict(os.environ, GOODTRACE_PURE_PYTHON="1" if pure else "0")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _compiler_available() -> bool:
    include = sysconfig.get_paths().get("include", "")
    return shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") \
        is not None and Path(include, "Python.h").exists()


def test_the_c_fast_path_is_built_where_a_compiler_is() -> None:
    """CI must exercise the C path: a silent fall back to Python would hide its bugs."""
    if os.environ.get("GOODTRACE_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("GOODTRACE_PURE_PYTHON is set")
    if not _compiler_available():
        pytest.skip("no C compiler or Python headers: the pure-Python spans are used")
    assert _recorder.IMPLEMENTATION == "c"
    assert gt.span is _recorder._speedups.span


@pytest.mark.processes
def test_c_and_python_spans_write_the_same_records() -> None:
    python = _run(pure=True)
    assert python["implementation"] == "python"
    if not _compiler_available():
        pytest.skip("the C fast path is not built here")
    c = _run(pure=False)
    assert c["implementation"] == "c"
    assert c["outcomes"] == python["outcomes"]
    assert c["spans"] == python["spans"]
    # and the script recorded what it meant to
    names = [s["name"] for s in c["spans"]]
    assert names.count("forward") == 3 and names.count("in_thread") == 1
    assert names.count("bare_decorated") == 3 and names.count("named_before_init") == 3
    assert {s["cat"] for s in c["spans"] if s["name"] == "named_before_init"} == {"eval"}
    assert {s["cat"] for s in c["spans"] if s["name"] == "push"} == {"upload"}
    assert next(s for s in c["spans"] if s["name"] == "checkpoint")["cat"] == "checkpoint_save"
    assert sum(1 for s in c["spans"] if s.get("err")) == 3
    assert ["forward", "compute", "Span"] in c["outcomes"]
    assert c["outcomes"].count("reraised") == 3
    assert c["outcomes"].count(["TypeError", "TypeError"]) == 3


def test_spans_keep_no_references_and_collect_cycles() -> None:
    """Refcounts in C: nothing leaks per span, and a cycle through attrs is collected."""
    clock = FakeClock()
    with capture(clock=clock, record_gc=False):
        key_probe = gt.span("leak_probe")
        key = key_probe.key
        before = sys.getrefcount(key)
        recorder = _recorder._active
        assert recorder is not None
        for _ in range(1000):
            with gt.span("leak_probe"):
                pass
        recorder.buffer.clear()
        assert sys.getrefcount(key) == before

        class Attrs(dict[str, Any]):
            pass

        attrs = Attrs()
        span = gt.span("cycle", attrs=attrs)
        attrs["span"] = span  # span -> attrs -> span
        probe = weakref.ref(attrs)
        del attrs, span
        gc.collect()
        assert probe() is None


def test_misuse_of_a_span_object_is_a_clear_error() -> None:
    with capture(record_gc=False):
        span = gt.span("forward")
        with pytest.raises(RuntimeError if _recorder.IMPLEMENTATION == "c" else AttributeError):
            span.__exit__(None, None, None)
        with span:
            pass
        # a span object entered again records again (each entry has its own t0)
        with span:
            pass
        assert span.t0 > 0


def test_threads_record_their_own_ids() -> None:
    """The C path caches the last thread id: spans from alternating threads keep theirs."""
    with capture(record_gc=False) as cap:
        barrier = threading.Barrier(2)

        def work() -> None:
            for _ in range(50):
                with gt.span("t"):
                    pass
                barrier.wait(timeout=10)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        idents = {t.ident for t in threads}
    spans = cap.records("span")
    assert len(spans) == 100
    by_tid: dict[int, int] = {}
    for s in spans:
        by_tid[s["tid"]] = by_tid.get(s["tid"], 0) + 1
    assert set(by_tid) == idents and set(by_tid.values()) == {50}


def test_real_clock_spans_lie_between_perf_counter_reads() -> None:
    """The C path reads CLOCK_MONOTONIC itself when the clock is time.perf_counter_ns: it must
    be the same clock."""
    import time

    with capture(record_gc=False) as cap:
        before = time.perf_counter_ns()
        with gt.span("x"):
            inside = time.perf_counter_ns()
        after = time.perf_counter_ns()
    (span,) = cap.records("span")
    assert before <= span["t0"] <= inside <= span["t1"] <= after


GC_REBIND_SCRIPT = r'''
import gc, sys, tempfile, threading
import goodtrace as gt
from goodtrace.record import spans

gt.init(tempfile.mkdtemp(), record_gc=False)


class Sink:
    """Stands in for the buffer's append; a freed one has lost its slot (AttributeError)."""

    __slots__ = ("records",)

    def __init__(self, records):
        self.records = records

    def __call__(self, record):
        self.records.append(record)


records = []
spans._append = Sink(records)
steps = iter(range(10**15, 10**16))  # big ints: never cached, freed with their last reference
spans._step = next(steps)
rebinds = 0


def rebind(phase, info):
    """A GC callback (it runs inside whatever allocation triggered the collection) that rebinds
    the hot path's state, dropping the last reference to the old objects, as a finish() or a
    step change on another thread would while this thread sits in the collection."""
    global rebinds
    if phase == "start":
        spans._append = Sink(records)
        spans._step = next(steps)
        rebinds += 1


failures = []


class Box:
    pass


def work():
    try:
        for _ in range(3000):
            # one tracked object alive across the exit: with the threshold at 1, the collection
            # then falls inside the span's exit (its record tuple's allocation)
            with gt.span("t"):
                box = Box()
            del box
            with gt.span("u", "compute"):
                box = Box()
            del box
    except BaseException as exc:
        failures.append(repr(exc))


gc.callbacks.append(rebind)
gc.set_threshold(1)  # a collection at nearly every allocation of a tracked object (the record tuple)
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
gc.set_threshold(700)
gc.callbacks.remove(rebind)
bad_steps = sum(1 for r in records if not (isinstance(r[3], int) and 10**15 <= r[3] < 10**16))
print(spans.IMPLEMENTATION, len(records), bad_steps, rebinds, failures[:3])
'''


@pytest.mark.processes
def test_spans_survive_a_gc_callback_that_rebinds_the_hot_path_state() -> None:
    """The C span exit reads ``_append`` and ``_step`` after its allocations, and owns them:
    an allocation can run a collection whose callbacks rebind them (another thread's finish()
    or step change), and a borrowed reference held across it would point at a freed object.
    With the borrowed references (before the fix) this script crashed (SIGSEGV) on every run.
    On Python 3.12+ collections run between bytecodes, not inside allocations, so it passes
    there either way."""
    out = subprocess.run([sys.executable, "-c", GC_REBIND_SCRIPT], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    implementation, count, bad_steps, rebinds, failures = out.stdout.split(maxsplit=4)
    assert implementation == _recorder.IMPLEMENTATION
    assert failures.strip() == "[]"
    assert int(count) == 4 * 3000 * 2
    assert int(bad_steps) == 0
    assert int(rebinds) > 1000  # the callback really ran, many times, between spans' calls
