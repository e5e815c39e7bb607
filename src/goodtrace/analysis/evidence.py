"""When a difference between ranks is evidence and not noise (docs/semantics.md section 7).

A rank is compared with the other ranks at each sampled step: the difference between its value
(compute time, arrival at the sync point, entry into a span) and the other ranks' median at that
step. It is named only when the difference is **consistent** (it has the same sign at most of
the sampled steps, enough of them) and **large** against the rank's own step-to-step noise (a
robust spread of its own values) and against a fixed floor. Pure data, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from goodtrace.record.live.change_point import interpolate

MIN_SAMPLES = 8  # sampled steps a rank must share with other ranks before it can be named
CONSISTENT = 0.8  # ... the share of them at which it must be behind the other ranks' median
NOISE_FACTOR = 2.0  # ... and its median difference must exceed this many times its own noise
MAD_TO_SIGMA = 1.4826  # makes a median absolute deviation comparable to a standard deviation


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


def median(values: Any) -> float:
    """``float(np.median(values))`` of a numpy array of numbers, to the bit (the middle element,
    or the float64 mean of the middle two; NaN when a float array holds one), without
    ``np.median``'s machinery: tens of microseconds a call, a few calls per session, thousands
    of sessions at many ranks. Empty (NaN, with numpy's warning) and other dtypes: ``np.median``."""
    import numpy as np

    n = len(values)
    kind = values.dtype.kind
    if not n or not (kind in "iu" or values.dtype == np.float64):  # (float32's mean is float32's)
        return float(np.median(values))
    half = n // 2
    kth = [half - 1, half] if n % 2 == 0 else [half]
    if kind == "f":
        kth.append(n - 1)  # NaN sorts last: np.median's check
    part = np.partition(values, kth)
    if kind == "f" and np.isnan(part[-1]):
        return float("nan")
    if n % 2:
        return float(np.float64(part[half]))
    return (float(np.float64(part[half - 1])) + float(np.float64(part[half]))) / 2


def quantile(values: Any, q: float) -> float:
    """``float(np.quantile(values, q))`` of a numpy array of float64 values (its default, linear
    method), to the bit: the two order statistics around ``q * (n - 1)`` by a partition, and
    numpy's interpolation between them (from the upper one when the fraction is 0.5 or more),
    without ``np.quantile``'s machinery (about 80 microseconds a call, one a rank: 10,000 ranks
    made it a second). NaN in the values, an empty array and other dtypes: ``np.quantile``."""
    import numpy as np

    n = len(values)
    if not n or values.dtype != np.float64:
        return float(np.quantile(values, q))
    position = (n - 1) * q
    low = math.floor(position)
    if low >= n - 1:
        part = np.partition(values, n - 1)
        return float("nan") if np.isnan(part[-1]) else float(part[-1])
    part = np.partition(values, [low, low + 1, n - 1])
    if np.isnan(part[-1]):
        return float("nan")
    return interpolate(float(part[low]), float(part[low + 1]), position - low)


def robust_noise(values: Any) -> float:
    """1.4826 x the median absolute deviation of ``values`` (a numpy array; 0 when empty)."""
    import numpy as np

    if not len(values):
        return 0.0
    return float(MAD_TO_SIGMA * median(np.abs(values - median(values))))
