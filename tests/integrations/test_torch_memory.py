"""goodtrace's CUDA memory figures never change the program's own: no reset of the allocator's
peak statistics, ever; the peaks come from the allocator's counters alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import goodtrace as gt
from goodtrace.integrations.torch import instrument
from goodtrace.integrations.torch_memory import CudaPeaks, peak_figures
from goodtrace.testing import capture


def test_peak_figures_are_the_allocators_high_water_marks() -> None:
    stats = {"allocated_bytes.all.current": 100, "allocated_bytes.all.peak": 900,
             "reserved_bytes.all.current": 2048, "reserved_bytes.all.peak": 4096}
    assert peak_figures(stats) == {"memory/cuda_peak_allocated_bytes": 900.0,
                                   "memory/cuda_peak_reserved_bytes": 4096.0}
    assert peak_figures({"allocated_bytes.all.peak": 7}) == {"memory/cuda_peak_allocated_bytes": 7.0}
    assert peak_figures({}) == {}


class Allocator:
    """The numbers CUDA's caching allocator keeps (``torch.cuda.memory_stats``): no CUDA here."""

    def __init__(self) -> None:
        self.current = 0
        self.high = 0

    def allocate(self, n: int) -> None:
        self.current += n
        self.high = max(self.high, self.current)

    def free(self, n: int) -> None:
        self.current -= n

    def reset_peak(self) -> None:
        self.high = self.current

    def stats(self) -> dict[str, int]:
        return {"allocated_bytes.all.current": self.current, "allocated_bytes.all.peak": self.high,
                "reserved_bytes.all.current": 2 * self.current, "reserved_bytes.all.peak": 2 * self.high}


def test_cuda_peaks_read_and_never_reset() -> None:
    allocator = Allocator()
    peaks = CudaPeaks(allocator.stats)
    allocator.allocate(1000)
    allocator.free(600)
    assert peaks.read() == {"memory/cuda_peak_allocated_bytes": 1000.0, "memory/cuda_peak_reserved_bytes": 2000.0}
    allocator.allocate(2000)
    allocator.free(2000)
    assert peaks.read()["memory/cuda_peak_allocated_bytes"] == 2400.0  # the new high
    allocator.reset_peak()  # the program's own reset (torchtitan's, per interval): its peaks from here
    allocator.allocate(100)
    assert peaks.read()["memory/cuda_peak_allocated_bytes"] == 500.0
    assert allocator.high == 500  # goodtrace never moved it


def test_instrument_never_resets_the_programs_peak_memory_statistics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA branch of ``instrument()`` over log steps, on this CPU machine's stand-in for the
    allocator: ``torch.cuda.reset_peak_memory_stats`` is wrapped to record every call (and to
    reset the stand-in's peak, as the real one does), and ``max_memory_allocated()``, what the
    program's own memory monitor reads, must still be the run's true high-water mark."""
    allocator = Allocator()
    resets: list[tuple[Any, ...]] = []

    def recording_reset(*args: Any, **kwargs: Any) -> None:
        resets.append(args)
        allocator.reset_peak()

    def value(of: Callable[[], int]) -> Callable[..., int]:
        return lambda *args, **kwargs: of()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda *args, **kwargs: allocator.stats())
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", value(lambda: allocator.high))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", value(lambda: 2 * allocator.high))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", recording_reset)
    with capture(tmp_path / "run") as cap:
        instrument(log_every=10, cuda_events=False, peak_flops=1e12, printer=lambda text: None)
        for step in range(31):
            with gt.step(step):
                size = 5000 if step == 3 else 100 * (step + 1)  # the run's high: step 3
                allocator.allocate(size)
                allocator.free(size)
    assert resets == []
    assert torch.cuda.max_memory_allocated() == 5000  # the program's own figure, as if goodtrace were absent
    peaks = {r["step"]: r["value"] for r in cap.records("metric") if r["name"] == "memory/cuda_peak_allocated_bytes"}
    # the high-water mark at each log step: step 0's, then step 3's (set in the interval to 10)
    assert peaks == {0: 100.0, 10: 5000.0, 20: 5000.0, 30: 5000.0}
