"""A session's step completions before a point of its files, read backwards a block at a time:
what ``goodtrace watch`` needs of a rank's past (its last 2,000 step times, for the slowdown
alarm) once it has read its present (:class:`goodtrace.read.follow.RunFollower`). Only the
lines that hold a step completion's mark (the writers' ``"kind":"sync"`` text) are kept; they
are decoded, by the readers' rules, once the wanted number of them is found or the session's
first byte is reached, and handed on in file order. Each byte before the point is read once,
and no more of them than the wanted step completions take.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from goodtrace import schema
from goodtrace.read.segments import SegmentRecords
from goodtrace.read.validate import check_record

__all__ = ["BLOCK", "FIRST_BLOCK", "SYNC_MARKS", "StepHistory", "marked_lines"]

FIRST_BLOCK = 64 * 1024  # the first block read back from a point (a few step completions, often)
BLOCK = 2**20  # ... then blocks of this size (larger while a line does not fit one)
# A step completion as the writers write it (a line in another spelling is not counted: a tail
# then starts earlier, and its history is shorter, not wrong)
SYNC_MARKS = (b'"kind":"sync"', b'"kind": "sync"')


def marked_lines(data: bytes, start: int = 0, end: int | None = None) -> list[bytes]:
    """The lines of ``data[start:end]`` (whole lines) that hold a step completion's mark, in
    order (found by the mark, not line by line: most lines hold none)."""
    end = len(data) if end is None else end
    lines: set[tuple[int, int]] = set()
    for mark in SYNC_MARKS:
        at = data.find(mark, start, end)
        while at >= 0:
            stop = data.find(b"\n", at, end)
            stop = end if stop < 0 else stop
            lines.add((max(start, data.rfind(b"\n", start, at) + 1), stop))
            at = data.find(mark, stop, end)
    return [data[a:b] for a, b in sorted(lines)]


@dataclasses.dataclass
class StepHistory:
    """The step completions of one session before byte ``at`` of its file ``index`` (of
    ``paths``, its files in order), back to the ``wanted``-th (or its first byte)."""

    paths: list[str]
    wanted: int
    index: int
    at: int  # a line start: the bytes before it are not read yet
    found: int = 0  # marked lines kept so far
    read: int = 0  # bytes read so far
    _blocks: list[list[bytes]] = dataclasses.field(default_factory=list)  # kept lines, the latest block first
    _span: int = FIRST_BLOCK  # the next block's size
    _long: bool = False  # ... whatever the budget (a line did not fit the last one)

    @property
    def done(self) -> bool:
        return self.found >= self.wanted or (self.index == 0 and self.at == 0)

    def read_back(self, fetch: Callable[[str, int, int], bytes], size_of: Callable[[str], int], budget: int) -> None:
        """Read blocks backwards (``fetch(path, start, size)``) until it is done or ``budget``
        bytes are read. Raises ``OSError``."""
        while not self.done and budget > 0:
            if self.at == 0:
                self.index -= 1
                self.at = size_of(self.paths[self.index])
                continue
            path = self.paths[self.index]
            size = self._span if self._long else min(self._span, max(budget, FIRST_BLOCK))  # within the budget ...
            begin = max(0, self.at - size)
            block = fetch(path, begin, self.at - begin)
            if len(block) != self.at - begin:
                raise OSError(f"{path} is shorter than it was")
            self.read += len(block)
            budget -= len(block)
            first = 0 if begin == 0 else block.find(b"\n") + 1  # the line it starts in begins earlier
            if begin > 0 and not 0 < first < len(block):
                self._span, self._long = 2 * len(block), True  # ... unless no line fit it: twice as large
                continue
            lines = marked_lines(block, first)
            keep = lines[max(0, len(lines) - (self.wanted - self.found)):]
            self._blocks.append(keep)
            self.found += len(keep)
            self.at = begin + first
            self._span, self._long = BLOCK, False

    def records(self, where: str, problems: list[str], skipped: dict[str, int]) -> Iterator[dict[str, Any]]:
        """The step completions kept, in file order, decoded by the readers' rules (``where``
        names the files in ``problems``); then nothing is kept."""
        lines = [line for block in reversed(self._blocks) for line in block]
        self._blocks = []
        if not lines:
            return
        records = iter(SegmentRecords(b"\n".join(lines) + b"\n", where, problems, skipped))
        first = next(records, None)
        if first is not None and check_record(first) is None:  # (the stream takes a chunk's first line as a header)
            records = itertools.chain((first,), records)
        for record in records:
            if record.get(schema.F_KIND) == schema.SYNC:
                yield record
