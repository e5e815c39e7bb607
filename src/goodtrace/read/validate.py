"""What a readable record is: the one set of rules every reader applies where records enter.

A segment's first line is its header: it must name a readable schema, a rank and a world size
in range and a (wall, monotonic) clock anchor, else the segment is skipped; an optional header
field of the wrong type or out of range is ignored, and named (:func:`check_header`). Every
other line must be one JSON object of a known kind whose required fields are present and in
range: times are integer ns in [0, 2**61), a span or step does not end before it starts, a sync
point is not before its last not-ready poll, device and FLOPs metrics are finite
(:data:`RULES`). A line that breaks them is skipped and counted under a reason
(:data:`SKIP_REASONS`); :func:`check_record` applies the rules in Python (``goodtrace
records``) and :func:`invalid_sql` writes the same rules as one DuckDB expression (the loader
behind the reports), so every reader skips the same records for the same reasons.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from goodtrace import schema

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_STEP",
    "MAX_TIME",
    "MAX_WALL",
    "MAX_WORLD",
    "RULES",
    "SKIP_REASONS",
    "HeaderCheck",
    "check_header",
    "check_record",
    "describe_skipped",
    "invalid_sql",
    "is_time",
    "json_object",
]

MAX_TIME = 2**61  # monotonic ns (73 years of uptime): any two times differ by less than int64
MAX_WALL = 2**62  # wall-clock ns since 1970 (the year 2116): a wall plus a monotonic span fits int64
MAX_STEP = 2**62  # |step number|: the difference of two fits int64
MAX_COUNT = 2**62  # sequence numbers, dropped-record counts, round-trip times
MAX_WORLD = 2**20  # ranks in one job (1,048,576); a larger world size is a corrupt header
MAX_LINE_BYTES = 32 * 2**20  # one line (DuckDB's read buffer); longer lines are skipped and counted

# Field types: (lowest, highest) allowed integer, both included; None = a non-null value.
TIME = (0, MAX_TIME - 1)
STEP = (-MAX_STEP + 1, MAX_STEP - 1)
COUNT = (0, MAX_COUNT - 1)
OFFSET = (-MAX_TIME + 1, MAX_TIME - 1)
PRESENT = None
TIME_FIELDS = (schema.F_T0, schema.F_T1, schema.F_T, schema.F_MONO)

# Metrics whose value the analysis computes with: a finite number (device times not negative).
FINITE_METRICS = frozenset({"flops_per_step", "model_flops_per_step", "tokens_per_step"})
NON_NEGATIVE_METRICS = frozenset(schema.DEVICE_METRICS)


class Rule:
    """The fields one record kind must have (``required``), may have (``optional``: absent,
    null or of another type counts as absent; an integer must be in range), and pairs that
    must be ordered (``ordered``: (a, b) means a <= b when both are there)."""

    def __init__(self, required: Mapping[str, tuple[int, int] | None],
                 optional: Mapping[str, tuple[int, int]] | None = None,
                 ordered: tuple[tuple[str, str], ...] = ()) -> None:
        self.required = dict(required)
        # a time field is a time in any record (the last sign of life reads them all)
        self.optional = {field: TIME for field in TIME_FIELDS if field not in self.required} | dict(optional or {})
        self.ordered = ordered


RULES: dict[str, Rule] = {  # in order of frequency (the SQL tests them in turn)
    schema.SPAN: Rule({schema.F_T0: TIME, schema.F_T1: TIME}, {schema.F_STEP: STEP}, ((schema.F_T0, schema.F_T1),)),
    schema.STEP: Rule({schema.F_STEP: STEP, schema.F_T0: TIME, schema.F_T1: TIME}, {schema.F_SEQ: COUNT},
                      ((schema.F_T0, schema.F_T1),)),
    schema.SYNC: Rule({schema.F_STEP: STEP, schema.F_T: TIME}, {schema.F_SEQ: COUNT, schema.F_READY_AFTER: TIME},
                      ((schema.F_READY_AFTER, schema.F_T),)),
    schema.METRIC: Rule({schema.F_NAME: PRESENT}, {schema.F_T: TIME, schema.F_STEP: STEP}),
    schema.HEARTBEAT: Rule({schema.F_MONO: TIME}, {schema.F_DROPPED: COUNT}),
    schema.TAG: Rule({schema.F_T: TIME}, {schema.F_STEP: STEP}),
    schema.EVENT: Rule({schema.F_T: TIME}, {schema.F_STEP: STEP}),
    schema.CLOCK: Rule({schema.F_T: TIME, schema.F_OFFSET: OFFSET}, {schema.F_RTT: COUNT}),
    schema.FINISH: Rule({schema.F_T: TIME}),
}

# Why a line was skipped (the keys of every reader's skip counts), in report order.
SKIP_REASONS: dict[str, str] = {
    "torn_last_line": "torn last line (a process killed mid-write)",
    "unreadable": "not a goodtrace record (not JSON, not one object, or no kind)",
    "too_long": f"longer than {MAX_LINE_BYTES // 2**20} MiB",
    "extra_header": "header line after the first",
    "unknown_kind": "record of an unknown kind",
    **{f"invalid_{kind}": f"{kind} record with a missing, non-numeric or impossible field" for kind in RULES},
    "file_skipped": "in a segment file skipped for its header",
}


def is_time(value: object) -> TypeGuard[int]:
    return type(value) is int and 0 <= value < MAX_TIME


def _in(value: object, bounds: tuple[int, int]) -> bool:
    return type(value) is int and bounds[0] <= value <= bounds[1]


def check_record(record: dict[str, Any]) -> str | None:
    """None for a valid record (a dict with a string kind), else the reason it is skipped."""
    kind = record.get(schema.F_KIND)
    rule = RULES.get(kind)  # type: ignore[arg-type]
    if rule is None:
        return "extra_header" if kind == schema.HEADER else "unknown_kind"
    for field, bounds in rule.required.items():
        value = record.get(field)
        if value is None or (bounds is not None and not _in(value, bounds)):
            return f"invalid_{kind}"
    for field, bounds in rule.optional.items():
        value = record.get(field)
        if type(value) is int and not bounds[0] <= value <= bounds[1]:
            return f"invalid_{kind}"
    for a, b in rule.ordered:
        first, second = record.get(a), record.get(b)
        if type(first) is int and type(second) is int and first > second:
            return f"invalid_{kind}"
    if kind == schema.METRIC:
        name = record.get(schema.F_NAME)
        if isinstance(name, str) and (name in FINITE_METRICS or name in NON_NEGATIVE_METRICS):
            value = record.get(schema.F_VALUE)
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                    or (name in NON_NEGATIVE_METRICS and value < 0)):
                return f"invalid_{kind}"
    return None


def invalid_sql(prefix: str = "") -> str:
    """The rules of :func:`check_record` as a DuckDB expression over typed record columns
    (``prefix`` + field name; DuckDB reads a field of the wrong type as NULL): NULL for a valid
    record, else the reason. A row whose ``kind`` is NULL is a line that is not a record.
    Written for speed (every line of a run goes through it): a required field's range test is
    NULL when the field is missing, which fails the record; kinds in order of frequency."""

    def column(field: str) -> str:
        return prefix + field

    def in_range(field: str, bounds: tuple[int, int]) -> str:
        return f"{column(field)} BETWEEN {bounds[0]} AND {bounds[1]}"

    kind = column(schema.F_KIND)
    cases = [f"WHEN {kind} IS NULL THEN 'unreadable'"]
    for name, rule in RULES.items():
        conditions: list[str] = []
        for field, bounds in rule.required.items():
            conditions.append(f"{column(field)} IS NOT NULL" if bounds is None else in_range(field, bounds))
        for field, bounds in rule.optional.items():
            conditions.append(f"coalesce({in_range(field, bounds)}, true)")
        for a, b in rule.ordered:
            conditions.append(f"coalesce({column(a)} <= {column(b)}, true)")
        if name == schema.METRIC:
            finite = ", ".join(f"'{n}'" for n in sorted(FINITE_METRICS))
            non_negative = ", ".join(f"'{n}'" for n in sorted(NON_NEGATIVE_METRICS))
            value = column(schema.F_VALUE)
            conditions.append(
                f"({column(schema.F_NAME)} NOT IN ({finite}, {non_negative}) OR coalesce(isfinite({value}) AND "
                f"({column(schema.F_NAME)} NOT IN ({non_negative}) OR {value} >= 0), false))"
            )
        cases.append(f"WHEN {kind} = '{name}' THEN CASE WHEN {' AND '.join(conditions)} THEN NULL "
                     f"ELSE 'invalid_{name}' END")
    cases.append(f"WHEN {kind} = '{schema.HEADER}' THEN 'extra_header'")
    return "CASE " + " ".join(cases) + " ELSE 'unknown_kind' END"


def describe_skipped(counts: Mapping[str, int]) -> str:
    """'3 lines skipped (not a goodtrace record (...): 2; span record with ...: 1)'."""
    total = sum(counts.values())
    order = list(SKIP_REASONS)
    parts = [f"{SKIP_REASONS.get(reason, reason)}: {counts[reason]:,}"
             for reason in sorted(counts, key=lambda r: order.index(r) if r in order else len(order))
             if counts[reason]]
    return f"{total:,} line{'s' if total != 1 else ''} skipped (" + "; ".join(parts) + ")"


# ---------------------------------------------------------------------------------- headers
class HeaderCheck:
    """A header line checked: ``header`` (a copy without the ignored fields) when usable, else
    ``refused`` (why the segment is skipped); ``ignored`` names optional fields left out;
    ``newer`` is the schema version when it is newer than this goodtrace reads."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.refused: str | None = None
        self.ignored: list[str] = []
        self.newer: object = None
        self.older = False


_OPTIONAL_HEADER_INTS: dict[str, tuple[int, int]] = {
    schema.H_PROC_START: TIME,
    schema.H_INIT: TIME,
    schema.H_SUBMIT_WALL: (0, MAX_WALL - 1),
    schema.H_PID: (0, 2**63 - 1),
    schema.H_RESTART: (0, 2**62),
    schema.H_LOCAL_RANK: (0, MAX_WORLD - 1),
    schema.H_SEGMENT: (0, 2**62),
    "main_tid": (0, 2**64 - 1),
}


def check_header(record: object, *, readable: frozenset[int] = frozenset(range(schema.SCHEMA_VERSION + 1))) -> HeaderCheck:
    """Check a segment's first line (already JSON-decoded). ``readable``: the schema versions
    this reader accepts (older ones are read as best effort)."""
    out = HeaderCheck()
    if not isinstance(record, dict) or record.get(schema.F_KIND) != schema.HEADER:
        out.refused = "does not start with a goodtrace header line"
        return out
    version = record.get(schema.H_SCHEMA)
    if type(version) is not int:
        out.refused = f"header schema version {_show(version)} is not a number"
        return out
    if version > schema.SCHEMA_VERSION:
        out.newer = version
        out.refused = (f"schema version {version} is newer than this goodtrace reads ({schema.SCHEMA_VERSION}); "
                       "upgrade goodtrace to read it")
        return out
    if version not in readable:
        out.refused = f"schema version {version} is not one this goodtrace reads ({sorted(readable)})"
        return out
    out.older = version not in schema.READABLE_VERSIONS
    rank, world = record.get(schema.H_RANK), record.get(schema.H_WORLD)
    mono, wall = record.get(schema.F_MONO), record.get(schema.F_WALL)
    if not _in(rank, (0, MAX_WORLD - 1)):
        out.refused = f"header rank {_show(rank)} is not a rank (0 to {MAX_WORLD - 1})"
    elif world is not None and not _in(world, (1, MAX_WORLD)):
        out.refused = f"header world size {_show(world)} is not a world size (1 to {MAX_WORLD})"
    elif not is_time(mono) or not _in(wall, (0, MAX_WALL - 1)):
        out.refused = (f"header clock anchor (wall {_show(wall)}, mono {_show(mono)}) is not a pair of "
                       "times in ns")
    if out.refused is not None:
        return out
    header = dict(record)
    for field, bounds in _OPTIONAL_HEADER_INTS.items():
        value = header.get(field, bounds)
        if value is None:  # written as null: unknown, as if absent
            del header[field]
        elif value is not bounds and not _in(value, bounds):
            out.ignored.append(field)
            del header[field]
    assert type(mono) is int
    for field in (schema.H_PROC_START, schema.H_INIT):  # a process starts before it writes
        value = header.get(field)
        if type(value) is int and value > mono:
            out.ignored.append(field)
            del header[field]
    for field in (schema.H_SESSION, schema.H_HOST):
        value = header.get(field)
        if value is not None and not (isinstance(value, str) and value):
            out.ignored.append(field)
            del header[field]
    config = header.get(schema.H_CONFIG)
    if config is not None and not isinstance(config, dict):
        out.ignored.append(schema.H_CONFIG)
        del header[schema.H_CONFIG]
    elif isinstance(config, dict):
        cleaned = dict(config)
        lag, flush = cleaned.get("lag"), cleaned.get("flush_interval_s")
        if lag is not None and not _in(lag, (0, 2**31)):
            out.ignored.append("config.lag")
            del cleaned["lag"]
        if "flush_interval_s" in cleaned and not (isinstance(flush, (int, float)) and not isinstance(flush, bool)
                                      and math.isfinite(flush) and 0 < flush < 1e9):
            out.ignored.append("config.flush_interval_s")
            del cleaned["flush_interval_s"]
        for key in ("overhead_categories", "blocking_categories"):
            if key in cleaned and not _strings(cleaned[key]):
                out.ignored.append(f"config.{key}")
                del cleaned[key]
        header[schema.H_CONFIG] = cleaned
    if "overhead_categories" in header and not _strings(header["overhead_categories"]):
        out.ignored.append("overhead_categories")
        del header["overhead_categories"]
    out.header = header
    return out


def _strings(value: object) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _show(value: object) -> str:
    """A field's value for a one-line message (cut, never a huge number in full)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def json_object(text: object, limit: int | None = None) -> dict[str, Any] | None:
    """Attributes text as a JSON object (None when it is not one, is too deeply nested, or is
    longer than ``limit``); NaN, Infinity and numbers beyond a float become null, so that
    every view can write them as JSON."""
    if not isinstance(text, str) or (limit is not None and len(text) > limit):
        return None
    try:
        value = json.loads(text, parse_constant=lambda _: None, parse_float=_finite_float)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
