"""What goodtrace costs the training thread per step, and what its readiness check costs it.

1. ``step``: ns per ``with gt.step(k) as s: s.complete_on(v); gt.metric("loss", v)``, where
   ``v`` is a device value that is already complete (so the lagged observation never waits):
   everything goodtrace does on the training thread per step (entering and leaving the step,
   the completion and the metric handles, observing the previous step's values). The writer is
   parked, as in ``span_overhead.py``. ``step_bare`` is the same loop with ``gt.step`` only.
   Both in wall time and in the training thread's CPU time (``thread_time``: what it spent,
   whatever other processes on a shared machine did meanwhile).
2. ``busy`` (only where the readiness check exists): a CPU-bound pure-Python loop (it never
   releases the GIL) in short chunks, alternately while a value that never completes is
   watched (the readiness thread polls every interval and must take the GIL from the loop each
   time) and while nothing is (the thread sleeps). The median of the paired chunk-time ratios
   is what polling costs such a loop: the worst case, since a loop that waits for data or the
   device releases the GIL and pays less.

Rounds are interleaved (machines here are shared and noisy); medians are reported.

Usage: python benchmarks/step_overhead.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import goodtrace as gt


class _Ready:
    """A device value that is already complete (the cheapest non-host value goodtrace sees)."""

    __slots__ = ()

    def __goodtrace_ready__(self) -> bool:
        return True

    def __goodtrace_wait__(self) -> None:
        return None

    def __goodtrace_float__(self) -> float:
        return 1.0


class _Never:
    """A device value that never completes: keeps the readiness check polling."""

    __slots__ = ()

    def __goodtrace_ready__(self) -> bool:
        return False

    def __goodtrace_wait__(self) -> None:
        raise RuntimeError("never waited on in this benchmark")


def _has_poller() -> bool:
    return any(f.name == "poll_interval_s" for f in dataclasses.fields(gt.Config))


def _timeit(body: Callable[[int], None], n: int) -> tuple[float, float]:
    """(wall ns, thread CPU ns) per iteration, with the cyclic GC paused."""
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        body(n)
        return (time.perf_counter_ns() - wall) / n, (time.thread_time_ns() - cpu) / n
    finally:
        gc.enable()


def steps_with_values(n: int) -> None:
    step, metric, value = gt.step, gt.metric, _Ready()
    for k in range(n):
        with step(k) as s:
            s.complete_on(value)
            metric("loss", value)


def steps_bare(n: int) -> None:
    step = gt.step
    for k in range(n):
        with step(k):
            pass


def busy(n: int) -> None:
    total = 0
    for i in range(n):
        total += i * i % 7


def polling_cost(run_dir: str, chunk: int, pairs: int) -> tuple[float, float, float]:
    """Over ``pairs`` alternating pairs of CPU-bound chunks, one while the readiness thread
    polls and one while it sleeps: the median ratio of their wall times and of the loop
    thread's CPU times (minus 1), and the polls per second it made while polling."""
    rec: Any = gt.init(run_dir, record_gc=False)
    readiness = rec.readiness
    with gt.step(0) as s:
        s.complete_on(_Never())
    (entry,) = list(readiness.watched)
    polls = [0]
    ready = entry.value[0].ready

    def counting_ready(handle: Any) -> bool | None:
        polls[0] += 1
        answer: bool | None = ready(handle)
        return answer

    entry.value = (type("Counted", (), {"ready": staticmethod(counting_ready)})(), entry.value[1])
    wall_ratios, cpu_ratios = [], []
    polling_s = 0.0
    gc.disable()
    try:
        for i in range(pairs):
            wall, cpu = {}, {}
            for polling in ((True, False) if i % 2 else (False, True)):
                if polling:
                    readiness.watch(entry)
                    time.sleep(0.001)  # let it wake and start polling
                else:
                    readiness.watched.clear()
                    time.sleep(0.003)  # let it go idle
                start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
                busy(chunk)
                wall[polling] = time.perf_counter_ns() - start
                cpu[polling] = time.thread_time_ns() - start_cpu
                if polling:
                    polling_s += wall[polling] / 1e9
            wall_ratios.append(wall[True] / wall[False])
            cpu_ratios.append(cpu[True] / cpu[False])
    finally:
        gc.enable()
        readiness.watched.clear()
        rec.sync.pending.clear()
        gt.finish()
    return statistics.median(wall_ratios) - 1, statistics.median(cpu_ratios) - 1, polls[0] / polling_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    n = 20_000 if args.quick else 100_000
    busy_n = 200_000  # one chunk: about 15 ms
    rounds = 5 if args.quick else 11
    poller = _has_poller()
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory() as run_dir:
        for _ in range(rounds):
            gt.init(run_dir, flush_interval_s=3600, max_buffer_records=10**8, record_gc=False)
            for name, body in (("step", steps_with_values), ("step_bare", steps_bare)):
                wall, cpu = _timeit(body, n)
                add(name, wall)
                add(name + "_cpu", cpu)
                gt.flush()  # written outside the timing, by the writer (its buffer's one consumer)
            gt.finish()
        busy_overhead = busy_cpu_overhead = polls_per_s = None
        if poller:
            busy_overhead, busy_cpu_overhead, polls_per_s = polling_cost(run_dir, busy_n, 20 if args.quick else 100)

    ns = {name: statistics.median(values) for name, values in samples.items()}
    print(f"medians of {rounds} interleaved rounds; python {sys.version.split()[0]}; "
          f"readiness check {'present' if poller else 'absent'}")
    print(f"  step + complete_on + metric   {ns['step']:8.0f} ns per step ({ns['step_cpu']:.0f} ns thread CPU)")
    print(f"  step only                     {ns['step_bare']:8.0f} ns per step ({ns['step_bare_cpu']:.0f} ns thread CPU)")
    if busy_overhead is not None and busy_cpu_overhead is not None:
        print(f"  CPU-bound loop while the readiness check polls ({polls_per_s:.0f} polls/s): "
              f"{100 * busy_overhead:+.2f} % wall time, {100 * busy_cpu_overhead:+.2f} % thread CPU "
              "(medians of paired chunks)")
    if args.json:
        print(json.dumps({"ns": ns, "busy_overhead": busy_overhead, "busy_cpu_overhead": busy_cpu_overhead,
                          "polls_per_s": polls_per_s,
                          "poller": poller, "n": n, "rounds": rounds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
