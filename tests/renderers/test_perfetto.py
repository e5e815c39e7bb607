"""The Perfetto/Chrome trace renderer and ``goodtrace trace``: events, selection, golden output,
the real CLI, and the real Perfetto UI (offline, headless Chromium) querying its own engine."""

from __future__ import annotations

import gc
import gzip
import json
import os
import shutil
import subprocess
import sys
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.analysis.intervals import step_intervals
from goodtrace.cli.ranges import format_ranks, parse_ranks, parse_steps
from goodtrace.read.segments import SegmentRecords, parse_segment
from goodtrace.read.sessions import RunIndex, Session, index_run, read_run
from goodtrace.renderers import perfetto
from goodtrace.renderers.perfetto import PerfettoRenderer, Selection
from helpers.browser import EVIL, MS, LoadedTrace, PerfettoUI, artifact, perfetto_ui, write_small_run

GOLDEN = Path(__file__).parent.parent / "data" / "golden_trace_small"
UPDATE = os.environ.get("GOODTRACE_UPDATE_GOLDEN") == "1"


def _events(text: str) -> list[dict[str, Any]]:
    return list(json.loads(text)["traceEvents"])


def _slices(events: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_run(tmp_path_factory.mktemp("small") / "run")


# ------------------------------------------------------------------------------ the model


def test_step_intervals_split_overhead_and_start_at_previous_sync(small_run: Path) -> None:
    run = read_run(small_run)
    session = next(s for s in run.sessions if s.rank == 0 and s.attempt == 1)
    intervals = {iv.step: iv for iv in step_intervals(session)}
    assert sorted(intervals) == [3, 4, 5, 6]
    # Step 3 (first of the attempt) starts when it was entered; step 4's interval holds the
    # checkpoint saved after step 3 (a blocking span settles step 3 first).
    assert intervals[3].duration_ns == 100 * MS
    assert intervals[4].t0 == intervals[3].t1
    assert intervals[4].duration_ns == 140 * MS
    assert intervals[4].overhead_ns == {"checkpoint_save": 40 * MS}
    assert intervals[4].productive_ns == 100 * MS
    assert intervals[4].compute_ns == 50 * MS


def test_sparse_sync_points_make_one_shared_window(small_run: Path) -> None:
    run = read_run(small_run)
    session = next(s for s in run.sessions if s.rank == 0 and s.attempt == 0)
    session.records = [r for r in session.records if not (r["kind"] == "sync" and r["step"] in (1, 2))]
    intervals = step_intervals(session)
    assert [(iv.first_step, iv.step) for iv in intervals] == [(0, 0), (1, 3)]
    assert intervals[1].duration_ns == 300 * MS and intervals[1].is_window


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
    events = _events(PerfettoRenderer().render(read_run(small_run)))
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1: "rank 0 (node-a)", 2: "rank 1 (node-a)", 3: "rank 2 (node-b)"}
    # Spans: category and step in args; rank 2 is the slow one.
    forward = _slices(events, name="forward", pid=3)
    assert len(forward) == 9 and all(e["cat"] == "compute" and e["dur"] == 80_000 for e in forward)
    assert sorted(e["args"]["step"] for e in forward) == [0, 1, 2, 3, 3, 4, 4, 5, 6]  # crashed in 4
    # Step track with the overhead split.
    step4 = [e for e in _slices(events, name="step 4") if e["args"]["attempt"] == 1]
    assert len(step4) == 3
    assert all(e["args"]["overhead_ms"] == {"checkpoint_save": 40.0} for e in step4)
    assert all(e["args"]["step_time_ms"] == 140.0 and e["args"]["productive_ms"] == 100.0 for e in step4)
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
    assert lifecycle == {"last sign of life (no finish record)": 3, "finish": 3}


def test_selection_by_steps_ranks_and_attempt(small_run: Path) -> None:
    run = read_run(small_run)
    events = _events(PerfettoRenderer(Selection(steps=(4, 5), ranks=frozenset({0, 2}))).render(run))
    assert {e["pid"] for e in events} == {1, 3}
    steps = {e["name"] for e in _slices(events, cat="step")}
    assert steps == {"step 4", "step 5"}
    assert {e["args"]["step"] for e in _slices(events, name="forward")} <= {3, 4, 5}
    assert not [e for e in events if e.get("cat") in ("startup", "teardown")]
    only_first = _events(PerfettoRenderer(Selection(attempt=0)).render(run))
    assert {e["args"]["attempt"] for e in _slices(only_first, cat="step")} == {0}
    assert max(e["args"]["step"] for e in _slices(only_first, cat="step")) == 3


def test_partially_overlapping_spans_go_to_an_overflow_track(small_run: Path, tmp_path: Path) -> None:
    run = read_run(small_run)
    session = run.sessions[0]
    first = next(r for r in session.records if r["kind"] == "span" and r["name"] == "forward")
    session.records.append({**first, "name": "late", "t0": first["t0"] + MS, "t1": first["t1"] + MS})
    events = _events(PerfettoRenderer().render(run))
    late = _slices(events, name="late")[0]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[late["tid"]].startswith("main thread (overlapping spans)")


def test_gzip_output_and_size_warning(small_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = read_run(small_run)
    plain = PerfettoRenderer().write(run, tmp_path / "t.json")
    packed = PerfettoRenderer().write(run, tmp_path / "t.json.gz")
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == (tmp_path / "t.json").read_bytes()
    assert packed.bytes_written < plain.bytes_written and plain.warning is None
    monkeypatch.setattr(perfetto, "COMFORTABLE_TRACE_BYTES", plain.json_bytes // 4)
    warned = PerfettoRenderer().write(run, tmp_path / "t2.json")
    assert warned.warning is not None and "--steps 0:" in warned.warning and "--ranks 0-" in warned.warning


def test_golden_trace() -> None:
    text = PerfettoRenderer().render(read_run(GOLDEN / "run"))
    golden = GOLDEN / "trace.json"
    if UPDATE or not golden.exists():
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), "set GOODTRACE_UPDATE_GOLDEN=1 after an intended change"


# ------------------------------------------------------------------------------ streaming


def _awkward_copy(small_run: Path, root: Path) -> Path:
    """The small run with what a real directory holds: a session in two segments, a corrupt
    line mid-file, a torn last line, CRLF line ends, and a file without a header."""
    run_dir = root / "run"
    shutil.copytree(small_run, run_dir)
    path = next((run_dir / "rank-00001").glob("a1-*.jsonl"))
    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    cut = len(lines) // 2
    path.write_text("\n".join(lines[:cut]) + "\n{not json\n", encoding="utf-8")
    second = path.with_name(f"{header['session']}.00001.jsonl")
    second.write_text("\n".join([json.dumps({**header, "segment": 1}), *lines[cut:]]) + '\n{"kind":"sp', encoding="utf-8")
    crlf = next((run_dir / "rank-00002").glob("a0-*.jsonl"))
    crlf.write_bytes(crlf.read_bytes().replace(b"\n", b"\r\n"))
    (run_dir / "rank-00000" / "stray.jsonl").write_text('{"kind":"span"}\n', encoding="utf-8")
    return run_dir


SEGMENT_LINES = [
    b'{"kind":"span","name":"a\\u00e9\xc3\xa9","t0":1,"t1":2,"attrs":{"x":[1,{"y":null}]}}',
    b'{"kind":"sync","step":1,"t":5}', b'{"x":1}', b"5", b"", b"  ", b'{"kind":"step"}\r', b'{"kind":"tag"',
    b"garbage", b'{"kind":"a"},{"kind":"b"}', b"\xff\xfe", b' {"kind":"e"}', b'{"kind":"e"} ', b'{"kind":1}',
]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.sampled_from(SEGMENT_LINES), max_size=8), newline=st.booleans(), cut=st.integers(0, 400))
def test_segment_records_decode_exactly_as_parse_segment(lines: list[bytes], newline: bool, cut: int) -> None:
    data = b"\n".join(lines) + (b"\n" if newline else b"")
    for piece in (data, data[:cut]):
        expected_problems: list[str] = []
        expected = parse_segment(piece, "f", expected_problems)
        problems: list[str] = []
        records = SegmentRecords(piece, "f", problems)
        assert (list(records), records.torn) == expected and problems == expected_problems


def test_index_run_keeps_what_read_run_gives_the_sessions(small_run: Path, tmp_path: Path) -> None:
    awkward = _awkward_copy(small_run, tmp_path)
    problems = read_run(awkward).problems
    assert any("a1-r1.0.jsonl: line 18 is not valid JSON" in p for p in problems) and any("stray.jsonl" in p for p in problems)
    assert {(s.segments, s.torn_lines) for s in read_run(awkward).sessions if s.session_id == "a1-r1"} == {(2, 2)}
    for run_dir in (small_run, awkward, GOLDEN / "run"):
        full = read_run(run_dir)
        index = index_run(run_dir, summarise=lambda s: sorted(r["kind"] for r in s.records))
        assert index.problems == full.problems
        assert [s.session_id for s in index.sessions] == [s.session_id for s in full.sessions]
        for indexed, session in zip(index.sessions, full.sessions, strict=True):
            assert (indexed.header, indexed.attempt, indexed.segments, indexed.torn_lines) == (
                session.header, session.attempt, session.segments, session.torn_lines)
            assert indexed.last_seen_mono == session.last_seen_mono and indexed.finish == session.finish
            assert indexed.of_kind("clock") == session.of_kind("clock")
            assert indexed.summary == sorted(r["kind"] for r in session.records if r["kind"] in ("step", "sync"))
            assert index.load(indexed).records == session.records


SELECTIONS = [
    Selection(), Selection(steps=(4, 5)), Selection(steps=(4, 5), ranks=frozenset({0, 2})), Selection(attempt=0),
    Selection(steps=(None, 3), attempt=1), Selection(steps=(5, None)), Selection(steps=(3, 3)),
]


@pytest.mark.parametrize("selection", SELECTIONS, ids=repr)
def test_streamed_trace_is_the_in_memory_trace(small_run: Path, tmp_path: Path, selection: Selection) -> None:
    run_dir = _awkward_copy(small_run, tmp_path)
    renderer = PerfettoRenderer(selection)
    expected = renderer.render(read_run(run_dir))
    assert renderer.render(renderer.index(run_dir)) == expected
    assert renderer.render(index_run(run_dir)) == expected  # an index without summaries: read again
    renderer.write(str(run_dir), tmp_path / "streamed.json.gz")
    assert gzip.decompress((tmp_path / "streamed.json.gz").read_bytes()).decode() == expected


def test_streaming_holds_one_session_at_a_time(small_run: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    alive: list[weakref.ref[Session]] = []
    loads: list[tuple[str, int]] = []
    original = RunIndex.load

    def load(self: RunIndex, session: Session, keep: Any = None) -> Session:
        gc.collect()
        assert [ref() for ref in alive if ref() is not None] == [], "a session read earlier is still held"
        loaded = original(self, session, keep)
        alive.append(weakref.ref(loaded))
        loads.append((session.session_id, len(loaded.records)))
        return loaded

    monkeypatch.setattr(RunIndex, "load", load)
    renderer = PerfettoRenderer()
    index = renderer.index(small_run)
    renderer.write(index, tmp_path / "t.json")
    assert sorted(sid for sid, _ in loads) == sorted(s.session_id for s in index.sessions)  # each read once
    everything = dict(loads)
    # A slice keeps only the records it can use (bounds, spans touching its window, its marks).
    loads.clear()
    sliced = PerfettoRenderer(Selection(steps=(1, 1), attempt=0))
    sliced.write(sliced.index(small_run), tmp_path / "s.json")
    assert loads and all(0 < n < everything[sid] / 2 for sid, n in loads)


# ------------------------------------------------------------------------------ the command


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "goodtrace", *args], capture_output=True, text=True, timeout=120)


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
def test_cli_user_errors(small_run: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    done = _cli("trace", str(small_run), "-o", str(tmp_path / "x.json"), *extra)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_cli_not_a_run(tmp_path: Path) -> None:
    done = _cli("trace", str(tmp_path), "-o", str(tmp_path / "x.json"))
    assert done.returncode == 2 and "no goodtrace records" in done.stderr


# ------------------------------------------------------------------------------ the real Perfetto UI


@pytest.fixture(scope="module")
def ui() -> Iterator[PerfettoUI]:
    with perfetto_ui() as opened:
        yield opened


def _assert_clean(loaded: LoadedTrace) -> None:
    assert not loaded.modals, loaded.modals
    assert not loaded.log.errors and not loaded.log.dialogs, (loaded.log.errors, loaded.log.dialogs)
    assert loaded.import_errors() == []


def test_perfetto_ui_loads_the_trace(ui: PerfettoUI, small_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "small.json"
    PerfettoRenderer().write(read_run(small_run), path)
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
    assert len(nested) == 3
    assert all(row == {"step": "step 4", "step_dur": 140 * MS, "part": "checkpoint_save", "part_dur": 40 * MS}
               for row in nested)
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


def test_perfetto_ui_loads_gzip_and_hostile_names(ui: PerfettoUI, tmp_path: Path) -> None:
    run_dir = write_small_run(tmp_path / "evil", evil=True)
    path = tmp_path / "evil.json.gz"
    PerfettoRenderer().write(read_run(run_dir), path)
    loaded = ui.load(path)
    _assert_clean(loaded)
    names = loaded.query(f"SELECT count(*) AS n FROM slice WHERE name = '{EVIL}'")
    assert names == [{"n": 27}]
    hosts = loaded.query("SELECT name FROM process WHERE pid = 3")
    assert hosts == [{"name": "rank 2 (<script>alert(2)</script>)"}]


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
    PerfettoRenderer().write(cap.run, path)
    loaded = ui.load(path)
    _assert_clean(loaded)
    steps = loaded.query("SELECT name FROM slice WHERE category = 'step' ORDER BY ts")
    assert [r["name"] for r in steps] == ["step 0", "step 1", "step 2", "step 3"]
    overhead = loaded.query(
        "SELECT parent.name AS step FROM slice child JOIN slice parent ON child.parent_id = parent.id "
        "WHERE child.name = 'checkpoint_save'"
    )
    assert overhead == [{"step": "step 2"}]  # saved after step 1: inside step 2's interval
    assert loaded.query("SELECT count(*) AS n FROM slice WHERE name = 'data' AND category = 'data'") == [{"n": 4}]
