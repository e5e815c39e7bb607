"""Arguments of the public recording calls, made safe: whatever a user passes, these return
something goodtrace can record, plus what was wrong with it (the caller warns once). They
never raise, and they run off the hot path (when a span name is first seen, or per step).

Names (spans, metrics, tags, events) are plain ``str`` cut to :data:`MAX_NAME_CHARS`; step
numbers are ints in the signed 64-bit range every reader of the files can hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from goodtrace import schema
from goodtrace.record.errors import describe

__all__ = ["MAX_NAME_CHARS", "name_text", "reduction", "rollback_to_step", "step_number", "timeout_seconds"]

#: Names longer than this are cut (the writer writes no more of any name).
MAX_NAME_CHARS = 1000
#: The most distinct metric names one run records (semantics.md section 9): a name made per step or
#: per sample (an f-string with the step in it) would otherwise grow every table without end.
MAX_METRIC_NAMES = 10_000
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def name_text(value: object) -> tuple[str, str | None]:
    """(the name to record, None) or (its text, what was wrong): a ``str`` as it is, a ``str``
    subclass as its plain text, anything else as its (cut) repr; cut to MAX_NAME_CHARS."""
    if type(value) is str:
        text, problem = value, None
    elif isinstance(value, str):
        text, problem = str.__str__(value), None  # a subclass's own __hash__/__eq__ never run again
    else:
        text = describe(value)
        problem = f"a name must be a str, got {type(value).__qualname__}; recorded as {text}"
    if len(text) > MAX_NAME_CHARS:
        return text[:MAX_NAME_CHARS], problem or f"a name of {len(text):,} characters was cut to {MAX_NAME_CHARS}"
    return text, problem


def step_number(value: object) -> tuple[int | None, str | None]:
    """(the step number, None) or (None, what was wrong): an int, or anything ``int()``
    accepts (NumPy and torch integers), within the signed 64-bit range."""
    try:
        number = value if type(value) is int else int(value)  # type: ignore[call-overload]
    except Exception:
        return None, f"step number must be an int, got {describe(value)}"
    if type(number) is not int or not _INT64_MIN <= number <= _INT64_MAX:
        return None, f"step number must be an int in the signed 64-bit range, got {describe(value, 60)}"
    return number, None


def rollback_to_step(attrs: object) -> tuple[int | None, str | None]:
    """The step a ``gt.event("rollback", to_step=N)`` restored, or (None, what was wrong)."""
    to_step = attrs.get("to_step") if isinstance(attrs, Mapping) else None
    if to_step is None:
        return None, "gt.event('rollback') needs to_step=<the step whose state was restored>"
    number, problem = step_number(to_step)
    return number, None if problem is None else f"gt.event('rollback', to_step=...): {problem}"


def reduction(value: object) -> tuple[str, str | None]:
    """(the reduction, None) or ("mean", what was wrong)."""
    if type(value) is str and value in schema.REDUCTIONS:
        return value, None
    return "mean", (
        f"reduce must be one of {sorted(schema.REDUCTIONS)}, got {describe(value, 60)}; recorded with 'mean'"
    )


def timeout_seconds(value: object, default: float) -> tuple[float, str | None]:
    """(a finite, non-negative number of seconds, None) or (``default``, what was wrong)."""
    if value is None:
        return default, None
    if (type(value) is int or type(value) is float) and isinstance(value, (int, float)):
        seconds = float(value) if -1e18 < value < 1e18 else math.inf  # float(10**400) raises
        if math.isfinite(seconds) and seconds >= 0:
            return seconds, None
    return default, f"timeout must be a non-negative number of seconds, got {describe(value, 60)}; using {default}"
