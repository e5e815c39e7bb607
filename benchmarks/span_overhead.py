"""Nanoseconds per span: goodtrace (enabled, disabled) against baselines, in one run.

Baselines, measured interleaved in the same process (machines here are shared and noisy):
  floor           two time.perf_counter_ns() calls and a list append, inlined
  plain_cm        a minimal context-manager class doing exactly that
  nullcontext     contextlib.nullcontext() (the reference for the disabled path)
  record_function torch.profiler.record_function (profiler not running), if torch is installed
  otel            an OpenTelemetry SDK span (no exporter), if opentelemetry-sdk is installed
goodtrace is measured twice: "hot path" (the writer thread parked, so only the cost paid in
the training thread is counted) and "end to end" (writer running: its JSON encoding competes
for the GIL, and is paid once per record somewhere in the process).

Usage: python benchmarks/span_overhead.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import goodtrace as gt
from _timing import timeit_ns
from goodtrace.record import spans as _recorder


def floor(n: int) -> None:
    clock = time.perf_counter_ns
    out: list[tuple[int, int]] = []
    for _ in range(n):
        a = clock()
        b = clock()
        out.append((a, b))


class _PlainSpan:
    __slots__ = ("t0",)
    out: list[tuple[int, int]] = []

    def __enter__(self) -> _PlainSpan:
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.out.append((self.t0, time.perf_counter_ns()))


def plain_cm(n: int) -> None:
    _PlainSpan.out = []
    for _ in range(n):
        with _PlainSpan():
            pass


def nullcontext(n: int) -> None:
    null = contextlib.nullcontext
    for _ in range(n):
        with null():
            pass


def goodtrace_span(n: int) -> None:
    span = gt.span
    for _ in range(n):
        with span("forward"):
            pass


def _optional_baselines() -> dict[str, Callable[[int], None]]:
    found: dict[str, Callable[[int], None]] = {}
    try:
        import torch  # noqa: F401
        from torch.profiler import record_function

        def torch_record_function(n: int) -> None:
            for _ in range(n):
                with record_function("forward"):
                    pass

        found["record_function"] = torch_record_function
    except ImportError:
        pass
    try:
        from opentelemetry.sdk.trace import TracerProvider

        tracer = TracerProvider().get_tracer("bench")

        def otel(n: int) -> None:
            for _ in range(n):
                with tracer.start_as_current_span("forward"):
                    pass

        found["otel"] = otel
    except ImportError:
        pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (< 1 minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--no-fallback", action="store_true",
                        help="skip measuring the pure-Python fallback (a second process)")
    args = parser.parse_args()
    n = 20_000 if args.quick else 100_000
    rounds = 5 if args.quick else 11
    slow_n = max(2_000, n // 10)  # record_function and OpenTelemetry are much slower
    optional = _optional_baselines()

    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory() as run_dir:
        for _ in range(rounds):
            add("floor", timeit_ns(floor, n))
            add("plain_cm", timeit_ns(plain_cm, n))
            add("nullcontext", timeit_ns(nullcontext, n))
            for name, body in optional.items():
                add(name, timeit_ns(body, slow_n))
            # hot path: writer parked (huge flush interval; it still takes whole chunks as they
            # fill); finish() writes the rest after the timing. The buffer has one consumer, the
            # writer: emptying it from here raced with a chunk being drained (IndexError).
            gt.init(run_dir, flush_interval_s=3600, max_buffer_records=10**8, record_gc=False)
            add("goodtrace_hot_path", timeit_ns(goodtrace_span, n))
            gt.finish()
            # end to end: the writer encodes and writes every 10 ms while we record
            gt.init(run_dir, flush_interval_s=0.01, record_gc=False)
            add("goodtrace_end_to_end", timeit_ns(goodtrace_span, n))
            gt.finish()
            gt.init(run_dir, enabled=False)
            add("goodtrace_disabled", timeit_ns(goodtrace_span, n))
            gt.finish()

    ns = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {
        "hot_path_vs_floor": ns["goodtrace_hot_path"] / ns["floor"],
        "end_to_end_vs_floor": ns["goodtrace_end_to_end"] / ns["floor"],
        "hot_path_vs_plain_cm": ns["goodtrace_hot_path"] / ns["plain_cm"],
        "plain_cm_vs_floor": ns["plain_cm"] / ns["floor"],
        "disabled_vs_nullcontext": ns["goodtrace_disabled"] / ns["nullcontext"],
    }
    for name in optional:
        ratios[f"{name}_vs_goodtrace_hot_path"] = ns[name] / ns["goodtrace_hot_path"]
    width = max(map(len, ns))
    print(f"ns per span (median of {rounds} interleaved rounds, n={n}); python {sys.version.split()[0]}")
    for name, value in ns.items():
        print(f"  {name:<{width}}  {value:8.0f} ns")
    print("ratios")
    for name, value in ratios.items():
        print(f"  {name:<32} {value:6.2f}x")
    targets = {"hot_path_vs_floor <= 2.5": ratios["hot_path_vs_floor"] <= 2.5,
               "disabled_vs_nullcontext <= 1.5": ratios["disabled_vs_nullcontext"] <= 1.5}
    for target, met in targets.items():
        print(f"  target {target}: {'met' if met else 'NOT met'} ({_recorder.IMPLEMENTATION} spans)")
    fallback: dict[str, Any] | None = None
    if _recorder.IMPLEMENTATION == "c" and not args.no_fallback:
        # The pure-Python spans (no compiler at install, or GOODTRACE_PURE_PYTHON=1): a fresh
        # interpreter, since the implementation is chosen at import; ratios to its own floor.
        argv = [sys.executable, __file__, "--json", "--no-fallback"] + (["--quick"] if args.quick else [])
        env = dict(os.environ, GOODTRACE_PURE_PYTHON="1")
        out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        child = json.loads(out.stdout.strip().splitlines()[-1])
        fallback = {"ns_per_span": {k: child["ns_per_span"][k] for k in
                                    ("floor", "plain_cm", "goodtrace_hot_path", "goodtrace_disabled")},
                    "ratios": {k: child["ratios"][k] for k in
                               ("hot_path_vs_floor", "hot_path_vs_plain_cm", "disabled_vs_nullcontext")}}
        print("pure-Python fallback (GOODTRACE_PURE_PYTHON=1, its own process and floor)")
        for name, value in fallback["ratios"].items():
            print(f"  {name:<32} {value:6.2f}x")
    if args.json:
        result: dict[str, Any] = {"implementation": _recorder.IMPLEMENTATION, "ns_per_span": ns,
                                  "ratios": ratios, "targets_met": targets, "n": n, "rounds": rounds,
                                  "pure_python_fallback": fallback}
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
