"""Segment files of a run directory and the records in them, one line at a time.

A run directory holds ``rank-NNNNN/<session>.<segment>.jsonl`` files (local, NFS, or any fsspec
URL). :func:`list_segments` finds them (anything that is not a regular file, such as a FIFO or
a directory named ``*.jsonl``, is skipped and named); :class:`SegmentRecords` decodes one
file's bytes as a stream of record dicts. Every line that is not a valid record is skipped and
counted by reason (:mod:`goodtrace.read.validate`): a torn *last* line, from a process killed
mid-write, is expected; others (not JSON, too deeply nested, longer than
``MAX_LINE_BYTES``, a record with an impossible field) are also reported as problems naming
the file and line. Standard library only (fsspec for URLs).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

from goodtrace import schema
from goodtrace.read.environment import run_cache_dir
from goodtrace.read.io_pool import io_map
from goodtrace.read.ring import RING_SUFFIX, recover_rings, ring_segments
from goodtrace.read.validate import MAX_LINE_BYTES, SKIP_REASONS, check_record
from goodtrace.record.io.storage import is_url, local_path

__all__ = [
    "MAX_PROBLEMS_PER_FILE",
    "SEGMENT_SUFFIX",
    "NotARunError",
    "SegmentRecords",
    "list_segments",
    "read_bytes",
    "segment_order",
]

SEGMENT_SUFFIX = ".jsonl"
MAX_PROBLEMS_PER_FILE = 20  # lines named one by one; the rest of a file's are counted


def segment_order(path: str) -> tuple[str, str, int, str]:
    """The key that lists segment files (paths or names) in the order they were written: by
    folder and session, then segment number as a number (the writer pads it to five digits, so
    past segment 99,999 name order would put ``.100000`` before ``.99999``, and what reads "a
    session's last file" would take a closed one for the open one)."""
    folder, _, name = path.rpartition("/")
    stem = name[:-len(SEGMENT_SUFFIX)] if name.endswith(SEGMENT_SUFFIX) else name
    session, dot, number = stem.rpartition(".")
    if dot and number.isascii() and number.isdigit():
        return folder, session, int(number), name
    return folder, stem, -1, name


class NotARunError(ValueError):
    """The path holds no goodtrace records."""


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def list_segments(run_dir: str, problems: list[str] | None = None, *, in_place: bool = False) -> list[tuple[str, str]]:
    """(rank directory name, segment path) pairs, sorted. Entries named ``*.jsonl`` that are
    not regular files (FIFOs, directories, devices, dangling links) are left out and named in
    ``problems``: opening a FIFO would wait forever for a writer. A local run's rings left by
    killed processes are turned into segments (:mod:`goodtrace.read.ring`): files in the
    reader's cache, listed where the run's own would be, the run left as it is; ``in_place``
    (``goodtrace compact``, which writes beside the run): written into the run, each ring
    deleted, for the rings whose writer is proven gone (the others are left out)."""
    found: list[tuple[str, str]] = []
    if is_url(run_dir):
        import fsspec

        fs, root = fsspec.core.url_to_fs(run_dir)
        for path in sorted(fs.glob(root.rstrip("/") + "/rank-*/*" + SEGMENT_SUFFIX), key=segment_order):
            found.append((path.rsplit("/", 2)[-2], path))
        return found
    root = local_path(run_dir)
    if not os.path.isdir(root):
        raise NotARunError(f"{run_dir!r} is not a directory")
    rank_dirs = [name for name in sorted(os.listdir(root)) if name.startswith("rank-")]
    # each rank directory listed (its entries' types from the listing, not a stat each), many
    # at once: on a network filesystem each listing is a round trip or more
    for entry, listed in zip(rank_dirs, io_map(lambda name: _list_rank_dir(os.path.join(root, name)), rank_dirs, root),
                             strict=True):
        if listed is None:
            continue  # not a directory
        rank_dir = os.path.join(root, entry)
        if isinstance(listed, OSError):
            if problems is not None:
                problems.append(f"{entry}: cannot be listed ({listed.strerror or listed}); skipped")
            continue
        recovered: dict[str, str] = {}
        if any(name.endswith(RING_SUFFIX) for name, _ in listed):  # a killed process's last records
            names = [name for name, _ in listed]
            if in_place:
                recover_rings(rank_dir, names, problems)
                again = _list_rank_dir(rank_dir)
                listed = again if isinstance(again, list) else []
            else:
                recovered = ring_segments(rank_dir, names, os.path.join(run_cache_dir(root, "rings"), entry), problems)
                listed = sorted([*listed, *((name, True) for name in recovered)], key=lambda item: segment_order(item[0]))
        for name, is_file in listed:
            if not name.endswith(SEGMENT_SUFFIX):
                continue
            if name in recovered:
                found.append((entry, recovered[name]))
                continue
            path = os.path.join(rank_dir, name)
            if is_file:
                found.append((entry, path))
                continue
            try:
                mode = os.stat(path).st_mode
            except OSError as exc:  # a dangling link, a link loop, no permission
                if problems is not None:
                    problems.append(f"{entry}/{name}: cannot be read ({exc.strerror or exc}); skipped")
                continue
            if stat.S_ISREG(mode):
                found.append((entry, path))
            elif problems is not None:
                problems.append(f"{entry}/{name}: {_file_kind(mode)}, not a segment file; skipped")
    return found


def _list_rank_dir(path: str) -> list[tuple[str, bool]] | OSError | None:
    """A rank directory's entries by name, each segment file's with whether it is a regular file
    (where the listing does not say, a stat: made here, on :func:`io_map`'s threads); None: not a
    directory; or why it cannot be listed."""
    try:
        if not os.path.isdir(path):
            return None
        with os.scandir(path) as entries:
            return sorted(((e.name, e.name.endswith(SEGMENT_SUFFIX) and _is_file(e)) for e in entries),
                          key=lambda entry: segment_order(entry[0]))
    except OSError as exc:
        return exc


def _is_file(entry: os.DirEntry[str]) -> bool:
    """A regular file (through a link), from the listing's type where it has one."""
    try:
        return entry.is_file()
    except OSError:
        return False


def read_bytes(run_dir: str, path: str, size: int | None = None) -> bytes:
    """The file's bytes (its first ``size`` bytes when given)."""
    if is_url(run_dir):
        import fsspec

        fs, _ = fsspec.core.url_to_fs(run_dir)
        if size is None:
            return bytes(fs.cat_file(path))
        return bytes(fs.cat_file(path, start=0, end=size)) if size else b""
    with open(path, "rb") as handle:
        return handle.read() if size is None else handle.read(size)


class _Lines:
    """The skip rules for one file's lines: counts by reason, problems naming file and line
    (the first :data:`MAX_PROBLEMS_PER_FILE`), whether the header line was seen."""

    def __init__(self, where: str, problems: list[str], skipped: dict[str, int] | None) -> None:
        self.where, self.problems = where, problems
        self.skipped: dict[str, int] = {} if skipped is None else skipped
        self.named = 0
        self.unnamed = 0
        self.first = True
        self.torn = 0  # lines that are not JSON (a torn last line among them)

    def skip(self, reason: str, index: int, why: str | None = None) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if why is None:
            return
        if self.named < MAX_PROBLEMS_PER_FILE:
            self.named += 1
            self.problems.append(f"{self.where}: line {index + 1} {why}; skipped")
        else:
            self.unnamed += 1

    def done(self) -> None:
        if self.unnamed:
            self.problems.append(f"{self.where}: {self.unnamed} more lines skipped (not listed)")
            self.unnamed = 0

    def accept(self, record: Any, index: int) -> bool:
        """Whether a decoded line is kept (the first record as it is, then valid records)."""
        first, self.first = self.first, False
        if not isinstance(record, dict) or not isinstance(record.get(schema.F_KIND), str):
            self.skip("unreadable", index, "is not a goodtrace record")
            return False
        if first:  # the header, or the reason the file is skipped: the caller decides
            return True
        reason = check_record(record)
        if reason is not None:
            self.skip(reason, index, f"is a {SKIP_REASONS[reason]}")
            return False
        return True

    def line(self, line: bytes, index: int, last: int) -> dict[str, Any] | None:
        """One line by the rules above: the record, or None (skipped and counted)."""
        if not line.strip():
            return None
        if len(line) > MAX_LINE_BYTES:
            self.first = False
            self.torn += 1
            if index == last:
                self.skip("torn_last_line", index)
            else:
                self.skip("too_long", index, f"is {len(line) / 2**20:.1f} MiB, longer than the "
                                             f"{MAX_LINE_BYTES // 2**20} MiB a record may take")
            return None
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            self.first = False
            self.torn += 1
            if index == last:
                self.skip("torn_last_line", index)
            else:
                self.skip("unreadable", index, "is not valid JSON")
            return None
        return record if self.accept(record, index) else None


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_FAST_LINE_CHARS = MAX_LINE_BYTES // 4  # a longer line may be over the byte limit: measured exactly


class SegmentRecords:
    """The records of one segment's bytes, one at a time, exactly as the line-by-line rules
    read them (same records, lines that are not JSON, problems and skip counts; a test holds
    them equal), about twice as fast and without a list of them all: well-formed lines are decoded straight from
    the file's text by the JSON scanner; from the first line that is not one clean object
    (blank, CRLF, garbage, very long) on, the line-by-line rules take over. ``torn`` and
    ``skipped`` are complete once the iteration ends."""

    def __init__(self, data: bytes, where: str, problems: list[str], skipped: dict[str, int] | None = None) -> None:
        self.data, self.where, self.problems = data, where, problems
        self.skipped: dict[str, int] = {} if skipped is None else skipped
        self.torn = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        data = self.data
        rules = _Lines(self.where, self.problems, self.skipped)
        index = 0
        try:
            text = data.decode("utf-8", "surrogatepass")  # what json.loads does to each line
        except UnicodeDecodeError:
            text = ""
            pos = 0
        else:
            scan, kind, size, pos = _SCAN, schema.F_KIND, len(text), 0
            while pos < size:
                if text[pos] != "{":
                    break
                try:
                    record, end = scan(text, pos)
                except (StopIteration, ValueError, RecursionError):
                    break
                if ((end < size and text[end] != "\n") or end - pos > _FAST_LINE_CHARS or type(record) is not dict
                        or type(record.get(kind)) is not str):
                    break
                if rules.accept(record, index):
                    yield record
                index += 1
                pos = end + 1
            else:
                rules.done()
                self.torn = rules.torn
                return
        # The rest, line by line (the line numbers and the torn-last-line rule of the rules).
        offset = len(text[:pos].encode("utf-8", "surrogatepass")) if pos else 0
        lines = data[offset:].split(b"\n")
        last = index + len(lines) - 1
        for number, line in enumerate(lines, index):
            record = rules.line(line, number, last)
            if record is not None:
                yield record
        rules.done()
        self.torn = rules.torn
