"""The standard-library reader without the records held (what ``goodtrace records`` lists of a
run of any length) sees the run exactly as the reader that holds them: the same sessions,
attempts, counts, last signs of life, finish records, problems and skipped lines, on a real run
with a crash and a restart, damaged on purpose; and the records read again one at a time are
the records it held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from goodtrace.read.sessions import RecordRange, Session, count_in_range, read_run
from helpers.fuzz import segment_files, write_seed_run


def _damaged(run_dir: Path) -> Path:
    write_seed_run(run_dir)
    files = segment_files(run_dir)
    lines = files[0].read_bytes().split(b"\n")
    lines.insert(4, b'{"kind":"span","name":"cut')  # not JSON, mid-file
    files[0].write_bytes(b"\n".join(lines) + b'{"kind":"span","na')  # and a torn last line
    stray = files[-1].parent / "stray.00000.jsonl"
    stray.write_bytes(b'{"kind":"span","name":"x"}\n{"kind":"tag"}\n')  # no header: every line skipped
    return run_dir


def _seen(session: Session) -> tuple[Any, ...]:
    return (session.session_id, session.rank, session.attempt, session.segments, session.torn_lines,
            session.record_count, session.last_seen_mono, session.finish, session.header)


@pytest.mark.processes
def test_a_run_read_without_its_records_is_the_run_read_with_them(tmp_path: Path) -> None:
    run_dir = _damaged(tmp_path / "run")
    held = read_run(run_dir)
    lean = read_run(run_dir, keep_records=False)
    assert [_seen(s) for s in lean.sessions] == [_seen(s) for s in held.sessions]
    assert len({s.attempt for s in held.sessions}) > 1 and any(s.finish for s in held.sessions)
    assert all(s.record_count == len(s.records) > 0 for s in held.sessions)
    assert all(s.records == [] for s in lean.sessions)
    assert lean.problems == held.problems and lean.skipped == held.skipped
    assert held.skipped.get("file_skipped") == 2 and held.skipped.get("torn_last_line") == 1
    assert any("stray.00000.jsonl" in p for p in held.problems) and any("line 5" in p for p in held.problems)
    # read again for a time range: each session's records that the range keeps, on its clock
    middle = (min(s.start_wall_ns for s in held.sessions) + max(s.wall_ns(s.last_seen_mono) for s in held.sessions)) // 2
    for span in (RecordRange(), RecordRange(low_step=2, high_step=5), RecordRange(until_ns=middle),
                 RecordRange(since_ns=middle, low_step=1)):
        want = [sum(span.keeps(r, int(s.header["wall"]), int(s.header["mono"])) for r in s.records)
                for s in held.sessions]
        assert count_in_range(lean, span) == want, span
        assert count_in_range(lean, span, workers=2) == want, span
        assert 0 < sum(want) < sum(s.record_count for s in held.sessions) or span == RecordRange(), span
    assert count_in_range(lean, RecordRange()) == [s.record_count for s in held.sessions]


@pytest.mark.processes
def test_the_readers_tell_their_progress_a_segment_at_a_time(tmp_path: Path) -> None:
    """``goodtrace records`` of a long run reads for a while: each reader says how many of the
    run's segments it has read (a file that cannot be used counts too), from none to all."""
    run_dir = _damaged(tmp_path / "run")
    total = len(segment_files(run_dir))  # the stray file without a header among them
    told: list[tuple[str, int, int]] = []
    lean = read_run(run_dir, keep_records=False, progress=lambda *said: told.append(said))
    assert told == [("reading segments", k, total) for k in range(total + 1)]
    assert [_seen(s) for s in lean.sessions] == [_seen(s) for s in read_run(run_dir).sessions]
    told.clear()
    counted = count_in_range(lean, RecordRange(), progress=lambda *said: told.append(said))
    assert counted == [s.record_count for s in lean.sessions]
    assert told == [("reading segments again", k, total) for k in range(total + 1)]


@pytest.mark.processes
def test_the_segments_counted_on_the_local_pool_are_the_run_counted_here(tmp_path: Path) -> None:
    """``goodtrace records`` of a large run counts its segments on a process per core: the
    sessions, their counts, last signs of life and finish records, the problems (in order) and
    the skipped lines are the ones one process finds, however the segments fall into tasks."""
    run_dir = _damaged(tmp_path / "run")
    here = read_run(run_dir, keep_records=False, workers=1)
    told: list[tuple[str, int, int]] = []
    pooled = read_run(run_dir, keep_records=False, workers=2, progress=lambda *said: told.append(said))
    assert [_seen(s) for s in pooled.sessions] == [_seen(s) for s in here.sessions]
    assert pooled.problems == here.problems and list(pooled.skipped.items()) == list(here.skipped.items())
    total = len(segment_files(run_dir))
    assert told and told[-1] == ("reading segments (2 workers)", total, total)
    assert [done for _, done, _ in told] == sorted(done for _, done, _ in told)


def test_a_session_made_with_its_records_counts_them() -> None:
    header = {"kind": "header", "schema": 1, "session": "s", "rank": 0, "wall": 10**18, "mono": 5}
    finish = {"kind": "finish", "t": 90, "completed": True}
    session = Session(header=header, records=[{"kind": "heartbeat", "mono": 70}, finish, {"kind": "tag", "t": 40}])
    assert session.record_count == 3 and session.last_seen_mono == 90 and session.finish == finish
    assert Session(header=header, records=[]).last_seen_mono == 5 and Session(header=header, records=[]).finish is None
