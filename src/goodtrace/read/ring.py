"""The ring a killed process left beside its segments (``rank-NNNNN/<session>.ring``, made by
the native writer, :mod:`goodtrace.record.io.native_writer`): the records it had not written yet,
turned into one more segment of its session, byte for byte the lines the writer would have
written, and the ring file deleted.

:func:`recover_rings` is the reader's one step for it (:func:`goodtrace.read.segments.list_segments`
runs it on local run directories before listing): a ring whose process still holds its file lock
is live and left alone. Exactness: every entry before the ring's ``head`` is whole (the producer
commits ``head`` after the entry); entries before ``tail`` are in the segments; for the one write
that may have been cut by the kill (the journal ``j_*``), the complete lines that reached the
segment file are counted and not repeated. Standard library only.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator

from goodtrace.record.io.native import OPEN_RING_FILES, RING_SUFFIX

__all__ = ["RING_SUFFIX", "RingError", "RingFile", "decode_lines", "pending_lines", "read_ring", "recover_rings"]

_MAGIC = b"GTRING\0\0"
_VERSION = 1
# RingShared in native_writer.h, field by field (little-endian, natural alignment)
_SHARED = struct.Struct("<8sII4Q4I3q5Qq q5Q qq64s".replace(" ", ""))
# A ring written on another host is recovered only when its writer's last heartbeat is this old
# (the rule that calls a session lost): a lock on NFS mounted without a lock service says nothing.
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


def _quiet_long_enough(ring: RingFile) -> bool:
    """Whether a ring's writer is surely gone where its lock cannot say: written on this host
    (the lock is this kernel's), or its last heartbeat older than the lost-session rule."""
    if not ring.host or ring.host == socket.gethostname()[:63]:
        return True
    stale_ns = max(STALE_MIN_S * 1e9, STALE_INTERVALS * ring.interval_ns)
    return time.time_ns() - ring.beat_wall > stale_ns


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


def _live(fd: int) -> bool:
    """Whether the process that made the ring still holds its lock."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        # EACCES or EAGAIN: held by a live writer. Any other refusal (ENOLCK: an NFS without a
        # lock service) tells nothing: left alone, as if live (the writer could not lock it
        # either, so its ring is in memory)
        return True
    return False


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


def recover_ring(path: str, problems: list[str] | None = None) -> int | None:
    """Turn a dead process's ring into a segment and delete it: the records recovered, or None
    when the ring is live (or was just recovered by another reader). Problems are named."""
    where = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
    if os.path.abspath(path) in OPEN_RING_FILES:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not wait
    except OSError:
        return None  # gone: recovered by another reader, or finished cleanly meanwhile
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if problems is not None:
                problems.append(f"{where}: not a regular file, not a ring; skipped")
            return None
        if info.st_nlink == 0 or _live(fd):
            return None
        try:
            ring = read_ring(path)
        except RingError as exc:
            if problems is not None:
                problems.append(f"{where}: {exc}; its records are not recovered")
            return None
        if not _quiet_long_enough(ring):
            return None  # another host's, heard from recently: maybe live
        lines, damaged = pending_lines(ring)
        segment = ring.segment_path(ring.segment + 1)
        if damaged is not None and problems is not None:
            problems.append(f"{where}: damaged after {len(lines):,} records ({damaged}); the rest is not "
                            "recovered and the file is left as it is")
        try:
            if lines:
                _write_segment(segment, ring.header_line(ring.segment + 1) + b"".join(lines))
            if damaged is None:
                os.unlink(path)
        except OSError as exc:
            if problems is not None and lines:
                problems.append(f"{where}: {len(lines):,} records of a process that ended without finishing are "
                                f"in its ring but could not be written to a segment ({exc.strerror or exc}); "
                                "they are left out")
            return None
        if lines and problems is not None:
            problems.append(f"{where}: {len(lines):,} records the process had not written when it ended (killed) "
                            f"were recovered from its ring into {os.path.basename(segment)}")
        return len(lines)
    finally:
        os.close(fd)  # releases the shared lock


def recover_rings(rank_dir: str, names: list[str], problems: list[str] | None = None) -> int:
    """Recover every dead ring among ``names`` (a rank directory's listing): the records recovered."""
    recovered = 0
    for name in names:
        if name.endswith(RING_SUFFIX):
            recovered += recover_ring(os.path.join(rank_dir, name), problems) or 0
    return recovered
