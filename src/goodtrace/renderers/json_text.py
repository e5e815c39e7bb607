"""``json.dumps(value, indent=N, allow_nan=False)``, to the byte, in about half the time: Python's
C encoder takes no indent before 3.13, and its pure-Python one is a chain of generators that
costs about 20 us for a step-table row (a report of a million steps writes a million rows).
:func:`dumps_indented` writes the same text with one recursive function appending to a list
(about 10 us a row; ``benchmarks/json_steps.py``).
A test holds it equal to ``json.dumps`` over generated values (every JSON type, nested and
empty containers, escapes, non-string keys, subclasses of int and float)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii
from typing import Any

__all__ = ["dumps_indented", "dumps_items"]


def dumps_indented(value: Any, indent: int, newline: str = "\n") -> str:
    """``json.dumps(value, indent=indent, allow_nan=False)``; ``newline``: the line break and
    the indentation the text sits at (``"\\n" + "  "``: the same text, every line after the
    first indented two more). Raises ``ValueError`` for a float JSON cannot hold and
    ``TypeError`` for a value or key it cannot encode, as ``json.dumps`` does."""
    out: list[str] = []
    _write(value, out, newline, " " * indent)
    return "".join(out)


def dumps_items(items: Iterable[tuple[Any, Any]], indent: int, newline: str = "\n") -> str:
    """:func:`dumps_indented` of the object of ``items`` (pairs with distinct keys, in order),
    from the pairs themselves: an object written row after row (a step table's) is not copied
    into a dict first."""
    out: list[str] = []
    _write_items(items, out, newline, " " * indent)
    return "".join(out)


def _float(value: float) -> str:
    if math.isfinite(value):
        return float.__repr__(value)
    raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")


def _key(key: Any) -> str:
    # json's rules for keys, in its order: str, float, True, False, None, int
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return _float(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


def _write(value: Any, out: list[str], newline: str, step: str) -> None:
    # json's order of checks: str, None, True, False, int, float, list/tuple, dict
    if isinstance(value, str):
        out.append(encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = newline + step
        out.append("[" + inner)
        for i, item in enumerate(value):
            if i:
                out.append("," + inner)
            _write(item, out, inner, step)
        out.append(newline + "]")
    elif isinstance(value, dict):
        _write_items(value.items(), out, newline, step)
    else:
        raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


_KEY_TEXT: dict[str, str] = {}  # a short str key -> its text and ": " (the same few keys, row after row)
_KEYS_KEPT = 1 << 16


def _write_items(items: Iterable[tuple[Any, Any]], out: list[str], newline: str, step: str) -> None:
    inner = newline + step
    first = True
    for key, item in items:
        if first:
            out.append("{" + inner)
            first = False
        else:
            out.append("," + inner)
        if type(key) is str:
            name = _KEY_TEXT.get(key)
            if name is None:
                name = encode_basestring_ascii(key) + ": "
                if len(_KEY_TEXT) < _KEYS_KEPT and len(key) <= 64:
                    _KEY_TEXT[key] = name
        else:
            name = encode_basestring_ascii(_key(key)) + ": "
        # an entry of a plain str, int, finite float, bool or None in one piece (most of a report's):
        # not a call each; anything else (a container, a subclass) as above
        kind = type(item)
        if kind is str:
            out.append(name + encode_basestring_ascii(item))
        elif kind is float and math.isfinite(item):
            out.append(name + float.__repr__(item))
        elif kind is int:
            out.append(name + int.__repr__(item))
        elif item is None or kind is bool:
            out.append(name + ("null" if item is None else "true" if item else "false"))
        else:
            out.append(name)
            _write(item, out, inner, step)
    out.append("{}" if first else newline + "}")
