"""The ring a killed process left beside its segments (``rank-NNNNN/<session>.ring``, made by
the native writer, :mod:`goodtrace.record.io.native_writer`): the records it had not written yet,
turned into one more segment of its session, byte for byte the lines the writer would have
written.

A reader never writes into the run: :func:`ring_segments` (what
:func:`goodtrace.read.segments.list_segments` runs on local run directories) puts that segment
into the reader's cache (``$GOODTRACE_CACHE_DIR/rings/<hash of the run>/<rank dir>/``) and
leaves the ring as it is. Only ``goodtrace compact`` (:func:`recover_ring`, asked to write
beside the run) writes it into the run and deletes the ring, and only when its writer is
proven gone (:func:`writer_state`): its lock is free and either the writer was of this host
(whose kernel holds the lock) or the filesystem's locks reach across hosts (not NFS mounted
``nolock``), or it was of this host and its pid has ended or is now another process's. A ring
whose lock is held is live and left alone; one of another host on a filesystem whose locks say
nothing is read (into the cache) only once its last heartbeat is as old as the rule that calls
a session lost, and never removed. Exactness: every entry before the ring's ``head`` is whole
(the producer commits ``head`` after the entry); entries before ``tail`` are in the segments;
for the one write that may have been cut by the kill (the journal ``j_*``), the complete lines
that reached the segment file are counted and not repeated. Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator

from goodtrace.read.io_pool import locks_across_hosts
from goodtrace.record.io.native import OPEN_RING_FILES, RING_SUFFIX
from goodtrace.record.process import pid_alive

__all__ = ["RING_SUFFIX", "RingError", "RingFile", "decode_lines", "pending_lines", "read_ring", "recover_ring",
           "recover_rings", "ring_segments", "writer_state"]

_MAGIC = b"GTRING\0\0"
_VERSION = 1
# RingShared in native_writer.h, field by field (little-endian, natural alignment)
_SHARED = struct.Struct("<8sII4Q4I3q5Qq q5Q qq64s".replace(" ", ""))
# A ring written on another host, on a filesystem whose locks do not reach across hosts (NFS
# mounted without a lock service), is read only when its writer's last heartbeat is this old (the
# rule that calls a session lost), and never removed: its lock says nothing.
STALE_INTERVALS, STALE_MIN_S = 5, 10.0
_ENTRY = struct.Struct("<IHHII4qd")  # Entry: size, type, flags, id1, id2, v[4], d
_BLOB = struct.Struct("<IHHII")  # BlobHeader: size, type, flags, len, pad
E_PAD, E_SPAN, E_STEP, E_SYNC, E_TAG, E_METRIC, E_BLOB = range(7)
F_STEP, F_SEQ, F_AFTER, F_VFLOAT, F_VINT = 1, 2, 4, 8, 16


class RingError(ValueError):
    """A file that is not a ring this version reads, or a damaged one."""


@dataclasses.dataclass
class RingFile:
    """A ring file's header fields and the texts its entries refer to; ``data`` is the file."""

    path: str
    data: bytes
    capacity: int
    ring_offset: int
    header_parts: list[bytes]
    texts: list[bytes]
    pid: int
    wall: int
    mono: int
    head: int
    tail: int
    discard_until: int
    segment: int
    j_segment: int
    j_offset: int
    j_len: int
    j_header: bool
    j_start: int
    j_end: int
    beat_wall: int = 0
    interval_ns: int = 0
    host: str = ""

    @property
    def session(self) -> str:
        """The session's segment prefix (the file name without ``.ring``)."""
        return os.path.basename(self.path)[: -len(RING_SUFFIX)]

    def segment_path(self, segment: int) -> str:
        return os.path.join(os.path.dirname(self.path), f"{self.session}.{segment:05d}.jsonl")

    def header_line(self, segment: int) -> bytes:
        """A segment header as the writer makes it (its parts around segment, wall and mono)."""
        a, b, c, d = self.header_parts
        return a + str(segment).encode() + b + str(self.wall).encode() + c + str(self.mono).encode() + d


def read_ring(path: str) -> RingFile:
    """The ring file at ``path``, checked: a regular file, magic, version and every size within
    the file (read whole only then)."""
    with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise RingError("not a regular file")
        data = handle.read(_SHARED.size)
        if len(data) < _SHARED.size or data[:8] != _MAGIC:
            raise RingError("not a goodtrace ring file (or one cut before it was set up)")
        (_, version, header_bytes, capacity, ring_offset, text_offset, text_capacity, h0, h1, h2, h3, pid, wall,
         mono, head, tail, discard, text_used, texts, segment, j_segment, j_offset, j_len, j_header, j_start,
         j_end, beat_wall, interval_ns, host) = _SHARED.unpack_from(data)
        if version != _VERSION:
            raise RingError(f"ring format version {version}, this goodtrace reads {_VERSION}")
        size = os.fstat(handle.fileno()).st_size
        if (ring_offset + capacity != size or text_offset + text_capacity > ring_offset or text_used > text_capacity
                or header_bytes > text_offset or text_offset < _SHARED.size or capacity % 8 or tail > head
                or head - tail > capacity or h0 + h1 + h2 + h3 > text_used):
            raise RingError("its sizes and offsets do not agree with the file")
        data += handle.read()
    if len(data) != size:
        raise RingError("it changed while it was read")
    parts: list[bytes] = []
    cursor = text_offset
    for length in (h0, h1, h2, h3):
        parts.append(data[cursor:cursor + length])
        cursor += length
    cursor = text_offset + ((h0 + h1 + h2 + h3 + 7) & ~7)
    end = text_offset + text_used
    names: list[bytes] = []
    while len(names) < texts and cursor + 4 <= end:
        (length,) = struct.unpack_from("<I", data, cursor)
        if cursor + 4 + length > end:
            break
        names.append(data[cursor + 4:cursor + 4 + length])
        cursor += (4 + length + 7) & ~7
    if len(names) != texts:
        raise RingError(f"{texts} interned names announced, {len(names)} found")
    return RingFile(path, data, capacity, ring_offset, parts, names, pid, wall, mono, head, tail, discard, segment,
                    j_segment, j_offset, j_len, bool(j_header), j_start, j_end, beat_wall, interval_ns,
                    host.split(b"\0", 1)[0].decode("utf-8", "replace"))


LIVE, GONE, QUIET = "live", "gone", "quiet"  # writer_state: what is known of a ring's writer


def _quiet_long_enough(ring: RingFile) -> bool:
    """Whether a ring's last heartbeat is as old as the rule that calls a session lost."""
    stale_ns = max(STALE_MIN_S * 1e9, STALE_INTERVALS * ring.interval_ns)
    return time.time_ns() - ring.beat_wall > stale_ns


def _this_host(ring: RingFile) -> bool:
    return not ring.host or ring.host == socket.gethostname()[:63]


def _pid_gone(ring: RingFile) -> bool:
    """Whether the ring's writer (of this host) has surely ended: no process has its pid, or the
    one that has it started after the writer had begun writing (a pid used again)."""
    return ring.pid > 0 and not pid_alive(ring.pid, ring.wall)


def writer_state(path: str, lock: str, ring: RingFile) -> str:
    """What is known of the writer of the ring at ``path`` whose lock test (:func:`_lock_state`)
    said ``lock``: :data:`LIVE` (its lock is held, or nothing says it has gone), :data:`GONE`
    (proven: the lock is free and the lock is this host's kernel's, or the filesystem's locks
    reach across hosts; or of this host and its pid ended or reused), or :data:`QUIET` (another
    host's, where locks say nothing, silent for as long as the lost-session rule asks: its
    records may be read, the file is never removed)."""
    if lock == "held":
        return LIVE
    if _this_host(ring):
        return GONE if lock == "free" or _pid_gone(ring) else LIVE
    if lock == "free" and locks_across_hosts(path):
        return GONE
    return QUIET if _quiet_long_enough(ring) else LIVE


def _step(flags: int, value: int) -> bytes:
    return str(value).encode() if flags & F_STEP else b"null"


def _float(value: float) -> bytes:
    # what json.dumps writes (repr), and null for NaN and infinities, as the C encoder does
    return repr(value).encode() if value - value == 0 else b"null"


def _text(ring: RingFile, index: int) -> bytes:
    if index >= len(ring.texts):
        raise RingError(f"an entry names text {index}; the ring has {len(ring.texts)}")
    return ring.texts[index]


def _encode(ring: RingFile, position: int) -> tuple[int, bytes | None]:
    """(entry size, its line(s); None for padding) of the entry at ring position ``position``."""
    data = ring.data
    at = ring.ring_offset + position
    size, kind, flags = struct.unpack_from("<IHH", data, at)
    if size < 8 or size % 8 or position + size > ring.capacity:
        raise RingError(f"an entry of {size} bytes at ring offset {position}")
    if kind == E_PAD:
        return size, None
    if kind == E_BLOB:
        if size < _BLOB.size:
            raise RingError(f"a {size}-byte entry of type {kind}")
        _, _, _, length, _ = _BLOB.unpack_from(data, at)
        if _BLOB.size + length > size:
            raise RingError(f"a {length}-byte record in a {size}-byte entry")
        return size, data[at + _BLOB.size:at + _BLOB.size + length]
    if size < _ENTRY.size:
        raise RingError(f"a {size}-byte entry of type {kind}")
    _, _, _, id1, id2, v0, v1, v2, v3, d = _ENTRY.unpack_from(data, at)
    if kind == E_SPAN:
        line = b"".join((_text(ring, id1), str(v0).encode(), b',"t1":', str(v1).encode(), b',"step":',
                         _step(flags, v2), b',"tid":', str(v3 & 0xFFFFFFFFFFFFFFFF).encode(),
                         b',"err":false,"attrs":null}\n'))
    elif kind == E_STEP:
        seq = b',"seq":' + str(v3).encode() if flags & F_SEQ else b""
        line = b"".join((b'{"kind":"step","step":', _step(flags, v0), b',"t0":', str(v1).encode(), b',"t1":',
                         str(v2).encode(), seq, b"}\n"))
    elif kind == E_SYNC:
        seq = b',"seq":' + str(v2).encode() if flags & F_SEQ else b""
        after = b',"after":' + str(v3).encode() if flags & F_AFTER else b""
        line = b"".join((b'{"kind":"sync","step":', _step(flags, v0), b',"t":', str(v1).encode(), b',"how":',
                         _text(ring, id1), seq, after, b"}\n"))
    elif kind == E_TAG:
        line = b"".join((b'{"kind":"tag","step":', _step(flags, v0), b',"name":', _text(ring, id1), b',"t":',
                         str(v1).encode(), b"}\n"))
    elif kind == E_METRIC:
        value = _float(d) if flags & F_VFLOAT else str(v2).encode() if flags & F_VINT else b"null"
        line = b"".join((b'{"kind":"metric","name":', _text(ring, id1), b',"step":', _step(flags, v0), b',"value":',
                         value, b',"reduce":', _text(ring, id2), b',"t":', str(v1).encode(), b"}\n"))
    else:
        raise RingError(f"an entry of unknown type {kind} at ring offset {position}")
    return size, line


def decode_lines(ring: RingFile, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, lines) of each entry in ring offsets [start, end) that the writer would write:
    the JSON lines the writer makes of it (padding and entries discarded by ``clear()`` give none)."""
    offset = start
    while offset < end:
        size, line = _encode(ring, offset % ring.capacity)
        if line is not None and offset >= ring.discard_until:
            yield offset, line
        offset += size
    if offset != end:
        raise RingError(f"the last entry runs past the ring's head ({offset} > {end})")


def _lines_written(ring: RingFile) -> int:
    """Complete lines of the write in flight at the kill that reached its segment file."""
    if not (ring.j_start == ring.tail < ring.j_end):
        return 0
    try:
        with open(ring.segment_path(ring.j_segment), "rb") as handle:
            handle.seek(ring.j_offset)
            written = handle.read(ring.j_len)
    except OSError:  # not there (never created): nothing of the write reached it
        return 0
    lines = written.count(b"\n")
    return max(0, lines - 1) if ring.j_header else lines


def pending_lines(ring: RingFile) -> tuple[list[bytes], str | None]:
    """The lines of the records in the ring that are not in the segments, in order, and what
    stopped the decoding early (a damaged entry), if anything."""
    skip = _lines_written(ring)
    lines: list[bytes] = []
    try:
        for _, line in decode_lines(ring, ring.tail, ring.head):
            if skip:
                count = line.count(b"\n")
                if count <= skip:
                    skip -= count
                    continue
                line = b"".join(part + b"\n" for part in line.split(b"\n")[skip:-1])
                skip = 0
            lines.append(line)
    except RingError as exc:
        return lines, str(exc)
    return lines, None


def _lock_state(fd: int) -> str:
    """``"held"`` when a process holds the ring's lock (its writer, live), ``"free"`` when it
    could be taken, ``"unknown"`` when the filesystem refused the question (ENOLCK: an NFS
    without a lock service)."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return "held" if exc.errno in (errno.EACCES, errno.EAGAIN) else "unknown"
    return "free"


def _write_segment(path: str, data: bytes) -> None:
    partial = f"{path}.recovering-{os.getpid()}"
    try:
        with open(partial, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)  # whole or not at all
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


def _same_bytes(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as handle:
            return os.fstat(handle.fileno()).st_size == len(data) and handle.read() == data
    except OSError:
        return False


def _where(path: str) -> str:
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


def _open_ring(path: str, problems: list[str] | None) -> tuple[RingFile, str, os.stat_result] | None:
    """A ring that is not live, read whole, with what is known of its writer (:func:`writer_state`)
    and its stat; None when it is live, gone, not a ring (named in ``problems``)."""
    if os.path.abspath(path) in OPEN_RING_FILES:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not wait
    except OSError:
        return None  # gone: recovered by compact, or finished cleanly meanwhile
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if problems is not None:
                problems.append(f"{_where(path)}: not a regular file, not a ring; skipped")
            return None
        lock = _lock_state(fd)
        if info.st_nlink == 0 or lock == "held":
            return None
        try:
            ring = read_ring(path)
        except RingError as exc:
            if problems is not None:
                problems.append(f"{_where(path)}: {exc}; its records are not recovered")
            return None
        state = writer_state(path, lock, ring)
        return (ring, state, info) if state != LIVE else None
    finally:
        os.close(fd)  # releases the shared lock


def _pending(ring: RingFile, problems: list[str] | None) -> tuple[bytes, int, bool]:
    """The segment the ring's records make (empty: none), their number, whether it is damaged
    (named in ``problems``)."""
    lines, damaged = pending_lines(ring)
    if damaged is not None and problems is not None:
        problems.append(f"{_where(ring.path)}: damaged after {len(lines):,} records ({damaged}); the rest is not "
                        "recovered and the file is left as it is")
    data = ring.header_line(ring.segment + 1) + b"".join(lines) if lines else b""
    return data, len(lines), damaged is not None


def _recovered(ring: RingFile, count: int, segment: str, problems: list[str] | None, *,
               cached: bool = False) -> None:
    if count and problems is not None:
        where = ("(read from the reader's cache; `goodtrace compact` writes them into the run)" if cached
                 else f"into {os.path.basename(segment)}")
        problems.append(f"{_where(ring.path)}: {count:,} records the process had not written when it ended "
                        f"(killed) were recovered from its ring {where}")


def _not_written(ring: RingFile, count: int, exc: OSError, problems: list[str] | None) -> None:
    if problems is not None and count:
        problems.append(f"{_where(ring.path)}: {count:,} records of a process that ended without finishing are "
                        f"in its ring but could not be written to a segment ({exc.strerror or exc}); "
                        "they are left out")


def recover_ring(path: str, problems: list[str] | None = None) -> int | None:
    """``goodtrace compact``'s recovery, beside the run: a ring whose writer is proven gone
    (:data:`GONE`) turned into the next segment of its session in the run, and deleted; the
    records recovered, or None when it is left as it is (live, maybe live, or another host's
    that locks cannot tell). Problems are named."""
    opened = _open_ring(path, problems)
    if opened is None or opened[1] != GONE:
        return None
    ring = opened[0]
    data, count, damaged = _pending(ring, problems)
    segment = ring.segment_path(ring.segment + 1)
    try:
        if data:
            _write_segment(segment, data)
        if not damaged:
            os.unlink(path)
    except OSError as exc:
        _not_written(ring, count, exc, problems)
        return None
    _recovered(ring, count, segment, problems)
    return count


def recover_rings(rank_dir: str, names: list[str], problems: list[str] | None = None) -> int:
    """:func:`recover_ring` for every ring among ``names`` (a rank directory's listing): the
    records recovered."""
    recovered = 0
    for name in names:
        if name.endswith(RING_SUFFIX):
            recovered += recover_ring(os.path.join(rank_dir, name), problems) or 0
    return recovered


RING_STATE_SUFFIX = ".ring.json"  # in the reader's cache: which ring a copy was made of


def ring_segment(path: str, folder: str, problems: list[str] | None = None) -> str | None:
    """A reader's recovery: the records of the ring at ``path`` (not live, :func:`writer_state`)
    as the next segment of its session, a file in the reader's ``folder``; its path, or None
    (live, nothing pending, or it could not be written). The ring and the run are left as they
    are. The ring is decoded again only when its stat changed since the last copy (a note
    beside it), and the copy rewritten only when its bytes would differ (two readers at once
    write the same bytes, each through a temporary file of its own)."""
    note = os.path.join(folder, os.path.basename(path)[: -len(RING_SUFFIX)] + RING_STATE_SUFFIX)
    try:
        ident = _identity(os.stat(path))
        with open(note, encoding="utf-8") as handle:
            kept = json.load(handle)
    except (OSError, ValueError):
        kept = None
    if (isinstance(kept, dict) and kept.get("ring") == ident and isinstance(kept.get("problems"), list)
            and _writer_not_live(path)):
        name = kept.get("segment")
        segment = os.path.join(folder, name) if isinstance(name, str) else None
        if segment is None or os.path.isfile(segment):
            if problems is not None:
                problems.extend(str(problem) for problem in kept["problems"])
            return segment
    opened = _open_ring(path, problems)
    if opened is None:
        return None
    ring, _, info = opened
    named: list[str] = []
    data, count, _ = _pending(ring, named)
    segment = os.path.join(folder, os.path.basename(ring.segment_path(ring.segment + 1)))
    if data:
        try:
            os.makedirs(folder, exist_ok=True)
            if not _same_bytes(segment, data):
                _write_segment(segment, data)
        except OSError as exc:
            if problems is not None:
                problems.extend(named)
            _not_written(ring, count, exc, problems)
            return None
        _recovered(ring, count, segment, named, cached=True)
    with contextlib.suppress(OSError):  # without the note, the ring is decoded again next time
        os.makedirs(folder, exist_ok=True)
        partial = f"{note}.{os.getpid()}.partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({"ring": _identity(info), "segment": os.path.basename(segment) if data else None,
                       "problems": named}, handle)
        os.replace(partial, note)
    if problems is not None:
        problems.extend(named)
    return segment if data else None


def _identity(info: os.stat_result) -> list[int]:
    return [info.st_size, info.st_mtime_ns, info.st_ino]


def _writer_not_live(path: str) -> bool:
    """The lock test alone (a copy already made of an unchanged ring): not held by a process."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return _lock_state(fd) != "held"
    finally:
        os.close(fd)


def ring_segments(rank_dir: str, names: list[str], folder: str, problems: list[str] | None = None) -> dict[str, str]:
    """A reader's recovery (:func:`ring_segment`) of every ring among ``names`` (a rank
    directory's listing) whose session's next segment is not in the run already (``goodtrace
    compact`` wrote it): segment file name -> its path in ``folder``, the reader's cache."""
    present = set(names)
    found: dict[str, str] = {}
    for name in names:
        if not name.endswith(RING_SUFFIX):
            continue
        segment = ring_segment(os.path.join(rank_dir, name), folder, problems)
        if segment is not None and os.path.basename(segment) not in present:
            found[os.path.basename(segment)] = segment
    return found
