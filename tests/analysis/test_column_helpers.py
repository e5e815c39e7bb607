"""The numpy helpers the cut is built on give what a Python loop over the rows gives: where
each execution is among the numbered ones (a table when they are numbered densely, a search
when not), the labels of a long column as codes, which sync record closes which execution,
and each interval's overhead per category (the intervals that follow each other, a cut's,
found from their shared edges)."""

from __future__ import annotations

import itertools
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.analysis.overhead import overhead_per_interval
from goodtrace.analysis.sync_match import assign_syncs
from goodtrace.columns import codes_in, label_codes, positions
from goodtrace.read.loaded import NO_TIME, Labels, SessionRecords

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


@st.composite
def disjoint(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Disjoint intervals in order, some empty, some touching."""
    o, starts, ends = draw(st.integers(-3, 3)), [], []
    for _ in range(draw(st.integers(0, 12))):
        o += draw(st.integers(0, 4))
        length = draw(st.integers(1, 5))
        starts.append(o)
        ends.append(o + length)
        o += length
    return starts, ends


@settings(max_examples=300, deadline=None)
@given(data=disjoint(), over=disjoint(), block=st.sampled_from([1, 2, 3, 1 << 16]))
def test_data_only_pieces_are_those_data_covers_and_overhead_does_not(
    data: tuple[list[int], list[int]], over: tuple[list[int], list[int]], block: int,
) -> None:
    """Of the pieces between consecutive boundaries, those inside a data interval and outside
    every overhead interval, as a loop over the pieces finds them; the same a few points at a
    time (block edges crossed) as all at once."""
    from goodtrace.analysis import overhead as module

    (d0, d1), (o0, o1) = data, over
    if not d0:
        return
    points = sorted(set(d0 + d1 + o0 + o1))
    expected = [any(a <= p and q <= b for a, b in zip(d0, d1, strict=True))
                and not any(a < q and p < b for a, b in zip(o0, o1, strict=True))
                for p, q in itertools.pairwise(points)]
    saved, module.BLOCK = module.BLOCK, block
    try:
        keep = module._data_only(*(np.array(x, dtype=np.int64) for x in (points, d0, d1, o0, o1)))
    finally:
        module.BLOCK = saved
    assert keep.tolist() == expected


@pytest.mark.parametrize("seed", range(6))
def test_quantile_is_numpys_to_the_bit(seed: int) -> None:
    """``columns.quantile`` (a partition and numpy's interpolation) equals ``np.quantile``'s
    default (linear) method to the bit, and so do the step statistics' and the live slowdown
    rule's quantiles (one interpolation, ``change_point.interpolate``): sizes of one to thousands, ties, tiny and huge values,
    the fractions around 0.5 where numpy interpolates from the other end, NaN."""
    from goodtrace.analysis.anomalies import _quantile as step_quantile
    from goodtrace.columns import quantile
    from goodtrace.record.live.change_point import _quantile as live_quantile

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
        if np.isnan(want):
            continue
        # the step statistics' quantiles (values partitioned at the two places) and the live
        # slowdown rule's (a sorted list, stdlib only) take the same interpolation
        low = int(q * (n - 1))
        assert step_quantile(np.partition(values, sorted({low, min(low + 1, n - 1)})), q) == want, (n, q)
        assert live_quantile(values.tolist(), q) == want, (n, q)


def _syncs_read_literally(
    seqs: list[int], numbers: list[int], t0s: list[int], syncs: list[tuple[int, int, int, str]],
) -> tuple[list[int], list[str | None], int]:
    """The rule of :func:`assign_syncs` as a loop: a record names its execution by seq (its
    first place in entry order), or, where it names none (seq -1, older files), the k-th record
    of step n the k-th execution of n; it counts when that execution has its step and entered
    at or before it; the earliest counting record (records are in time order) closes it."""
    first_of = {}
    for i, q in enumerate(seqs):
        first_of.setdefault(q, i)
    runs_of: dict[int, list[int]] = {}
    for i, number in enumerate(numbers):
        runs_of.setdefault(number, []).append(i)
    legacy_seen: dict[int, int] = {}
    times, hows, ignored = [NO_TIME] * len(seqs), [None] * len(seqs), 0
    for seq, step, t, how in syncs:
        if seq >= 0:
            execution = first_of.get(seq)
        else:
            k = legacy_seen[step] = legacy_seen.get(step, -1) + 1
            runs = runs_of.get(step, [])
            execution = runs[k] if k < len(runs) else None
        if execution is None or numbers[execution] != step or t < t0s[execution]:
            ignored += 1
        elif times[execution] == NO_TIME:
            times[execution], hows[execution] = t, how
    return times, hows, ignored


@settings(max_examples=400, deadline=None)
@given(data=st.data(), n=st.integers(0, 12), numbered=st.sampled_from(["in order", "gaps", "shuffled"]))
def test_each_execution_is_closed_by_its_earliest_sync_record(data: st.DataObject, n: int, numbered: str) -> None:
    seqs = list(range(n))
    if numbered == "gaps":
        seqs = [3 * q + 1 for q in seqs]
    elif numbered == "shuffled":
        seqs = data.draw(st.permutations(seqs))
    numbers = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    t0s = sorted(data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)))
    wanted = [*seqs, -1, -1, 99] if n else [-1, 99]
    shape = data.draw(st.sampled_from(["the recorder's", "one each", "any"]))
    if shape == "the recorder's":  # one record per execution, the k-th the k-th
        syncs = [(q, numbers[i], t0s[i] + 5, "lag") for i, q in enumerate(seqs)]
    elif shape == "one each":  # one record per execution, named or not, in time order but not entry order
        syncs = [(data.draw(st.sampled_from([q, -1])), numbers[i], t0s[i] + data.draw(st.integers(0, 30)),
                  data.draw(st.sampled_from(["lag", "poll"]))) for i, q in enumerate(seqs)]
    else:
        syncs = data.draw(st.lists(st.tuples(st.sampled_from(wanted), st.integers(0, 4), st.integers(0, 110),
                                             st.sampled_from(["lag", "poll"])), max_size=16))
    syncs.sort(key=lambda r: r[2])  # the reader gives them in time order
    rec = SessionRecords(sync_seq=array("q", [r[0] for r in syncs]), sync_step=array("q", [r[1] for r in syncs]),
                         sync_t=array("q", [r[2] for r in syncs]), sync_how=[r[3] for r in syncs])
    times, hows, names, ignored = assign_syncs(rec, np.array(seqs, dtype=np.int64),
                                               np.array(numbers, dtype=np.int64), np.array(t0s, dtype=np.int64))
    want_times, want_hows, want_ignored = _syncs_read_literally(seqs, numbers, t0s, syncs)
    assert times.tolist() == want_times
    assert [None if code < 0 else names[code] for code in hows.tolist()] == want_hows
    assert ignored == want_ignored
