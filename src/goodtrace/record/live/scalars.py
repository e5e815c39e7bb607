"""The live line as named scalars (``goodtrace/step_time_s``, ...): the names every sink and
the trainer integrations (Hugging Face's ``on_log``) give the live aggregator's numbers.
Naming only: every value is the live line's own.
"""

from __future__ import annotations

from goodtrace.record.live.line import LiveLine

PREFIX = "goodtrace"


def line_scalars(line: LiveLine) -> dict[str, float]:
    """The scalars of one live line (rank 0's log interval; cross-rank metric aggregates)."""
    out: dict[str, float] = {}

    def put(name: str, value: float | None) -> None:
        if value is not None:
            out[f"{PREFIX}/{name}"] = float(value)

    put("step_time_s", line.step_time_s)
    put("train_s", line.train_s)
    for category, seconds in line.overhead_s.items():
        put(f"overhead/{category}_s", seconds)
    put("tokens_per_s", line.tokens_per_s)
    put("tflops_per_s", line.tflops_per_s)
    put("mfu", line.mfu)
    put("goodput/attempt", line.goodput)
    put("goodput/job", line.job_goodput)
    put("ranks", float(line.ranks))
    put("slowest_rank", None if line.slowest_rank is None else float(line.slowest_rank))
    for name, summary in line.metrics.items():
        put(f"metric/{name}", summary.value)
        if line.ranks > 1:
            put(f"metric/{name}/mean", summary.mean)
            put(f"metric/{name}/min", summary.min)
            put(f"metric/{name}/max", summary.max)
    return out
