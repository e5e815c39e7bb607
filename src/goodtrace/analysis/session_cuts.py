"""The cuts the views read (``RunAnalysis.cuts``): which are kept once the analysis is done,
and how the others are made again when a view asks for one.

The analysis cuts every session once (:func:`goodtrace.analysis.cut.cut_session`) and then drops
what it no longer needs; the views that walk every rank (the HTML heat map and gantt chart, the
trace) read every session's cut through :class:`SessionCuts`, which holds the reference
sessions' (and those that fit in :data:`KEEP_CUTS_BYTES`) and cuts any other again from its
records when asked for: a run of many short sessions is cut once, a long run of many ranks
holds a bounded number of cuts at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from goodtrace.analysis.cut import SessionCut

__all__ = ["KEEP_CUTS_BYTES", "SessionCuts", "cut_bytes"]

# The cuts of sessions other than the reference ones that SessionCuts keeps of those the
# analysis made, and of those it made again, at most (each).
KEEP_CUTS_BYTES = 128 * 2**20


def cut_bytes(cut: SessionCut) -> int:
    """About what a cut holds: its per-execution and per-interval columns (8 bytes each)."""
    return 64 * len(cut.exec_step) + (32 + 8 * len(cut.interval_overhead)) * len(cut.interval_start) + 4096


class SessionCuts(Mapping[int, SessionCut]):
    """The cuts of the sessions of ``order`` (the job's order), as a mapping. The analysis
    hands over the cuts it made (:meth:`hold`); any other is made again by ``recut`` (the same
    ``cut_session`` of the same records: one derivation, made again) when asked for, and the
    last ones made are kept within :data:`KEEP_CUTS_BYTES` (the last one always). Without
    ``recut`` (the records were released) only the cuts held can be read."""

    def __init__(self, order: Sequence[int], recut: Callable[[int], SessionCut] | None = None) -> None:
        self._order = list(order)
        self._members = set(self._order)
        self._recut = recut
        self._held: dict[int, SessionCut] = {}
        self._held_bytes = 0  # of those held beside the ones always kept
        self._made: dict[int, tuple[SessionCut, int]] = {}  # the last ones made, oldest first
        self._made_bytes = 0

    def hold(self, session: int, cut: SessionCut, *, always: bool = False) -> None:
        """Keep a cut the analysis made: ``always`` (a reference session's, or any when none
        can be made again), else while those kept so fit in :data:`KEEP_CUTS_BYTES` (past
        it, the session is cut again when read)."""
        if session not in self._members:
            raise KeyError(session)
        if not always and self._recut is not None:
            size = cut_bytes(cut)
            if self._held_bytes + size > KEEP_CUTS_BYTES:
                return
            self._held_bytes += size
        self._held[session] = cut

    def __getitem__(self, session: int) -> SessionCut:
        held = self._held.get(session)
        if held is not None:
            return held
        if session not in self._members or self._recut is None:
            raise KeyError(session)
        made = self._made.pop(session, None)
        if made is None:
            while self._made and self._made_bytes > KEEP_CUTS_BYTES // 2:  # room before the next is made
                self._made_bytes -= self._made.pop(next(iter(self._made)))[1]
            cut = self._recut(session)
            made = (cut, cut_bytes(cut))
            self._made_bytes += made[1]
        self._made[session] = made  # the newest last
        while len(self._made) > 1 and self._made_bytes > KEEP_CUTS_BYTES:
            self._made_bytes -= self._made.pop(next(iter(self._made)))[1]
        return made[0]

    def __iter__(self) -> Iterator[int]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, session: object) -> bool:
        return session in self._members
