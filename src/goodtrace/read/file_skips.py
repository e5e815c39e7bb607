"""Lines a report skips in each record file, and the copies it reads instead of a file: one
without its lines too long for DuckDB (:func:`shortened_copy`), or one of the part of
a file still being written that a report reads (:func:`range_copy`; the segment cache keeps the
reduction of the part before it).

Lines longer than a record may be are left out of a copy of their file, counted and named:
DuckDB refuses a whole batch of files when one line is longer than its read buffer
(``maximum_object_size``): a 40 MB event attribute, or a torn 100 MB last line, would make the
whole run unreadable. When that happens the loader reads, instead of each file that has such
lines, a copy in which they are empty lines (the line numbers stay), and counts them. Copies
live in one temporary directory per process, removed at exit (the views read them again
after the load). Standard library only; memory holds one block and one line of at most the
limit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence

from goodtrace.read.discovery import where_of
from goodtrace.read.validate import MAX_LINE_BYTES, SKIP_REASONS

__all__ = ["SHORTEN_TO", "FileSkips", "LongLines", "copy_without_long_lines", "range_copy", "shortened_copy"]

# A file DuckDB refused for a line too long is read from a copy without the lines longer than
# this: a little under DuckDB's buffer (duckdb_sql.DUCKDB_OBJECT_BYTES, twice over), so that
# the retry always fits.
SHORTEN_TO = MAX_LINE_BYTES - 65536


class FileSkips:
    """Lines skipped in each file, by reason (validate.SKIP_REASONS), and the warnings that
    name them; ``substitutes`` maps a file to the copy read instead (its long lines left out),
    ``ranged`` a copy of some of a file's bytes (:func:`range_copy`) to the file and the byte
    the copy starts at."""

    def __init__(self) -> None:
        self.by_file: dict[str, dict[str, int]] = {}
        self.substitutes: dict[str, str] = {}
        self.ranged: dict[str, tuple[str, int]] = {}
        self.unranged: set[str] = set()  # files to read by range that were read whole (no copy)
        self.long_ranges: set[str] = set()  # files whose range was read without its long lines
        self.notes: list[str] = []

    def add(self, path: str, reason: str, count: int) -> None:
        if count:
            counts = self.by_file.setdefault(path, {})
            counts[reason] = counts.get(reason, 0) + count

    def add_stored(self, path: str, counts: Mapping[str, object]) -> None:
        """The lines a chunk index or compact's manifest says were skipped in ``path`` (what it
        holds is read as written elsewhere: reasons this reader does not know, and counts that
        are not whole numbers, are left out)."""
        for reason, count in counts.items():
            if reason in SKIP_REASONS and isinstance(count, int) and not isinstance(count, bool):
                self.add(path, reason, count)

    def add_rows(self, path: str, rows: dict[str, int], torn: bool) -> None:
        """What DuckDB found in one file: rows by reason (its first line is the header the
        session came from, not an extra one; an unreadable row that is the file's torn tail is a
        torn last line)."""
        rows = dict(rows)
        if rows.get("extra_header"):
            rows["extra_header"] -= 1
        elif rows.get("unreadable"):  # the header line itself, which DuckDB could not decode
            rows["unreadable"] -= 1
        if torn and rows.get("unreadable"):
            rows["unreadable"] -= 1
            rows["torn_last_line"] = rows.get("torn_last_line", 0) + 1
        for reason, count in rows.items():
            self.add(path, reason, count)

    def shorten(self, paths: Sequence[str]) -> dict[str, str]:
        """Copies of the files among ``paths`` that have lines over the limit (DuckDB refused
        their batch); the long lines are counted and named."""
        done: dict[str, str] = {}
        shortened = set(self.substitutes.values())
        for path in paths:
            if path in shortened:
                continue
            found = shortened_copy(path, SHORTEN_TO)
            if found is None:
                continue
            copy, left_out = found
            original = self.original(path)
            done[path] = self.substitutes[path] = copy
            self.add(original, "too_long", left_out.too_long)
            self.add(original, "torn_last_line", 1 if left_out.torn else 0)
            numbers = left_out.numbers
            start = self.ranged.get(path, ("", 0))[1]
            if start:  # a range copy's line k (its line 1: the file's header) is the file's line before + k - 1
                before = _lines_before(original, start)
                numbers = [before + k - 1 for k in numbers]
            shown = ", ".join(str(n) for n in numbers[:5]) + (" ..." if len(numbers) > 5 else "")
            self.notes.append(f"{where_of(original)}: line(s) {shown} longer than {MAX_LINE_BYTES // 2**20} "
                              "MiB; skipped (the rest of the file is read)")
        return done

    def original(self, path: str) -> str:
        for original, copy in self.substitutes.items():
            if copy == path:
                path = original
                break
        return self.ranged[path][0] if path in self.ranged else path


def _lines_before(path: str, end: int) -> int:
    """The lines a file's first ``end`` bytes hold (each ends in a newline)."""
    count = 0
    with open(path, "rb") as handle:
        left = end
        while left > 0:
            block = handle.read(min(left, 1 << 22))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count


def range_copy(path: str, start: int, end: int, folder: str) -> str:
    """A copy of bytes ``start`` to ``end`` of a record file in ``folder``, after the file's
    header line when ``start`` is past it (so that the copy reads as a segment of the same
    session): the part of a file still being written that a report reads, once and whole
    lines (:mod:`goodtrace.read.segment_cache` keeps the reduction of the part before
    ``start``). Raises OSError."""
    os.makedirs(folder, exist_ok=True)
    handle, target = tempfile.mkstemp(dir=folder, suffix=f"-{os.path.basename(path)}")
    with open(path, "rb") as source, os.fdopen(handle, "wb") as out:
        if start > 0:
            header = source.readline(MAX_LINE_BYTES)
            if len(header) <= start:  # else the range starts in the header: all of the file
                out.write(header if header.endswith(b"\n") else header + b"\n")
        source.seek(start)
        left = end - start
        while left > 0:
            block = source.read(min(left, 1 << 22))
            if not block:
                break
            out.write(block)
            left -= len(block)
    return target


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
