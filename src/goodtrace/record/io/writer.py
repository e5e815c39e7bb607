"""The background writer: bounded buffer -> JSON lines -> the rank's segment files.

The recorder appends record tuples to a :class:`RecordBuffer`, which holds at most
``max_buffer_records``: an append past that drops the record and counts it (the check is part
of every append, so memory is bounded whatever the writer is doing). Two daemon threads do the
rest. The *flusher* hands bounded chunks (at most ``CHUNK_RECORDS`` records) to the *I/O
thread* on a fixed cadence: every flush interval it takes the records present at that moment
and writes a heartbeat after them (on time, whatever the producer does), and in between it
takes whole chunks as soon as they fill, so a fast producer never leaves more than one chunk
waiting. All conversion to JSON happens here, never on the hot path (runs of plain spans in
one C call, ``_speedups.encode_plain_spans``, when the extension was built). The I/O thread appends
each chunk with one write (local disk, NFS), or adds it to the open segment of an object store
and uploads that at every heartbeat (every k-th with ``remote_upload_interval_s``); if storage
is slow, hung or failing, chunks wait up to a byte limit, after which they are dropped and
counted: training never waits. A failed write leaves no partial line behind, each segment has
one header, and a deleted run directory is noticed (an ``fstat`` at a heartbeat at most every
``storage_check_interval_s``, by default every heartbeat; a path lookup at rotation and close)
and recreated, header first.

Every count of records that did not reach storage is written into the next heartbeat
(``dropped``), and ``close()`` returns False and says how many when it is not zero.
"""

from __future__ import annotations

import collections
import errno
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from goodtrace.record.config import Config
from goodtrace.record.errors import warn
from goodtrace.record.io.encoding import MAX_ATTRS_CHARS, RecordBuffer, _Encoder
from goodtrace.record.io.storage import Storage, TornWriteError, symlink_loop
from goodtrace.record.threads import Thread

CHUNK_RECORDS = 32_768  # records per chunk handed to the I/O thread (about 4-5 MiB of JSON)
POLL_S = 0.02  # how often the flusher looks for a full chunk between heartbeats
HEADER_TIMEOUT_S = 2.0  # how long start() waits for the first header to reach storage

__all__ = ["CHUNK_RECORDS", "MAX_ATTRS_CHARS", "RecordBuffer", "Writer", "WriterStats"]


class _Chunk:
    """Work for the I/O thread: encoded lines of ``count`` records (a heartbeat ends them when
    ``heartbeat``), or an ``action``: write the header now, upload now, close the segment."""

    __slots__ = ("action", "count", "data", "heartbeat")

    def __init__(self, data: bytes, count: int, heartbeat: bool, action: str = "") -> None:
        self.data = data
        self.count = count
        self.heartbeat = heartbeat
        self.action = action


class WriterStats:
    """What the writer did, for benchmarks and tests: seconds per storage call (append, upload)
    and seconds to encode each chunk (the most recent 10,000 of each)."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds: collections.deque[float] = collections.deque(maxlen=10_000)
        self.encode_seconds: collections.deque[float] = collections.deque(maxlen=10_000)

    def max_chunk_seconds(self) -> float:
        """The longest it took to encode one chunk plus the longest storage call."""
        return max(self.encode_seconds, default=0.0) + max(self.seconds, default=0.0)


class Writer:
    """Owns the two threads; ``flush()`` and ``close()`` may be called from any thread and
    return within their timeout whatever storage does."""

    def __init__(
        self,
        storage: Storage,
        buffer: RecordBuffer,
        config: Config,
        header: Callable[[int, int, int], dict[str, Any]],
        segment_prefix: str,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._storage = storage
        self._buffer = buffer
        self._config = config
        self._header = header
        self._prefix = segment_prefix
        self._clock = clock
        self._encoder = _Encoder()
        self._flush_lock = threading.RLock()  # re-entrant: a signal handler may finish() mid-flush
        self._io_cond = threading.Condition()
        self._io_queue: collections.deque[_Chunk] = collections.deque()
        self._io_pending_bytes = 0
        self._io_busy = False
        self._wake = threading.Event()
        self._stop = threading.Event()  # the I/O thread ends once its queue is empty
        self._stop_flusher = threading.Event()
        self._dropped = 0  # records in chunks that storage refused or could not take in time
        self.lost_records = 0  # written into a file that was then deleted
        self.written_records = 0
        self.stats = WriterStats()
        self._warned: set[str] = set()
        # segment state: the I/O thread's alone (flush and close hand it actions, never touch it)
        self._segment = 0
        self._segment_bytes = 0
        self._segment_has_header = False
        self._segment_data = bytearray()  # object stores: the open segment, re-uploaded whole
        self._segment_uploaded = 0  # bytes of _segment_data already uploaded
        self._segment_unuploaded_records = 0
        self._beats_since_upload = 0
        self._checked_at = time.monotonic()
        self._records_since_check = 0
        self._flusher = Thread(target=self._flush_loop, name="goodtrace-flusher", daemon=True)
        self._io = Thread(target=self._io_loop, name="goodtrace-io", daemon=True)

    @property
    def dropped_records(self) -> int:
        """Every record that will not reach storage: refused by the full buffer, dropped when
        storage was failing or too slow, or written into a deleted file."""
        return self._buffer.dropped + self._dropped + self.lost_records

    def start(self) -> None:
        """Start the threads and write the first segment's header now (bounded wait), so that a
        process killed in its first second still leaves its session behind."""
        self._flusher.start()
        self._io.start()
        self._enqueue(b"", 0, heartbeat=False, action="header")
        self._wait_idle(HEADER_TIMEOUT_S)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and len(self._warned) < 100:
            self._warned.add(key)
            warn(message, stacklevel=2)  # never raises, whatever the warnings filter

    # ---------------------------------------------------------------- flusher side
    def _flush_loop(self) -> None:
        interval = self._config.flush_interval_s
        poll = min(interval, POLL_S)
        next_beat = time.monotonic() + interval
        while not self._stop_flusher.is_set():
            try:
                now = time.monotonic()
                if len(self._buffer) < CHUNK_RECORDS:  # a full chunk goes at once: no idle gap
                    self._wake.wait(max(0.0, min(poll, next_beat - now)))
                    self._wake.clear()
                if self._stop_flusher.is_set():
                    break
                now = time.monotonic()
                if now >= next_beat:
                    next_beat += interval
                    if next_beat <= now:  # fell behind (a stopped process, a long GC): no burst
                        next_beat = now + interval
                    self.flush_once()
                elif len(self._buffer) >= CHUNK_RECORDS:
                    self._drain(whole_chunks_only=True)
                if self._buffer.dropped and "buffer" not in self._warned:
                    self.warn_once(
                        "buffer",
                        f"dropping records: more than max_buffer_records={self._buffer.limit} were waiting to "
                        "be written (counted in the run's heartbeat)",
                    )
            except BaseException as exc:  # the thread must survive anything (it keeps the bound)
                self.warn_once("flush", f"internal error in the writer: {exc!r}")

    def flush_once(self, deadline: float | None = None) -> None:
        """Hand every record buffered now, then a heartbeat, to the I/O thread. Never blocks on
        I/O; with a ``deadline`` (``time.monotonic()``), waits until then for room in the I/O
        queue instead of dropping (``flush()`` and ``close()``: the caller asked to wait)."""
        try:
            self._drain(whole_chunks_only=False, deadline=deadline)
        except Exception as exc:
            self.warn_once("flush", f"internal error while encoding records: {exc!r}")

    def _encode_error(self, exc: Exception) -> None:
        self._dropped += 1
        self.warn_once("encode", f"could not encode a record ({exc!r}); it was skipped")

    def _drain(self, *, whole_chunks_only: bool, deadline: float | None = None) -> None:
        with self._flush_lock:
            buffer = self._buffer
            popleft = buffer.popleft
            left = len(buffer)  # what is here now: a producer that keeps up cannot hold us here
            if whole_chunks_only:
                left -= left % CHUNK_RECORDS
            heartbeat = not whole_chunks_only
            while left > 0 or heartbeat:
                take = min(left, CHUNK_RECORDS)
                left -= take
                started = time.perf_counter()
                records: list[tuple[Any, ...]] = []
                try:
                    records.extend(popleft() for _ in range(take))
                    lines: list[bytes] = []
                    count = self._encoder.encode_many(records, lines, self._encode_error)
                    last = left <= 0
                    if last and heartbeat:
                        lines.append(
                            f'{{"kind":"heartbeat","wall":{time.time_ns()},"mono":{self._clock()},'
                            f'"dropped":{self.dropped_records}}}\n'.encode()
                        )
                    data = b"".join(lines)
                    self.stats.encode_seconds.append(time.perf_counter() - started)
                except BaseException:  # out of memory, say: what was taken out is counted, never lost unsaid
                    self._drop(len(records), "the writer could not encode them (out of memory?)")
                    raise
                self._enqueue(data, count, heartbeat=last and heartbeat, deadline=deadline)
                if last:
                    break

    def _enqueue(
        self, data: bytes, count: int, *, heartbeat: bool, action: str = "", deadline: float | None = None
    ) -> None:
        try:
            self._hand_over(data, count, heartbeat, action, deadline)
        except BaseException:  # the hand-off itself failed (out of memory): the chunk is dropped, counted
            self._drop(count, "the writer could not hand a chunk over (out of memory?)")
            raise

    def _hand_over(self, data: bytes, count: int, heartbeat: bool, action: str, deadline: float | None) -> None:
        limit = self._config.max_pending_bytes
        with self._io_cond:
            # Past the byte limit a chunk waits for room (until ``deadline``) or is dropped; one
            # chunk is always taken when none is queued, so memory stays under limit + one chunk.
            full = bool(self._io_queue) and self._io_pending_bytes + len(data) > limit
            while full and deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._io_cond.wait(timeout=min(left, 0.05))
                full = bool(self._io_queue) and self._io_pending_bytes + len(data) > limit
            if not full:
                self._io_queue.append(_Chunk(data, count, heartbeat, action))
                self._io_pending_bytes += len(data)
                self._io_cond.notify_all()
        if full:
            self._drop(count, f"storage at {self._storage.description} is not keeping up")

    def _drop(self, count: int, why: str) -> None:
        self._dropped += count
        if count:
            self.warn_once("drop", f"dropping records: {why} (counted in the run's heartbeat)")

    # ---------------------------------------------------------------- I/O side
    def _io_loop(self) -> None:
        while True:
            item: _Chunk | None = None
            try:
                with self._io_cond:
                    while not self._io_queue and not self._stop.is_set():
                        self._io_cond.wait()
                    if not self._io_queue:  # stopped, and nothing left to write
                        return
                    item = self._io_queue.popleft()
                    self._io_busy = True
                self._do(item)
            except BaseException as exc:  # the thread must survive anything
                if item is not None:
                    self._dropped += item.count
                self.warn_once("io", f"internal error in the writer's I/O thread: {exc!r}")
            finally:
                with self._io_cond:
                    if item is not None:
                        self._io_pending_bytes -= len(item.data)
                    self._io_busy = False
                    self._io_cond.notify_all()

    def _do(self, item: _Chunk) -> None:
        if item.action == "close":
            if self._storage.remote:
                self._maybe_upload(force=True)
            else:
                self._check_storage(thorough=True)
                self._storage.close_file(self._segment_path())
        elif item.action == "upload":
            if self._storage.remote:
                self._maybe_upload(force=True)
        else:
            self._write_chunk(item)
            if self._storage.remote:
                # Upload on the heartbeat cadence: every k-th flush interval, k set by
                # remote_upload_interval_s (1 by default), and the header at once. When a slow
                # store left several chunks queued, one upload after the last of them does.
                self._beats_since_upload += item.heartbeat
                every = max(1, round(self._config.remote_upload_interval_s / self._config.flush_interval_s))
                if item.action == "header" or (self._beats_since_upload >= every and not self._io_queue):
                    self._maybe_upload(force=True)

    def _segment_path(self) -> str:
        return f"{self._prefix}.{self._segment:05d}.jsonl"

    def _header_bytes(self) -> bytes:
        header = self._header(self._segment, time.time_ns(), self._clock())
        return (json.dumps(header, separators=(",", ":"), default=str) + "\n").encode()

    def _timed(self, call: Callable[[str, bytes], None], path: str, data: bytes) -> None:
        t0 = time.perf_counter()
        try:
            call(path, data)
        finally:
            self.stats.calls += 1
            self.stats.seconds.append(time.perf_counter() - t0)

    def _write_chunk(self, chunk: _Chunk) -> None:
        if self._storage.remote:
            self._add_remote(chunk)
            return
        limit = self._config.segment_bytes
        if self._segment_bytes and self._segment_bytes + len(chunk.data) > limit:
            self._rotate()
        elif chunk.heartbeat and time.monotonic() - self._checked_at >= self._config.storage_check_interval_s:
            self._check_storage()
        data = chunk.data if self._segment_has_header else self._header_bytes() + chunk.data
        try:
            self._timed(self._storage.append, self._segment_path(), data)
        except TornWriteError as exc:  # part of a line stayed behind: never append after it
            self._failed(chunk, exc)
            self._new_segment()
            return
        except Exception as exc:
            self._failed(chunk, exc)
            return
        self._segment_has_header = True
        self._segment_bytes += len(data)
        self.written_records += chunk.count
        self._records_since_check += chunk.count

    def _failed(self, chunk: _Chunk, exc: BaseException) -> None:
        self._dropped += chunk.count
        loop = symlink_loop(self._storage.description) if getattr(exc, "errno", None) == errno.ELOOP else None
        self.warn_once(
            f"io:{type(exc).__name__}",
            f"could not write to {self._storage.description}: {exc!r}{_named(loop)}; "
            "records are dropped and counted until it works again",
        )

    def _check_storage(self, *, thorough: bool = False) -> None:
        """Is our open segment still the file at its path (run directory not deleted or
        replaced)? If not, count what went into it since the last check as lost and continue in
        a new segment, which recreates the directory."""
        self._checked_at = time.monotonic()
        try:
            problem = self._storage.check(self._segment_path(), thorough=thorough)
        except Exception as exc:
            problem = f"could not check it: {exc!r}"
        if problem:
            lost = self._records_since_check
            self.lost_records += lost
            self.warn_once(
                "gone",
                f"{problem} ({self._storage.description}): up to {lost} records written since the last "
                "check are lost; recording goes on into a new segment in a recreated directory",
            )
            self._storage.forget(self._segment_path())
            self._new_segment()
        self._records_since_check = 0

    def _new_segment(self) -> None:
        self._segment += 1
        self._segment_bytes = 0
        self._segment_has_header = False

    def _rotate(self) -> None:
        self._check_storage(thorough=True)
        if self._segment_bytes:  # _check_storage may already have moved on
            try:
                self._storage.close_file(self._segment_path())
            except Exception as exc:
                self.warn_once("close", f"could not close a segment on {self._storage.description}: {exc!r}")
            self._new_segment()

    # object stores: the open segment lives in memory and is uploaded whole; closed ones never change
    def _add_remote(self, chunk: _Chunk) -> None:
        if self._segment_data and len(self._segment_data) + len(chunk.data) > self._config.remote_segment_bytes:
            self._maybe_upload(force=True)
            if self._segment_unuploaded_records:  # the upload failed: this segment's rest is lost
                self._dropped += self._segment_unuploaded_records
            self._segment_data = bytearray()
            self._segment_uploaded = 0
            self._segment_unuploaded_records = 0
            self._new_segment()
        if not self._segment_data:
            self._segment_data += self._header_bytes()
        self._segment_data += chunk.data
        self._segment_unuploaded_records += chunk.count

    def _maybe_upload(self, *, force: bool = True) -> None:
        """Upload the open segment if it changed since its last upload (a failure is retried at
        the next heartbeat; the records stay counted as not written until then)."""
        self._beats_since_upload = 0
        if len(self._segment_data) == self._segment_uploaded:
            return
        size = len(self._segment_data)
        try:
            self._timed(self._storage.put, self._segment_path(), bytes(self._segment_data))
        except Exception as exc:
            self.warn_once(f"io:{type(exc).__name__}", f"could not upload to {self._storage.description}: {exc!r}")
            return
        self._segment_uploaded = size
        self.written_records += self._segment_unuploaded_records
        self._segment_unuploaded_records = 0

    # ---------------------------------------------------------------- shutdown
    def _wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._io_cond:
            while self._io_queue or self._io_busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._io_cond.wait(timeout=min(left, 0.05))
        return True

    def flush(self, timeout: float) -> bool:
        """Flush everything buffered now and wait up to ``timeout`` s for it to reach storage."""
        self.flush_once(time.monotonic() + timeout)
        if self._storage.remote:
            self._enqueue(b"", 0, heartbeat=False, action="upload")
        return self._wait_idle(timeout)

    def close(self, timeout: float) -> bool:
        """Final flush, upload, close the segment and stop the threads, all within ``timeout``
        s. True only if every record reached storage; otherwise a warning says how many did not."""
        deadline = time.monotonic() + timeout
        self._stop_flusher.set()
        self._wake.set()
        self.flush_once(deadline)
        try:
            self._enqueue(b"", 0, heartbeat=False, action="close")
            done = self._wait_idle(timeout)
        except Exception as exc:  # MemoryError: what is still buffered or queued is counted below
            self.warn_once("close-error", f"the writer failed while closing: {exc!r}")
            done = False
        if not done:
            self._dropped += len(self._buffer)  # never handed over
        self._stop.set()
        with self._io_cond:
            self._io_cond.notify_all()
            if not done:  # what is still queued will not be written by us
                self._dropped += sum(chunk.count for chunk in self._io_queue)
                self._dropped += self._segment_unuploaded_records
        # Daemon threads, never joined without a timeout: a thread stuck in a hung filesystem
        # must not hold the process.
        if done:
            self._io.join(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        dropped = self.dropped_records
        if not done:
            self.warn_once(
                "close",
                f"storage at {self._storage.description} did not accept the last records within {timeout:.1f} s; "
                f"{dropped} records in total did not reach storage",
            )
        elif dropped:
            self.warn_once("close", f"{dropped} records did not reach storage at {self._storage.description} "
                           "(dropped or lost; see the earlier warnings)")
        return done and dropped == 0


def _named(loop: list[str] | None) -> str:
    return f" (a symlink loop: {' -> '.join(loop)})" if loop else ""
