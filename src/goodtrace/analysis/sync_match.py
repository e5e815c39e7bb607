"""Which sync point closes which step execution (:func:`assign_syncs`), and the numpy helper
the cut shares with it (:func:`occurrence`): the first part of
:func:`goodtrace.analysis.cut.cut_session`."""

from __future__ import annotations

from goodtrace.analysis.overhead import Array, _np, label_codes, positions
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


def assign_syncs(rec: SessionRecords, seqs: Array, numbers: Array,
                 t0s: Array) -> tuple[Array, Array, tuple[str, ...], int]:
    """The sync time of each execution (NO_TIME: none), how each was taken (int32 codes into the
    names returned next, -1 for none), and the count of sync records that name no execution
    or come before its entry. A sync record names its execution (seq); in older files the k-th
    sync point of step n belongs to the k-th execution of n. When several name one execution,
    the earliest counts."""
    import numpy as np

    n = len(seqs)
    times = np.full(n, NO_TIME, dtype=np.int64)
    hows = np.full(n, -1, dtype=np.intc)
    s_seq, s_step, s_t = _np(rec.sync_seq), _np(rec.sync_step), _np(rec.sync_t)
    how_codes, how_names = label_codes(rec.sync_how)
    if len(s_t) == 0 or n == 0:
        return times, hows, how_names, len(s_t)
    index = np.full(len(s_t), -1, dtype=np.int64)
    named = s_seq >= 0
    if named.any():
        # executions in entry order (the common case): no sort
        order = None if bool((seqs[1:] >= seqs[:-1]).all()) else np.argsort(seqs, kind="stable")
        at = positions(seqs if order is None else seqs[order], s_seq[named])
        index[named] = at if order is None else np.where(at >= 0, order[np.maximum(at, 0)], -1)
    if (~named).any():  # older files: match the k-th sync point of a step to its k-th execution
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
    ok[ok] &= (numbers[index[ok]] == s_step[ok]) & (s_t[ok] >= t0s[index[ok]])
    ignored = int(len(s_t) - ok.sum())
    candidates = np.flatnonzero(ok)  # sync records sorted by time: the first per execution is the earliest
    named_executions = index[candidates]
    if len(named_executions) < 2 or bool((named_executions[1:] > named_executions[:-1]).all()):
        executions, chosen = named_executions, candidates  # the common case: one each, in order
    else:
        executions, first = np.unique(named_executions, return_index=True)
        chosen = candidates[first]
    times[executions] = s_t[chosen]
    hows[executions] = how_codes[chosen]
    return times, hows, how_names, ignored
