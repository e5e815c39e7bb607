"""The streaming segment reader and the session index: the same records, torn lines and
problems as the line-by-line reader, on a run directory with every awkward thing a real one
holds (a session split over segments, a corrupt line mid-file, a torn last line, CRLF line
ends, a file without a header)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.read import segments
from goodtrace.read.segments import SegmentRecords
from goodtrace.read.sessions import read_run
from helpers.browser import awkward_copy, write_small_run

GOLDEN = Path(__file__).parent.parent / "data" / "golden_trace_small"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_run(tmp_path_factory.mktemp("small") / "run")


SEGMENT_LINES = [
    b'{"kind":"span","name":"a\\u00e9\xc3\xa9","t0":1,"t1":2,"attrs":{"x":[1,{"y":null}]}}',
    b'{"kind":"sync","step":1,"t":5}', b'{"x":1}', b"5", b"", b"  ", b'{"kind":"step"}\r', b'{"kind":"tag"',
    b"garbage", b'{"kind":"a"},{"kind":"b"}', b"\xff\xfe", b' {"kind":"e"}', b'{"kind":"e"} ', b'{"kind":1}',
]


def parse_segment(data: bytes, where: str, problems: list[str]) -> tuple[list[dict[str, Any]], int]:
    """The reference: every line by the skip rules alone, in a list (the reader before the
    streaming one)."""
    rules = segments._Lines(where, problems, None)
    lines = data.split(b"\n")
    records = [r for index, line in enumerate(lines) if (r := rules.line(line, index, len(lines) - 1)) is not None]
    rules.done()
    return records, rules.torn


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


def test_read_run_names_the_bad_lines_and_counts_segments_and_torn_lines(small_run: Path, tmp_path: Path) -> None:
    awkward = awkward_copy(small_run, tmp_path)
    problems = read_run(awkward).problems
    assert any("a1-r1.0.jsonl: line 18 is not valid JSON" in p for p in problems) and any("stray.jsonl" in p for p in problems)
    assert {(s.segments, s.torn_lines) for s in read_run(awkward).sessions if s.session_id == "a1-r1"} == {(2, 2)}


def test_segments_past_99999_are_listed_in_the_order_they_were_written(tmp_path: Path) -> None:
    """The writer pads a segment's number to five digits, so segment 100,000 of a session sorts
    before 99,999 by name: the listing orders a session's files by number, so that a session's
    last file (the one a view reads again, as it may have grown since the run was loaded) is
    the one written last."""
    from goodtrace.read import raw
    from helpers.builders import Proc, load

    run_dir = tmp_path / "run"
    proc = Proc(run_dir, start=0.0)
    t = proc.loop(range(30), 1.0)
    proc.heartbeat(t)  # no finish: the last segment is still open
    last = proc.write(segment_lines=-(-len(proc.lines) // 3), first_segment=99_998)
    assert last.name.endswith(".100000.jsonl")
    names = [Path(p).name for _, p in segments.list_segments(str(run_dir))]
    assert [n.rsplit(".", 2)[1] for n in names] == ["99998", "99999", "100000"]
    assert sorted(names) != names  # name order alone would not do
    loaded = load(run_dir)
    files = loaded.files[0]
    assert Path(files[-1]) == last
    assert raw._files_for(loaded, 0, (0, 1), (0, 0), None, False)[-1] == files[-1]
    assert segments.segment_order("rank-00000/s.100000.jsonl") > segments.segment_order("rank-00000/s.99999.jsonl")
    assert segments.segment_order("rank-00001/a.00000.jsonl") > segments.segment_order("rank-00000/z.99999.jsonl")
