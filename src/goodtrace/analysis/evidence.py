"""When a difference between ranks is evidence and not noise (docs/semantics.md section 7).

A rank is compared with the other ranks at each sampled step: the difference between its value
(compute time, arrival at the sync point, entry into a span) and the other ranks' median at that
step. It is named only when the difference is **consistent** (it has the same sign at most of
the sampled steps, enough of them) and **large** against the rank's own step-to-step noise (a
robust spread of its own values) and against a fixed floor. Pure data, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MIN_SAMPLES = 8  # sampled steps a rank must share with other ranks before it can be named
CONSISTENT = 0.8  # ... the share of them at which it must be behind the other ranks' median
NOISE_FACTOR = 2.0  # ... and its median difference must exceed this many times its own noise


@dataclasses.dataclass(frozen=True)
class Evidence:
    """One rank's difference from the other ranks over the sampled steps they share."""

    effect_s: float  # median over the sampled steps of (this rank - the other ranks' median)
    consistency: float  # share of those steps where this rank was behind (difference > 0)
    samples: int  # sampled steps with at least one other rank
    noise_s: float  # 1.4826 x MAD of the rank's own values step to step

    def beyond_noise(self, floor_s: float = 0.0) -> bool:
        """Whether this is evidence: enough samples, consistent, and larger than
        ``NOISE_FACTOR`` x the rank's own noise and ``floor_s``."""
        return (
            self.samples >= MIN_SAMPLES
            and self.consistency >= CONSISTENT
            and self.effect_s > max(floor_s, NOISE_FACTOR * self.noise_s)
        )

    def to_dict(self) -> dict[str, Any]:
        # every field a number: no deep copy (asdict's, thousands of ranks times three)
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


