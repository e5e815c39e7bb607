"""The verdict: the run's main loss in words, with its evidence (docs/semantics.md 5.6).

:func:`verdict_of` groups the job's buckets into the losses a user acts on (input pipeline,
other host overhead, checkpoints, evaluation, restarts, start-up) and names the largest when it
takes at least :data:`MIN_SHARE` of the job; a named straggler whose delay costs the other ranks
at least :data:`MIN_STRAGGLER_SHARE` of their step time comes first, since its cost hides inside
their productive time. Otherwise the run is compute-bound. Pure: drawn from the analysis's
partition, step intervals and stragglers, never from records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.analysis.ranks import RankFigure, Straggler

__all__ = ["LOSS_GROUPS", "MIN_SHARE", "MIN_STRAGGLER_SHARE", "Loss", "Verdict", "verdict_of"]

NS = 1e9
MIN_SHARE = 0.10  # a loss named as the main one takes at least this share of the job
MIN_STRAGGLER_SHARE = 0.05  # ... a straggler: the others wait at least this share of their step time

# kind -> the buckets it sums; "host-bound" also takes every overhead category not named here
LOSS_GROUPS: dict[str, tuple[str, ...]] = {
    "input-bound": (schema.DATA,),
    "host-bound": (schema.COMPILE, schema.LOG, schema.GC, schema.INIT, schema.PROFILE),
    "checkpoint-heavy": (schema.CHECKPOINT_SAVE, schema.CHECKPOINT_RESTORE),
    "eval-heavy": (schema.EVAL,),
    "restart-heavy": (schema.BUCKET_DISRUPTION, schema.BUCKET_WASTED_PROGRESS),
    "start-up-heavy": (schema.BUCKET_STARTUP, schema.BUCKET_WARMUP, schema.BUCKET_SCHEDULING),
}
_NOT_A_LOSS = frozenset({schema.BUCKET_PRODUCTIVE, schema.BUCKET_TEARDOWN, "in_progress"})


@dataclasses.dataclass(frozen=True)
class Loss:
    """One group of buckets: its kind, time, share of the job and the buckets in it."""

    kind: str
    ns: int
    fraction: float
    buckets: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seconds": self.ns / NS, "fraction": self.fraction,
                "buckets": {name: ns / NS for name, ns in self.buckets.items()}}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The main loss (``kind``), the sentence that names it and its evidence, and every loss
    group, largest first."""

    kind: str
    text: str
    evidence: str
    losses: tuple[Loss, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "evidence": self.evidence,
                "losses": [loss.to_dict() for loss in self.losses]}

    @property
    def line(self) -> str:
        return f"{self.text}; {self.evidence}" if self.evidence else self.text


def _pct(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.01 else f"{fraction:.1%}"


def _groups(buckets: Mapping[str, int], total_ns: int) -> list[Loss]:
    named = {b for group in LOSS_GROUPS.values() for b in group}
    out = []
    for kind, members in LOSS_GROUPS.items():
        chosen = [b for b in members if buckets.get(b, 0) > 0]
        if kind == "host-bound":  # the user's overhead categories are host overhead too
            chosen += sorted(b for b, ns in buckets.items() if ns > 0 and b not in named and b not in _NOT_A_LOSS)
        parts = {b: buckets[b] for b in sorted(chosen, key=lambda b: -buckets[b])}
        ns = sum(parts.values())
        if ns > 0:
            out.append(Loss(kind, ns, ns / total_ns if total_ns > 0 else 0.0, parts))
    out.sort(key=lambda loss: -loss.ns)
    return out


def _straggler_wait(straggler: Straggler, figure: RankFigure | None) -> float | None:
    """What the other ranks wait for the straggler per step, in seconds: the largest of its
    effects that are evidence (extra compute, late arrival, late entry into a span)."""
    if figure is None:
        return None
    effects = [e.effect_s for e in (figure.compute_evidence, figure.arrival_evidence, figure.start_evidence)
               if e is not None and e.effect_s > 0]
    return max(effects) if effects else None


def verdict_of(buckets: Mapping[str, int], total_ns: int, step_ns: int, stragglers: Sequence[Straggler],
               figures: Sequence[RankFigure], step_median_s: float | None) -> Verdict:
    """The verdict of a job whose partition is ``buckets`` over ``total_ns``; ``step_ns`` is the
    time of its step intervals (the share of step time an in-step loss took), ``figures`` the
    ranks' figures behind ``stragglers``, ``step_median_s`` the median step time."""
    losses = _groups(buckets, total_ns)
    by_rank = {f.rank: f for f in figures}
    for straggler in stragglers:
        wait = _straggler_wait(straggler, by_rank.get(straggler.rank))
        if wait is not None and step_median_s and wait / step_median_s >= MIN_STRAGGLER_SHARE:
            return Verdict(
                "straggler-bound",
                f"straggler-bound: rank {straggler.rank} (host {straggler.host}) holds the others back",
                f"the other ranks wait about {wait * 1e3:.1f} ms per step for it ({_pct(wait / step_median_s)} of the "
                f"median step); it {straggler.reason}", tuple(losses))
    main = losses[0] if losses else None
    if main is None or main.fraction < MIN_SHARE:
        productive = buckets.get(schema.BUCKET_PRODUCTIVE, 0) / total_ns if total_ns > 0 else 0.0
        largest = f"; the largest loss, {main.kind.replace('-', ' ')}, is {_pct(main.fraction)} of the job" if main else ""
        return Verdict("compute-bound", "compute-bound: no loss takes 10% of the job",
                       f"{_pct(productive)} of the job was productive{largest}", tuple(losses))
    share = f"{_pct(main.fraction)} of the job"
    parts = ", ".join(f"{name} {ns / NS:.3f} s" for name, ns in main.buckets.items())
    if main.kind == "input-bound":
        in_steps = f"{_pct(main.ns / step_ns)} of step time" if step_ns > 0 else share
        text = "input-bound: the device waited for the input pipeline"
        evidence = f"{in_steps} ({main.ns / NS:.3f} s, {share}) was data loading with no device work queued"
    elif main.kind == "host-bound":
        text = "host-bound: the device waited for the host"
        evidence = f"overhead spans with no device work queued took {share} ({parts})"
    elif main.kind == "restart-heavy":
        text = "restart-heavy: crashes and restarts cost the most"
        evidence = f"{share} was lost to restarts ({parts})"
    elif main.kind == "start-up-heavy":
        text = "start-up-heavy: starting the job cost the most"
        evidence = f"{share} went to start-up ({parts})"
    else:
        what = "checkpoints" if main.kind == "checkpoint-heavy" else "evaluation"
        text = f"{main.kind}: {what} cost the most"
        evidence = f"{share} ({parts})"
    return Verdict(main.kind, text, evidence, tuple(losses))
