"""What goodtrace costs the training thread per step, and what its readiness check costs it.

1. ``step``: ns per ``with gt.step(k) as s: s.complete_on(v); gt.metric("loss", v)``, where
   ``v`` is a device value that is already complete (so the lagged observation never waits):
   everything goodtrace does on the training thread per step (entering and leaving the step,
   the completion and the metric handles, observing the previous step's values). The writer is
   parked, as in ``span_overhead.py``. ``step_bare`` is the same loop with ``gt.step`` only.
2. ``busy``: a CPU-bound pure-Python loop (it never releases the GIL) timed while a value that
   never completes is pending, so the background readiness check polls all the time and has to
   take the GIL from the loop at every poll, against the same loop with the check off
   (``poll_interval_s=0``). The worst case for the poller; a loop that waits on data or on the
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


def _timeit(body: Callable[[int], None], n: int) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        body(n)
        return (time.perf_counter_ns() - start) / n
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    n = 20_000 if args.quick else 100_000
    busy_n = 2_000_000 if args.quick else 10_000_000
    rounds = 5 if args.quick else 11
    poller = _has_poller()
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory() as run_dir:
        for _ in range(rounds):
            rec: Any = gt.init(run_dir, flush_interval_s=3600, max_buffer_records=10**8, record_gc=False)
            add("step", _timeit(steps_with_values, n))
            rec.buffer.clear()
            add("step_bare", _timeit(steps_bare, n))
            rec.buffer.clear()
            gt.finish()
            options: dict[str, Any] = {"lag": 1000, "record_gc": False}
            for label, interval in (("busy_poller_off", 0.0), ("busy_poller_on", None)):
                if poller and interval is not None:
                    options["poll_interval_s"] = interval
                else:
                    options.pop("poll_interval_s", None)
                rec = gt.init(run_dir, **options)
                with gt.step(0) as s:
                    s.complete_on(_Never())
                add(label, _timeit(busy, busy_n))
                rec._pending.clear()  # never observed: the benchmark ends without waiting on it
                if hasattr(rec, "_watched"):
                    rec._watched.clear()
                gt.finish()

    ns = {name: statistics.median(values) for name, values in samples.items()}
    busy_overhead = ns["busy_poller_on"] / ns["busy_poller_off"] - 1
    print(f"medians of {rounds} interleaved rounds; python {sys.version.split()[0]}; "
          f"readiness poller {'present' if poller else 'absent'}")
    print(f"  step + complete_on + metric   {ns['step']:8.0f} ns per step")
    print(f"  step only                     {ns['step_bare']:8.0f} ns per step")
    print(f"  CPU-bound loop, poller polling: {100 * busy_overhead:+.2f} % time "
          f"({ns['busy_poller_on']:.1f} vs {ns['busy_poller_off']:.1f} ns per iteration)")
    if args.json:
        print(json.dumps({"ns": ns, "busy_overhead": busy_overhead, "poller": poller, "n": n,
                          "rounds": rounds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
