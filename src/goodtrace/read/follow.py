"""Following a run while it is written: each poll reads only the bytes appended to each
segment file since the previous poll, up to the last complete line, and decodes them with the
readers' rules (:mod:`goodtrace.read.segments`, :mod:`goodtrace.read.validate`). Local paths and
fsspec URLs (a ranged read from the offset reached).

A run of any length: before its first poll, a follower can be told where each session's reading
starts (:meth:`RunFollower.start_sessions`): from its first byte, from where its last few step
completions begin (found from the end of its newest file, a block at a time, so that a week-long
session costs what its tail costs), or from the bytes written after now; the step completions
before a tail's are read back later, a part at a time (:meth:`RunFollower.poll_history`,
:class:`StepHistory`). A poll decodes at most ``poll_bytes`` of one session's
files, in file order (:attr:`RunFollower.pending` says that more was left for the next poll),
so that a long history is read a part at a time between frames. Many files are read at once on
a network filesystem or behind a URL (:func:`goodtrace.read.io_pool.io_map`).

A history (:class:`StepHistory`): a session's step completions before a point of its files, read
backwards a block at a time: what ``goodtrace watch`` needs of a rank's past (its last 2,000 step
times, for the slowdown alarm) once it has read its present. Only the
lines that hold a step completion's mark (the writers' ``"kind":"sync"`` text) are kept; they
are decoded, by the readers' rules, once the wanted number of them is found or the session's
first byte is reached, and handed on in file order. Each byte before the point is read once,
and no more of them than the wanted step completions take.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from goodtrace import schema
from goodtrace.read.io_pool import io_map, on_network_filesystem
from goodtrace.read.segments import SegmentRecords, list_segments, segment_order
from goodtrace.read.sessions import checked_header
from goodtrace.read.validate import check_record
from goodtrace.record.io.storage import is_url

__all__ = ["BLOCK", "FIRST_BLOCK", "POLL_BYTES", "SYNC_MARKS", "RunFollower", "StepHistory", "marked_lines"]

POLL_BYTES = 16 * 2**20  # the most bytes one poll decodes of one session's files
HEADER_GUESS = 4096  # a header line is read in one call of this many bytes, most often
HEADER_BYTES = 2**20  # a header line longer than this is not read as one before the first poll
WINDOW = 16  # files a poll reads before it decodes them, at once, where that pays (io_map); elsewhere one
HISTORY_BYTES = 64 * 2**20  # about the most bytes of the sessions' histories one poll_history reads ...
HISTORY_SESSIONS = 64  # ... of this many sessions at most
FIRST_BLOCK = 64 * 1024  # the first block read back from a point (a few step completions, often)
BLOCK = 2**20  # ... then blocks of this size (larger while a line does not fit one)
# A step completion as the writers write it (a line in another spelling is not counted: a tail
# then starts earlier, and its history is shorter, not wrong)
SYNC_MARKS = (b'"kind":"sync"', b'"kind": "sync"')


def _group(path: str) -> str:
    """The files of one session: ``rank-NNNNN/<session>`` of ``<session>.<segment>.jsonl``."""
    return path.rsplit(".", 2)[0]


class RunFollower:
    """Poll a run directory for new records: ``for path, header, record in follower.poll()``
    (``header``: the session's, its first file's header, as the readers take it)."""

    def __init__(self, run_dir: str, *, poll_bytes: int = POLL_BYTES) -> None:
        self.run_dir = run_dir
        self.poll_bytes = poll_bytes
        self.offsets: dict[str, int] = {}  # segment path -> bytes decoded so far (or skipped)
        self.sizes: dict[str, int] = {}  # segment path -> its size when last read
        self.headers: dict[str, dict[str, Any]] = {}  # segment path -> its header record
        self._first_headers: dict[str, dict[str, Any]] = {}  # session id -> its first file's header
        self.bytes_read = 0  # every byte read from the files, re-read partial lines and tails' search included
        self._behind: set[str] = set()  # sessions' files (by _group) the last poll left bytes of
        self._done: set[str] = set()  # closed files read to their end: not read again
        self._history: dict[str, StepHistory] = {}  # the step completions before a tail's, for poll_history
        self.histories_ended: list[str] = []  # sessions whose history poll_history read to its end
        self.problems: list[str] = []
        self.skipped: dict[str, int] = {}
        self._fs: Any = None
        # files read ahead of their decoding: many at once where each read is a round trip (up to
        # WINDOW x poll_bytes held); on a local disk one at a time, as a loop reads them anyway
        self._window = WINDOW if is_url(run_dir) or on_network_filesystem(run_dir, unknown=True) else 1

    # ------------------------------------------------------------------ bytes
    def _read(self, path: str, start: int, limit: int | None) -> tuple[bytes, int]:
        """:meth:`_fetch`, its bytes counted."""
        data, size = self._fetch(path, start, limit)
        self.bytes_read += len(data)
        return data, size

    def _fetch(self, path: str, start: int, limit: int | None) -> tuple[bytes, int]:
        """Up to ``limit`` bytes from ``start`` (all that is there when None), and the file's size
        (nothing of the follower changed: it runs on :func:`io_map`'s threads)."""
        if is_url(self.run_dir):
            size = self._size(path)
            end = size if limit is None else min(size, start + limit)
            return (bytes(self._fs.cat_file(path, start=start, end=end)) if end > start else b""), size
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(start)
            return handle.read(-1 if limit is None else max(0, min(limit, size - start))), size

    def _connect(self) -> None:
        """The URL's filesystem, made once, before threads use it."""
        if is_url(self.run_dir) and self._fs is None:
            import fsspec

            self._fs, _ = fsspec.core.url_to_fs(self.run_dir)

    def _size(self, path: str) -> int:
        if is_url(self.run_dir):
            self._connect()
            return int(self._fs.size(path))
        return os.stat(path).st_size

    def _line_start(self, path: str, at: int) -> tuple[int, int]:
        """Where the line holding byte ``at`` starts (``at`` itself after a newline), and the bytes
        read to find it."""
        read = 0
        while at > 0:
            begin = max(0, at - BLOCK)
            block, _ = self._fetch(path, begin, at - begin)
            read += len(block)
            found = block.rfind(b"\n")
            if found >= 0:
                return begin + found + 1, read
            at = begin
        return 0, read

    # ------------------------------------------------------------------ where reading starts
    def first_headers(self) -> dict[str, dict[str, Any]]:
        """The header of every segment file there now, by path (kept for the polls; a file whose
        first line is not a usable header is left out, named in ``problems``, and read by the
        polls, which skip it as every reader does). Many files are read at once on a network
        filesystem or behind a URL (:func:`io_map`)."""
        listed = [(rank_dir, path) for rank_dir, path in list_segments(self.run_dir, self.problems)
                  if path not in self.headers]
        self._connect()
        for (rank_dir, path), got in zip(listed, io_map(self._header_line, [p for _, p in listed], self.run_dir),
                                         strict=True):
            if isinstance(got, OSError):
                self.problems.append(f"{path}: cannot be read ({got}); retried at the next poll")
                continue
            data, read = got
            self.bytes_read += read
            end = data.find(b"\n") + 1
            if end == 0:
                continue  # no whole line yet: the first poll reads it
            where = f"{rank_dir}/{os.path.basename(path)}"
            first = next(iter(SegmentRecords(data[:end], where, [], {})), None)
            header = checked_header(first, where, self.problems) if first is not None else None
            if header is not None:
                self._add_header(path, header)
        return dict(self.headers)

    def _header_line(self, path: str) -> tuple[bytes, int] | OSError:
        """The first bytes of ``path``, its first line whole when it has one of at most
        :data:`HEADER_BYTES`, and the bytes read; the error when it cannot be read."""
        try:
            data, size = self._fetch(path, 0, HEADER_GUESS)
            read = len(data)
            if b"\n" not in data and size > len(data):
                data, _ = self._fetch(path, 0, HEADER_BYTES)
                read += len(data)
            return data, read
        except OSError as exc:
            return exc

    def _add_header(self, path: str, header: dict[str, Any]) -> None:
        self.headers[path] = header
        self._first_headers.setdefault(str(header.get(schema.H_SESSION)), header)  # files come in order

    def start_sessions(self, whole: Iterable[str], tail: Iterable[str], steps: int, history: int = 0) -> None:
        """Before the first poll (after :meth:`first_headers`), where each session's reading
        starts: the sessions in ``whole`` from their first byte; those in ``tail`` from the line
        of the ``steps``-th step completion from the end (their first byte when they hold fewer),
        and the ``history`` step completions before it are left to :meth:`poll_history`; any
        other session from the end of its last complete line now. Many sessions are looked at
        once on a network filesystem or behind a URL."""
        whole, tail = set(whole), set(tail)
        files: dict[str, list[str]] = {}
        for path in sorted(self.headers, key=segment_order):
            files.setdefault(str(self.headers[path].get(schema.H_SESSION)), []).append(path)
        todo = [(paths, steps if session in tail else 0) for session, paths in files.items() if session not in whole]
        self._connect()
        for (paths, counted), got in zip(todo, io_map(self._tail_start, todo, self.run_dir), strict=True):
            if isinstance(got, OSError):  # read from its start, as a session that came later
                self.problems.append(f"{paths[-1]}: cannot be read ({got}); read from its session's start")
                continue
            (first, line), read = got
            self.offsets[paths[first]] = line
            self._done.update(paths[:first])  # the polls start after them (what is needed of them is history)
            self.bytes_read += read
            if counted and history and (first, line) != (0, 0):
                session = str(self.headers[paths[0]].get(schema.H_SESSION))
                self._history[session] = StepHistory(paths[:first + 1], history, first, line)

    def _tail_start(self, todo: tuple[list[str], int]) -> tuple[tuple[int, int], int] | OSError:
        """For one session's files (in order) and a step count: where the polls read them from
        (a file and an offset in it; the later files are read whole, the earlier ones not at
        all), the line of their ``steps``-th step completion from the end (with 0, the end of
        their last whole line; their start when they hold fewer), and the bytes read to find
        it; the error when they cannot be read."""
        paths, steps = todo
        read = 0
        try:
            if steps == 0:
                last = paths[-1]
                end, read = self._line_start(last, self._size(last))
                return (len(paths) - 1, end), read
            for index in range(len(paths) - 1, -1, -1):
                path = paths[index]
                at, span = self._size(path), FIRST_BLOCK
                while at > 0:
                    begin = max(0, at - span)
                    block, _ = self._fetch(path, begin, at - begin)
                    read += len(block)
                    marks = sorted(i for m in SYNC_MARKS for i in _find_all(block, m))
                    if len(marks) >= steps:
                        mark = marks[len(marks) - steps]
                        newline = block.rfind(b"\n", 0, mark)
                        if newline >= 0:
                            return (index, begin + newline + 1), read
                        line, searched = self._line_start(path, begin + mark)  # its line starts in an earlier block
                        return (index, line), read + searched
                    steps -= len(marks)
                    at, span = begin, BLOCK
        except OSError as exc:
            return exc
        return (0, 0), read

    # ------------------------------------------------------------------ polls
    def poll(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """The records appended since the last poll, file by file, in file order (at most
        ``poll_bytes`` of each session's files; :attr:`pending` when some were left). The files
        are read :data:`WINDOW` at a time, at once, on a network filesystem or behind a URL (one
        at a time elsewhere), and decoded in order."""
        left: dict[str, int] = {}  # session's files -> bytes this poll may still decode of them
        behind: set[str] = set()  # sessions' files with bytes left for the next poll
        listed = list_segments(self.run_dir, self.problems)
        self._connect()
        # a file with a later one of its session is closed (the writer moved on): once read to its
        # end it is not read again (a long run's rank has many: a week is some ten 64 MiB segments, more when smaller)
        closed = {path for (_, path), (_, after) in itertools.pairwise(listed) if _group(path) == _group(after)}
        listed = [(rank_dir, path) for rank_dir, path in listed if path not in self._done]
        unread: set[str] = set()  # sessions' files with a file that may hold more than this poll decodes
        for at in range(0, len(listed), self._window):
            window = listed[at : at + self._window]
            ahead = []  # read ahead, at once: a file of a session whose earlier files are all read
            for _, path in window:
                if _group(path) not in unread:
                    ahead.append(path)
                    if self.offsets.get(path, 0) < self.sizes.get(path, -1) or path not in self.sizes:
                        unread.add(_group(path))  # its later files are read when it is decoded, if at all
            fetched = dict(zip(ahead, io_map(self._poll_bytes, ahead, self.run_dir), strict=True))
            for rank_dir, path in window:
                yield from self._decode(rank_dir, path, fetched.pop(path, None), left, behind)
                if path in closed and self.offsets.get(path, 0) == self.sizes.get(path):
                    self._done.add(path)
        self._behind = behind

    def _poll_bytes(self, path: str) -> tuple[bytes, int] | OSError:
        """What a poll reads of ``path``: at most ``poll_bytes`` from where the last one ended, and
        the file's size; the error when it cannot be read."""
        try:
            return self._fetch(path, self.offsets.get(path, 0), self.poll_bytes)
        except OSError as exc:
            return exc

    def _decode(self, rank_dir: str, path: str, got: tuple[bytes, int] | OSError | None, left: dict[str, int],
                behind: set[str]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """The records of what a poll read of ``path`` (``got``; None: not read ahead, read here),
        within what is left of its session's bytes for this poll (``left``, ``behind``: updated)."""
        group = _group(path)
        if group in behind:
            return  # a file of the session before this one was read in part
        start, budget = self.offsets.get(path, 0), left.get(group, self.poll_bytes)
        if budget <= 0:
            behind.add(group)
            return
        try:
            if isinstance(got, OSError):
                raise got
            if got is None:
                data, size = self._read(path, start, budget)
            else:
                data, size = got
                self.bytes_read += len(data)
                data = data[:budget]
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            if end == 0 and start + len(data) < size:
                if budget < self.poll_bytes:  # the next poll, with all of its bytes
                    behind.add(group)
                    return
                data, size = self._read(path, start, None)  # a line longer than a poll's bytes
                end = data.rfind(b"\n") + 1
        except OSError as exc:
            self.problems.append(f"{path}: cannot be read ({exc}); retried at the next poll")
            return
        self.sizes[path] = size
        if start + len(data) < size:
            behind.add(group)
        if end == 0:
            return
        left[group] = budget - end
        self.offsets[path] = start + end
        where = f"{rank_dir}/{os.path.basename(path)}"
        records = iter(SegmentRecords(data[:end], where, self.problems, self.skipped))
        del data
        if start == 0:  # the header (already read when first_headers listed the file)
            first = next(records, None)
            if first is not None and path not in self.headers:
                header = checked_header(first, where, self.problems)
                if header is not None:
                    self._add_header(path, header)
        if path not in self.headers:
            return  # a file without a header line is skipped by every reader
        session = self._first_headers[str(self.headers[path].get(schema.H_SESSION))]
        if start > 0 and (first := next(records, None)) is not None and check_record(first) is None:
            yield path, session, first  # (the stream takes a chunk's first line as a header)
        for record in records:
            yield path, session, record

    def poll_history(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """The step completions of the sessions' histories (:meth:`start_sessions`), read back
        from their tails: about :data:`HISTORY_BYTES` of at most :data:`HISTORY_SESSIONS`
        sessions a call (at most ``poll_bytes`` of one), many at once
        (:class:`StepHistory`: only the lines that hold a step
        completion's mark are decoded, so what is wrong in the others is not seen). A session's are handed on in file order once all are found, and the session
        goes to :attr:`histories_ended`, as one whose history cannot be read (named in
        ``problems``: what was found of it is handed on)."""
        # (session, its history, bytes it may read): many sessions a call, a share of the bytes each
        sessions = list(itertools.islice(self._history.items(), HISTORY_SESSIONS))
        share = min(self.poll_bytes, max(BLOCK, HISTORY_BYTES // max(1, len(sessions))))
        chosen = [(session, history, share) for session, history in sessions]
        self._connect()

        def step_back(item: tuple[str, StepHistory, int]) -> OSError | None:
            try:
                item[1].read_back(lambda path, start, size: self._fetch(path, start, size)[0], self._size, item[2])
            except OSError as exc:
                return exc
            return None

        for (session, history, _), failed in zip(chosen, io_map(step_back, chosen, self.run_dir), strict=True):
            self.bytes_read += history.read
            history.read = 0
            if failed is not None:
                self.problems.append(f"{history.paths[history.index]}: its step times before the tail cannot be "
                                     f"read ({failed}); left out")
            elif not history.done:
                continue
            del self._history[session]
            self.histories_ended.append(session)
            last = history.paths[-1]
            header = self.headers.get(last)
            if header is None:
                continue
            where = f"{os.path.basename(os.path.dirname(last))}/{os.path.basename(last)}"
            session_header = self._first_headers[str(header.get(schema.H_SESSION))]
            for record in history.records(f"{where} (before its tail)", self.problems, self.skipped):
                yield last, session_header, record

    @property
    def has_history(self) -> bool:
        """Some session's history is not read to its end."""
        return bool(self._history)

    def history_behind(self) -> dict[str, float]:
        """The sessions whose history is not read to its end yet, and how much of it is found."""
        return {session: history.found / history.wanted for session, history in self._history.items()}

    @property
    def pending(self) -> bool:
        """The last poll left bytes of some session for the next (``poll_bytes``), or a
        history is not read to its end."""
        return bool(self._behind) or self.has_history

    def behind(self) -> dict[str, float]:
        """The sessions whose files the last poll left bytes of, and how much of their files (as
        large as it saw them) is read or skipped."""
        files: dict[str, list[str]] = {}
        for path, header in self.headers.items():
            if _group(path) in self._behind:
                files.setdefault(str(header.get(schema.H_SESSION)), []).append(path)
        return {session: sum(self.offsets.get(p, 0) for p in paths) / max(1, sum(self.sizes.get(p, 0) for p in paths))
                for session, paths in files.items()}


def _find_all(data: bytes, mark: bytes) -> Iterator[int]:
    at = data.find(mark)
    while at >= 0:
        yield at
        at = data.find(mark, at + 1)


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
