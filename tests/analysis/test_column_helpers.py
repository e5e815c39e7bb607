"""The numpy helpers the cut is built on give what a Python loop over the rows gives: where
each execution is among the numbered ones (a table when they are numbered densely, a search
when not), the labels of a long column as codes, and each interval's overhead per category
(the intervals that follow each other, a cut's, found from their shared edges)."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.analysis.overhead import codes_in, label_codes, overhead_per_interval, positions
from goodtrace.read.loaded import Labels

NAMES = ["poll", "lag", "blocking", "barrier", "exit", ""]


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(-50, 400), max_size=60), wanted=st.lists(st.integers(-60, 420), max_size=60),
       dense=st.booleans())
def test_positions_are_where_each_wanted_key_first_is(keys: list[int], wanted: list[int], dense: bool) -> None:
    ordered = sorted(keys)  # a key may be there twice: its first place
    if dense and ordered:  # every key from the first to the last, once: the offset path
        ordered = list(range(ordered[0], ordered[0] + len(set(ordered))))
    found = positions(np.array(ordered, dtype=np.int64), np.array(wanted, dtype=np.int64))
    assert found.tolist() == [ordered.index(w) if w in ordered else -1 for w in wanted]


def test_positions_of_sparse_keys_search() -> None:
    keys = np.array([0, 10**12, 2 * 10**12], dtype=np.int64)  # a table by key would be huge
    assert positions(keys, np.array([10**12, 5, 2 * 10**12], dtype=np.int64)).tolist() == [1, -1, 2]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.sampled_from(NAMES), max_size=40), wanted=st.sets(st.sampled_from(NAMES)))
def test_labels_as_codes(values: list[str], wanted: set[str]) -> None:
    names = sorted(set(NAMES))
    coded = Labels(array("i", [names.index(v) for v in values]), names)
    assert list(coded) == values and coded == values and len(coded) == len(values)
    assert coded[1:3] == values[1:3]
    assert all(coded[i] == v for i, v in enumerate(values))
    assert all((name in coded) == (name in values) for name in NAMES)
    for column in (coded, values):  # the reader's Labels, or a plain list
        codes, known = label_codes(column)
        assert [known[c] for c in codes.tolist()] == values
        assert codes_in(codes, known, wanted).tolist() == [v in wanted for v in values]


@st.composite
def tilings(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int], list[str]]:
    """Intervals that follow each other, and disjoint overhead intervals in order with labels."""
    t = draw(st.integers(0, 5))
    bounds = [t]
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.integers(0, 6))
        bounds.append(t)
    o, starts, ends, labels = draw(st.integers(-3, 3)), [], [], []
    for _ in range(draw(st.integers(0, 15))):
        o += draw(st.integers(0, 4))
        length = draw(st.integers(0, 5))
        starts.append(o)
        ends.append(o + length)
        labels.append(draw(st.sampled_from(["data", "eval", "checkpoint_save"])))
        o += length
    return bounds[:-1], bounds[1:], starts, ends, labels


def _cover(a: list[int], b: list[int], starts: list[int], ends: list[int], labels: list[str],
           skip_data: bool) -> tuple[list[int], dict[str, list[int]]]:
    """Each interval's productive rest and overhead per label, a Python step per pair."""
    expected: dict[str, list[int]] = {}
    for label in sorted(set(labels)):
        if skip_data and label == "data":
            continue
        per = [sum(max(0, min(e, hi) - max(s, lo)) for s, e, la in zip(starts, ends, labels, strict=True) if la == label)
               for lo, hi in zip(a, b, strict=True)]
        if any(per):
            expected[label] = per
    rest = [hi - lo - sum(v[w] for v in expected.values()) for w, (lo, hi) in enumerate(zip(a, b, strict=True))]
    return rest, expected


@settings(max_examples=300, deadline=None)
@given(tiling=tilings(), skip_data=st.booleans())
def test_overhead_per_interval_is_each_interval_s_cover(
    tiling: tuple[list[int], list[int], list[int], list[int], list[str]], skip_data: bool,
) -> None:
    a, b, starts, ends, labels = tiling
    # the intervals that follow each other (found from their edges), and every other one (not)
    for lo, hi in ((a, b), (a[::2], b[::2])):
        arrays = [np.array(x, dtype=np.int64) for x in (lo, hi, starts, ends)]
        productive, overhead = overhead_per_interval(skip_data, *arrays, labels)
        rest, expected = _cover(lo, hi, starts, ends, labels, skip_data)
        assert {k: list(v) for k, v in overhead.items()} == expected
        assert list(productive) == rest


@settings(max_examples=100, deadline=None)
@given(tiling=tilings(), skip_data=st.booleans())
def test_overhead_per_interval_a_few_intervals_at_a_time_is_the_same(
    tiling: tuple[list[int], list[int], list[int], list[int], list[str]], skip_data: bool,
) -> None:
    """Intervals taken a block at a time (here 3, so that every tiling crosses block edges)
    give each interval's cover as one block does."""
    from goodtrace.analysis import overhead as module

    a, b, starts, ends, labels = tiling
    block = module.BLOCK
    module.BLOCK = 3
    try:
        for lo, hi in ((a, b), (a[::2], b[::2])):
            arrays = [np.array(x, dtype=np.int64) for x in (lo, hi, starts, ends)]
            productive, overhead = overhead_per_interval(skip_data, *arrays, labels)
            rest, expected = _cover(lo, hi, starts, ends, labels, skip_data)
            assert {k: list(v) for k, v in overhead.items()} == expected
            assert list(productive) == rest
    finally:
        module.BLOCK = block


@pytest.mark.parametrize("seed", range(6))
def test_quantile_is_numpys_to_the_bit(seed: int) -> None:
    """``evidence.quantile`` (a partition and numpy's interpolation) equals ``np.quantile``'s
    default (linear) method to the bit: sizes of one to thousands, ties, tiny and huge values,
    the fractions around 0.5 where numpy interpolates from the other end, NaN."""
    from goodtrace.analysis.evidence import quantile

    rng = np.random.default_rng(seed)
    for trial in range(2000):
        n = int(rng.integers(1, 40)) if trial % 4 else int(rng.integers(1, 3000))
        values = (rng.choice([0.5, 0.25, 1e-3, 3.0], n) if trial % 5 == 0
                  else rng.random(n) * 10.0 ** float(rng.integers(-9, 9)))
        if trial % 97 == 0:
            values[int(rng.integers(0, n))] = np.nan
        q = float(rng.choice([0.9, 0.5, 0.99, 0.1, 0.75, 1.0, 0.0, float(rng.random())]))
        want = float(np.quantile(values, q))
        got = quantile(values, q)
        assert got == want or (np.isnan(got) and np.isnan(want)), (n, q, got, want)
