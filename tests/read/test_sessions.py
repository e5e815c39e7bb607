"""The standard-library reader without the records held (what ``goodtrace records`` lists of a
run of any length) sees the run exactly as the reader that holds them: the same sessions,
attempts, counts, last signs of life, finish records, problems and skipped lines, on a real run
with a crash and a restart, damaged on purpose; and the records read again one at a time are
the records it held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from goodtrace.read.sessions import Session, iter_records, read_run
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
    again: dict[str, list[dict[str, Any]]] = {}
    for session, record in iter_records(lean):
        again.setdefault(session.session_id, []).append(record)
    assert again == {s.session_id: s.records for s in held.sessions}


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
    counted = sum(1 for _ in iter_records(lean, lambda *said: told.append(said)))
    assert counted == sum(s.record_count for s in lean.sessions)
    assert told == [("reading segments again", k, total) for k in range(total + 1)]


def test_a_session_made_with_its_records_counts_them() -> None:
    header = {"kind": "header", "schema": 1, "session": "s", "rank": 0, "wall": 10**18, "mono": 5}
    finish = {"kind": "finish", "t": 90, "completed": True}
    session = Session(header=header, records=[{"kind": "heartbeat", "mono": 70}, finish, {"kind": "tag", "t": 40}])
    assert session.record_count == 3 and session.last_seen_mono == 90 and session.finish == finish
    assert Session(header=header, records=[]).last_seen_mono == 5 and Session(header=header, records=[]).finish is None
