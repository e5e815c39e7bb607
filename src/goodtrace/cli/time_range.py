"""The command line's time forms, parsed in one place: durations (``90``, ``15m``, ``1.5h``),
``--window A:B|D``, ``--every D`` and the ``--since``/``--until`` edges of every command that
reads a run (a UTC time, a duration from the job start, or ``step:N``)."""

from __future__ import annotations

import argparse
import datetime
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when parsed: ``goodtrace --help`` loads no analysis
    from goodtrace.analysis.time_range import RangeEdge

__all__ = ["add_range_arguments", "parse_duration", "parse_edge", "parse_window", "range_options"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_FORMS = ("a UTC time (2026-11-24T03:00, or with a zone: +02:00), a duration from the job start "
          "(90s, 15m, 2h; negative: before the job's end) or a step (step:1200)")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``1.5h`` -> seconds (a leading ``-`` is kept)."""
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d*)?)\s*(s|m|min|h|d)?\s*", text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90, 90s, 15m, 1.5h)")
    return float(match.group(1)) * _UNITS[match.group(2) or ""]


def parse_window(text: str) -> tuple[float, float]:
    """``A:B`` (seconds from the job start; negative from its end; either side may be empty)
    or one duration ``D`` meaning the last D of the job."""
    if ":" in text:
        lo, hi = text.split(":", 1)
        a = parse_duration(lo) if lo.strip() else 0.0
        b = parse_duration(hi) if hi.strip() else math.inf
        if b != math.inf and (a >= 0) == (b >= 0) and b <= a:
            raise ValueError(f"window {text!r} is empty (B must be after A)")
        return a, b
    width = parse_duration(text)
    if width <= 0:
        raise ValueError(f"window {text!r} must be a positive duration")
    return -width, math.inf


def parse_edge(text: str, option: str = "--since") -> RangeEdge:
    """One ``--since``/``--until`` value: ``step:N``, a duration, or an ISO 8601 date/time
    (UTC unless it names a zone; ``Z`` accepted)."""
    from goodtrace.analysis.time_range import RangeEdge

    value = text.strip()
    if value.lower().startswith("step:"):
        number = value[5:].strip()
        if not re.fullmatch(r"-?\d+", number):
            raise ValueError(f"{option} {text!r}: a step is step:N with a whole number N")
        return RangeEdge(step=int(number), text=value)
    try:
        return RangeEdge(offset_s=parse_duration(value), text=value)
    except ValueError:
        pass
    iso = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        moment = datetime.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected {_FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    delta = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    wall_ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
    return RangeEdge(wall_ns=wall_ns, text=value)


def add_range_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="WHEN",
                        help="only from WHEN on: a UTC time (2026-11-24T03:00), a duration from the job start "
                             "(2h; negative: before the end) or a step (step:1200)")
    parser.add_argument("--until", metavar="WHEN", help="only until WHEN (the same forms as --since)")


def range_options(args: argparse.Namespace) -> dict[str, Any]:
    """``since``/``until`` keywords for :func:`goodtrace.analysis.analyze` (ValueError: bad text;
    an edge already made, a ``RangeEdge``, is kept: ``goodtrace diff`` selects an attempt so)."""
    from goodtrace.analysis.time_range import RangeEdge

    options: dict[str, Any] = {}
    for name in ("since", "until"):
        text = getattr(args, name, None)
        if isinstance(text, RangeEdge):
            options[name] = text
        elif text is not None:
            options[name] = parse_edge(text, f"--{name}")
    return options

