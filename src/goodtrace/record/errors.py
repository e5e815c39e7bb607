"""What goodtrace tells the user when something goes wrong inside it: one warning class, and
the one way to issue it.

Training continues whatever happens in goodtrace; problems surface as a ``GoodtraceWarning``
(issued once per kind of problem) and, for lost records, as counts in the run's files.
:func:`warn` never raises, whatever the program's warnings filter says (``-W error`` or
``warnings.simplefilter("error")`` turn a warning into an exception, which must not reach the
training loop or kill a writer thread).
"""

from __future__ import annotations

import warnings

__all__ = ["GoodtraceWarning", "warn"]


class GoodtraceWarning(UserWarning):
    """Something went wrong inside goodtrace; training continues."""


def warn(message: str, *, stacklevel: int = 2) -> None:
    """Issue ``goodtrace: message`` as a :class:`GoodtraceWarning`; never raises."""
    try:
        warnings.warn(f"goodtrace: {message}", GoodtraceWarning, stacklevel=stacklevel + 1)
    except Exception:  # the filter made it an error: it was still shown to whoever asked for errors
        pass
