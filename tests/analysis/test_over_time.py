"""Goodput over time and the --since/--until time range, on hand-written runs with known hourly
buckets. The builders' job clock starts at WALL0 = 2023-11-14T22:13:20Z, so the first whole
UTC hour (23:00) is at job time H0 = 2800 s; ``hourly_run`` starts at 22:30."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_analysis_properties import loaded_runs  # the property tests' random runs

from goodtrace.analysis import (
    AnalysisError,
    RangeEdge,
    analyze,
    interval_partition,
    over_time,
    overhead,
    rolling_goodput,
)
from goodtrace.analysis.over_time import default_every_s, goodput_over_time, periodic_partitions
from goodtrace.read.loaded import LoadedRun
from helpers.builders import H0, WALL0, Proc, hourly_run, load, ns


def _hours(result: object) -> list[tuple[float, float, dict[str, float], bool]]:
    over = result.over_time  # type: ignore[attr-defined]
    return [((p.start_wall_ns - WALL0) / 1e9, (p.end_wall_ns - WALL0) / 1e9,
             {k: v / 1e9 for k, v in p.buckets_ns.items()}, p.partial) for p in over.periods]


def test_hourly_buckets_ofhourly_run(tmp_path: Path) -> None:
    result = analyze(load(hourly_run(tmp_path)), every_s=3600.0)
    assert _hours(result) == [
        (H0 - 1800, H0, {"productive": 1200.0, "startup": 600.0}, True),
        # the checkpoint sits in the interval of step 60: [H0+2400, H0+2760] = 300 s + 60 s productive
        (H0, H0 + 3600, {"productive": 3300.0, "checkpoint_save": 300.0}, False),
        (H0 + 3600, H0 + 4600, {"productive": 900.0, "teardown": 100.0}, True),
    ]
    over = result.over_time
    assert over is not None and over.every_s == 3600.0
    assert [p.goodput for p in over.periods] == [1200 / 1800, 3300 / 3600, 900 / 1000]
    # worst = most time lost, so the short first hour (600 s lost) outranks the full one (300 s)
    assert over.worst == (0, 1, 2)
    assert over.periods[1].top_loss() == ("checkpoint_save", ns(300))
    rows = result.to_dict()["goodput_over_time"]
    assert rows[1]["start"] == "2023-11-14T23:00:00Z" and rows[1]["end"] == "2023-11-15T00:00:00Z"
    assert rows[0]["start"] == "2023-11-14T22:30:00Z" and rows[0]["start_s"] == 0.0
    assert rows[1]["buckets"]["checkpoint_save"] == {"ns": ns(300), "seconds": 300.0, "fraction": 300 / 3600}
    assert [row["worst"] for row in rows] == [1, 2, 3]


def test_a_gap_between_attempts_is_a_whole_hour_of_disruption(tmp_path: Path) -> None:
    a0 = Proc(tmp_path, restart=0, start=H0 - 600)
    a0.loop(range(10), H0 - 600, step_s=60.0)  # to H0
    a0.heartbeat(H0 + 60)  # killed a minute after its last step
    a0.write()
    a1 = Proc(tmp_path, restart=1, start=H0 + 4800)
    a1.loop(range(10, 20), H0 + 4800, step_s=60.0)  # to H0 + 5400
    a1.finish(H0 + 5400)
    a1.write()
    result = analyze(load(tmp_path), every_s=3600.0)
    assert _hours(result) == [
        (H0 - 600, H0, {"productive": 600.0}, True),
        (H0, H0 + 3600, {"disruption": 3600.0}, False),
        (H0 + 3600, H0 + 5400, {"productive": 600.0, "disruption": 1200.0}, True),
    ]
    over = result.over_time
    assert over is not None and over.worst == (1, 2)  # the first hour lost nothing
    assert over.periods[1].top_loss() == ("disruption", ns(3600)) and over.periods[1].goodput == 0.0


def test_a_run_shorter_than_the_period_is_one_partial_period(tmp_path: Path) -> None:
    p = Proc(tmp_path, start=H0 + 10)
    p.loop(range(5), H0 + 10)
    p.finish(H0 + 16)
    p.write()
    result = analyze(load(tmp_path), every_s=3600.0)
    assert _hours(result) == [(H0 + 10, H0 + 16, {"productive": 5.0, "teardown": 1.0}, True)]
    assert result.over_time is not None and result.over_time.worst == ()  # nothing to compare with


@pytest.mark.parametrize(("span_s", "every_s"), [
    (0.0, 1.0), (3.0, 1.0), (30.0, 1.0), (34.0, 2.0), (300.0, 10.0), (6400.0, 300.0), (86_400.0, 3600.0),
    (7 * 86_400.0, 6 * 3600.0), (1e12, 365 * 86_400.0),
])
def test_the_default_period_is_a_human_one_that_fits_the_span(span_s: float, every_s: float) -> None:
    assert default_every_s(span_s) == every_s
    if span_s >= 10 and span_s < 1e9:  # about 10 to 30 periods
        assert 10 <= span_s / every_s <= 30


def test_without_every_the_periods_fit_the_run(tmp_path: Path) -> None:
    result = analyze(load(hourly_run(tmp_path)))  # 6,400 s from 22:30 UTC: periods of 5 min
    over = result.over_time
    assert over is not None and over.every_s == 300.0 and len(over.periods) == 22
    assert [p.partial for p in over.periods] == [False] * 21 + [True]  # 22:30 is on a 5 min edge
    assert sum(p.length_ns for p in over.periods) == result.partition.total_ns
    p = Proc(tmp_path / "short", start=H0 + 10)  # a demo-sized run: 34 s
    p.loop(range(33), H0 + 10)
    p.finish(H0 + 44)
    p.write()
    over = analyze(load(tmp_path / "short")).over_time
    assert over is not None and over.every_s == 2.0 and len(over.periods) == 17


def test_a_chosen_period_and_agreement_with_interval_partition(tmp_path: Path) -> None:
    result = analyze(load(hourly_run(tmp_path)), every_s=600.0)
    over = result.over_time
    assert over is not None and len(over.periods) == 11 and over.every_s == 600.0
    for period in over.periods:  # one pass gives what clipping the partition gives, to the ns
        clipped = interval_partition(result.timeline, period.start_wall_ns, period.end_wall_ns)
        assert period.buckets_ns == {k: v for k, v in clipped.buckets_ns.items() if v}
        assert sum(period.buckets_ns.values()) == period.length_ns
    total: dict[str, int] = {}
    for period in over.periods:
        for k, v in period.buckets_ns.items():
            total[k] = total.get(k, 0) + v
    assert total == {k: v for k, v in result.partition.buckets_ns.items() if v}
    with pytest.raises(AnalysisError, match="wider period"):
        periodic_partitions(result.timeline, 1000)  # 1 us periods over 8,000 s
    with pytest.raises(AnalysisError, match="positive"):
        goodput_over_time(result.timeline, 0.0)
    for huge in (1e30, float("inf")):  # one period, the whole job; no overflow
        (whole,) = goodput_over_time(result.timeline, huge).periods
        assert (whole.start_wall_ns, whole.end_wall_ns) == (result.timeline.start, result.timeline.end)
        (rolled,) = rolling_goodput(result.timeline, huge)
        assert rolled.productive_s == 5400.0 and rolled.end_s == 6400.0


def test_since_until_by_time_and_by_step(tmp_path: Path) -> None:
    loaded = load(hourly_run(tmp_path))
    s0 = H0 - 1800
    # step k runs [s0 + 600 + 60k, +60]: 1,200 s after the start is step 10's start (H0 - 600);
    # H0 + 2000 falls inside step 53
    result = analyze(loaded, since=RangeEdge(offset_s=1200.0), until=RangeEdge(wall_ns=WALL0 + ns(H0 + 2000)),
                     every_s=3600.0)
    assert result.time_range == (WALL0 + ns(s0 + 1200), WALL0 + ns(H0 + 2000))
    assert result.window is not None and result.window.buckets_ns["productive"] == ns(2600)
    assert [r.step for r in result.steps] == list(range(10, 54))
    assert result.step_stats.count == 44
    assert _hours(result) == [(H0 - 600, H0, {"productive": 600.0}, True),
                              (H0, H0 + 2000, {"productive": 2000.0}, True)]
    by_step = analyze(load(tmp_path), since=RangeEdge(step=60), until=RangeEdge(step=61))
    assert [r.step for r in by_step.steps] == [60, 61]
    assert by_step.window is not None
    assert {k: v / 1e9 for k, v in by_step.window.buckets_ns.items() if v} == {
        "productive": 120.0, "checkpoint_save": 300.0}
    whole = analyze(load(tmp_path))
    assert by_step.partition == whole.partition  # the headline stays the job's
    assert [p.to_dict(0) for p in whole.over_time.periods] != [  # type: ignore[union-attr]
        p.to_dict(0) for p in by_step.over_time.periods]  # type: ignore[union-attr]


@pytest.mark.parametrize(("since", "until", "message"), [
    (RangeEdge(offset_s=9000.0), None, "after the end of the job"),
    (None, RangeEdge(wall_ns=WALL0), "before the start of the job"),
    (RangeEdge(step=500), None, "no step at or after 500 ran (the highest step is 89)"),
    (None, RangeEdge(step=-1), "no step at or before -1 ran"),
    (RangeEdge(offset_s=100.0), RangeEdge(offset_s=50.0), "the time range is empty"),
])
def test_time_ranges_that_select_nothing_are_clear_errors(tmp_path: Path, since: RangeEdge | None,
                                                    until: RangeEdge | None, message: str) -> None:
    with pytest.raises(AnalysisError, match=message.replace("(", r"\(").replace(")", r"\)")):
        analyze(load(hourly_run(tmp_path)), since=since, until=until)


def test_window_and_time_range_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="not both"):
        analyze(load(hourly_run(tmp_path)), window=(0.0, 10.0), since=RangeEdge(offset_s=1.0))


def test_an_analysis_refused_after_the_cut_leaves_no_file_open(tmp_path: Path) -> None:
    """A time range is resolved after every session is cut: the refusal leaves nothing the cut
    opened (the slowdown series' temporary file) for the garbage collector to find open."""
    import gc
    import warnings

    loaded = load(hourly_run(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(AnalysisError, match="after the end of the job"):
            analyze(loaded, since=RangeEdge(offset_s=9000.0))
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


@contextlib.contextmanager
def _blocks_of(size: int) -> Iterator[None]:
    """The analysis working on its long columns ``size`` elements at a time (``overhead.BLOCK``)."""
    saved = overhead.BLOCK, over_time.BLOCK
    overhead.BLOCK = over_time.BLOCK = size
    try:
        yield
    finally:
        overhead.BLOCK, over_time.BLOCK = saved


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loaded_runs(), st.integers(10**6, 4 * 10**9), st.integers(0, 10**18))
@pytest.mark.slow
def test_periods_are_the_clipped_partition_on_any_run(run: LoadedRun, width: int, origin: int) -> None:
    """Whatever the run and the period: each period's buckets are the partition clipped to it,
    to the ns, and the periods add up to the job."""
    result = analyze(run)
    timeline = result.timeline
    periods = periodic_partitions(timeline, width, origin=origin % width)
    with _blocks_of(2):  # the columns worked on two elements at a time: the same to the ns
        small = analyze(run)
        assert small.partition == result.partition and small.timeline.totals() == timeline.totals()
        assert periodic_partitions(timeline, width, origin=origin % width) == periods
    if timeline.end <= timeline.start:
        assert periods == []
        return
    assert periods[0].start_wall_ns == timeline.start and periods[-1].end_wall_ns == timeline.end
    total: dict[str, int] = {}
    for before, after in itertools.pairwise(periods):
        assert before.end_wall_ns == after.start_wall_ns
    for period in periods:
        clipped = interval_partition(timeline, period.start_wall_ns, period.end_wall_ns)
        assert period.buckets_ns == {k: v for k, v in clipped.buckets_ns.items() if v}
        for k, v in period.buckets_ns.items():
            total[k] = total.get(k, 0) + v
    assert total == {k: v for k, v in result.partition.buckets_ns.items() if v}
