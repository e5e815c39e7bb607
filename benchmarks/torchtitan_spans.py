"""Cost of a span on the training thread: torchtitan's ``log_trace_span`` against goodtrace's.

Measured interleaved in one process (machines here are shared and noisy), the median of the
rounds, per span:
  log_trace_span       torchtitan's structured logger with its default JSONL handler (each
                       span writes its _start and _end records through Python logging into
                       the file, on the training thread)
  log_trace_span+gt    the same with goodtrace's handler added (TITAN_STRUCT_LOGGER_HANDLERS):
                       what recording a torchtitan trainer through goodtrace adds to it
  gt.span              goodtrace's own span (recording enabled; the writer thread encodes later)
The ratio is log_trace_span / gt.span, both from the same rounds.

Usage: python benchmarks/torchtitan_spans.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile

import goodtrace as gt
from _timing import timeit_ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and spans (< 1 min)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    rounds, spans = (5, 2_000) if args.quick else (11, 20_000)

    try:
        from torchtitan.observability import structured_logger as sl
        from torchtitan.observability.structured_logger import jsonl_handler
    except ImportError:
        print("torchtitan is not installed (pip install torchtitan==0.3.0)", file=sys.stderr)
        return 1
    from goodtrace.integrations.torchtitan import GoodtraceHandler

    with tempfile.TemporaryDirectory() as folder:
        os.environ.pop("TITAN_STRUCT_LOGGER_HANDLERS", None)
        sl.init_structured_logger(source="training", output_dir=folder, rank=0)
        gt.init(os.path.join(folder, "goodtrace"), max_buffer_records=10_000_000)
        sl.set_step(1)
        logger = logging.getLogger("torchtitan.structured_logger")
        ours = GoodtraceHandler()

        def titan(n: int) -> None:
            span = sl.log_trace_span
            for _ in range(n):
                with span("fwd_bwd"):
                    pass

        def titan_with_goodtrace(n: int) -> None:
            logger.addHandler(ours)
            try:
                titan(n)
            finally:
                logger.removeHandler(ours)

        def goodtrace_span(n: int) -> None:
            span = gt.span
            for _ in range(n):
                with span("fwd_bwd"):
                    pass

        variants = {"log_trace_span": titan, "log_trace_span+gt": titan_with_goodtrace, "gt.span": goodtrace_span}
        results: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, body in variants.items():
                results[name].append(timeit_ns(body, spans))
        gt.finish()
        assert any(isinstance(h, jsonl_handler.TraceJsonlHandler) for h in logger.handlers)

    medians = {name: statistics.median(values) for name, values in results.items()}
    ratio = medians["log_trace_span"] / medians["gt.span"]
    for name, ns in medians.items():
        print(f"{name:20s} {ns / 1000:9.2f} us per span")
    print(f"log_trace_span / gt.span: {ratio:.0f}x ({rounds} rounds of {spans} spans, medians)")
    if args.json:
        print(json.dumps({"ns_per_span": medians, "ratio_titan_to_goodtrace": ratio, "rounds": rounds,
                          "spans": spans}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
