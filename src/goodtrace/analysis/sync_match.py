"""Which sync point closes which step execution (:func:`assign_syncs`), and the numpy helper
the cut shares with it (:func:`occurrence`): the first part of
:func:`goodtrace.analysis.cut.cut_session`."""

from __future__ import annotations

from goodtrace.columns import Array, int64s, label_codes, positions
from goodtrace.read.loaded import NO_TIME, SessionRecords

__all__ = ["assign_syncs", "occurrence"]


def occurrence(keys: Array) -> Array:
    """For each position, how many earlier positions hold the same key (0, 1, 2, ...)."""
    import numpy as np

    n = len(keys)
    if n < 2 or bool((keys[1:] > keys[:-1]).all()):
        return np.zeros(n, dtype=np.int64)  # every key once (step numbers that only rise: the common case)
    order = np.lexsort((np.arange(n), keys))
    sorted_keys = keys[order]
    starts = np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1]))
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    occurrence = np.empty(n, dtype=np.int64)
    occurrence[order] = np.arange(n) - first
    return occurrence


def _executions_named(seqs: Array, wanted: Array) -> Array:
    """The execution (its first place in entry order) each of the seqs ``wanted`` names, -1
    for none."""
    import numpy as np

    if bool((seqs[1:] >= seqs[:-1]).all()):  # executions in entry order (the common case): no sort
        return positions(seqs, wanted)
    order = np.argsort(seqs, kind="stable")
    at = positions(seqs[order], wanted)
    return np.where(at >= 0, order[np.maximum(at, 0)], -1)


def assign_syncs(rec: SessionRecords, seqs: Array, numbers: Array,
                 t0s: Array) -> tuple[Array, Array, tuple[str, ...], int]:
    """The sync time of each execution (NO_TIME: none), how each was taken (int32 codes into the
    names returned next, -1 for none), and the count of sync records that name no execution
    or come before its entry. A sync record names its execution (seq); in older files the k-th
    sync point of step n belongs to the k-th execution of n. When several name one execution,
    the earliest counts."""
    import numpy as np

    n = len(seqs)
    s_seq, s_step, s_t = int64s(rec.sync_seq), int64s(rec.sync_step), int64s(rec.sync_t)
    how_codes, how_names = label_codes(rec.sync_how)
    if len(s_t) == 0 or n == 0:
        return np.full(n, NO_TIME, dtype=np.int64), np.full(n, -1, dtype=np.intc), how_names, len(s_t)
    named = s_seq >= 0
    every_named = bool(named.all())
    if every_named:  # what the recorder writes (the common case): no mask to apply
        index = _executions_named(seqs, s_seq)
    else:
        index = np.full(len(s_t), -1, dtype=np.int64)
        if named.any():
            index[named] = _executions_named(seqs, s_seq[named])
        # older files: match the k-th sync point of a step to its k-th execution
        if n < 2 or bool((numbers[1:] > numbers[:-1]).all()):
            unique, dense = numbers, np.arange(n)  # every number once, in order (the common case)
        else:
            unique, dense = np.unique(numbers, return_inverse=True)
        width = n + 1
        ex_key = dense * width + occurrence(dense)
        legacy = np.flatnonzero(~named)
        at = np.searchsorted(unique, s_step[legacy])
        at_ok = (at < len(unique)) & (unique[np.minimum(at, len(unique) - 1)] == s_step[legacy])
        legacy, at = legacy[at_ok], at[at_ok]
        sy_key = at * width + occurrence(at)
        order = np.argsort(ex_key)
        pos = np.minimum(np.searchsorted(ex_key[order], sy_key), n - 1)
        found = ex_key[order][pos] == sy_key
        index[legacy[found]] = order[pos[found]]
    ok = index >= 0
    if bool(ok.all()):  # every sync record names an execution (the common case): no mask to apply
        ok = numbers[index] == s_step
        ok &= s_t >= t0s[index]
    else:
        some = np.flatnonzero(ok)
        executions_of = index[some]
        ok[some] = (numbers[executions_of] == s_step[some]) & (s_t[some] >= t0s[executions_of])
        del some, executions_of
    ignored = int(len(s_t) - ok.sum())
    candidates = np.flatnonzero(ok)  # sync records sorted by time: the first per execution is the earliest
    named_executions = index[candidates]
    if len(named_executions) < 2 or bool((named_executions[1:] > named_executions[:-1]).all()):
        executions, chosen = named_executions, candidates  # the common case: one each, in order
        if len(executions) == n and len(chosen) == len(s_t):  # every execution and every record: the k-th, the k-th
            return s_t.copy(), how_codes.astype(np.intc), how_names, ignored
    else:
        executions, first = np.unique(named_executions, return_index=True)
        chosen = candidates[first]
    times = np.full(n, NO_TIME, dtype=np.int64)
    hows = np.full(n, -1, dtype=np.intc)
    times[executions] = s_t[chosen]
    hows[executions] = how_codes[chosen]
    return times, hows, how_names, ignored
