"""What goodtrace tells the user when something goes wrong inside it: one warning class, and
the one way to issue it.

Training continues whatever happens in goodtrace; problems surface as a ``GoodtraceWarning``
(issued once per kind of problem) and, for lost records, as counts in the run's files.
:func:`warn` never raises, whatever the program's warnings filter says (``-W error`` or
``warnings.simplefilter("error")`` turn a warning into an exception, which must not reach the
training loop or kill a writer thread): under such a filter the message goes to stderr instead.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["GoodtraceWarning", "describe", "warn"]


class GoodtraceWarning(UserWarning):
    """Something went wrong inside goodtrace; training continues."""


def warn(message: str, *, stacklevel: int = 2) -> None:
    """Issue ``goodtrace: message`` as a :class:`GoodtraceWarning`; never raises."""
    try:
        warnings.warn(f"goodtrace: {message}", GoodtraceWarning, stacklevel=stacklevel + 1)
    except Exception:  # the filter made it an error, which must not reach the loop: show it plainly
        try:
            sys.stderr.write(f"GoodtraceWarning (not raised: training continues): goodtrace: {message}\n")
        except Exception:
            pass


def describe(value: object, limit: int = 200) -> str:
    """``repr(value)`` for messages and record names, cut to ``limit`` characters; never raises
    (a user's ``__repr__`` may raise, or return a gigabyte)."""
    try:
        text = repr(value[:limit] if type(value) is str else value)
    except Exception:
        text = f"<{type(value).__qualname__} object>"
    if type(text) is not str:
        text = f"<{type(value).__qualname__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
