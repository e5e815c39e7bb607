"""The live vector: one rank's log interval as a fixed-size list of floats, and rank 0's merge.

A vector is a header, then ``max_metrics`` metric entries, then a region for metric names
(``live/names.py``). All values are integers below 2**53 or floats, so float64 transports carry
them exactly. :func:`pack` builds this rank's; :func:`merge` reduces the gathered vectors of
all ranks into one :class:`MetricSummary` per metric and the ranks' totals. A vector of another
layout (another goodtrace version, another ``max_metrics``) is left out with a warning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from goodtrace.record.live.line import MetricSummary
from goodtrace.record.live.names import NAME_FLOATS
from goodtrace.record.live.slowdown import FIELDS as SLOW_FIELDS

__all__ = [
    "ENTRY",
    "HEADER",
    "H_ALIGNED_END",
    "H_HOST",
    "H_HOST_SLOT",
    "H_LISTENS",
    "H_NAME_FLOATS",
    "H_STEP_S",
    "LAYOUT",
    "REDUCTIONS",
    "Header",
    "Merged",
    "merge",
    "pack",
    "slow_fields",
    "valid",
]

LAYOUT = 4.0  # changes whenever the layout below does
# The header: layout, step, number of entries, tokens, flops, peak flops, floats of names, this
# rank's step time over the log interval, the interval's end on the aligned clock (ns), this
# rank's host (a CRC of its name), its host's name slot, whether it wants the merged line (1.0:
# it has line listeners, a sink on a rank other than 0), then its slowdown fields (live/slowdown.py).
(H_LAYOUT, H_STEP, H_ENTRIES, H_TOKENS, H_FLOPS, H_PEAK, H_NAME_FLOATS, H_STEP_S, H_ALIGNED_END,
 H_HOST, H_HOST_SLOT, H_LISTENS, H_SLOW) = range(13)
HEADER = H_SLOW + SLOW_FIELDS
ENTRY = 8  # slot, reduction, sum, sum of squares, min, max, count, last
REDUCTIONS = ("mean", "sum", "min", "max", "std", "last")  # codes in the entries


class Header(NamedTuple):
    """This rank's figures in a vector's header (besides the layout, the counts and the names)."""

    step: int
    tokens: float
    flops: float
    peak_flops: float  # this rank's peak: its devices' peak FLOP/s summed
    step_s: float  # this rank's step time over the interval
    aligned_end: int  # the interval's end on the aligned clock (ns)
    host_id: float
    host_slot: int
    slow: Sequence[float]  # live/slowdown.py's fields
    listens: bool = False  # this rank wants the merged line (its sinks), not only the onsets


class Merged(NamedTuple):
    """Rank 0's reduction of the gathered vectors."""

    ranks: int  # ranks whose vector had this layout
    tokens: float
    flops: float
    peak_flops: float
    metrics: dict[str, MetricSummary]
    per_rank: list[Sequence[float]]  # the vectors of this layout, in rank order


def pack(header: Header, stats: Mapping[str, list[float]], reductions: Mapping[str, str], names: Sequence[str],
         max_metrics: int, announced: Sequence[float], slot: Callable[[str], int]) -> list[float]:
    """This rank's vector: ``stats`` per metric name (sum, sum of squares, min, max, count,
    last) for ``names``, and the names it announces (``live/names.py``)."""
    vector = [LAYOUT, float(header.step), float(len(names)), header.tokens, header.flops, header.peak_flops,
              float(len(announced)), header.step_s, float(header.aligned_end), header.host_id,
              float(header.host_slot), 1.0 if header.listens else 0.0, *header.slow]
    for name in names:
        code = REDUCTIONS.index(reductions[name]) if reductions[name] in REDUCTIONS else 0
        vector.append(float(slot(name)))
        vector.append(float(code))
        vector.extend(stats[name])
    vector.extend([0.0] * (HEADER + ENTRY * max_metrics - len(vector)))
    vector.extend(announced)
    vector.extend([0.0] * (NAME_FLOATS - len(announced)))
    return vector


def valid(vector: Sequence[float], size: int) -> bool:
    """Whether a gathered vector has this rank's layout."""
    return len(vector) == size and vector[H_LAYOUT] == LAYOUT


def slow_fields(vectors: Sequence[Sequence[float]], size: int) -> list[Sequence[float] | None]:
    """Each rank's slowdown fields (None for a vector of another layout)."""
    return [v[H_SLOW: H_SLOW + SLOW_FIELDS] if valid(v, size) else None for v in vectors]


def merge(vectors: Sequence[Sequence[float]], size: int, max_metrics: int, names: Mapping[int, str],
          warn: Callable[[str, str], None]) -> Merged:
    """Reduce every rank's metric entries (a rank without a value adds a count of zero) and
    sum the ranks' tokens, FLOPs and peaks. ``names``: slot -> metric name, as learned."""
    merged: dict[int, list[float]] = {}  # slot -> sum, sum of squares, min, max, count, last, ranks
    codes: dict[int, int] = {}  # slot -> reduction code of the lowest rank that has a value
    ranks = 0
    tokens = flops = peak = 0.0
    per_rank: list[Sequence[float]] = []
    for rank, vector in enumerate(vectors):
        if not valid(vector, size):
            warn("layout", f"rank {rank} sent a live vector of another layout (another goodtrace "
                 "version, or another max_metrics); the live line leaves that rank out")
            continue
        per_rank.append(vector)
        ranks += 1
        tokens += vector[H_TOKENS]
        flops += vector[H_FLOPS]
        peak += vector[H_PEAK]
        for index in range(min(int(vector[H_ENTRIES]), max_metrics)):
            base = HEADER + ENTRY * index
            slot_value, code_value, s, sq, lo, hi, n, last = vector[base: base + ENTRY]
            if not n > 0:
                continue  # no value on this rank: a count of zero, nothing else
            slot, code = int(slot_value), int(code_value)
            entry = merged.get(slot)
            if entry is None:
                merged[slot] = [s, sq, lo, hi, n, last, 1.0]
                codes[slot] = code
                continue
            entry[0] += s
            entry[1] += sq
            entry[2] = min(entry[2], lo)
            entry[3] = max(entry[3], hi)
            entry[4] += n
            entry[5] = last  # "last": the highest rank's last value
            entry[6] += 1.0
            if code != codes[slot]:
                warn(f"reduce-slot:{slot}", f"ranks reduce metric {names.get(slot, slot)!r} "
                     "differently; the live line uses the lowest rank's reduction")
    metrics: dict[str, MetricSummary] = {}
    for slot, (s, sq, lo, hi, n, last, with_value) in merged.items():
        name = names.get(slot, f"metric#{slot:012x}")
        reduce = REDUCTIONS[codes[slot]] if 0 <= codes[slot] < len(REDUCTIONS) else "mean"
        mean = s / n
        variance = max(0.0, sq / n - mean * mean)
        metrics[name] = MetricSummary(name, reduce, int(n), s, mean, lo, hi, math.sqrt(variance), last,
                                      int(with_value))
    return Merged(ranks, tokens, flops, peak, metrics, per_rank)
