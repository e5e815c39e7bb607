"""Chrome trace-event JSON pieces: event encoders, number formats and the trace summary.

Everything here is text: events are built as JSON strings (exact microseconds from integer
nanoseconds, cached name strings) for :mod:`goodtrace.renderers.perfetto` to stream out.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

__all__ = [
    "COMFORTABLE_TRACE_BYTES",
    "JSON",
    "TRACE_BYTES_PER_RECORD",
    "Lane",
    "TraceSummary",
    "complete",
    "instant",
    "meta",
    "ms",
    "safe",
    "string",
    "us",
]

# The Perfetto UI runs its trace processor in WebAssembly inside the browser tab: JSON traces of
# a few hundred MB open in seconds to a minute; past ~1 GB the tab needs many GB of memory and
# past ~2 GB the URL loader fails. Above this size the command warns and suggests a slice.
COMFORTABLE_TRACE_BYTES = 300_000_000
TRACE_BYTES_PER_RECORD = 105  # a trace's JSON per record read (report_steps' run: 130.6 MiB, 1.3 M records)


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    """What was written: sizes and counts, plus a warning when the UI would struggle."""

    path: str
    bytes_written: int
    json_bytes: int
    events: int
    processes: int
    spans: int
    origin_wall_ns: int
    warning: str | None = None


# UTF-8 output: the Perfetto JSON importer does not decode \uXXXX escapes in every field.
JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


_STRINGS: dict[Any, str] = {}


def string(value: Any) -> str:
    """A name or category as a JSON string, cached (runs repeat a few names millions of times)."""
    cached = _STRINGS.get(value)
    if cached is None:
        if len(_STRINGS) > 100_000:
            _STRINGS.clear()
        cached = _STRINGS[value] = JSON.encode(str(value))
    return cached


def us(ns: int) -> str:
    """Nanoseconds as a microsecond JSON number, exactly (Chrome trace ``ts``/``dur`` unit)."""
    if ns >= 0:
        whole, frac = divmod(ns, 1000)
        return f"{whole}.{frac:03d}" if frac else str(whole)
    whole, frac = divmod(-ns, 1000)
    return f"-{whole}.{frac:03d}" if frac else f"-{whole}"


def ms(ns: int) -> float:
    return round(ns / 1e6, 6)


def safe(value: Any) -> Any:
    """JSON-safe args: non-finite floats become strings (the trace must stay valid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe(v) for v in value]
    return value


class Lane:
    """One track: a synthetic thread id with a name and sort order."""

    __slots__ = ("name", "sort", "tid")

    def __init__(self, tid: int, name: str, sort: int) -> None:
        self.tid, self.name, self.sort = tid, name, sort


def meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> str:
    return f'{{"ph":"M","name":"{name}","pid":{pid},"tid":{tid},"args":{JSON.encode(args)}}}'


def complete(name: str, category: str, pid: int, tid: int, ts: str, dur: str, args: dict[str, Any]) -> str:
    return (
        f'{{"ph":"X","name":{string(name)},"cat":{string(category)},"pid":{pid},"tid":{tid},'
        f'"ts":{ts},"dur":{dur},"args":{JSON.encode(args)}}}'
    )


def instant(name: str, category: str, pid: int, tid: int, ts: str, args: dict[str, Any]) -> str:
    return (
        f'{{"ph":"i","s":"t","name":{string(name)},"cat":{string(category)},"pid":{pid},'
        f'"tid":{tid},"ts":{ts},"args":{JSON.encode(args)}}}'
    )
