"""The live line: what rank 0 knows at a log step, and how it is printed.

:class:`LiveLine` is what :class:`goodtrace.record.live.LiveAggregator` hands to listeners
(sinks) and prints through :func:`format_line`: ``step 20 | loss 2.913 | 0.182 s/step = 0.151
train + 0.031 checkpoint_save | 30.4k tok/s | ... | goodput 9.1% (this attempt, rank 0)``: the
goodput is rank 0's since this process started, not the job's across restarts (the report's);
then the ranks slower than they were (``rank 3 computes 22% slower since step 15 (host h3)``).
"""

from __future__ import annotations

import dataclasses

from goodtrace.record.live.slowdown import LiveSlowdown

__all__ = ["LiveLine", "MetricSummary", "format_bytes", "format_line"]


@dataclasses.dataclass(frozen=True)
class MetricSummary:
    """A metric over all ranks and all its values in the interval."""

    name: str
    reduce: str
    count: int
    sum: float
    mean: float
    min: float
    max: float
    std: float
    last: float  # the last value of the highest-numbered rank that has one
    ranks: int = 0  # ranks that had a value in the log interval (the others count zero values)

    @property
    def value(self) -> float:
        """The metric reduced with its own reduction."""
        return float(getattr(self, self.reduce))


@dataclasses.dataclass(frozen=True)
class LiveLine:
    """What rank 0 knows at a log step. Times are rank 0's (job-level numbers are rank 0's)."""

    step: int
    steps: int  # steps in the log interval since the previous line
    ranks: int  # ranks whose vectors were reduced (every rank, whatever metrics it recorded)
    step_time_s: float | None  # log interval time / steps
    train_s: float | None  # productive part of step_time_s
    overhead_s: dict[str, float]  # per overhead category, per step
    metrics: dict[str, MetricSummary]
    tokens_per_s: float | None
    tflops_per_s: float | None
    mfu: float | None
    goodput: float | None  # productive time / time since process start: this attempt only (rank 0's)
    timing: str  # "sync" (from sync points) or "host" (no completion values: host step ends)
    text: str
    # This attempt so far (the computing rank's timeline), for sinks: seconds since process
    # start, productive seconds, and seconds per overhead category.
    elapsed_s: float | None = None
    productive_s: float | None = None
    overhead_total_s: dict[str, float] = dataclasses.field(default_factory=dict)
    wall_ns: int | None = None  # the log interval's end on this host's wall clock
    first_step: int | None = None  # the first step this attempt executed
    rank: int = 0  # the rank that computed the line (rank 0 unless a sink runs on others)
    # Per rank, indexed by rank: step time over the interval, and how late the rank reached the
    # log interval's last sync point (aligned clocks when measured, else host wall clocks).
    rank_step_s: tuple[float, ...] = ()
    rank_lateness_s: tuple[float, ...] = ()
    slowest_rank: int | None = None  # the latest rank at that sync point (None with one rank)
    host_ranks: tuple[int, ...] = ()  # ranks on the computing rank's host
    job_goodput: float | None = None  # the whole job so far (filled by goodtrace.sinks from the run)
    slowdowns: tuple[LiveSlowdown, ...] = ()  # ranks slower than they were (record/live/slowdown.py)


def format_bytes(count: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


def _si(value: float) -> str:
    for suffix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{suffix}"
    return f"{value:.1f}"


def format_line(line: LiveLine) -> str:
    """``step 20 | loss 2.913 | 0.182 s = 0.151 train + 0.031 checkpoint_save | ...``."""
    parts = [f"step {line.step}"]
    loss = line.metrics.get("loss")
    if loss is not None:
        parts.append(f"loss {loss.value:.4f}")
    if line.step_time_s is not None and line.train_s is not None:
        split = " + ".join(f"{v:.3f} {c}" for c, v in line.overhead_s.items() if v >= 0.0005)
        text = f"{line.step_time_s:.3f} s/step = {line.train_s:.3f} train"
        parts.append(text + (f" + {split}" if split else ""))
    if line.tokens_per_s is not None:
        parts.append(f"{_si(line.tokens_per_s)} tok/s")
    if line.tflops_per_s is not None:
        parts.append(f"{line.tflops_per_s:.3g} TFLOP/s")
    if line.mfu is not None:
        parts.append(f"MFU {100 * line.mfu:.1f}%")
    memory = []
    for name, label in (("memory/cuda_peak_allocated_bytes", "cuda"), ("memory/cuda_peak_reserved_bytes", "reserved"),
                        ("memory/rss_bytes", "rss")):
        summary = line.metrics.get(name)
        if summary is not None:
            memory.append(f"{label} {format_bytes(summary.max)}")
    if memory:
        parts.append(" ".join(memory))
    if line.goodput is not None:  # not the job's goodput: earlier attempts and restarts are not in it
        text = format_goodput(line.goodput, line.rank)
        if line.job_goodput is not None:  # a sink read the earlier attempts back
            text += f", {100 * line.job_goodput:.1f}% (job so far)"
        parts.append(text)
    parts.extend(s.text for s in line.slowdowns)
    return " | ".join(parts)


def format_goodput(goodput: float, rank: int = 0) -> str:
    """The words that say which goodput it is: this attempt's so far on this rank's timeline,
    by the report's partition rules (record/live/goodput.py)."""
    return f"goodput {100 * goodput:.1f}% (this attempt, rank {rank})"
