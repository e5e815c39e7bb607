"""What goodtrace tells the user when something goes wrong inside it: one warning class.

Training continues whatever happens in goodtrace; problems surface as a ``GoodtraceWarning``
(issued once per kind of problem) and, for lost records, as counts in the run's files.
"""

from __future__ import annotations


class GoodtraceWarning(UserWarning):
    """Something went wrong inside goodtrace; training continues."""
