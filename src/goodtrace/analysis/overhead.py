"""Main-thread overhead inside one session, on numpy columns: the disjoint intervals of the
overhead and data spans (outermost wins; a blocking span counts from its step's device-dated
sync point; data loading where no overhead is) and, per step interval, the time each category
covers and the productive rest. :mod:`goodtrace.analysis.cut` cuts the session with them.
"""

from __future__ import annotations

from array import array
from typing import Any, NamedTuple, TypeAlias

from goodtrace import schema
from goodtrace.columns import codes_in, distinct_sorted, int64s, int_array, ints, label_codes
from goodtrace.read.loaded import NO_TIME, SessionRecords

DATA = schema.DATA

# The cut works on numpy columns (a long run on thousands of ranks holds millions of
# executions); its results are stored as arrays of Python ints.
Array: TypeAlias = Any  # numpy.ndarray (numpy is imported when a session is cut)
# Elements a column of millions is worked on at a time where a step makes temporaries of its
# length (a long synchronous loop's reference rank: tens of MB each, several at once). 512 KiB
# an int64 temporary: under the 1 MiB above which the report's process maps large blocks afresh
# (cli.analysed.return_freed_memory), so a block's temporaries reuse the last block's memory
# instead of faulting in new pages (2 x 1 M executions: the cut 0.29 -> 0.24 s at 1 << 18)
BLOCK = 1 << 16


def merge_intervals(starts: Array, ends: Array) -> tuple[Array, Array, Array]:
    """Intervals sorted by (start, -end) -> the outermost wins, a partial overlap adds its new
    part: (kept positions, their starts, their ends), disjoint and sorted."""
    import numpy as np

    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64), starts, ends
    reach = np.maximum.accumulate(np.concatenate(([np.int64(NO_TIME)], ends[:-1])))
    keep = np.flatnonzero(ends > reach)
    return keep, np.maximum(starts[keep], reach[keep]), ends[keep]


def _data_only(points: Array, d0: Array, d1: Array, starts: Array, ends: Array) -> Array:
    """Of the pieces between consecutive ``points`` (every data and overhead boundary), those
    the data intervals cover whole and the overhead intervals not at all. Each point is placed
    once among each set of intervals (disjoint and sorted: a cover is its running lengths before
    the place plus its part of the one there), a block of points at a time; the running lengths
    are made once, not once a block (that was quadratic in a long synchronous loop's pieces)."""
    import numpy as np

    keep = np.zeros(max(0, len(points) - 1), dtype=bool)
    d_lengths = d1 - d0
    d_cum = np.concatenate(([np.int64(0)], np.cumsum(d_lengths)))
    o_lengths = ends - starts
    o_cum = np.concatenate(([np.int64(0)], np.cumsum(o_lengths)))
    for lo in range(0, len(keep), BLOCK):
        hi = min(len(keep), lo + BLOCK)
        x = points[lo:hi + 1]
        data = _cover_at(*_places(x, d0), d_lengths, d_cum)
        whole = np.diff(data) == np.diff(x)
        del data
        if len(starts):
            over = _cover_at(*_places(x, starts), o_lengths, o_cum)
            whole &= over[1:] == over[:-1]
            del over
        keep[lo:hi] = whole
    return keep


UNSEEN_DISPATCH_NS = 100_000  # host time of its own step before a span under which the step is taken to have dispatched nothing


class Flattened(NamedTuple):
    """:func:`flatten_overhead`'s result: the disjoint overhead intervals and their categories,
    and the host-overhead rule's two figures inside the step intervals: ``overlapped_ns`` of
    span time that overlapped device work already queued (productive), ``uncertain_ns`` of the
    time charged that followed untraced host time of its own step (work it may have dispatched
    before the span, which the sync points cannot see)."""

    starts: Array
    ends: Array
    labels: list[str]
    overlapped_ns: int = 0
    uncertain_ns: int = 0


def busy_until(exec_t0: Array, exec_t1: Array, synced: Array, t: Array) -> tuple[Array, Array]:
    """For host instants ``t`` (span starts): until when the device still had work of the loop
    dispatched before ``t``, and whether executions dispatched before ``t`` lack a sync point
    of their own (sparse completion: their end is unseen). Work runs in dispatch order on one
    stream, so the device is busy until the sync point of the last execution that exited
    before ``t`` (``synced``: each execution's counted sync point, else NO_TIME); NO_TIME
    where none did."""
    import numpy as np

    i = np.searchsorted(exec_t0, t, side="right") - 1
    safe = np.maximum(i, 0)
    j = np.where((i >= 0) & (t > exec_t1[safe]), i, i - 1)  # the last execution that exited before t
    has = synced != NO_TIME
    reach = np.maximum.accumulate(synced) if len(synced) else synced
    last_synced = np.maximum.accumulate(np.where(has, np.arange(len(synced)), -1)) if len(synced) else synced
    valid = j >= 0
    j = np.maximum(j, 0)
    bound = np.where(valid, reach[j] if len(reach) else NO_TIME, NO_TIME)
    unseen = valid & ((last_synced[j] if len(reach) else -1) < j)
    return bound, unseen


def flatten_overhead(
    rec: SessionRecords, categories: frozenset[str], blocking: frozenset[str],
    exec_t0: Array, exec_t1: Array, device_dated: Array, synced: Array, a: int, b: int, *,
    data_mode: str = "clip", steps_range: tuple[int, int] | None = None,
) -> Flattened:
    """Disjoint (start, end, category) intervals of the main-thread overhead and data spans
    inside [a, b): among overhead spans the outermost wins (a partial overlap adds only its new
    part); data loading counts where no overhead span does. A blocking span that holds the
    device-dated sync point of the step it started in counts from that sync point on (it
    waited for the device). Every other overhead span, and data loading with ``data_mode``
    ``clip``, counts only from where the device had run out of queued work
    (:func:`busy_until`, docs/semantics.md 3.4); ``keep``: data loading counts whole, ``skip``:
    in-step data loading (inside ``steps_range``, the step intervals) is productive."""
    import numpy as np

    codes, names = label_codes(rec.span_category)
    t0, t1 = int64s(rec.span_t0), int64s(rec.span_t1)
    inside = (t1 > a) & (t0 < b)
    is_data = codes_in(codes, names, (DATA,))
    is_over = codes_in(codes, names, categories - {DATA})
    is_block = codes_in(codes, names, (categories & blocking) - {DATA})
    wanted_data = inside & is_data
    if data_mode == "skip" and steps_range is not None:  # only data loading before the first step or after the last interval
        wanted_data &= (t0 < steps_range[0]) | (t1 > steps_range[1])
    # the host-overhead rule: the spans it applies to start where the device ran out of work
    ruled = inside & ((is_over & ~is_block) | (wanted_data if data_mode == "clip" else False))
    r = np.flatnonzero(ruled)
    overlapped = uncertain = 0
    clipped0 = t0.copy() if len(r) else t0
    u0 = u1 = np.zeros(0, dtype=np.int64)
    if len(r) and len(exec_t0):
        s, e = t0[r], t1[r]
        bound, unseen = busy_until(exec_t0, exec_t1, synced, s)
        new0 = np.maximum(s, bound)
        clipped0[r] = new0
        # untraced host time of the span's own step before it: the step may have dispatched work
        # there (only a span charged after at least UNSEEN_DISPATCH_NS of its step, whose step was
        # not complete yet, can be in that case: the cover is found for those alone)
        i = np.maximum(np.searchsorted(exec_t0, s, side="right") - 1, 0)
        own = exec_t0[i]
        in_step = (s >= own) & (s <= exec_t1[i])
        done = in_step & (synced[i] != NO_TIME) & (synced[i] <= s)  # its own step was done already
        unseen &= ~done
        maybe = in_step & ~done & (new0 < e) & (s - own >= UNSEEN_DISPATCH_NS)
        c = np.flatnonzero(maybe)
        if len(c):
            every = np.flatnonzero(inside & (is_over | is_data))
            _, m0, m1 = merge_intervals(*_sorted_spans(t0[every], t1[every]))
            lengths = m1 - m0
            cum = np.concatenate(([np.int64(0)], np.cumsum(lengths)))
            traced = _cover_at(*_places(s[c], m0), lengths, cum) - _cover_at(*_places(own[c], m0), lengths, cum)
            unseen[c[(s[c] - own[c]) - traced >= UNSEEN_DISPATCH_NS]] = True
        if steps_range is not None:
            lo, hi = steps_range
            if bool((new0 != s).any()):  # the rule moved some span's start: by how much, once each
                overlapped = _union_length(s, e, lo, hi) - _union_length(new0, e, lo, hi)
            k = np.flatnonzero(unseen & (new0 < e))
            u0, u1 = _merge_union(np.maximum(new0[k], lo), np.minimum(e[k], hi))
    over = np.flatnonzero(inside & is_over)
    del is_over
    o0, o1 = clipped0[over].copy(), t1[over]
    block = is_block[over]
    del is_block
    if block.any() and len(exec_t0):
        k = np.flatnonzero(block)
        i = np.searchsorted(exec_t0, o0[k], side="right") - 1
        valid = (i >= 0) & (o0[k] <= exec_t1[np.maximum(i, 0)])
        dated = np.where(valid, device_dated[np.maximum(i, 0)], NO_TIME)
        clip = (dated > o0[k]) & (dated < o1[k])
        o0[k[clip]] = dated[clip]
        moved = bool(clip.any())
    else:
        moved = False
    if moved or len(r):  # starts moved: in (start, -end) order again
        live = o1 > o0
        over, o0, o1 = over[live], o0[live], o1[live]
        if len(o0) > 1 and not bool(((o0[1:] > o0[:-1]) | ((o0[1:] == o0[:-1]) & (o1[1:] <= o1[:-1]))).all()):
            order = np.lexsort((-o1, o0))
            over, o0, o1 = over[order], o0[order], o1[order]
    kept, starts, ends = merge_intervals(o0, o1)
    labels = np.array(names, dtype=object)[codes[over[kept]]].tolist() if len(kept) else []
    del inside, is_data
    data = np.flatnonzero(wanted_data & (t1 > clipped0))
    del wanted_data
    if len(data):
        starts, ends, labels = _with_data(starts, ends, labels, *_sorted_spans(clipped0[data], t1[data]))
    if len(u0):
        lengths = ends - starts
        cum = np.concatenate(([np.int64(0)], np.cumsum(lengths)))
        uncertain = int((_cover_at(*_places(u1, starts), lengths, cum)
                         - _cover_at(*_places(u0, starts), lengths, cum)).sum()) if len(starts) else 0
    return Flattened(starts, ends, labels, int(overlapped), uncertain)


def _sorted_spans(t0: Array, t1: Array) -> tuple[Array, Array]:
    """Spans in (start, -end) order, as :func:`merge_intervals` takes them (no sort where they
    are: the reader's spans come in start order)."""
    import numpy as np

    if len(t0) < 2 or bool(((t0[1:] > t0[:-1]) | ((t0[1:] == t0[:-1]) & (t1[1:] <= t1[:-1]))).all()):
        return t0, t1
    order = np.lexsort((-t1, t0))
    return t0[order], t1[order]


def _merge_union(t0: Array, t1: Array) -> tuple[Array, Array]:
    """The union of intervals as disjoint sorted ones (empty ones dropped)."""
    keep = t1 > t0
    _, s, e = merge_intervals(*_sorted_spans(t0[keep], t1[keep]))
    return s, e


def _union_length(t0: Array, t1: Array, lo: int, hi: int) -> int:
    """The length of the union of intervals, clipped to [lo, hi)."""
    import numpy as np

    s, e = _merge_union(np.maximum(t0, lo), np.minimum(t1, hi))
    return int((e - s).sum())


def _with_data(starts: Array, ends: Array, labels: list[str], d0: Array, d1: Array) -> tuple[Array, Array, list[str]]:
    """The overhead intervals with data loading added where no overhead interval is."""
    import numpy as np

    _, d0, d1 = merge_intervals(d0, d1)
    # data loading where no overhead interval is: the data intervals cut at every overhead boundary
    points = distinct_sorted(np.concatenate((d0, d1, starts, ends)))
    keep = _data_only(points, d0, d1, starts, ends)
    g0, g1 = points[:-1][keep], points[1:][keep]
    del points, keep
    if len(g0):  # adjacent pieces are one
        first = np.flatnonzero(np.concatenate(([True], g0[1:] != g1[:-1])))
        last = np.concatenate((first[1:] - 1, [len(g0) - 1]))
        g0, g1 = g0[first], g1[last]
    all0 = np.concatenate((starts, g0))
    order = np.argsort(all0, kind="stable")
    all0 = all0[order]  # one column of millions at a time
    all1 = np.concatenate((ends, g1))[order]
    found = sorted(set(labels) | {DATA})  # the few categories, as codes until the end
    code_of = {name: k for k, name in enumerate(found)}
    codes = np.full(len(order), code_of[DATA], dtype=np.int32)
    codes[:len(labels)] = np.fromiter((code_of[label] for label in labels), dtype=np.int32, count=len(labels))
    del labels
    codes = codes[order]
    del order
    return all0, all1, np.array(found, dtype=object)[codes].tolist()  # references to the shared strings


def overhead_per_interval(
    skip_data: bool, interval_start: Array, interval_end: Array, starts: Array, ends: Array, labels: list[str]
) -> tuple[array[int], dict[str, array[int]]]:
    """Per interval: the productive rest and the overhead per category (``skip_data``: an
    asynchronous loop, where in-step data loading is productive). ``starts``/``ends``: disjoint
    and sorted (:func:`flatten_overhead`'s), so each edge is placed once among all of them, and
    a category's cover before an edge is its lengths before that place plus its part of the one
    there (one search a session, not one a category; a block of intervals at a time, so that
    the temporaries stay a block's)."""
    import numpy as np

    n = len(interval_start)
    rest = np.subtract(interval_end, interval_start, out=ints(n))
    wanted = [label for label in sorted(set(labels)) if not (skip_data and label == DATA)]
    if not wanted or not len(starts) or not n:
        return int_array(rest), {}
    # intervals that follow each other (a cut's): the cover before each edge, found once
    follow = n > 1 and bool((interval_start[1:] == interval_end[:-1]).all())
    codes = np.array(labels, dtype=object)
    lengths = ends - starts
    mine = {label: np.where(codes == label, lengths, 0) for label in wanted}
    del codes, lengths
    cum = {label: np.concatenate(([np.int64(0)], np.cumsum(m))) for label, m in mine.items()}  # lengths before a place
    covered = {label: ints(n) for label in wanted}
    for lo in range(0, n, BLOCK):
        hi = min(n, lo + BLOCK)
        if follow:
            j, offset = _places(np.concatenate((interval_start[lo:lo + 1], interval_end[lo:hi])), starts)
            for label in wanted:
                cover = _cover_at(j, offset, mine[label], cum[label])
                np.subtract(cover[1:], cover[:-1], out=covered[label][lo:hi])
        else:
            end_at, start_at = _places(interval_end[lo:hi], starts), _places(interval_start[lo:hi], starts)
            for label in wanted:
                np.subtract(_cover_at(*end_at, mine[label], cum[label]), _cover_at(*start_at, mine[label], cum[label]),
                            out=covered[label][lo:hi])
    overhead: dict[str, array[int]] = {}
    for label in wanted:
        if covered[label].any():
            rest -= covered[label]
            overhead[label] = int_array(covered[label])
    return int_array(rest), overhead


def _places(x: Array, starts: Array) -> tuple[Array, Array]:
    """Each time in ``x`` among the sorted ``starts``: the last interval starting at or before it
    (0 before the first) and how far past that start it is, clipped at 0."""
    import numpy as np

    j = np.searchsorted(starts, x, side="right")
    j -= 1
    np.maximum(j, 0, out=j)
    offset = x - starts[j]
    np.maximum(offset, 0, out=offset)  # before the first start: 0 past it, and nothing before it
    return j, offset


def _cover_at(j: Array, offset: Array, lengths: Array, cum: Array) -> Array:
    """The cover before each place (:func:`_places`) of intervals of ``lengths`` (0: not
    counted; ``cum``: their running sum from 0): the whole ones before it, and its own part."""
    import numpy as np

    out = np.minimum(offset, lengths[j])
    out += cum[j]
    return out
