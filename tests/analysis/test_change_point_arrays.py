"""The slowdown rule on numpy arrays (the report's series, millions of executions long) gives
exactly what it gives on Python lists (the live line's and ``goodtrace watch``'s series): the
same onsets, the same levels to the bit, the same changes at another rank's onset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.record.live.change_point import change_at, change_point, judge, own_slowdown

pytestmark = pytest.mark.unit


def _series(seed: int, n: int, shift_at: float, factor: float, noise: float, ties: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 0.1 * (1 + noise * rng.standard_normal(n))
    x[int(shift_at * n):] *= factor
    if ties:  # repeated values: the medians and the quantile meet equal neighbours
        x = np.round(x, 3)
    return x


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 400),
    shift_at=st.floats(0.0, 1.0),
    factor=st.sampled_from([1.0, 1.05, 1.2, 1.5, 3.0, 0.7]),
    noise=st.sampled_from([0.0, 0.01, 0.1, 0.5]),
    ties=st.booleans(),
)
def test_arrays_and_lists_agree_to_the_bit(seed: int, n: int, shift_at: float, factor: float, noise: float,
                                           ties: bool) -> None:
    x = _series(seed, n, shift_at, factor, noise, ties)
    steps = np.arange(100, 100 + n, dtype=np.int64)
    k_list, k_array = change_point(x.tolist()), change_point(x)
    assert k_list == k_array
    if k_list is not None:
        assert judge(x.tolist(), k_list) == judge(x, k_list)
    assert own_slowdown(steps.tolist(), x.tolist()) == own_slowdown(steps, x)
    for onset in (100, 100 + n // 3, 100 + n // 2, 100 + n):
        assert change_at(steps.tolist(), x.tolist(), onset) == change_at(steps, x, onset)
        assert change_at(range(100, 100 + n), x, onset) == change_at(steps.tolist(), x.tolist(), onset)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(20, 200))
def test_unordered_steps_agree(seed: int, n: int) -> None:
    """Repeated and decreasing step numbers (a rollback): the first execution at or past the onset."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(0, n, n).astype(np.int64)
    x = 0.1 + rng.random(n)
    for onset in (0, n // 4, n // 2, n):
        assert change_at(steps.tolist(), x.tolist(), onset) == change_at(steps, x, onset)


def test_a_slowdown_is_found_alike() -> None:
    """A clear slowdown: both forms name the same onset and levels (not only "nothing found")."""
    x = _series(7, 2_000, 0.6, 1.5, 0.02, False)
    steps = np.arange(2_000, dtype=np.int64)
    found = own_slowdown(steps, x)
    assert found is not None and found.onset_step == 1_200
    assert found == own_slowdown(steps.tolist(), x.tolist())
