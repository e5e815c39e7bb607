"""A timeline's pieces as columns (:class:`PieceColumns`): a long run's reference rank has
millions of them, a piece or two per step interval when its steps hold overhead. What
:func:`goodtrace.analysis.partition.assemble` emits is collected by :class:`PieceBuilder`, single
pieces into Python lists and runs of pieces (a stretch carved in numpy,
:meth:`goodtrace.analysis.cut.SessionCut.carve_columns`) as arrays, merged with the piece before
when adjacent and alike, as one piece object at a time was."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["PieceBuilder", "PieceColumns", "ordered_sums"]


@dataclasses.dataclass(frozen=True)
class PieceColumns:
    """A timeline's pieces as columns (a long run has millions): each piece's start and end
    (ns, on the wall clock), its label and its startup part as codes into ``labels`` and
    ``parts`` (part code 0 is "": none), labels numbered in the order they first appear (every
    label listed is some piece's)."""

    start: Any  # int64 arrays
    end: Any
    label: Any  # int32 arrays (codes: a few labels)
    part: Any
    labels: list[str]
    parts: list[str]

    def __len__(self) -> int:
        return len(self.start)


class PieceBuilder:
    """The pieces :func:`assemble` emits, merged with the one before when adjacent and alike:
    single pieces into Python lists, runs of pieces (a stretch carved in numpy) as arrays."""

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self.codes: dict[str, int] = {}
        self.part_codes: dict[str, int] = {"": 0}
        self._blocks: list[tuple[Any, Any, Any, Any]] = []
        self._s: list[int] = []
        self._e: list[int] = []
        self._l: list[int] = []
        self._p: list[int] = []

    def _last(self) -> tuple[int, int, int] | None:
        """The last piece's end, label and part codes."""
        if self._s:
            return self._e[-1], self._l[-1], self._p[-1]
        if self._blocks:
            _, e, label, part = self._blocks[-1]
            return int(e[-1]), int(label[-1]), int(part[-1])
        return None

    def _extend_last(self, end: int) -> None:
        if self._s:
            self._e[-1] = end
        else:
            self._blocks[-1][1][-1] = end

    def add(self, s: int, e: int, label: str, part: str) -> None:
        code = self.codes.setdefault(label, len(self.codes))
        part_code = self.part_codes.setdefault(part, len(self.part_codes))
        if self._last() == (s, code, part_code):
            self._extend_last(e)
            return
        self._s.append(s)
        self._e.append(e)
        self._l.append(code)
        self._p.append(part_code)

    def add_run(self, starts: Any, ends: Any, labels: Any, names: list[str]) -> Any:
        """Pieces without a part, already merged among themselves, in order (``labels``: codes
        into ``names``); returns their label codes here."""
        np = self._np
        if not len(starts):
            return np.zeros(0, dtype=np.int32)
        found, first = np.unique(labels, return_index=True)
        for k in found[np.argsort(first, kind="stable")].tolist():  # numbered in the order they appear
            self.codes.setdefault(names[k], len(self.codes))
        codes = np.array([self.codes.get(name, -1) for name in names], dtype=np.int32)[labels]
        first = 0
        if self._last() == (int(starts[0]), int(codes[0]), 0):
            self._extend_last(int(ends[0]))
            first = 1
        if first < len(starts):
            self._flush()
            self._blocks.append((np.array(starts[first:], dtype=np.int64), np.array(ends[first:], dtype=np.int64),
                                 codes[first:], np.zeros(len(codes) - first, dtype=np.int32)))
        return codes

    def _flush(self) -> None:
        if self._s:
            np = self._np
            self._blocks.append((np.array(self._s, dtype=np.int64), np.array(self._e, dtype=np.int64),
                                 np.array(self._l, dtype=np.int32), np.array(self._p, dtype=np.int32)))
            self._s, self._e, self._l, self._p = [], [], [], []

    def columns(self) -> PieceColumns:
        """The pieces as columns (once: the builder lets go of its blocks)."""
        np = self._np
        self._flush()
        joined = [np.concatenate([block[k] for block in self._blocks]) if self._blocks
                  else np.zeros(0, dtype=np.int64 if k < 2 else np.int32) for k in range(4)]
        self._blocks = []  # the columns hold them now
        return PieceColumns(joined[0], joined[1], joined[2], joined[3], list(self.codes), list(self.part_codes))


def ordered_sums(codes: Any, lengths: Any, names: list[str], skip_zero: bool) -> dict[str, int]:
    """Per code, the sum of ``lengths``, keyed by name in the order the codes first appear
    (``skip_zero``: code 0 left out)."""
    import numpy as np

    found, first = np.unique(codes, return_index=True)
    out: dict[str, int] = {}
    for code in found[np.argsort(first, kind="stable")].tolist():
        if not (skip_zero and code == 0):
            out[names[code]] = int(lengths[codes == code].sum())
    return out
