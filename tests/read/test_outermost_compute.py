"""Each execution's outermost compute time (``outermost.outermost_compute``), checked against
a plain reading of its rule, one span at a time, on random sessions with nested and
overlapping spans, spans without a step, steps entered twice (a re-done step), spans of a step
that never entered, and executions entered at the same time; and the result kept for a
session's closed files, the later files' spans added to it, checked against the whole session's
wherever the reader would use it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from goodtrace.read import outermost
from goodtrace.read.outermost import outermost_compute


def _reference(spans: list[tuple[int, int, int | None]], executions: list[tuple[int, int, int]]) -> dict[int, int]:
    """The rule read literally: spans in start order (the longer first at equal starts); a
    span's part past the latest end of the spans before it counts; the part goes to the
    execution of its step entered last at or before the part began (without a step: the
    execution entered last), the higher-numbered one at equal entry times."""
    out: dict[int, int] = {}
    reach: int | None = None
    for t0, t1, step in sorted(spans, key=lambda s: (s[0], -s[1])):
        if reach is not None and t1 <= reach:
            continue
        a = t0 if reach is None else max(t0, reach)
        reach = t1 if reach is None else max(reach, t1)
        candidates = [(e_t0, seq) for seq, e_step, e_t0 in executions
                      if e_t0 <= a and (step is None or e_step == step)]
        if candidates:
            seq = max(candidates)[1]
            out[seq] = out.get(seq, 0) + (t1 - a)
    return out


def _session(rng: random.Random) -> tuple[list[tuple[int, int, int | None]], list[tuple[int, int, int]]]:
    executions: list[tuple[int, int, int]] = []
    t = 1_000
    step = 0
    for seq in range(rng.randint(1, 12)):
        if rng.random() < 0.2 and step > 0:
            step -= 1  # a re-done step
        executions.append((seq, step, t))
        if rng.random() > 0.15:  # else the next one enters at the same time
            t += rng.randint(1, 50)
        step += 1
    spans: list[tuple[int, int, int | None]] = []
    for _ in range(rng.randint(1, 30)):
        t0 = rng.randint(900, t + 60)
        step_of: int | None = rng.choice([None, rng.randint(-1, step + 1), executions[-1][1]])
        spans.append((t0, t0 + rng.randint(1, 80), step_of))
        if rng.random() < 0.2:  # a span starting with an earlier one
            spans.append((t0, t0 + rng.randint(1, 80), step_of))
    return spans, executions


def test_outermost_compute_follows_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in range(300):
        _check(seed)
    monkeypatch.setattr(outermost, "COMPUTE_CHUNK", 3)  # the latest end carried across chunks
    for seed in range(300):
        _check(seed)


def _check(seed: int) -> None:
    rng = random.Random(seed)
    spans, executions = _session(rng)
    rng.shuffle(spans)  # as files hold them: in the order they ended, across files
    given = list(executions)
    if seed % 2:
        rng.shuffle(given)  # not in seq order
    t0 = np.array([s[0] for s in spans], dtype=np.int64)
    t1 = np.array([s[1] for s in spans], dtype=np.int64)
    step = np.ma.masked_array([s[2] or 0 for s in spans], mask=[s[2] is None for s in spans], dtype=np.int64)
    seqs, ns = outermost_compute(t0, t1, step, *(np.array(column, dtype=np.int64) for column in zip(*given, strict=True)))
    assert list(seqs) == sorted(seqs), seed
    assert dict(zip(seqs.tolist(), ns.tolist(), strict=True)) == _reference(spans, executions), seed


def test_no_spans_or_no_executions() -> None:
    empty = np.zeros(0, dtype=np.int64)
    one = np.array([5], dtype=np.int64)
    for args in ((empty, empty, empty, one, one, one), (one, one + 1, one, empty, empty, empty)):
        seqs, ns = outermost_compute(*args)
        assert len(seqs) == 0 and len(ns) == 0


def _columns(spans: list[tuple[int, int, int | None]], executions: list[tuple[int, int, int]]) -> tuple[dict, dict]:
    """A session's compute spans in their kept order (start, the longer first) and its executions, as columns."""
    ordered = sorted(spans, key=lambda s: (s[0], -s[1]))
    compute = {"t0": np.array([s[0] for s in ordered], dtype=np.int64),
               "t1": np.array([s[1] for s in ordered], dtype=np.int64),
               "step": np.array([s[2] or 0 for s in ordered], dtype=np.int64),
               "nostep": np.array([s[2] is None for s in ordered], dtype=bool)}
    steps = {name: np.array([e[k] for e in executions], dtype=np.int64) for k, name in enumerate(("seq", "step", "t0"))}
    return steps, compute


def _resumed(spans: list[tuple[int, int, int | None]], executions: list[tuple[int, int, int]],
             boundary: int, written: list[int] | None = None) -> dict[int, int] | None:
    """The outermost compute of the records written by ``boundary`` (the kept files: a span is
    written when it ends, an execution when it enters, or at ``written``), kept
    (``kept_outer``), with the later spans' parts added to it, where ``_adds_to`` says they can
    be; None where it says not."""
    kept_spans = [s for s in spans if s[1] <= boundary]
    new_spans = [s for s in spans if s[1] > boundary]
    at = written or [e[2] for e in executions]
    kept_steps, kept_compute = _columns(kept_spans, [e for e, w in zip(executions, at, strict=True) if w <= boundary])
    outer = outermost.kept_outer(kept_steps, kept_compute)
    steps, compute = _columns(new_spans, executions)
    if not outermost.adds_to(outer["bounds"], steps["t0"], compute["t0"]):
        return None
    seq, ns = outermost_compute(compute["t0"], compute["t1"], np.ma.MaskedArray(compute["step"], mask=compute["nostep"]),
                                steps["seq"], steps["step"], steps["t0"], reach=int(outer["bounds"][0]))
    seq, ns = outermost.by_seq(np.concatenate((outer["seq"], seq)), np.concatenate((outer["ns"], ns)))
    assert list(seq) == sorted(set(seq.tolist()))
    return dict(zip(seq.tolist(), ns.tolist(), strict=True))


def test_the_kept_outermost_compute_with_new_spans_added_is_the_whole_session_s() -> None:
    """Wherever the kept result is used (the new spans start after the kept ones, no new
    execution entered before the kept spans end), it is the one computed over every span."""
    used = 0
    for seed in range(400):
        rng = random.Random(seed)
        spans, executions = _session(rng)
        boundary = rng.randint(900, max(t1 for _, t1, _ in spans) + 10)
        # an execution's record written when it entered, or later (when it left)
        written = [e[2] + (rng.randint(0, 60) if seed % 2 else 0) for e in executions]
        found = _resumed(spans, executions, boundary, written)
        if found is not None:
            used += 1
            assert found == _reference(spans, executions), seed
    assert used > 100  # the random sessions overlap a lot: still, many are resumed


def test_a_growing_loop_s_kept_outermost_compute_is_resumed() -> None:
    """A loop's steps one after another (a compute span or two in each, nested or not, some
    without a step), the files closing between any two steps: the kept result is always used."""
    for seed in range(200):
        rng = random.Random(seed)
        executions, spans, t = [], [], 1_000
        for seq in range(rng.randint(2, 15)):
            executions.append((seq, seq, t))
            start = t + rng.randint(0, 3)
            end = start + rng.randint(1, 20)
            spans.append((start, end, rng.choice([seq, None])))
            if rng.random() < 0.4:
                spans.append((start + 1, end, seq))  # nested
            t = end + rng.randint(1, 5)
        cut = rng.randint(1, len(executions) - 1)
        boundary = executions[cut][2] - 1  # between two steps
        found = _resumed(spans, executions, boundary)
        assert found is not None, seed
        assert found == _reference(spans, executions), seed
