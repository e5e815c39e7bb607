"""The details of ``hang`` events (the watchdog's: step, span, where, since, stack) of the
sessions that recorded one.

The loader keeps every session's events as (name, time, step); a hang's stack and the rest of
its attributes are wanted only where there is a hang, so they are read from those sessions'
own segment files (or taken from their full timelines when the loader holds them).
"""

from __future__ import annotations

from typing import Any

from goodtrace import schema
from goodtrace.read.loaded import LoadedRun
from goodtrace.read.segments import SegmentRecords, read_bytes

__all__ = ["HANG_EVENTS", "hang_details"]

HANG_EVENTS = ("hang", "hang_over")  # goodtrace.record.hang.HANG_EVENT, HANG_OVER_EVENT

HangEvent = tuple[str, int, int | None, dict[str, Any]]  # (name, t, step, attrs)


def hang_details(run: LoadedRun) -> dict[int, list[HangEvent]]:
    """Per session index with a hang event: its hang events in time order, with attributes
    (empty where they could not be read: a compacted copy without the JSON files)."""
    found: dict[int, list[HangEvent]] = {}
    for index, records in run.session_records.items():
        if not any(name in HANG_EVENTS for name, _, _ in records.events):
            continue
        timeline = run.timelines.get(index)
        if timeline is not None:
            events = [(n, t, s, a or {}) for n, t, s, a in timeline.events if n in HANG_EVENTS]
        else:
            events = _from_files(run, index)
        if not events:  # the files are gone (a compacted copy): names and times only
            events = [(n, t, s, {}) for n, t, s in records.events if n in HANG_EVENTS]
        found[index] = sorted(events, key=lambda e: e[1])
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
                events.append((record[schema.F_NAME], int(record[schema.F_T]),
                               step if isinstance(step, int) else None, attrs if isinstance(attrs, dict) else {}))
    return events
