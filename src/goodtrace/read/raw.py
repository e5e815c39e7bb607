"""Raw records of chosen sessions, for the views that draw them (the gantt chart, the trace) and
for the stacks of hang events: spans, tags, events and metrics.

The run model (:mod:`goodtrace.analysis`) says which sessions a view shows and which part of
each (a range of its own clock, or all of it); :func:`session_records` then has DuckDB read
just those sessions' files (or their rows of the Parquet copy), keep the records inside those
ranges, and hand them over one session at a time, sorted by time, as plain tuples
(:func:`session_record_chunks`: a part of a session at a time, for a view that writes them as
it reads them). Memory holds one batch of sessions' kept records (one part of them, read in
parts); a 20-step slice of 10,000 ranks is a small read.

The details of ``hang`` events (the watchdog's: step, span, where, since, stack;
:func:`hang_details`): the run model's event table says which sessions have one (name, time,
step); a hang's stack
and the rest of its attributes are wanted only there, so they are read from those sessions'
own segment files (or taken from their step detail when the loader holds it).
"""

from __future__ import annotations

import itertools
import operator
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from goodtrace import schema
from goodtrace.read import duckdb_sql
from goodtrace.read.loaded import FileRange, HangEvent, LoadedRun, Progress
from goodtrace.read.segments import SegmentRecords, read_bytes
from goodtrace.read.validate import json_object

__all__ = ["CHUNK_RECORDS", "HANG_EVENTS", "ClockRange", "RawRecord", "hang_details", "hang_events_in", "session_record_chunks", "session_records"]

# (t0, t1) of a session's own clock; None: all of it
ClockRange = tuple[int, int] | None

_BATCH_FILES = 64
CHUNK_RECORDS = 16384  # records of a session handed over at a time (session_record_chunks): a few MB
_PARQUET_SHARE = 8  # compacted sessions read per query for each JSON file


class RawRecord(NamedTuple):
    """One record as the timelines need it (fields a kind does not have are None). A named
    tuple: a view reads hundreds of thousands (a gantt chart's spans), and one is made in a
    third of the time a frozen dataclass takes."""

    kind: str
    name: str | None
    category: str | None
    t0: int | None
    t1: int | None
    t: int | None
    step: int | None
    tid: int | None
    error: bool
    value: float | None
    attrs: dict[str, Any] | None

    @property
    def time(self) -> int:
        return self.t0 if self.t0 is not None else (self.t if self.t is not None else 0)


_SHARED_STRINGS = 1 << 16  # distinct strings kept as one object each (then a string each, as read)


def _attrs(text: object) -> dict[str, Any] | None:
    return json_object(text, 65536)


def _bounds(clock_range: ClockRange) -> tuple[int, int]:
    return clock_range if clock_range is not None else (-(2**62), 2**62)


def session_records(
    run: LoadedRun,
    clock_ranges: Mapping[int, ClockRange],
    *,
    steps: tuple[int | None, int | None] | None = None,
    progress: Progress | None = None,
    spans_only: bool = False,
) -> Iterator[tuple[int, list[RawRecord]]]:
    """``(session index, its records)`` for each session of ``clock_ranges``, in index order: spans
    that touch its range, and tags, events and metrics whose step is in ``steps`` (inclusive;
    None: any) or, without a step, whose time is inside the range; device metrics always.
    ``spans_only``: the spans alone, without their attributes (what a chart of a few steps
    draws: the marks of every step of a long run are not read)."""
    chunks = session_record_chunks(run, clock_ranges, steps=steps, progress=progress, spans_only=spans_only)
    for sid, parts in itertools.groupby(chunks, key=operator.itemgetter(0)):  # a session's parts are adjacent
        yield sid, [record for _, chunk in parts for record in chunk]


def session_record_chunks(
    run: LoadedRun,
    clock_ranges: Mapping[int, ClockRange],
    *,
    steps: tuple[int | None, int | None] | None = None,
    progress: Progress | None = None,
    spans_only: bool = False,
    drawn_steps: Mapping[int, tuple[int, int]] | None = None,
) -> Iterator[tuple[int, list[RawRecord]]]:
    """:func:`session_records` a part at a time: ``(session index, some of its records)``, a
    session's parts one after the other, in time order, at most :data:`CHUNK_RECORDS` each
    (a view that writes records as it reads them holds no more: a window of a long run has
    millions); each session at least once (with none, when nothing of it is in its range).
    ``drawn_steps``: per session, the lowest and highest step of the executions the view draws
    (their device metrics are wanted, past ``steps`` too: a shared interval closing at the range's
    end), so that only the files that can hold what is wanted are read (:func:`_files_for`)."""
    wanted = sorted(clock_ranges)
    if not wanted:
        return
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-raw-")
    try:
        con = duckdb_sql.connect(tmpdir)
        try:
            yield from _stream(con, run, wanted, clock_ranges, steps, progress, spans_only, drawn_steps or {})
        finally:
            con.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _files_for(run: LoadedRun, sid: int, clock_range: ClockRange, steps: tuple[int | None, int | None] | None,
               drawn: tuple[int, int] | None, spans_only: bool) -> list[str]:
    """The JSON files of session ``sid`` that can hold a record :func:`session_records` wants
    (``LoadedRun.file_ranges``: a view of a few steps of a week-long session reads the files
    around them, not the week): a span or an unstepped mark in ``clock_range`` needs a file whose
    records' times reach it; a tag, event or metric of a step in ``steps``, or a device metric
    of a step in ``drawn`` (the steps of the executions the view draws), one whose marks' steps
    do (with no ``steps``: every file). A file loaded without a range, and a session's last
    file (it may have grown since it was loaded), are always read."""
    files = run.files.get(sid, [])
    if clock_range is None or len(files) < 2 or (not spans_only and steps is None):
        return list(files)
    w0, w1 = clock_range
    lo, hi = (None, None) if steps is None else steps
    low, high = -(2**62) if lo is None else lo, 2**62 if hi is None else hi
    if drawn is not None:
        low, high = min(low, drawn[0]), max(high, drawn[1])

    def wanted(found: FileRange | None) -> bool:
        if found is None or not (found.last_t < w0 or found.first_t > w1):
            return True
        return not spans_only and found.first_mark_step is not None and found.last_mark_step is not None \
            and not (found.last_mark_step < low or found.first_mark_step > high)

    ranges = run.file_ranges
    return [p for p in files[:-1] if wanted(ranges.get(p))] + files[-1:]


def _stream(
    con: Any, run: LoadedRun, wanted: list[int], clock_ranges: Mapping[int, ClockRange],
    steps: tuple[int | None, int | None] | None, progress: Progress | None, spans_only: bool,
    drawn_steps: Mapping[int, tuple[int, int]],
) -> Iterator[tuple[int, list[RawRecord]]]:
    con.execute("CREATE TEMP TABLE files_batch (path VARCHAR, sid INTEGER)")
    con.execute("CREATE TEMP TABLE clock_ranges (sid INTEGER, w0 BIGINT, w1 BIGINT)")
    con.execute("CREATE TEMP TABLE fidmap (fid INTEGER, sid INTEGER)")
    if run.parquet_path is not None and run.parquet_fids:
        con.execute(f"CREATE TEMP VIEW parquet_records AS SELECT * FROM read_parquet({duckdb_sql.sql_str(run.parquet_path)})")
    lo, hi = steps if steps is not None else (None, None)
    in_steps = "true" if steps is None else (
        f"(r.step >= {int(lo) if lo is not None else -(2**62)} AND r.step <= {int(hi) if hi is not None else 2**62})"
    )
    where = (
        "(r.kind = 'span' AND r.t0 IS NOT NULL AND r.t1 IS NOT NULL AND "
        "  ((r.t1 > w.w0 AND r.t0 < w.w1) OR (r.t0 = r.t1 AND r.t0 BETWEEN w.w0 AND w.w1)))"
    )
    if not spans_only:
        where += (
            f" OR (r.kind IN ('tag', 'event', 'metric') AND r.t IS NOT NULL AND "
            f"  ((r.step IS NOT NULL AND {in_steps}) OR (r.step IS NULL AND r.t BETWEEN w.w0 AND w.w1)))"
            f" OR (r.kind = 'metric' AND r.name IN ({', '.join(repr(m) for m in schema.DEVICE_METRICS)}))"
        )
    # a chart of spans draws none of their attributes: not read (each is JSON text parsed a record)
    attrs = "NULL" if spans_only else "CAST(r.attrs AS VARCHAR)"
    columns = f"r.kind, r.name, r.cat, r.t0, r.t1, r.t, r.step, r.tid, r.err, r.value, {attrs}"
    # batches of whole sessions
    batches: list[list[int]] = [[]]
    size = 0.0
    for sid in wanted:
        # a JSON file is parsed whole; a session's rows of the Parquet copy are a filtered read,
        # 1/8 of the cost: 512 compacted sessions per query (16 queries -> 2 at 1,024 ranks: a
        # 20-step trace slice 5.5 s -> 4.8 s)
        files = len(run.files.get(sid, ())) + (1 / _PARQUET_SHARE if sid in run.parquet_fids else 0)
        if batches[-1] and size + files > _BATCH_FILES:
            batches.append([])
            size = 0.0
        batches[-1].append(sid)
        size += files
    done = 0
    for batch in batches:
        con.execute("DELETE FROM clock_ranges")
        con.execute("DELETE FROM files_batch")
        con.execute("DELETE FROM fidmap")
        duckdb_sql.insert_rows(con, "clock_ranges", [(sid, *_bounds(clock_ranges[sid])) for sid in batch])
        parts = []
        paths = [(p, sid) for sid in batch for p in _files_for(run, sid, clock_ranges[sid], steps, drawn_steps.get(sid), spans_only)]
        if paths:
            duckdb_sql.insert_rows(con, "files_batch", paths)
            parts.append(
                f"SELECT f.sid, {columns} FROM {duckdb_sql.read_json_sql([p for p, _ in paths])} r "
                "JOIN files_batch f ON r.filename = f.path JOIN clock_ranges w ON w.sid = f.sid "
                f"WHERE ({where}) AND {duckdb_sql.VALID_JSON}"
            )
        fids = [(fid, sid) for sid in batch for fid in run.parquet_fids.get(sid, ())]
        if fids and run.parquet_path is not None:
            duckdb_sql.insert_rows(con, "fidmap", fids)
            fid_list = ", ".join(str(f) for f, _ in fids)
            parts.append(
                f"SELECT m.sid, {columns} FROM parquet_records r JOIN fidmap m ON r.fid = m.fid "
                f"JOIN clock_ranges w ON w.sid = m.sid WHERE r.fid IN ({fid_list}) AND ({where}) AND r.bad IS NULL"
            )
        if not parts:
            for sid in batch:
                yield sid, []
            continue
        seen: set[int] = set()
        cursor = con.execute(
            f"SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY sid, coalesce(t0, t), t1 DESC, kind, name, step, cat, tid, value"
        )
        current: int | None = None
        records: list[RawRecord] = []
        # one object per distinct kind, name and category (a window of a long run holds
        # millions of records of a few names: a string each was about 60 bytes a field)
        shared: dict[str, str] = {}
        while True:
            rows = cursor.fetchmany(CHUNK_RECORDS)
            if not rows:
                break
            for row in rows:
                sid = row[0]
                if sid != current or len(records) >= CHUNK_RECORDS:
                    if current is not None:
                        seen.add(current)
                        yield current, records
                    current, records = sid, []
                kind, name, cat, t0, t1, t, step, tid, err, value, attrs = row[1:]
                if len(shared) < _SHARED_STRINGS:
                    kind = shared.setdefault(kind, kind)
                    if name is not None:
                        name = shared.setdefault(name, name)
                    if cat is not None:
                        cat = shared.setdefault(cat, cat)
                records.append(RawRecord(kind, name, cat, t0, None if t1 is None else max(t1, t0 or t1), t, step,
                                         tid, bool(err), value, _attrs(attrs) if attrs is not None else None))
        if current is not None:
            seen.add(current)
            yield current, records
        for sid in batch:  # a session with nothing in its range still has its steps to show
            if sid not in seen:
                yield sid, []
        done += len(batch)
        if progress is not None:
            progress("reading spans", done, len(wanted))


HANG_EVENTS = ("hang", "hang_over")  # goodtrace.record.hang.HANG_EVENT, HANG_OVER_EVENT



def hang_events_in(con: Any) -> dict[int, list[tuple[str, int, int | None]]]:
    """(name, t, step) of the hang events of each session that has one, from the run model's
    event table (a DuckDB connection of :mod:`goodtrace.read.load`)."""
    names = ", ".join(f"'{name}'" for name in HANG_EVENTS)
    rows = con.execute(f"SELECT sid, name, t, step FROM m_events WHERE name IN ({names}) ORDER BY sid, t, name, step").fetchall()
    found: dict[int, list[tuple[str, int, int | None]]] = {}
    for sid, name, t, step in rows:
        found.setdefault(int(sid), []).append((str(name), int(t), None if step is None else int(step)))
    return found


def hang_details(run: LoadedRun, events: dict[int, list[tuple[str, int, int | None]]]) -> dict[int, list[HangEvent]]:
    """Per session with a hang event (``events``: :func:`hang_events_in`): its hang events in
    time order, with attributes (empty where they could not be read: a compacted copy without
    the JSON files)."""
    found: dict[int, list[HangEvent]] = {}
    for index, named in events.items():
        session_detail = run.details.get(index)
        if session_detail is not None:
            details = [HangEvent(n, t, s, a or {}) for n, t, s, a in session_detail.events if n in HANG_EVENTS]
        else:
            details = _from_files(run, index)
        if not details:  # the files are gone (a compacted copy): names and times only
            details = [HangEvent(n, t, s, {}) for n, t, s in named]
        found[index] = sorted(details, key=lambda e: e[1])
    return found


def _from_files(run: LoadedRun, index: int) -> list[HangEvent]:
    events: list[HangEvent] = []
    for path in run.files.get(index, ()):
        try:
            data = read_bytes(run.path, path)
        except OSError:
            continue
        for record in SegmentRecords(data, path, []):
            if record.get(schema.F_KIND) == schema.EVENT and record.get(schema.F_NAME) in HANG_EVENTS:
                attrs, step = record.get(schema.F_ATTRS), record.get(schema.F_STEP)
                events.append(HangEvent(record[schema.F_NAME], int(record[schema.F_T]),
                                        step if isinstance(step, int) else None, attrs if isinstance(attrs, dict) else {}))
    return events
