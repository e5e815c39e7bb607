"""Each execution's outermost main-thread compute time from a session's compute spans
(:func:`outermost_compute`), and that of a session's kept executions, kept beside its columns
(:func:`kept_outer`), which a re-report adds the new files' spans to (:func:`adds_to`,
:func:`by_seq`): :func:`goodtrace.read.model_fetch.fill_compute`'s pass."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

from goodtrace.columns import distinct_sorted

__all__ = ["COMPUTE_CHUNK", "adds_to", "by_seq", "kept_outer", "outermost_compute"]


COMPUTE_CHUNK = 262_144  # compute spans handled at a time (bounds the temporaries, not the result)


def outermost_compute(t0: Any, t1: Any, step: Any, ex_seq: Any, ex_step: Any, ex_t0: Any, *,
                      reach: int | None = None) -> tuple[Any, Any]:
    """A session's outermost main-thread compute time per execution, from its compute spans
    (``t0``, ``t1``, ``step``: NULL, masked, where a span names no step) and its executions
    (``ex_*``): ``(seq, ns)``, the executions with compute time in ``seq`` order.

    A span nested in an earlier one (in start order, the longer first at equal starts) adds
    nothing, a partial overlap adds its uncovered tail; each part belongs to the execution of
    its step (the span's ambient step) entered last at or before the part began (without a
    step: to the execution entered last), the later-numbered one where two entered at the same
    time; a part of a step that never entered belongs to none. The spans are taken
    :data:`COMPUTE_CHUNK` at a time, in start order, the latest end so far carried across
    (``reach``: the latest end of spans before these, whose parts are counted elsewhere:
    :func:`kept_outer`)."""
    import numpy as np

    no_seq = np.zeros(0, dtype=np.int64)
    t0 = np.asarray(t0, dtype=np.int64)
    if not len(t0) or not len(ex_seq):
        return no_seq, no_seq
    t1 = np.asarray(t1, dtype=np.int64)
    nostep = np.ma.getmaskarray(step)
    step = np.asarray(np.ma.filled(step, 0) if isinstance(step, np.ma.MaskedArray) else step, dtype=np.int64)
    ex_seq, ex_step, ex_t0 = (np.frombuffer(values, dtype=np.int64) if isinstance(values, array)
                              else np.asarray(values, dtype=np.int64) for values in (ex_seq, ex_step, ex_t0))
    in_order = bool(((t0[1:] > t0[:-1]) | ((t0[1:] == t0[:-1]) & (t1[1:] <= t1[:-1]))).all())
    if not in_order:  # fill_compute's fetch sorts them: a copy only for other callers
        order = np.lexsort((-t1, t0))
        t0, t1, step, nostep = t0[order], t1[order], step[order], nostep[order]
        del order
    # executions by entry time (the later-numbered last at equal times): their order as given
    # when they entered one after another, as they do
    by_time = None if bool((ex_t0[1:] > ex_t0[:-1]).all()) else np.lexsort((ex_seq, ex_t0))
    entered_t0 = ex_t0 if by_time is None else ex_t0[by_time]
    per_execution = np.zeros(len(ex_seq), dtype=np.int64)  # ns, by index into ex_*
    reach = np.iinfo(np.int64).min if reach is None else reach  # the latest end of the spans before the chunk
    by_step: tuple[Any, Any] | None = None  # the executions ordered by step, made once when first needed
    for lo in range(0, len(t0), COMPUTE_CHUNK):
        hi = min(lo + COMPUTE_CHUNK, len(t0))
        ends = t1[lo:hi]
        before = np.empty_like(ends)  # the latest end of the spans before each
        before[0] = reach
        np.maximum.accumulate(ends[:-1], out=before[1:])
        np.maximum(before, reach, out=before)
        reach = max(reach, int(ends.max()))
        keep = ends > before
        a = np.maximum(t0[lo:hi], before)[keep]
        ns = ends[keep] - a
        part_step, part_nostep = step[lo:hi][keep], nostep[lo:hi][keep]
        del before, keep
        # the execution entered last at or before each part began: the answer for a part
        # without a step, and for one of the step of that execution
        last = np.searchsorted(entered_t0, a, side="right") - 1
        entered = last >= 0
        if by_time is not None:
            last[entered] = by_time[last[entered]]
        same = entered & (part_nostep | (ex_step[np.maximum(last, 0)] == part_step))
        np.add.at(per_execution, last[same], ns[same])
        other = np.flatnonzero(entered & ~same)
        del last, entered, same
        if len(other):  # of another step than the last entered: by (step, time) among that step's executions
            if by_step is None:
                order_by_step = np.argsort(ex_step, kind="stable")
                by_step = order_by_step, ex_step[order_by_step]
            mine = _executions_of(by_step[0], by_step[1], part_step[other])
            n = len(mine)
            kind = np.concatenate((np.zeros(n, dtype=np.int8), np.ones(len(other), dtype=np.int8)))
            keys_t = np.concatenate((ex_t0[mine], a[other]))
            keys_step = np.concatenate((ex_step[mine], part_step[other]))
            tie = np.concatenate((ex_seq[mine], np.zeros(len(other), dtype=np.int64)))
            merged = np.lexsort((tie, kind, keys_t, keys_step))  # an execution before a part at equal time
            del kind, keys_t, tie
            at = np.where(merged < n, np.arange(len(merged)), -1)
            np.maximum.accumulate(at, out=at)  # the last execution at or before each position
            parts = np.flatnonzero(merged >= n)
            prior = at[parts]
            found = prior >= 0
            found[found] = keys_step[merged[prior[found]]] == keys_step[merged[parts[found]]]
            np.add.at(per_execution, mine[merged[prior[found]]], ns[other[merged[parts[found]] - n]])
    having = np.flatnonzero(per_execution)  # every part is longer than 0
    return by_seq(ex_seq[having], per_execution[having])


def _executions_of(order_by_step: Any, sorted_steps: Any, steps: Any) -> Any:
    """The executions (indexes, ascending) of any of ``steps``, from the executions ordered by
    step: a search per distinct step, not a pass over every execution (once per chunk of spans,
    that grew with the spans times the executions)."""
    import numpy as np

    wanted = distinct_sorted(steps)
    first = np.searchsorted(sorted_steps, wanted, side="left")
    counts = np.searchsorted(sorted_steps, wanted, side="right") - first
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    # the runs [first, first + count) of the ordered executions, end to end
    at = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(total)
    found = order_by_step[at]
    return found if bool((found[1:] > found[:-1]).all()) else np.sort(found)


def kept_outer(steps: Mapping[str, Any], compute: Mapping[str, Any]) -> dict[str, Any]:
    """The outermost compute of a session's kept executions (``steps``: seq, step, t0) from its
    kept compute spans (``compute``, in order), kept beside them: ``seq`` and ``ns`` as
    :func:`outermost_compute` gives them, and ``bounds``: the latest end and the latest start
    of those spans, and how many of the executions entered at or before that end. A re-report
    adds the new files' spans to it (:func:`adds_to`) rather than going over every span again."""
    import numpy as np

    t0, t1 = compute["t0"], compute["t1"]
    seq, ns = outermost_compute(t0, t1, np.ma.MaskedArray(compute["step"], mask=compute["nostep"]),
                                steps["seq"], steps["step"], steps["t0"])
    least = np.iinfo(np.int64).min
    reach = int(t1.max()) if len(t1) else least
    bounds = np.array([reach, int(t0.max()) if len(t0) else least,
                       int(np.count_nonzero(np.asarray(steps["t0"]) <= reach))], dtype=np.int64)
    return {"seq": seq, "ns": ns, "bounds": bounds}


def adds_to(bounds: Any, ex_t0: Any, new_t0: Any) -> bool:
    """Whether new compute spans (starting at ``new_t0``) and the executions now (entered at
    ``ex_t0``) leave the kept outermost compute (:func:`kept_outer`'s ``bounds``) as it is, so
    that the new spans' parts add to it: every new span starts after every kept one (they
    follow in start order, the latest end carried over), and no new execution entered at or
    before the kept spans' latest end (no kept part changes hands)."""
    import numpy as np

    reach, last_start, entered = (int(v) for v in bounds.tolist())
    if len(new_t0) and int(new_t0.min()) <= last_start:
        return False
    return int(np.count_nonzero(np.asarray(ex_t0) <= reach)) == entered


def by_seq(seqs: Any, totals: Any) -> tuple[Any, Any]:
    """(seq, ns) pairs in seq order, each seq once with its ns summed; as they are when they
    already are so (no copy)."""
    import numpy as np

    if bool((seqs[1:] > seqs[:-1]).all()):
        return seqs, totals
    order = np.argsort(seqs, kind="stable")
    seqs, totals = seqs[order], totals[order]
    starts = np.flatnonzero(np.concatenate(([True], seqs[1:] != seqs[:-1])))
    return seqs[starts], np.add.reduceat(totals, starts)
