"""The Perfetto/Chrome trace renderer and ``goodtrace trace``: events, selection, golden output,
the real CLI, and the real Perfetto UI (offline, headless Chromium) querying its own engine."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace import schema
from goodtrace.analysis import RunAnalysis, analyze
from goodtrace.analysis.intervals import session_intervals, slice_clock_range, slice_steps
from goodtrace.cli.ranges import format_ranks, parse_ranks, parse_steps
from goodtrace.read import raw
from goodtrace.read.load import load_run
from goodtrace.read.loaded import LoadedRun
from goodtrace.read.raw import RawRecord
from goodtrace.renderers import perfetto
from goodtrace.renderers.perfetto import PerfettoRenderer, Selection
from helpers.browser import (
    EVIL,
    MS,
    LoadedTrace,
    PerfettoUI,
    artifact,
    awkward_copy,
    perfetto_ui,
    write_small_run,
)
from helpers.cli import Ran, goodtrace

GOLDEN = Path(__file__).parent.parent / "data" / "golden_trace_small"
UPDATE = os.environ.get("GOODTRACE_UPDATE_GOLDEN") == "1"


def _analysed(run_dir: Path) -> tuple[RunAnalysis, LoadedRun]:
    loaded = load_run(run_dir)
    return analyze(loaded), loaded


def test_a_slice_reads_only_the_files_that_can_hold_what_it_draws(tmp_path: Path) -> None:
    """A trace of a few steps of a long session reads the files whose records' times reach the
    slice, or whose tags, events and metrics are of its steps, or of the steps its intervals
    close on (a device metric): the same trace as a read of every file, from fewer files. The
    session holds, each in a file of its own far from the slice, a tag of a step of the slice,
    the device time of the step that closes the slice's last interval (shared: step 14 has no
    sync point of its own), a device metric without a step, and a span from long before the
    slice to long after it."""
    from helpers.builders import Proc

    run_dir = tmp_path / "run"
    proc = Proc(run_dir, start=0.0)
    t = 1.0
    for k in range(60):
        if k == 5:
            proc.span("epoch", t, t + 30.0)  # from step 5 to step 35, in a file before the slice
        proc.step(k, t, t + 1.0)
        proc.span("forward", t + 0.1, t + 0.9, step=k)
        if k != 14:
            proc.sync(k, t + 1.0, "lag")
        proc.metric("loss", k, 1.0 / (k + 1), t + 1.0)
        if k == 40:
            proc.tag(12, "late", t + 0.5)
        if k == 50:
            proc.metric(schema.DEVICE_BUSY_METRIC, 15, 0.25, t + 0.5)
        if k == 45:  # a device metric without a step: the trace writes it whatever its time
            proc.lines.append({"kind": "metric", "name": schema.DEVICE_IDLE_METRIC, "step": None, "value": 0.5,
                               "reduce": "mean", "t": proc.mono(t)})
        t += 1.0
    proc.finish(t)
    proc.write(segment_lines=10)
    analysis, loaded = _analysed(run_dir)
    files = loaded.files[0]
    assert len(files) >= 20
    selection = Selection(steps=(10, 14))
    drawn = slice_steps(analysis, 0, selection.steps)
    assert drawn == (10, 15)  # the last interval closes on step 15
    window = slice_clock_range(analysis, 0, selection.steps)
    chosen = raw._files_for(loaded, 0, window, selection.steps, drawn, False)
    assert files[-1] in chosen and len(chosen) <= len(files) // 2, (len(chosen), len(files))
    trace = PerfettoRenderer(selection).render(analysis, loaded)
    events = _events(trace)
    assert any(e.get("name") == "late" for e in events) and any(e.get("name") == "epoch" for e in events)
    assert any(e.get("name") == "device busy" for e in events)
    assert any(e.get("name") == schema.DEVICE_IDLE_METRIC and e.get("ph") == "C" for e in events)
    ranges, loaded.file_ranges = loaded.file_ranges, {}  # no ranges: every file read
    assert raw._files_for(loaded, 0, window, selection.steps, drawn, False) == files
    assert PerfettoRenderer(selection).render(analysis, loaded) == trace
    loaded.file_ranges = ranges


def _render(run_dir: Path, selection: Selection | None = None) -> str:
    analysis, loaded = _analysed(run_dir)
    return PerfettoRenderer(selection).render(analysis, loaded)


def _session(analysis: RunAnalysis, rank: int, attempt: int) -> int:
    return next(i for i in analysis.cuts if analysis.sessions[i].rank == rank and analysis.attempt_of[i] == attempt)


def _events(text: str) -> list[dict[str, Any]]:
    return list(json.loads(text)["traceEvents"])


def _slices(events: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_run(tmp_path_factory.mktemp("small") / "run")


# ------------------------------------------------------------------------------ the model


def test_step_intervals_split_overhead_and_start_at_previous_sync(small_run: Path) -> None:
    analysis, _ = _analysed(small_run)
    session = _session(analysis, 0, 1)
    intervals = {iv.step: iv for iv in session_intervals(analysis, session)}
    assert sorted(intervals) == [3, 4, 5, 6]
    # Step 3 (first of the attempt) starts when it was entered; step 4's interval holds the
    # checkpoint saved after step 3 (a blocking span settles step 3 first), and step 4's data
    # loading after it, with no device work queued (data badput).
    assert intervals[3].duration_ns == 100 * MS
    assert intervals[4].start == intervals[3].end
    assert intervals[4].duration_ns == 140 * MS
    assert intervals[4].overhead_ns == {"checkpoint_save": 40 * MS, "data": 10 * MS}
    assert intervals[4].productive_ns == 90 * MS
    cut = analysis.cuts[session]
    assert list(cut.exec_compute) == [50 * MS] * 4  # outermost main-thread compute per execution


def test_sparse_sync_points_make_one_shared_interval(small_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "sparse"
    shutil.copytree(small_run, run_dir)
    path = next((run_dir / "rank-00000").glob("a0-*.jsonl"))
    lines = [line for line in path.read_text().splitlines()
             if not (json.loads(line)["kind"] == "sync" and json.loads(line)["step"] in (1, 2))]
    path.write_text("\n".join(lines) + "\n")
    analysis, _ = _analysed(run_dir)
    intervals = session_intervals(analysis, _session(analysis, 0, 0))
    assert [(iv.first_step, iv.step) for iv in intervals] == [(0, 0), (1, 3)]
    assert intervals[1].duration_ns == 300 * MS and intervals[1].is_shared


def test_format_ranks_is_what_parse_ranks_reads() -> None:
    assert format_ranks({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert format_ranks({3}) == "3"
    assert format_ranks(set()) == ""
    assert parse_ranks(format_ranks({0, 1, 2, 5, 7, 8, 100})) == {0, 1, 2, 5, 7, 8, 100}


def test_parse_selection() -> None:
    assert parse_steps("3:7") == (3, 7)
    assert parse_steps("3:") == (3, None)
    assert parse_steps(":7") == (None, 7)
    assert parse_steps("5") == (5, 5)
    assert parse_ranks("0,3,8-10") == frozenset({0, 3, 8, 9, 10})
    for bad in ("7:3", "a:b", "1:2:3"):
        with pytest.raises(ValueError):
            parse_steps(bad)
    for bad in ("", "x", "5-2", "-1"):
        with pytest.raises(ValueError):
            parse_ranks(bad)


# ------------------------------------------------------------------------------ the trace


def test_trace_structure(small_run: Path) -> None:
    analysis, loaded = _analysed(small_run)
    events = _events(PerfettoRenderer().render(analysis, loaded))
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1: "rank 0 (node-a)", 2: "rank 1 (node-a)", 3: "rank 2 (node-b)"}
    # Spans: category and step in args; rank 2 is the slow one.
    forward = _slices(events, name="forward", pid=3)
    assert len(forward) == 9 and all(e["cat"] == "compute" and e["dur"] == 80_000 for e in forward)
    assert sorted(e["args"]["step"] for e in forward) == [0, 1, 2, 3, 3, 4, 4, 5, 6]  # crashed in 4
    # Step track with the overhead split.
    step4 = [e for e in _slices(events, name="step 4") if e["args"]["attempt"] == 1]
    assert len(step4) == 3
    # rank 1 measured a 5 ms device-idle gap before each step (CUDA events) while it loaded data:
    # the analysis charges that as data; the others load their batch with no device work queued
    # (10 ms of data); the trace shows the analysis's split
    assert {e["pid"]: e["args"]["overhead_ms"] for e in step4} == {
        1: {"checkpoint_save": 40.0, "data": 10.0}, 2: {"checkpoint_save": 40.0, "data": 5.0},
        3: {"checkpoint_save": 40.0, "data": 10.0}}
    assert all(e["args"]["step_time_ms"] == 140.0 for e in step4)
    # Aligned clocks: every rank's step 2 ends at the same true time, although rank 1's
    # header wall clock is 20 ms off (corrected by its measured offset) and every process has
    # a different monotonic base.
    step2_ts = {e["pid"]: e["ts"] for e in _slices(events, name="step 2")}
    assert len(step2_ts) == 3 and len(set(step2_ts.values())) == 1
    # Tags, events and metrics.
    tags = [e for e in events if e["ph"] == "i" and e["cat"] == "tag"]
    assert len(tags) == 6 and {e["name"] for e in tags} == {"checkpoint"}
    spikes = [e for e in events if e["ph"] == "i" and e["name"] == "loss spike"]
    assert len(spikes) == 3 and spikes[0]["args"]["attrs"]["loss"] == 9.5
    counters = Counter(e["name"] for e in events if e["ph"] == "C")
    assert counters == {"loss": 3 * 8, "device/busy_s": 4, "device/idle_s": 4}
    # Device time on its own track; the crash is visible.
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    device = _slices(events, cat="device", pid=1)  # spans of category "device"
    assert len(device) == 4 and {threads[(1, e["tid"])] for e in device} == {"device (attempt 1)"}
    # Per-step device-busy metrics (CUDA events): exact duration, drawn ending at the sync point.
    measured = _slices(events, cat="device", pid=2)
    assert [e["args"]["step"] for e in measured] == [3, 4, 5, 6]
    assert all(e["dur"] == 70_000 and e["args"]["attrs"]["idle_before_ms"] == 5.0 for e in measured)
    step_end = {e["args"]["step"]: e["ts"] + e["dur"] for e in _slices(events, cat="step", pid=2)
                if e["args"]["attempt"] == 1}
    assert all(e["ts"] + e["dur"] == step_end[e["args"]["step"]] for e in measured)
    assert {threads[(2, e["tid"])] for e in measured} == {"device (attempt 1)"}
    lifecycle = Counter(e["name"] for e in events if e.get("cat") == "lifecycle")
    assert lifecycle == {"killed (no finish record)": 3, "completed": 3}
    # The steps track is the analysis's step table, to the nanosecond (rank 0 is the reference).
    origin = json.loads(PerfettoRenderer().render(analysis, loaded))["otherData"]["origin_wall_ns"]
    track = sorted((round(float(e["ts"]) * 1000) + origin, round(float(e["ts"] + e["dur"]) * 1000) + origin)
                   for e in _slices(events, cat="step", pid=1))
    assert track == sorted((r.start_ns, r.end_ns) for r in analysis.steps)


def test_selection_by_steps_ranks_and_attempt(small_run: Path) -> None:
    analysis, loaded = _analysed(small_run)
    events = _events(PerfettoRenderer(Selection(steps=(4, 5), ranks=frozenset({0, 2}))).render(analysis, loaded))
    assert {e["pid"] for e in events} == {1, 3}
    steps = {e["name"] for e in _slices(events, cat="step")}
    assert steps == {"step 4", "step 5"}
    assert {e["args"]["step"] for e in _slices(events, name="forward")} <= {3, 4, 5}
    assert not [e for e in events if e.get("cat") in ("startup", "teardown")]
    only_first = _events(PerfettoRenderer(Selection(attempt=0)).render(analysis, loaded))
    assert {e["args"]["attempt"] for e in _slices(only_first, cat="step")} == {0}
    assert max(e["args"]["step"] for e in _slices(only_first, cat="step")) == 3


def test_partially_overlapping_spans_go_to_an_overflow_track(small_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "overlap"
    shutil.copytree(small_run, run_dir)
    path = next((run_dir / "rank-00000").glob("a0-*.jsonl"))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    first = next(r for r in records if r["kind"] == "span" and r["name"] == "forward")
    with open(path, "a") as handle:
        handle.write(json.dumps({**first, "name": "late", "t0": first["t0"] + MS, "t1": first["t1"] + MS}) + "\n")
    events = _events(_render(run_dir))
    late = _slices(events, name="late")[0]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[late["tid"]].startswith("main thread (overlapping spans)")


def test_gzip_output_and_size_warning(small_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _analysed(small_run)
    plain = PerfettoRenderer().write(*run, tmp_path / "t.json")
    packed = PerfettoRenderer().write(*run, tmp_path / "t.json.gz")
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == (tmp_path / "t.json").read_bytes()
    assert packed.bytes_written < plain.bytes_written and plain.warning is None
    monkeypatch.setattr(perfetto, "COMFORTABLE_TRACE_BYTES", plain.json_bytes // 4)
    warned = PerfettoRenderer().write(*run, tmp_path / "t2.json")
    assert warned.warning is not None and "--steps 0:" in warned.warning and "--ranks 0-" in warned.warning


def test_golden_trace() -> None:
    """The trace of the golden run. A missing golden file fails the test (write it with
    GOODTRACE_UPDATE_GOLDEN=1 after an intended change, and check its diff)."""
    text = _render(GOLDEN / "run")
    golden = GOLDEN / "trace.json"
    if UPDATE:
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden} is missing: run with GOODTRACE_UPDATE_GOLDEN=1 and check it"
    assert text == golden.read_text(encoding="utf-8"), "set GOODTRACE_UPDATE_GOLDEN=1 after an intended change"


# ------------------------------------------------------------------------------ streaming


SELECTIONS = [
    Selection(), Selection(steps=(4, 5)), Selection(steps=(4, 5), ranks=frozenset({0, 2})), Selection(attempt=0),
    Selection(steps=(None, 3), attempt=1), Selection(steps=(5, None)), Selection(steps=(3, 3)),
]


@pytest.mark.parametrize("selection", SELECTIONS, ids=repr)
def test_a_real_directory_renders_every_slice(small_run: Path, tmp_path: Path, selection: Selection) -> None:
    """Split sessions, corrupt and torn lines, CRLF and a headerless file: every slice renders as
    valid JSON whose steps track is the analysis's, and a slice holds only what touches it."""
    run_dir = awkward_copy(small_run, tmp_path)
    analysis, loaded = _analysed(run_dir)
    events = _events(PerfettoRenderer(selection).render(analysis, loaded))
    steps = {(e["pid"], e["args"]["attempt"], e["args"]["step"]) for e in _slices(events, cat="step")}
    expected = {
        (analysis.sessions[i].rank + 1, analysis.attempt_of[i], w.step)
        for i in PerfettoRenderer(selection).sessions(analysis) for w in session_intervals(analysis, i, selection.steps)
    }
    assert steps == expected
    if selection.steps is not None:
        lo, hi = selection.steps
        assert all((lo is None or e["args"]["step"] is None or e["args"]["step"] >= lo - 1)
                   and (hi is None or e["args"]["step"] is None or e["args"]["step"] <= hi)
                   for e in _slices(events, name="forward"))


# ------------------------------------------------------------------------------ the command


def _cli(*args: str) -> Ran:
    return goodtrace(*args)


@pytest.mark.processes
def test_cli_writes_a_slice(small_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "slice.json.gz"
    done = _cli("trace", str(small_run), "-o", str(out), "--steps", "4:5", "--ranks", "1", "--attempt", "1")
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "1 rank(s)" in done.stdout
    events = _events(gzip.decompress(out.read_bytes()).decode())
    assert {e["name"] for e in _slices(events, cat="step")} == {"step 4", "step 5"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--steps", "9:2"], "bad step range"),
        (["--ranks", "x"], "bad rank list"),
        (["--attempt", "7"], "no attempt 7"),
        (["--ranks", "5-9"], "the run has no rank in '5-9' (it has ranks 0-2)"),
    ],
)
@pytest.mark.processes
def test_cli_user_errors(small_run: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    done = _cli("trace", str(small_run), "-o", str(tmp_path / "x.json"), *extra)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.processes
def test_cli_not_a_run(tmp_path: Path) -> None:
    done = _cli("trace", str(tmp_path), "-o", str(tmp_path / "x.json"))
    assert done.returncode == 2 and "no goodtrace records" in done.stderr


# ------------------------------------------------------------------------------ the real Perfetto UI


@pytest.fixture(scope="module")
def ui(chromium: Any) -> Iterator[PerfettoUI]:
    with perfetto_ui(chromium) as opened:
        yield opened


def _assert_clean(loaded: LoadedTrace) -> None:
    assert not loaded.modals, loaded.modals
    assert not loaded.log.errors and not loaded.log.dialogs, (loaded.log.errors, loaded.log.dialogs)
    assert loaded.import_errors() == []


@pytest.mark.browser
@pytest.mark.processes
def test_perfetto_ui_loads_the_trace(ui: PerfettoUI, small_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "small.json"
    PerfettoRenderer().write(*_analysed(small_run), path)
    expected = _events(path.read_text(encoding="utf-8"))
    loaded = ui.load(path)
    _assert_clean(loaded)

    processes = loaded.query("SELECT pid, name FROM process WHERE pid > 0 ORDER BY pid")
    assert processes == [
        {"pid": 1, "name": "rank 0 (node-a)"}, {"pid": 2, "name": "rank 1 (node-a)"},
        {"pid": 3, "name": "rank 2 (node-b)"},
    ]
    # Slices per rank (thread and process-scoped tracks), as written.
    per_rank = loaded.query(
        "SELECT p.pid AS pid, count(*) AS n FROM slice s JOIN thread_track tt ON s.track_id = tt.id "
        "JOIN thread USING (utid) JOIN process p USING (upid) WHERE s.dur > 0 GROUP BY p.pid ORDER BY p.pid"
    )
    written = Counter(e["pid"] for e in expected if e["ph"] == "X")
    assert per_rank == [{"pid": pid, "n": written[pid]} for pid in (1, 2, 3)]
    # Durations survive exactly (ns): the slow rank's compute, the checkpoint inside step 4.
    forward = loaded.query(
        "SELECT p.pid AS pid, min(s.dur) AS lo, max(s.dur) AS hi, count(*) AS n FROM slice s "
        "JOIN thread_track tt ON s.track_id = tt.id JOIN thread USING (utid) JOIN process p USING (upid) "
        "WHERE s.name = 'forward' GROUP BY p.pid ORDER BY p.pid"
    )
    assert forward == [
        {"pid": 1, "lo": 50 * MS, "hi": 50 * MS, "n": 9}, {"pid": 2, "lo": 50 * MS, "hi": 50 * MS, "n": 9},
        {"pid": 3, "lo": 80 * MS, "hi": 80 * MS, "n": 9},
    ]
    nested = loaded.query(
        "SELECT parent.name AS step, parent.dur AS step_dur, child.name AS part, child.dur AS part_dur "
        "FROM slice child JOIN slice parent ON child.parent_id = parent.id WHERE child.category = 'overhead'"
    )
    checkpoints = [row for row in nested if row["part"] == "checkpoint_save"]
    assert len(checkpoints) == 3  # after step 3 of attempt 1 (attempt 0 crashed before step 4 ended: its tail)
    assert all(row == {"step": "step 4", "step_dur": 140 * MS, "part": "checkpoint_save", "part_dur": 40 * MS}
               for row in checkpoints if row["step"] == "step 4")
    # attempt 0's step 3 was done again by attempt 1: its productive time is wasted progress
    assert {row["step"] for row in nested if row["part"] == "wasted_progress"} == {"step 3"}
    # Ranks aligned on the corrected clock: step 2 starts at the same ts on every rank.
    aligned = loaded.query("SELECT count(DISTINCT ts) AS n, count(*) AS c FROM slice WHERE name = 'step 2'")
    assert aligned == [{"n": 1, "c": 3}]
    # Instant events: tags, events, lifecycle marks.
    instants = loaded.query("SELECT category, count(*) AS n FROM slice WHERE dur = 0 GROUP BY category ORDER BY category")
    assert instants == [{"category": "event", "n": 3}, {"category": "lifecycle", "n": 6}, {"category": "tag", "n": 6}]
    counters = loaded.query(
        "SELECT t.name AS name, count(*) AS n FROM counter c JOIN counter_track t ON c.track_id = t.id GROUP BY t.name"
    )
    assert sorted(counters, key=lambda r: r["name"]) == [
        {"name": "device/busy_s value", "n": 4}, {"name": "device/idle_s value", "n": 4}, {"name": "loss value", "n": 24},
    ]
    threads = {r["name"] for r in loaded.query("SELECT name FROM thread WHERE name IS NOT NULL")}
    assert {"steps (attempt 0)", "main thread (attempt 1)", "device (attempt 1)", "thread 222 (attempt 0)"} <= threads
    loaded.page.screenshot(path=str(artifact("perfetto-small-trace.png")))


@pytest.mark.browser
@pytest.mark.processes
def test_perfetto_ui_loads_gzip_and_hostile_names(ui: PerfettoUI, tmp_path: Path) -> None:
    run_dir = write_small_run(tmp_path / "evil", evil=True)
    path = tmp_path / "evil.json.gz"
    PerfettoRenderer().write(*_analysed(run_dir), path)
    loaded = ui.load(path)
    _assert_clean(loaded)
    names = loaded.query(f"SELECT count(*) AS n FROM slice WHERE name = '{EVIL}'")
    assert names == [{"n": 27}]
    hosts = loaded.query("SELECT name FROM process WHERE pid = 3")
    assert hosts == [{"name": "rank 2 (<script>alert(2)</script>)"}]


@pytest.mark.browser
@pytest.mark.processes
def test_perfetto_ui_loads_a_run_from_the_real_recorder(ui: PerfettoUI, tmp_path: Path) -> None:
    import goodtrace as gt
    from goodtrace.testing import SimulatedDevice, capture

    device = SimulatedDevice()
    try:
        with capture(tmp_path / "recorded", rank=0, world_size=1) as cap:
            for step in range(4):
                with gt.step(step) as s:
                    with gt.span("data"):
                        pass
                    value = device.launch(0.003, f"step{step}")
                    s.complete_on(value)
                    gt.metric("loss", 1.0 / (step + 1))
                if step == 1:
                    gt.tag("checkpoint")
                    with gt.span("checkpoint"):
                        pass
            gt.event("done", where="<end>")
    finally:
        device.close()
    assert cap.run is not None
    path = tmp_path / "recorded.json"
    PerfettoRenderer().write(*_analysed(tmp_path / "recorded"), path)
    loaded = ui.load(path)
    _assert_clean(loaded)
    # two steps whose values one readiness poll found ready end together (the later one lasts
    # 0 on a loaded machine): a tie in time is ordered by step
    steps = loaded.query("SELECT name FROM slice WHERE category = 'step' ORDER BY ts, EXTRACT_ARG(arg_set_id, 'args.step')")
    assert [r["name"] for r in steps] == ["step 0", "step 1", "step 2", "step 3"]
    overhead = loaded.query(
        "SELECT parent.name AS step FROM slice child JOIN slice parent ON child.parent_id = parent.id "
        "WHERE child.name = 'checkpoint_save'"
    )
    assert overhead == [{"step": "step 2"}]  # saved after step 1: inside step 2's interval
    assert loaded.query("SELECT count(*) AS n FROM slice WHERE name = 'data' AND category = 'data'") == [{"n": 4}]


_SPAN_TIMES = st.tuples(st.integers(0, 20), st.integers(-3, 20), st.one_of(st.none(), st.integers(0, 5)),
                        st.booleans(), st.sampled_from([None, "a", "b"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_SPAN_TIMES, max_size=40), st.lists(_SPAN_TIMES, max_size=5))
def test_a_track_s_spans_are_walked_as_sorted_walks_them(read: list[Any], drawn: list[Any]) -> None:
    # spans as the reader hands them over (by start, then end descending), then spans drawn
    # later in any order (the device busy time): walked as the writer's sort of them all walked
    # them, ties in the order added, every field as added
    def record(n: int, t0: int, t1: int, step: int | None, error: bool, name: str | None) -> RawRecord:
        return RawRecord("span", name, "device", t0, max(t1, t0), None, step, None, error, None,
                         {"n": n} if n % 3 == 0 else None)

    spans = [record(n, *fields) for n, fields in enumerate(sorted(read, key=lambda f: (f[0], -max(f[1], f[0]))))]
    spans += [record(len(spans) + n, *fields) for n, fields in enumerate(drawn)]
    track = perfetto._LaneSpans()
    for span in spans:
        track.add(span)
    assert len(track) == len(spans)
    assert list(track.in_order()) == sorted(spans, key=lambda r: (r.t0 or 0, -(r.t1 or 0)))


def test_a_session_s_records_come_in_parts_of_at_most_a_chunk(small_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the trace writes a session's records as they are read: a session's parts, one after the
    # other, make the records it is read whole as
    analysis, loaded = _analysed(small_run)
    ranges = {i: None for i in analysis.cuts}
    whole = dict(raw.session_records(loaded, ranges))
    monkeypatch.setattr(raw, "CHUNK_RECORDS", 7)
    parts = list(raw.session_record_chunks(loaded, ranges))
    assert all(len(chunk) <= 7 for _, chunk in parts) and max(len(chunk) for _, chunk in parts) == 7
    order = [sid for k, (sid, _) in enumerate(parts) if k == 0 or parts[k - 1][0] != sid]
    assert len(order) == len(set(order)) == len(whole)  # each session's parts together
    joined: dict[int, list[RawRecord]] = {}
    for sid, chunk in parts:
        joined.setdefault(sid, []).extend(chunk)
    assert joined == whole and sum(map(len, whole.values())) > 7 * len(whole)
