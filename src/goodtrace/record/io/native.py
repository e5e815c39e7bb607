"""The native writer: the recorder's buffer and writer when ``_native`` was built and the run
directory is a local (or NFS) path.

The common records go into a C ring as plain fields and a C thread turns them into the same
JSON lines as :mod:`goodtrace.record.io.writer`, writing them with one ``write`` per flush and
a heartbeat every flush interval, without ever taking the GIL: a training thread that holds
the GIL (the convoy effect of a loop making a system call every few microseconds) cannot
starve it. The ring lives in a file mapped ``MAP_SHARED`` beside the session's segments
(``<segment prefix>.ring``, :data:`RING_SUFFIX`): a record whose append returned is in the
kernel's page cache, so a SIGKILL loses none of it (a machine crash still loses what was not
written back); :mod:`goodtrace.read.ring` turns what the writer had not written into a segment.
A clean close deletes the file. Where it cannot be made (a read-only or full directory) the
ring is in the process's memory, as before, with one warning. Rare records
(attributes, errors, events, the finish record) are encoded by the Python encoder as they are
appended and travel through the ring as bytes, in order. Warnings are Python's: a small
daemon thread reads the writer's counters every flush interval (if it is starved, a warning
comes late; no record does).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from goodtrace import schema
from goodtrace.record.config import Config
from goodtrace.record.errors import warn
from goodtrace.record.io.encoding import _Encoder
from goodtrace.record.io.storage import LocalStorage, symlink_loop
from goodtrace.record.threads import Thread

_SEGMENT, _WALL, _MONO = -7_300_000_000_000_000_001, -7_300_000_000_000_000_002, -7_300_000_000_000_000_003
RING_BYTES_PER_RECORD = 64  # one fixed-field record
# The ring's bytes: max_buffer_records of them, but at most half of max_pending_bytes (32 MiB by
# default: a second of records at 500 k/s, while the writer drains a chunk every 65 ms). Every
# page of the ring is touched as it wraps, so its size is resident memory.
HEADER_TIMEOUT_S = 2.0
RING_SUFFIX = ".ring"
#: The interned texts' area of a ring file (names, a span's constant start): 4 MiB, tens of
#: thousands of names. A name that no longer fits goes through the Python encoder, as bytes.
RING_TEXT_BYTES = 4 << 20

#: The ring files of this process's open native writers: a reader in the same process (where
#: the file lock cannot tell) leaves them alone.
OPEN_RING_FILES: set[str] = set()

__all__ = ["OPEN_RING_FILES", "RING_SUFFIX", "NativeBuffer", "NativeStats", "NativeWriter"]


class NativeBuffer:
    """The recorder's buffer when the native writer runs: ``append`` is the C ring itself."""

    __slots__ = ("append", "limit", "ring")

    def __init__(self, ring: Any, limit: int) -> None:
        self.ring = ring
        self.append: Callable[[tuple[Any, ...]], None] = ring
        self.limit = limit

    @property
    def dropped(self) -> int:
        return int(self.ring.dropped)

    def __len__(self) -> int:
        return len(self.ring)

    def append_always(self, record: tuple[Any, ...]) -> None:
        self.ring.append_always(record)

    def clear(self) -> None:
        self.ring.clear()


class NativeStats:
    """What the native writer did, as :class:`goodtrace.record.io.writer.WriterStats` says it."""

    def __init__(self, ring: Any) -> None:
        self._ring = ring

    @property
    def calls(self) -> int:
        return int(self._ring.stats()["writes"])

    def max_chunk_seconds(self) -> float:
        """The longest it took to encode one chunk and write it."""
        return float(self._ring.stats()["max_chunk_ns"]) / 1e9


class NativeWriter:
    """Same interface as :class:`goodtrace.record.io.writer.Writer` (start, flush, close, the
    counters), over the C writer thread."""

    def __init__(
        self,
        native: Any,
        storage: LocalStorage,
        config: Config,
        header: Callable[[int, int, int], dict[str, Any]],
        segment_prefix: str,
    ) -> None:
        import json

        self._storage = storage
        self._config = config
        encoder = _Encoder()
        text = json.dumps(header(_SEGMENT, _WALL, _MONO), separators=(",", ":"), default=str) + "\n"
        parts: list[bytes] = []
        for mark in (_SEGMENT, _WALL, _MONO):
            before, text = text.split(str(mark), 1)
            parts.append(before.encode())
        parts.append(text.encode())
        limit = config.max_buffer_records
        self._ring_bytes = max(1 << 20, min(limit * RING_BYTES_PER_RECORD, config.max_pending_bytes // 2))
        ring_path = os.path.join(storage.root, *(segment_prefix + RING_SUFFIX).split("/"))
        in_file = os.environ.get("GOODTRACE_RING_FILE", "1") != "0"  # 0: in memory (the benchmarks' baseline)
        made_dir: OSError | None = None
        try:
            if in_file:
                os.makedirs(os.path.dirname(ring_path), exist_ok=True)
        except OSError as exc:
            made_dir = exc
        self.ring = native.NativeRing(
            root=os.fsencode(storage.root),
            prefix=os.fsencode(segment_prefix),
            header=tuple(parts),
            limit=limit,
            ring_bytes=self._ring_bytes,
            flush_interval_s=config.flush_interval_s,
            segment_bytes=config.segment_bytes,
            string_json=lambda value: encoder.string(value).encode("utf-8", "surrogatepass"),
            span_prefix=encoder.span_prefix,
            encode_line=lambda record: encoder.encode(record).encode("utf-8", "surrogatepass"),
            kinds=(schema.STEP, schema.SYNC, schema.TAG, schema.METRIC),
            ring_path=os.fsencode(ring_path) if in_file and made_dir is None else None,
            text_bytes=RING_TEXT_BYTES,
        )
        self.ring_file: str | None = None if self.ring.file is None else os.fsdecode(self.ring.file)
        if self.ring_file is not None:
            OPEN_RING_FILES.add(self.ring_file)
        elif in_file:
            error = made_dir.errno if made_dir is not None else int(self.ring.file_errno)
            why = (f"[Errno {error}] {os.strerror(error or 0)}" if error != errno.EOPNOTSUPP else
                   "its filesystem is not one where a shared file mapping is known to be safe (ext4, xfs, "
                   "tmpfs, NFS, overlayfs)")
            warn(f"the recorder's ring could not be put in a file beside the segments ({ring_path}: {why}); "
                 "it stays in this process's memory, where a killed process loses what the writer had not "
                 "yet written (up to a flush interval)", stacklevel=2)
        self.buffer = NativeBuffer(self.ring, limit)
        self.stats = NativeStats(self.ring)
        self._warned: set[str] = set()
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._monitor = Thread(target=self._watch, name="goodtrace-monitor", daemon=True)

    # the counters of Writer
    @property
    def written_records(self) -> int:
        return int(self.ring.stats()["written"])

    @property
    def lost_records(self) -> int:
        return int(self.ring.stats()["lost"])

    @property
    def dropped_records(self) -> int:
        """Every record that will not reach storage: refused by the full ring, refused by
        storage, not encodable, or written into a deleted file."""
        stats = self.ring.stats()
        return int(stats["dropped_full"] + stats["dropped_write"] + stats["dropped_encode"] + stats["lost"])

    def start(self) -> None:
        """Start the C thread; it writes the first segment's header at once (waited for, bounded)."""
        self.ring.start(HEADER_TIMEOUT_S)
        self._monitor.start()

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and len(self._warned) < 100:
            self._warned.add(key)
            warn(message, stacklevel=2)

    def _grew(self, stats: dict[str, int], name: str) -> int:
        """How much counter ``name`` grew since this was last asked."""
        before = self._seen.get(name, 0)
        self._seen[name] = stats[name]
        return stats[name] - before

    def check(self) -> None:
        """Turn what the counters say happened into the Python writer's warnings."""
        stats = self.ring.stats()
        where = self._storage.description
        if self._grew(stats, "dropped_full"):
            self.warn_once("buffer", f"dropping records: the buffer was full (max_buffer_records={self.buffer.limit} "
                           f"records, or {self._ring_bytes >> 20} MiB, half of max_pending_bytes, were waiting to be "
                           "written; counted in the run's heartbeat)")
        if self._grew(stats, "write_errors"):
            error = stats["last_errno"]
            loop = symlink_loop(self._storage.root) if error == errno.ELOOP else None
            named = f" (a symlink loop: {' -> '.join(loop)})" if loop else ""
            self.warn_once(f"io:{error}", f"could not write to {where}: [Errno {error}] {os.strerror(error)}{named}; "
                           "records are dropped and counted until it works again")
        if self._grew(stats, "recreated"):
            self.warn_once("gone", f"the run directory or the segment file was deleted ({where}): "
                           f"{stats['lost']} records written before it was noticed are lost; recording goes on "
                           "into a new segment in a recreated directory")
        if self._grew(stats, "dropped_encode"):
            self.warn_once("encode", "could not encode a record; it was skipped")

    def _watch(self) -> None:
        while not self._stop.wait(self._config.flush_interval_s):
            try:
                self.check()
            except Exception:  # a warning is never worth a dead thread
                pass

    def flush(self, timeout: float) -> bool:
        """Everything appended before the call written, within ``timeout`` s."""
        done = bool(self.ring.flush(timeout))
        self.check()
        return done

    def close(self, timeout: float) -> bool:
        """Final flush, close the segment (fsync) and stop the thread, within ``timeout`` s. True
        only if every record reached storage; otherwise a warning says how many did not."""
        started = time.monotonic()
        done = bool(self.ring.close(timeout))
        if done and self.ring_file is not None:
            OPEN_RING_FILES.discard(self.ring_file)  # deleted by the close
        self._stop.set()
        self.check()
        where = self._storage.description
        dropped = self.dropped_records
        if not done:
            pending = int(self.ring.stats()["pending"])
            self.warn_once("close", f"storage at {where} did not accept the last records within {timeout:.1f} s "
                           f"({time.monotonic() - started:.1f} s waited); {dropped + pending} records in total "
                           "did not reach storage")
        elif dropped:
            self.warn_once("close", f"{dropped} records did not reach storage at {where} "
                           "(dropped or lost; see the earlier warnings)")
        return done and dropped == 0
