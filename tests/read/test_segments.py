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
