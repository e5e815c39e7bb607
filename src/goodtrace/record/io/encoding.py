"""What a record looks like on its way to disk: the bounded buffer the training thread appends
to, and the encoder that turns record tuples into JSON lines on the writer's thread (runs of
plain spans in one C call, ``_speedups.encode_plain_spans``, when the extension was built;
the same lines in Python otherwise). :mod:`goodtrace.record.io.writer` moves them to storage."""

from __future__ import annotations

import collections
import importlib
import json
import os
from collections.abc import Callable
from typing import Any

from goodtrace import schema
from goodtrace.record.errors import describe

_speedups: Any
try:
    if os.environ.get("GOODTRACE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("GOODTRACE_PURE_PYTHON is set")
    _speedups = importlib.import_module("goodtrace.record._speedups")
    if not hasattr(_speedups, "Sink") or not hasattr(_speedups, "encode_plain_spans"):
        raise ImportError("an older build of _speedups")
except ImportError:
    _speedups = None
_encode_plain_spans: Callable[[list[tuple[Any, ...]], dict[Any, bytes], int], tuple[bytes, int]] | None = (
    None if _speedups is None else _speedups.encode_plain_spans
)


class RecordBuffer:
    """The recorder's in-memory buffer: ``append`` keeps at most ``limit`` records and counts
    the ones it had to drop. ``append`` is a C callable when ``_speedups`` was built (a length
    check and a deque append), else a Python closure doing the same."""

    __slots__ = ("_count", "_sink", "append", "limit", "records")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.records: collections.deque[tuple[Any, ...]] = collections.deque()
        self._count = [0]
        self._sink: Any = None
        self.append: Callable[[tuple[Any, ...]], None]
        if _speedups is not None:
            self._sink = _speedups.Sink(self.records, limit)
            self.append = self._sink
        else:
            self.append = _bounded_append(self.records, limit, self._count)

    @property
    def dropped(self) -> int:
        """Records refused because the buffer was full."""
        return int(self._sink.dropped) if self._sink is not None else self._count[0]

    def __len__(self) -> int:
        return len(self.records)

    def append_always(self, record: tuple[Any, ...]) -> None:
        """Append past the bound (one record: the finish record, which crash accounting needs)."""
        self.records.append(record)

    def popleft(self) -> tuple[Any, ...]:
        return self.records.popleft()

    def clear(self) -> None:
        self.records.clear()


def _bounded_append(
    records: collections.deque[tuple[Any, ...]], limit: int, count: list[int]
) -> Callable[[tuple[Any, ...]], None]:
    push = records.append

    def append(record: tuple[Any, ...]) -> None:
        if len(records) < limit:
            push(record)
        else:
            count[0] += 1

    return append


#: The most characters of JSON one record's attributes (or value) take in the files; a larger
#: one is cut: strings to 1,000 characters and containers to 100 items, or else replaced by
#: ``{"truncated_chars": <its size>}``. A 40 MB attribute never makes a 40 MB line.
MAX_ATTRS_CHARS = 64 * 1024


def _dumps(value: Any) -> str:
    """JSON for attribute values: never fails (odd objects become strings, NaN becomes null,
    cycles and deep nesting are cut) and is never longer than MAX_ATTRS_CHARS."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except Exception:
        text = json.dumps(_sanitise(value), allow_nan=False, separators=(",", ":"))
    if len(text) > MAX_ATTRS_CHARS:
        size = len(text)
        text = json.dumps(_sanitise(value, cut=100), allow_nan=False, separators=(",", ":"))
        if len(text) > MAX_ATTRS_CHARS:
            text = f'{{"truncated_chars":{size}}}'
    return text


def _sanitise(value: Any, depth: int = 0, cut: int | None = None) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return value if cut is None else value[:1000]
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if depth < 4 and isinstance(value, dict):
        items = list(value.items())[:cut]
        return {k if isinstance(k, str) else describe(k): _sanitise(v, depth + 1, cut) for k, v in items}
    if depth < 4 and isinstance(value, (list, tuple)):
        return [_sanitise(v, depth + 1, cut) for v in value[:cut]]
    return describe(value, 1000)


def _extra(record: tuple[Any, ...], index: int, field: str) -> str:
    """``,"field":N`` for an optional integer field at ``record[index]`` (absent or None: "")."""
    value = record[index] if len(record) > index else None
    return "" if value is None else f',"{field}":{int(value)}'


class _Encoder:
    """Encodes record tuples to JSON lines; caches the JSON form of repeated strings and, per
    span key, the constant part of a plain span's line (no attributes, no error, a step)."""

    def __init__(self) -> None:
        self._strings: dict[Any, str] = {}
        self._span_formats: dict[Any, str] = {}
        self._span_prefixes: dict[Any, bytes] = {}  # the same, up to "t0": (for the C loop)

    def string(self, value: Any) -> str:
        try:
            cached = self._strings.get(value)
        except TypeError:  # unhashable "name": write its repr
            return json.dumps(repr(value)[:1000])
        if cached is None:
            text = value if isinstance(value, str) else repr(value)
            cached = json.dumps(text[:1000])
            if len(self._strings) < 100_000:
                self._strings[value] = cached
        return cached

    @staticmethod
    def step(value: Any) -> str:
        return "null" if value is None else str(int(value))

    def encode_many(
        self, records: list[tuple[Any, ...]], out: list[bytes], on_error: Callable[[Exception], None]
    ) -> int:
        """Append the UTF-8 lines of ``records`` to ``out``; returns how many were encoded.

        Runs of plain spans (no attributes, no error, int times, step and thread) whose key was
        seen before go through ``_speedups.encode_plain_spans`` in one call when it was built;
        every other record, and the first span of each key, through the Python code below,
        which writes the same bytes."""
        fast = _encode_plain_spans
        prefixes = self._span_prefixes
        formats = self._span_formats
        push = out.append
        done = 0
        index, total = 0, len(records)
        while index < total:
            if fast is not None:
                data, stop = fast(records, prefixes, index)
                if stop > index:
                    push(data)
                    done += stop - index
                    index = stop
                    if index >= total:
                        break
            record = records[index]
            index += 1
            try:
                key = record[0]
                if key.__class__ is tuple and record[5] is None and record[6] is None and record[3].__class__ is int:
                    fmt = formats.get(key)
                    if fmt is None:
                        fmt = self._span_format(key)
                    line = fmt % record[1:5]  # the common span in one %-format
                else:
                    line = self.encode(record)
                push(line.encode("utf-8", "surrogatepass"))
                done += 1
            except Exception as exc:
                on_error(exc)
        return done

    def _span_format(self, key: Any) -> str:
        s = self.string
        prefix = f'{{"kind":"span","name":{s(key[0])},"cat":{s(key[1])},"t0":'
        fmt = prefix.replace("%", "%%") + '%d,"t1":%d,"step":%d,"tid":%d,"err":false,"attrs":null}\n'
        if len(self._span_formats) < 100_000:
            self._span_formats[key] = fmt
            self._span_prefixes[key] = prefix.encode("utf-8", "surrogatepass")
        return fmt

    def encode(self, record: tuple[Any, ...]) -> str:
        kind = record[0]
        s = self.string
        if type(kind) is tuple:  # a span: (key, t0, t1, step, thread, attrs, exc_type)
            key, t0, t1, step, tid, attrs, exc_type = record
            attrs_json = "null" if attrs is None else _dumps(attrs)
            return (
                f'{{"kind":"span","name":{s(key[0])},"cat":{s(key[1])},"t0":{int(t0)},"t1":{int(t1)},'
                f'"step":{self.step(step)},"tid":{int(tid)},"err":{"false" if exc_type is None else "true"},'
                f'"attrs":{attrs_json}}}\n'
            )
        if kind is schema.STEP:  # (STEP, step, t0, t1[, seq])
            step, t0, t1 = record[1:4]
            return f'{{"kind":"step","step":{self.step(step)},"t0":{t0},"t1":{t1}{_extra(record, 4, "seq")}}}\n'
        if kind is schema.SYNC:  # (SYNC, step, t, how[, seq[, after]])
            step, t, how = record[1:4]
            return (
                f'{{"kind":"sync","step":{self.step(step)},"t":{t},"how":{s(how)}'
                f'{_extra(record, 4, "seq")}{_extra(record, 5, "after")}}}\n'
            )
        if kind is schema.TAG:
            _, step, name, t = record
            return f'{{"kind":"tag","step":{self.step(step)},"name":{s(name)},"t":{int(t)}}}\n'
        if kind is schema.EVENT:
            _, name, t, step, attrs = record
            attrs_json = "null" if attrs is None else _dumps(attrs)
            return (
                f'{{"kind":"event","name":{s(name)},"t":{int(t)},"step":{self.step(step)},'
                f'"attrs":{attrs_json}}}\n'
            )
        if kind is schema.METRIC:
            _, name, step, value, reduce, t = record
            return (
                f'{{"kind":"metric","name":{s(name)},"step":{self.step(step)},'
                f'"value":{_dumps(value)},"reduce":{s(reduce)},"t":{int(t)}}}\n'
            )
        if kind is schema.CLOCK:
            _, offset, rtt, reference, t = record
            return (
                f'{{"kind":"clock","offset_ns":{int(offset)},"rtt_ns":{int(rtt)},'
                f'"attrs":{{"reference_rank":{int(reference)}}},"t":{int(t)}}}\n'
            )
        if kind is schema.FINISH:  # (FINISH, completed, t, reason[, exception])
            completed, t, reason = record[1:4]
            exception = record[4] if len(record) > 4 else None
            crash = "" if exception is None else f',"exception":{s(exception)}'
            return (
                f'{{"kind":"finish","completed":{_dumps(completed)},"t":{t},'
                f'"reason":{s(reason)}{crash}}}\n'
            )
        raise ValueError(f"unknown record kind {kind!r}")
