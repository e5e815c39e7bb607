"""Following a run while it is written: each poll reads only the bytes appended to each
segment file since the previous poll, up to the last complete line, and decodes them with the
readers' rules (:mod:`goodtrace.read.segments`, :mod:`goodtrace.read.validate`). Local paths and
fsspec URLs (a ranged read from the offset reached).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from goodtrace import schema
from goodtrace.read.segments import SegmentRecords, list_segments
from goodtrace.read.validate import check_record
from goodtrace.record.io.storage import is_url

__all__ = ["RunFollower"]


class RunFollower:
    """Poll a run directory for new records: ``for path, header, record in follower.poll()``."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.offsets: dict[str, int] = {}  # segment path -> bytes decoded so far
        self.headers: dict[str, dict[str, Any]] = {}  # segment path -> its header record
        self.bytes_read = 0  # every byte read from the files, re-read partial lines included
        self.problems: list[str] = []
        self.skipped: dict[str, int] = {}

    def _read_from(self, path: str, start: int) -> bytes:
        if is_url(self.run_dir):
            import fsspec

            fs, _ = fsspec.core.url_to_fs(self.run_dir)
            size = int(fs.size(path))
            return bytes(fs.cat_file(path, start=start, end=size)) if size > start else b""
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read()

    def poll(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """The records appended since the last poll, file by file, in file order."""
        for _, path in list_segments(self.run_dir, self.problems):
            start = self.offsets.get(path, 0)
            try:
                data = self._read_from(path, start)
            except OSError as exc:
                self.problems.append(f"{path}: cannot be read ({exc}); retried at the next poll")
                continue
            self.bytes_read += len(data)
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            if end == 0:
                continue
            self.offsets[path] = start + end
            records = iter(SegmentRecords(data[:end], path, self.problems, self.skipped))
            if start == 0:
                header = next(records, None)
                if header is not None and header.get(schema.F_KIND) == schema.HEADER:
                    self.headers[path] = header
            elif (first := next(records, None)) is not None and check_record(first) is None and path in self.headers:
                yield path, self.headers[path], first  # (the stream takes a chunk's first line as a header)
            if path not in self.headers:
                continue  # a file without a header line is skipped by every reader
            for record in records:
                yield path, self.headers[path], record
