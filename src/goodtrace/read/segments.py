"""Segment files of a run directory and the records in them, one line at a time.

A run directory holds ``rank-NNNNN/<session>.<segment>.jsonl`` files (local, NFS, or any fsspec
URL). :func:`list_segments` finds them; :class:`SegmentRecords` decodes one file's bytes as a
stream of record dicts (a torn *last* line, from a process killed mid-write, is expected and
skipped; other undecodable lines are skipped and reported as problems). Standard library
only (fsspec for URLs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from goodtrace import schema
from goodtrace.record.storage import is_url, local_path

__all__ = ["SEGMENT_SUFFIX", "NotARunError", "SegmentRecords", "list_segments", "parse_segment", "read_bytes"]

SEGMENT_SUFFIX = ".jsonl"


class NotARunError(ValueError):
    """The path holds no goodtrace records."""



def list_segments(run_dir: str) -> list[tuple[str, str]]:
    """(rank directory name, segment path) pairs, sorted."""
    found: list[tuple[str, str]] = []
    if is_url(run_dir):
        import fsspec

        fs, root = fsspec.core.url_to_fs(run_dir)
        for path in sorted(fs.glob(root.rstrip("/") + "/rank-*/*" + SEGMENT_SUFFIX)):
            found.append((path.rsplit("/", 2)[-2], path))
        return found
    root = local_path(run_dir)
    if not os.path.isdir(root):
        raise NotARunError(f"{run_dir!r} is not a directory")
    for entry in sorted(os.listdir(root)):
        rank_dir = os.path.join(root, entry)
        if entry.startswith("rank-") and os.path.isdir(rank_dir):
            for name in sorted(os.listdir(rank_dir)):
                if name.endswith(SEGMENT_SUFFIX):
                    found.append((entry, os.path.join(rank_dir, name)))
    return found


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


def parse_segment(data: bytes, where: str, problems: list[str]) -> tuple[list[dict[str, Any]], int]:
    """Decode JSON lines; returns (records, torn_lines). A torn *last* line is expected."""
    lines = data.split(b"\n")
    records: list[dict[str, Any]] = []
    torn = 0
    last = len(lines) - 1
    for index, line in enumerate(lines):
        record, bad = _parse_line(line, index, last, where, problems)
        torn += bad
        if record is not None:
            records.append(record)
    return records, torn


def _parse_line(
    line: bytes, index: int, last: int, where: str, problems: list[str]
) -> tuple[dict[str, Any] | None, int]:
    """One line by the rules of :func:`parse_segment`: (the record or None, 1 if not JSON)."""
    if not line.strip():
        return None, 0
    try:
        record = json.loads(line)
    except ValueError:
        if index != last:
            problems.append(f"{where}: line {index + 1} is not valid JSON; skipped")
        return None, 1
    if not isinstance(record, dict) or not isinstance(record.get(schema.F_KIND), str):
        problems.append(f"{where}: line {index + 1} is not a goodtrace record; skipped")
        return None, 0
    return record, 0


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


class SegmentRecords:
    """The records of one segment's bytes, one at a time, exactly as :func:`parse_segment`
    returns them (same records, torn lines and problems), about twice as fast and without a
    list of them all: well-formed lines are decoded straight from the file's text by the JSON
    scanner; from the first line that is not one clean object (blank, CRLF, garbage) on, the
    line-by-line rules take over. ``torn`` is complete once the iteration ends."""

    def __init__(self, data: bytes, where: str, problems: list[str]) -> None:
        self.data, self.where, self.problems = data, where, problems
        self.torn = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        data = self.data
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
                except (StopIteration, ValueError):
                    break
                if (end < size and text[end] != "\n") or type(record) is not dict or type(record.get(kind)) is not str:
                    break
                yield record
                pos = end + 1
            else:
                return
        # The rest, line by line (the line numbers and the torn-last-line rule as parse_segment).
        offset = len(text[:pos].encode("utf-8", "surrogatepass")) if pos else 0
        first_index = text.count("\n", 0, pos) if pos else 0
        lines = data[offset:].split(b"\n")
        last = first_index + len(lines) - 1
        for index, line in enumerate(lines, first_index):
            record, bad = _parse_line(line, index, last, self.where, self.problems)
            self.torn += bad
            if record is not None:
                yield record
