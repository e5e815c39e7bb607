"""Property tests: for random valid timelines (attempts, sparse or missing sync points,
nested and overlapping spans, crashes, restarts from any step, rollbacks inside a process, said
or seen in the step numbers), the buckets are non-negative and add up to the job time exactly,
the labelled pieces tile the job, interval goodput over periods that tile the job adds up to the
whole, and the step table's columns agree with its rows."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodtrace.analysis import analyze, interval_partition
from goodtrace.analysis.cut import FLAG_REWOUND
from goodtrace.read.load import LoadedRun, SessionInfo, SessionRecords
from goodtrace.read.loaded import NO_TIME

WALL0 = 1_700_000_000 * 10**9
SECOND = 1_000_000_000
CATEGORIES = ("compute", "data", "eval", "gc", "checkpoint_save", "checkpoint_restore", "init", "compile",
              "profile", "log", "user_overhead", "user_productive")
HOWS = ("lag", "host", "ready", "blocking", "finish")


@st.composite
def loaded_runs(draw: Any) -> LoadedRun:
    sessions: list[SessionInfo] = []
    records: dict[int, SessionRecords] = {}
    t = 0
    next_step = 0
    submit = WALL0 - draw(st.integers(0, 5 * SECOND)) if draw(st.booleans()) else None
    for a in range(draw(st.integers(1, 3))):
        start = t + draw(st.integers(1, 5 * SECOND))
        mono_base = draw(st.integers(0, 10**12))

        def mono(x: int, base: int = mono_base) -> int:
            return x + base

        cur = start + draw(st.integers(0, 3 * SECOND))
        k = draw(st.integers(0, next_step)) if a else 0
        rec = SessionRecords()
        steps: list[tuple[int, int, int]] = []
        syncs: list[tuple[int, int, int, str]] = []
        for seq in range(draw(st.integers(0, 8))):
            length = draw(st.integers(1, 3 * SECOND))
            host_exit = draw(st.integers(0, length))
            steps.append((k, mono(cur), mono(cur + host_exit)))
            if draw(st.booleans()):
                syncs.append((seq, k, mono(cur + length), draw(st.sampled_from(HOWS))))
            cur += length
            k += 1
            if draw(st.integers(0, 5)) == 0:  # a rollback inside the process: said, or seen in the numbers
                to_step = draw(st.integers(-1, k))
                if draw(st.booleans()):
                    rec.events.append(("rollback", mono(cur), to_step))
                k = to_step + 1 + draw(st.integers(0, 2))  # 0-2 batches skipped
            next_step = max(next_step, k)
        end = cur + draw(st.integers(0, 3 * SECOND))
        spans: list[tuple[str, int, int]] = []
        for _ in range(draw(st.integers(0, 10))):
            s0 = draw(st.integers(start - SECOND, end + SECOND))
            s1 = s0 + draw(st.integers(1, 4 * SECOND))
            spans.append((draw(st.sampled_from(CATEGORIES)), mono(s0), mono(s1)))
        spans.sort(key=lambda s: (s[1], -s[2]))
        syncs.sort(key=lambda s: s[2])
        for seq, (step, t0, t1) in enumerate(steps):
            for column, value in ((rec.step_seq, seq), (rec.step_number, step), (rec.step_t0, t0), (rec.step_t1, t1)):
                column.append(value)
        for seq, step, t, how in syncs:
            for column, value in ((rec.sync_seq, seq), (rec.sync_step, step), (rec.sync_t, t)):
                column.append(value)
            rec.sync_how.append(how)
        for category, t0, t1 in spans:
            if category != "compute":  # the loader keeps main-thread spans of every other category
                rec.span_category.append(category)
                for column, value in ((rec.span_t0, t0), (rec.span_t1, t1), (rec.span_step, NO_TIME)):
                    column.append(value)
        times = [end] + [s[2] - mono_base for s in spans] + [s[1] - mono_base for s in steps]
        last_seen = max(x for x in times if x >= start) if any(x >= start for x in times) else start
        crashed = draw(st.booleans())
        info = SessionInfo(
            index=a, session=f"s{a}", rank=0, world=1, host="h", pid=a, restart=None,
            proc_start=mono(start), init=mono(start), submit_wall=submit,
            wall_anchor=WALL0 + start, mono_anchor=mono(start), last_seen=mono(last_seen),
            finish_completed=None if crashed else draw(st.sampled_from((True, False, None))),
            finish_t=None if crashed else mono(last_seen), has_finish=not crashed, main_tid=1,
            overhead_categories=frozenset({"user_overhead"}),
            first_step=min((s[0] for s in steps), default=None),
            last_step=max((s[0] for s in steps), default=None), step_count=len(steps),
            sync_count=len(syncs),
        )
        sessions.append(info)
        records[a] = rec
        t = last_seen
    return LoadedRun(path="memory", sessions=sessions, details={}, session_records=records)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loaded_runs())
@pytest.mark.slow
def test_buckets_are_non_negative_and_sum_to_the_job_time(run: LoadedRun) -> None:
    result = analyze(run)
    p = result.partition
    assert all(v >= 0 for v in p.buckets_ns.values())
    assert sum(p.buckets_ns.values()) == p.total_ns
    assert sum(p.startup_parts_ns.values()) == p.buckets_ns["startup"]
    pieces = result.timeline.pieces
    assert all(x.end > x.start for x in pieces)
    assert all(x.end == y.start for x, y in itertools.pairwise(pieces))
    if pieces:
        assert (pieces[0].start, pieces[-1].end) == (p.start_wall_ns, p.end_wall_ns)
    table = result.steps
    for i, row in enumerate(table):
        # zero-length only where one readiness check found two steps ready (a tie, semantics 1.4)
        assert row.productive_s >= 0 and (row.step_time_s > 0 or (i > 0 and row.end_ns == table[i - 1].end_ns))
        assert abs(row.productive_s + sum(row.overhead_s.values()) - row.step_time_s) < 1e-6
        # the columns the statistics and anomalies use are the rows' own numbers, bit for bit
        assert (row.step_time_s, row.productive_s, row.first_of_attempt, row.attempt, row.seq, row.shared,
                row.host_timed) == (table.step_time_s[i], table.productive_s[i], table.first_of_attempt[i],
                                    table.attempt[i], table.seq[i], table.shared[i], table.host_timed[i])
        assert row == table[i]
    # MFU's counted steps are the step table's counted rows (re-done after a restart or a rollback excluded)
    assert result.program.counted_steps == sum(1 for row in table if row.counted)
    # a rollback throws an execution away once: no two rewinds claim it, and the flag says which
    for cut in result.cuts.values():
        thrown = [i for r in cut.rewinds for i in r.thrown]
        assert len(thrown) == len(set(thrown))
        assert set(thrown) == {i for i, flags in enumerate(cut.exec_flags) if flags & FLAG_REWOUND}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loaded_runs(), st.lists(st.floats(0.0, 1.0), max_size=6))
@pytest.mark.slow
def test_interval_goodput_over_tiling_periods_adds_up_to_the_whole(run: LoadedRun, cuts: list[float]) -> None:
    result = analyze(run)
    timeline = result.timeline
    total = timeline.end - timeline.start
    edges = sorted({timeline.start, timeline.end, *(timeline.start + round(c * total) for c in cuts)})
    summed: dict[str, int] = {}
    for a, b in itertools.pairwise(edges):
        part = interval_partition(timeline, a, b)
        assert sum(part.buckets_ns.values()) == b - a
        for name, value in part.buckets_ns.items():
            summed[name] = summed.get(name, 0) + value
    assert {k: v for k, v in summed.items() if v} == {k: v for k, v in result.partition.buckets_ns.items() if v}
    if total > 0:
        width = max(total / 3 / 1e9, 1e-9)
        rolled = analyze(run, rolling_s=width).rolling
        assert abs(sum(w.productive_s for w in rolled) - result.partition.seconds("productive")) < 1e-6
