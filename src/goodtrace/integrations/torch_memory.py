"""CUDA memory peaks, read without resetting the allocator's statistics.

``torch.cuda.reset_peak_memory_stats()`` is process-wide: a library that calls it changes what
the program's own memory monitor (torchtitan's, Hugging Face's, Lightning's) reports. goodtrace
never calls it. At each log step it reads the allocator's counters once
(``torch.cuda.memory_stats()``) and reports, by :func:`peak_figures`, the high-water marks
``allocated_bytes.all.peak`` and ``reserved_bytes.all.peak``: the peak since the process started,
or since the program's own last reset, never since goodtrace's previous look. Without a reset
the allocator cannot tell a log interval's own peak when it stayed below an earlier high (it
lies somewhere between the current value and that high); the figure is then the high, an upper
bound that in steady training (every step reaches the same peak) is the interval's peak, and
that rises in the interval that set a new high. The program that resets its peaks every
interval (torchtitan does) gets its per-interval peak in goodtrace's figure too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CudaPeaks", "peak_figures"]

# (metric name, allocator statistic: the high-water mark)
PEAK_METRICS = (
    ("memory/cuda_peak_allocated_bytes", "allocated_bytes.all.peak"),
    ("memory/cuda_peak_reserved_bytes", "reserved_bytes.all.peak"),
)


def peak_figures(stats: Mapping[str, Any]) -> dict[str, float]:
    """metric name -> bytes, from one ``torch.cuda.memory_stats()`` mapping: the high-water
    marks as the allocator keeps them (a statistic it lacks is left out)."""
    out: dict[str, float] = {}
    for metric, key in PEAK_METRICS:
        value = stats.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[metric] = float(value)
    return out


class CudaPeaks:
    """The peaks of allocated and reserved CUDA memory from ``stats()`` (default
    ``torch.cuda.memory_stats``) alone: never a reset."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]] | None = None) -> None:
        if stats is None:
            import torch

            stats = torch.cuda.memory_stats
        self._stats = stats

    def read(self) -> dict[str, float]:
        return peak_figures(self._stats())
