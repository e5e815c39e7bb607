"""The details of ``hang`` events (the watchdog's: step, span, where, since, stack) of the
sessions that recorded one.

The run model's event table says which sessions have one (name, time, step); a hang's stack
and the rest of its attributes are wanted only there, so they are read from those sessions'
own segment files (or taken from their step detail when the loader holds it).
"""

from __future__ import annotations

from typing import Any

from goodtrace import schema
from goodtrace.read.loaded import HangEvent, LoadedRun
from goodtrace.read.segments import SegmentRecords, read_bytes

__all__ = ["HANG_EVENTS", "hang_details", "hang_events_in"]

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
