"""The JSON form of a run's analysis (``goodtrace report --json``): one object, stable keys.

``render_json(analysis)`` returns the text; the object is ``RunAnalysis.to_dict()`` (schema
``goodtrace.report/1``). Numbers are seconds or fractions; bucket values also carry exact ns.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii
from typing import IO, Any

from goodtrace.analysis import RunAnalysis
from goodtrace.analysis.steps import StepRow
from goodtrace.renderers.json_text import dumps_indented, dumps_items


def report_object(analysis: RunAnalysis, *, include_steps: bool = True) -> dict[str, Any]:
    return analysis.to_dict(include_steps=include_steps)


def finite(value: Any) -> Any:
    """``value`` with every float that JSON cannot hold (NaN, infinities) as null. The reader
    lets none reach the numbers; this keeps the output valid JSON whatever a field holds."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _dumps(value: Any, indent: int | None, newline: str = "\n") -> str:
    """``json.dumps(value, indent=indent)`` (``newline``: the line break and indentation the
    text sits at, with an indent), every float JSON cannot hold written as null."""
    def text(of: Any) -> str:
        return json.dumps(of, allow_nan=False) if indent is None else dumps_indented(of, indent, newline)

    try:
        return text(value)
    except ValueError:  # a non-finite float somewhere: written as null
        return text(finite(value))


def _row_text(row: StepRow, indent: int, newline: str) -> str:
    """``_dumps(row.to_dict(), indent, newline)``, written from the row's fields (no copy)."""
    try:
        return dumps_items(row.items(), indent, newline)
    except ValueError:  # a non-finite float: written as null
        return _dumps(row.to_dict(), indent, newline)


def iter_json(analysis: RunAnalysis, *, include_steps: bool = True, indent: int | None = 2) -> Iterator[str]:
    """The text of :func:`render_json` in pieces: everything but the step table, then the step
    table a row at a time (its last key), so that a report of a million steps is written
    without holding a million rows. The pieces joined are ``json.dumps`` of
    :func:`report_object`, to the byte."""
    head = _dumps(report_object(analysis, include_steps=False), indent)
    if not include_steps:
        yield head
        return
    if indent is None:
        yield head[:-1] + ', "steps": ['
        for i, row in enumerate(analysis.steps):
            yield (", " if i else "") + _dumps(row.to_dict(), None)
        yield "]}"
        return
    inner = "\n" + " " * (2 * indent)  # a row is an object in a list in the report object
    yield head[:-2] + ",\n" + " " * indent + '"steps": ['
    rows = 0
    for columns in analysis.steps.blocks(_TEXT_BLOCK):
        text = _block_text(columns, indent, inner)
        yield ("," if rows else "") + inner + ("," + inner).join(text)
        rows += len(text)
    yield ("\n" + " " * indent + "]" if rows else "]") + "\n}"


_TEXT_BLOCK = 4096  # rows written at a time (their text, about 600 bytes a row, held together)
_BOOL = {True: "true", False: "false"}
# each field of a step row and how its values are written (a field of a new type fails here)
_STEP_FIELDS = tuple(field.name for field in dataclasses.fields(StepRow))
_STEP_KINDS: dict[str, Any] = {field.name: {"int": int, "float": float, "bool": bool, "str": str, "float | None": None,
                                            "dict[str, float]": dict, "tuple[str, ...]": tuple}[str(field.type)]
                               for field in dataclasses.fields(StepRow)}


def _block_text(columns: list[list[Any]], indent: int, newline: str) -> list[str]:
    """Each row's text (:func:`_row_text`) of a block of the step table's rows as columns
    (``StepTable.blocks``): each column written at once, then every row from one template of
    its keys; a block with a float JSON cannot hold is written row by row (as null)."""
    field = newline + " " * indent
    text: list[Any] = []
    try:
        for name, column in zip(_STEP_FIELDS, columns, strict=True):
            kind = _STEP_KINDS[name]
            if kind is int:
                text.append(map(int.__repr__, column))
            elif kind is float:
                if not all(map(math.isfinite, column)):
                    raise ValueError(name)
                text.append(map(float.__repr__, column))
            elif kind is bool:
                text.append(map(_BOOL.__getitem__, column))
            elif kind is str:
                known = {value: encode_basestring_ascii(value) for value in set(column)}
                text.append(map(known.__getitem__, column))
            elif kind is None:  # a float or None
                if not all(math.isfinite(v) for v in column if v is not None):
                    raise ValueError(name)
                text.append(["null" if v is None else float.__repr__(v) for v in column])
            elif kind is dict:  # a step's overhead and metrics: written as dumps_indented writes them
                text.append([dumps_items(v.items(), indent, field) if v else "{}" for v in column])
            else:  # a list of strings (tags)
                text.append([dumps_indented(list(v), indent, field) if v else "[]" for v in column])
        template = "{" + field + ("," + field).join(encode_basestring_ascii(name).replace("%", "%%") + ": %s"
                                                    for name in _STEP_FIELDS) + newline + "}"
        return [template % values for values in zip(*text, strict=True)]
    except ValueError:  # a non-finite float: the rows one by one, it written as null
        return [_row_text(StepRow(*values), indent, newline) for values in zip(*columns, strict=True)]


def render_json(analysis: RunAnalysis, *, include_steps: bool = True, indent: int | None = 2) -> str:
    return "".join(iter_json(analysis, include_steps=include_steps, indent=indent))


def write_json(analysis: RunAnalysis, out: IO[str], *, include_steps: bool = True, indent: int | None = 2) -> None:
    """:func:`render_json` written to ``out`` piece by piece (``report --json`` on stdout)."""
    for piece in iter_json(analysis, include_steps=include_steps, indent=indent):
        out.write(piece)
