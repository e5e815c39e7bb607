"""Run text (names, hosts, file names, warnings) made safe to print: names are data.

:func:`printable` shows control characters (ESC, OSC, BEL, carriage returns, ...) as escapes and
replaces lone surrogates, so no byte a run file holds can drive the terminal or make a
``print`` fail; ``one_line`` also folds line breaks, for messages that must stay one line.
Standard library only (the console renderer adds rich's markup escaping on top).
"""

from __future__ import annotations

import re

__all__ = ["one_line", "printable"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object) -> str:
    """``text`` with control characters as escapes (``\\x1b``) and lone surrogates replaced."""
    value = str(text)
    if any("\ud800" <= c <= "\udfff" for c in value):
        value = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], value)


def one_line(text: object) -> str:
    """:func:`printable` on one line (line breaks and runs of blanks become one space)."""
    return printable(" ".join(str(text).split()))
