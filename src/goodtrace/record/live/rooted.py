"""The live line over a rooted transport: what rank 0 sends back after gathering every vector.

With a transport that gathers to rank 0 (PyTorch's gloo group) instead of all-gathering, the
other ranks no longer see every vector, so rank 0 sends them what they use, in two fixed-size
float vectors (docs/semantics.md section 9):

* **the broadcast**, to every rank: the onsets at which every rank sends its own change in the
  next log interval (live/slowdown.py's candidates), and the metric and host names no broadcast
  has carried yet (live/names.py's region), so that every rank names the merged metrics;
* **the summary**, point to point, only to the ranks whose vector says they want the merged
  line (a sink on a rank other than 0): the totals, the merged metrics, the ranks named slower
  than they were, the slowest rank, and the step time and lateness of the ranks of its host.

A rank that has no sink therefore receives one broadcast per log step, whatever the number of
ranks. Framework-neutral: nothing here imports torch or jax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from goodtrace.record.live.line import MetricSummary
from goodtrace.record.live.names import NAME_FLOATS
from goodtrace.record.live.slowdown import CANDIDATES, Candidate, LiveSlowdown

__all__ = [
    "BROADCAST",
    "HOST_RANKS",
    "SLOWDOWNS",
    "Summary",
    "broadcast_names_at",
    "pack_broadcast",
    "pack_summary",
    "summary_size",
    "unpack_candidates",
    "unpack_summary",
]

B_LAYOUT = 1.0
B_HEADER = 2 + 2 * CANDIDATES  # layout, floats of names, then (rank, onset) per candidate
BROADCAST = B_HEADER + NAME_FLOATS

S_LAYOUT = 1.0
S_HEADER = 9  # layout, ranks, tokens, flops, peak, slowest rank, metrics, slowdowns, host ranks
S_METRIC = 10  # slot, reduction, count, sum, mean, min, max, std, last, ranks with a value
SLOWDOWNS = 8  # ranks named slower than they were, sent to the other ranks' sinks (the first ones)
S_SLOW = 6  # rank, onset, before, after, the others' change (NaN: none), host slot
HOST_RANKS = 64  # ranks of one host whose step time and lateness the host's sinks get
S_HOST = 3  # rank, step time, lateness
REDUCTIONS = ("mean", "sum", "min", "max", "std", "last")


def summary_size(max_metrics: int) -> int:
    return S_HEADER + S_METRIC * max_metrics + S_SLOW * SLOWDOWNS + S_HOST * HOST_RANKS


def broadcast_names_at() -> tuple[int, int]:
    """(start of the names region, index of its length) in the broadcast, for ``MetricNames.learn``."""
    return B_HEADER, 1


def pack_broadcast(candidates: Sequence[Candidate], names: Sequence[float]) -> list[float]:
    vector = [B_LAYOUT, float(len(names))]
    for index in range(CANDIDATES):
        if index < len(candidates):
            vector += [float(candidates[index].rank), float(candidates[index].onset_step)]
        else:
            vector += [-1.0, 0.0]
    vector += list(names[:NAME_FLOATS])
    return vector + [0.0] * (BROADCAST - len(vector))


def unpack_candidates(vector: Sequence[float]) -> list[Candidate] | None:
    """The broadcast's onsets (None: not a broadcast of this layout)."""
    if len(vector) != BROADCAST or vector[0] != B_LAYOUT:
        return None
    found = []
    for index in range(CANDIDATES):
        rank, onset = vector[2 + 2 * index], vector[3 + 2 * index]
        if rank >= 0:
            found.append(Candidate(int(rank), int(onset)))
    return found


class Summary(NamedTuple):
    """What a rank with sinks gets of rank 0's merge."""

    ranks: int
    tokens: float
    flops: float
    peak_flops: float
    slowest_rank: int | None
    metrics: dict[str, MetricSummary]
    slowdowns: list[tuple[int, int, float, float, float | None, int]]  # rank, onset, before, after, others, host slot
    host: list[tuple[int, float, float]]  # rank, step time, lateness


def pack_summary(max_metrics: int, ranks: int, tokens: float, flops: float, peak: float, slowest: int | None,
                 metrics: Mapping[str, MetricSummary], slot: Callable[[str], int],
                 slowdowns: Sequence[tuple[LiveSlowdown, int]], host: Sequence[tuple[int, float, float]]) -> list[float]:
    """The summary for one rank: the first ``max_metrics`` merged metrics by name, the first
    ``SLOWDOWNS`` named ranks (each with its host's name slot), its host's ranks (``HOST_RANKS``)."""
    chosen = sorted(metrics)[:max_metrics]
    slow = list(slowdowns)[:SLOWDOWNS]
    rows = list(host)[:HOST_RANKS]
    vector = [S_LAYOUT, float(ranks), tokens, flops, peak, -1.0 if slowest is None else float(slowest),
              float(len(chosen)), float(len(slow)), float(len(rows))]
    for name in chosen:
        m = metrics[name]
        code = REDUCTIONS.index(m.reduce) if m.reduce in REDUCTIONS else 0
        vector += [float(slot(name)), float(code), float(m.count), m.sum, m.mean, m.min, m.max, m.std, m.last,
                   float(m.ranks)]
    vector += [0.0] * (S_METRIC * (max_metrics - len(chosen)))
    for named, host_slot in slow:
        others = math.nan if named.others_increase is None else named.others_increase
        vector += [float(named.rank), float(named.onset_step), named.before_s, named.after_s, others, float(host_slot)]
    vector += [0.0] * (S_SLOW * (SLOWDOWNS - len(slow)))
    for rank, step_s, late in rows:
        vector += [float(rank), step_s, late]
    return vector + [0.0] * (summary_size(max_metrics) - len(vector))


def unpack_summary(vector: Sequence[float], max_metrics: int, names: Mapping[int, str]) -> Summary | None:
    """Rank 0's summary (None: not a summary of this layout)."""
    if len(vector) != summary_size(max_metrics) or vector[0] != S_LAYOUT:
        return None
    n_metrics, n_slow, n_host = (min(int(vector[i]), cap) for i, cap in
                                 ((6, max_metrics), (7, SLOWDOWNS), (8, HOST_RANKS)))
    metrics: dict[str, MetricSummary] = {}
    for index in range(n_metrics):
        base = S_HEADER + S_METRIC * index
        slot, code, count, s, mean, lo, hi, std, last, with_value = vector[base: base + S_METRIC]
        name = names.get(int(slot), f"metric#{int(slot):012x}")
        reduce = REDUCTIONS[int(code)] if 0 <= int(code) < len(REDUCTIONS) else "mean"
        metrics[name] = MetricSummary(name, reduce, int(count), s, mean, lo, hi, std, last, int(with_value))
    slowdowns = []
    base = S_HEADER + S_METRIC * max_metrics
    for index in range(n_slow):
        rank, onset, before, after, others, host_slot = vector[base + S_SLOW * index: base + S_SLOW * (index + 1)]
        slowdowns.append((int(rank), int(onset), before, after, None if math.isnan(others) else others, int(host_slot)))
    base += S_SLOW * SLOWDOWNS
    host = [(int(vector[base + S_HOST * i]), vector[base + S_HOST * i + 1], vector[base + S_HOST * i + 2])
            for i in range(n_host)]
    slowest = int(vector[5]) if vector[5] >= 0 else None
    return Summary(int(vector[1]), vector[2], vector[3], vector[4], slowest, metrics, slowdowns, host)
