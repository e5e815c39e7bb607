"""The cuts the views read (``RunAnalysis.cuts``): which are kept in memory once the analysis is
done, and where the others wait until a view asks for one.

The analysis cuts every session once (:func:`goodtrace.analysis.cut.cut_session`) and then drops
what it no longer needs; the views that walk every rank (the HTML heat map and gantt chart, the
trace) read every session's cut through :class:`SessionCuts`, which holds the reference
sessions' (and those that fit in :data:`KEEP_CUTS_BYTES`) in memory and writes any other to a
temporary file (:class:`~goodtrace.analysis.spill.SpillFile`), read back when asked for: a run of
many short sessions is held whole, a long run of many ranks holds a bounded number of cuts at a
time, and the records they were cut from are released as each is cut (what a view reads again
it reads from the rank files, for its range alone).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from goodtrace.analysis.cut import SessionCut
from goodtrace.analysis.spill import SpillFile

__all__ = ["KEEP_CUTS_BYTES", "SessionCuts", "cut_bytes"]

# The cuts of sessions other than the reference ones that SessionCuts keeps in memory of those
# the analysis made, and of those it read back, at most (each).
KEEP_CUTS_BYTES = 128 * 2**20


def cut_bytes(cut: SessionCut) -> int:
    """About what a cut holds: its per-execution and per-interval columns (8 bytes each)."""
    return 64 * len(cut.exec_step) + (32 + 8 * len(cut.interval_overhead)) * len(cut.interval_start) + 4096


class SessionCuts(Mapping[int, SessionCut]):
    """The cuts of the sessions of ``order`` (the job's order), as a mapping. The analysis
    hands over the cuts it made (:meth:`hold`); those past :data:`KEEP_CUTS_BYTES` are written
    to a temporary file and read back when asked for (the same cut: one derivation), and the
    last ones read back are kept within :data:`KEEP_CUTS_BYTES` (the last one always). A cut
    that cannot be written (a full disk) is kept in memory."""

    def __init__(self, order: Sequence[int]) -> None:
        self._order = list(order)
        self._members = set(self._order)
        self._held: dict[int, SessionCut] = {}
        self._held_bytes = 0  # of those held beside the ones always kept
        self._file = SpillFile("goodtrace-cuts-")
        self._spilled: dict[int, tuple[tuple[int, int], int]] = {}  # where in the file, its cut_bytes
        self._read: dict[int, tuple[SessionCut, int]] = {}  # the last ones read back, oldest first
        self._read_bytes = 0

    def hold(self, session: int, cut: SessionCut, *, always: bool = False) -> None:
        """Keep a cut the analysis made: in memory when ``always`` (a reference session's) or
        while those kept so fit in :data:`KEEP_CUTS_BYTES`, else in the temporary file."""
        if session not in self._members:
            raise KeyError(session)
        if not always:
            size = cut_bytes(cut)
            if self._held_bytes + size > KEEP_CUTS_BYTES:
                try:
                    self._spilled[session] = (self._file.put(cut), size)
                    return
                except OSError:
                    pass  # kept in memory: the numbers are the same
            self._held_bytes += size
        self._held[session] = cut

    @property
    def spill_failure(self) -> str | None:
        """Why a cut could not be written to the temporary file (then kept in memory); None."""
        return self._file.failure

    def __getitem__(self, session: int) -> SessionCut:
        held = self._held.get(session)
        if held is not None:
            return held
        read = self._read.pop(session, None)
        if read is None:
            where, size = self._spilled[session]  # KeyError: not a session held
            while self._read and self._read_bytes > KEEP_CUTS_BYTES // 2:  # room before the next is read
                self._read_bytes -= self._read.pop(next(iter(self._read)))[1]
            read = (self._file.get(where), size)
            self._read_bytes += size
        self._read[session] = read  # the newest last
        while len(self._read) > 1 and self._read_bytes > KEEP_CUTS_BYTES:
            self._read_bytes -= self._read.pop(next(iter(self._read)))[1]
        return read[0]

    def __iter__(self) -> Iterator[int]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, session: object) -> bool:
        return session in self._members
