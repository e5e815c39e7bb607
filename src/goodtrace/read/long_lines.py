"""Lines longer than a record may be: left out of a copy of their file, counted and named.

DuckDB refuses a whole batch of files when one line is longer than its read buffer
(``maximum_object_size``): a 40 MB event attribute, or a torn 100 MB last line, would make the
whole run unreadable. When that happens the loader reads, instead of each file that has such
lines, a copy in which they are empty lines (the line numbers stay), and counts them. Copies
live in one temporary directory per process, removed at exit (the timelines read them again
after the load). Standard library only; memory holds one block and one line of at most the
limit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from goodtrace.read.validate import MAX_LINE_BYTES

__all__ = ["LongLines", "copy_without_long_lines", "shortened_copy"]

_BLOCK = 1 << 20  # shorter than any line over the limit: lines inside one block are never long
_copies: str | None = None


class LongLines:
    """What :func:`copy_without_long_lines` left out: the 1-based line numbers of the long
    lines (``torn``: the last of them had no newline, a write cut short)."""

    def __init__(self) -> None:
        self.numbers: list[int] = []
        self.torn = False

    @property
    def too_long(self) -> int:
        return len(self.numbers) - (1 if self.torn else 0)


def copy_without_long_lines(source: str, target: str, limit: int = MAX_LINE_BYTES) -> LongLines:
    """Copy ``source`` to ``target`` with every line longer than ``limit`` bytes made empty."""
    out = LongLines()
    number = 1  # the line being read
    pending: list[bytes] = []
    length = 0
    over = False

    def end_line() -> None:
        nonlocal pending, length, over, number
        if over:
            out.numbers.append(number)
        else:
            write(b"".join(pending))
        write(b"\n")
        pending, length, over = [], 0, False
        number += 1

    def add(piece: bytes) -> None:
        nonlocal length, over, pending
        if over:
            return
        if length + len(piece) > limit:
            over, pending, length = True, [], 0
        else:
            pending.append(piece)
            length += len(piece)

    with open(source, "rb") as src, open(target, "wb") as dst:
        write = dst.write
        while True:
            block = src.read(_BLOCK)
            if not block:
                break
            first = block.find(b"\n")
            if first < 0:
                add(block)
                continue
            add(block[:first])
            end_line()
            last = block.rfind(b"\n")
            if last > first:  # whole lines, each shorter than the block
                middle = block[first + 1:last + 1]
                write(middle)
                number += middle.count(b"\n")
            add(block[last + 1:])
        if over:
            out.numbers.append(number)
            out.torn = True
        elif pending:
            write(b"".join(pending))
    return out


def shortened_copy(path: str, limit: int = MAX_LINE_BYTES) -> tuple[str, LongLines] | None:
    """A copy of ``path`` without its lines longer than ``limit`` (None when it has none): the
    copy's path and what was left out. The copy is removed when the process exits."""
    global _copies
    if os.path.getsize(path) <= limit:
        return None
    if _copies is None:
        _copies = tempfile.mkdtemp(prefix="goodtrace-lines-")
        atexit.register(shutil.rmtree, _copies, True)
    target = os.path.join(tempfile.mkdtemp(dir=_copies), os.path.basename(path))
    left_out = copy_without_long_lines(path, target, limit)
    if not left_out.numbers:
        os.remove(target)
        return None
    return target, left_out
