"""The background writer: buffer -> JSON lines -> the rank's segment files.

Two daemon threads. The *flusher* wakes every flush interval, drains the recorder's buffer,
encodes records to JSON lines (all conversion happens here, never on the hot path), adds a
heartbeat and hands the chunk to the *I/O thread*. The I/O thread appends chunks to the current
segment and rotates segments. If storage is slow, hung or failing, chunks pile up to a byte
limit, after which the flusher drops them and counts the records: training never waits.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from goodtrace import schema
from goodtrace.record.config import Config
from goodtrace.record.errors import describe, warn
from goodtrace.record.storage import Storage

_CHUNK_RECORDS = 20_000  # records per chunk handed to the I/O thread


#: The most characters of JSON one record's attributes (or value) take in the files; a larger
#: one is cut: strings to 1,000 characters and containers to 100 items, or else replaced by
#: ``{"truncated_chars": <its size>}``. A 40 MB attribute never makes a 40 MB line.
MAX_ATTRS_CHARS = 64 * 1024


def _dumps(value: Any) -> str:
    """JSON for attribute values: never fails (odd objects become strings, NaN becomes null,
    cycles and deep nesting are cut) and is never longer than MAX_ATTRS_CHARS."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except Exception:
        text = json.dumps(_sanitise(value), allow_nan=False, separators=(",", ":"))
    if len(text) > MAX_ATTRS_CHARS:
        size = len(text)
        text = json.dumps(_sanitise(value, cut=100), allow_nan=False, separators=(",", ":"))
        if len(text) > MAX_ATTRS_CHARS:
            text = f'{{"truncated_chars":{size}}}'
    return text


def _sanitise(value: Any, depth: int = 0, cut: int | None = None) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return value if cut is None else value[:1000]
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if depth < 4 and isinstance(value, dict):
        items = list(value.items())[:cut]
        return {k if isinstance(k, str) else describe(k): _sanitise(v, depth + 1, cut) for k, v in items}
    if depth < 4 and isinstance(value, (list, tuple)):
        return [_sanitise(v, depth + 1, cut) for v in value[:cut]]
    return describe(value, 1000)


def _extra(record: tuple[Any, ...], index: int, field: str) -> str:
    """``,"field":N`` for an optional integer field at ``record[index]`` (absent or None: "")."""
    value = record[index] if len(record) > index else None
    return "" if value is None else f',"{field}":{int(value)}'


class _Encoder:
    """Encodes record tuples to JSON lines; caches the JSON form of repeated strings."""

    def __init__(self) -> None:
        self._strings: dict[Any, str] = {}

    def string(self, value: Any) -> str:
        try:
            cached = self._strings.get(value)
        except TypeError:  # unhashable "name": write its repr
            return json.dumps(repr(value)[:1000])
        if cached is None:
            text = value if isinstance(value, str) else repr(value)
            cached = json.dumps(text[:1000])
            if len(self._strings) < 100_000:
                self._strings[value] = cached
        return cached

    @staticmethod
    def step(value: Any) -> str:
        return "null" if value is None else str(int(value))

    def encode(self, record: tuple[Any, ...]) -> str:
        kind = record[0]
        s = self.string
        if type(kind) is tuple:  # a span: (key, t0, t1, step, thread, attrs, exc_type)
            key, t0, t1, step, tid, attrs, exc_type = record
            attrs_json = "null" if attrs is None else _dumps(attrs)
            return (
                f'{{"kind":"span","name":{s(key[0])},"cat":{s(key[1])},"t0":{t0},"t1":{t1},'
                f'"step":{self.step(step)},"tid":{tid},"err":{"false" if exc_type is None else "true"},'
                f'"attrs":{attrs_json}}}\n'
            )
        if kind is schema.STEP:  # (STEP, step, t0, t1[, seq])
            step, t0, t1 = record[1:4]
            return f'{{"kind":"step","step":{self.step(step)},"t0":{t0},"t1":{t1}{_extra(record, 4, "seq")}}}\n'
        if kind is schema.SYNC:  # (SYNC, step, t, how[, seq[, after]])
            step, t, how = record[1:4]
            return (
                f'{{"kind":"sync","step":{self.step(step)},"t":{t},"how":{s(how)}'
                f'{_extra(record, 4, "seq")}{_extra(record, 5, "after")}}}\n'
            )
        if kind is schema.TAG:
            _, step, name, t = record
            return f'{{"kind":"tag","step":{self.step(step)},"name":{s(name)},"t":{t}}}\n'
        if kind is schema.EVENT:
            _, name, t, step, attrs = record
            attrs_json = "null" if attrs is None else _dumps(attrs)
            return (
                f'{{"kind":"event","name":{s(name)},"t":{t},"step":{self.step(step)},'
                f'"attrs":{attrs_json}}}\n'
            )
        if kind is schema.METRIC:
            _, name, step, value, reduce, t = record
            return (
                f'{{"kind":"metric","name":{s(name)},"step":{self.step(step)},'
                f'"value":{_dumps(value)},"reduce":{s(reduce)},"t":{t}}}\n'
            )
        if kind is schema.CLOCK:
            _, offset, rtt, reference, t = record
            return (
                f'{{"kind":"clock","offset_ns":{int(offset)},"rtt_ns":{int(rtt)},'
                f'"attrs":{{"reference_rank":{int(reference)}}},"t":{t}}}\n'
            )
        if kind is schema.FINISH:  # (FINISH, completed, t, reason[, exception])
            completed, t, reason = record[1:4]
            exception = record[4] if len(record) > 4 else None
            crash = "" if exception is None else f',"exception":{s(exception)}'
            return (
                f'{{"kind":"finish","completed":{_dumps(completed)},"t":{t},'
                f'"reason":{s(reason)}{crash}}}\n'
            )
        raise ValueError(f"unknown record kind {kind!r}")


class Writer:
    """Owns the two threads; ``flush()`` and ``close()`` may be called from any thread."""

    def __init__(
        self,
        storage: Storage,
        buffer: collections.deque[tuple[Any, ...]],
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
        self._io_queue: collections.deque[tuple[bytes, int]] = collections.deque()
        self._io_pending_bytes = 0
        self._io_busy = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.dropped_records = 0
        self.written_records = 0
        self.write_errors = 0
        self._warned: set[str] = set()
        # segment state (I/O thread only)
        self._segment = 0
        self._segment_bytes = 0
        self._segment_data = bytearray()
        self._segment_uploaded_at = 0.0
        self._flusher = threading.Thread(target=self._flush_loop, name="goodtrace-flusher", daemon=True)
        self._io = threading.Thread(target=self._io_loop, name="goodtrace-io", daemon=True)

    @property
    def current_segment(self) -> int:
        return self._segment

    def start(self) -> None:
        self._flusher.start()
        self._io.start()

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, stacklevel=2)

    # ---------------------------------------------------------------- flusher side
    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._config.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.flush_once()

    def flush_once(self) -> None:
        """Drain the buffer into one chunk and queue it for the I/O thread. Never blocks on I/O."""
        try:
            with self._flush_lock:
                self._flush_locked()
        except Exception as exc:
            self.write_errors += 1
            self.warn_once("flush", f"internal error while encoding records: {exc!r}")

    def _flush_locked(self) -> None:
        buffer = self._buffer
        overflow = len(buffer) - self._config.max_buffer_records
        if overflow > 0:  # producer faster than we can encode: keep the newest
            for _ in range(overflow):
                buffer.popleft()
            self._drop(overflow, "the in-memory buffer overflowed")
        encode = self._encoder.encode
        popleft = buffer.popleft
        exhausted = False
        while not exhausted:
            lines: list[str] = []
            count = 0
            while count < _CHUNK_RECORDS:
                try:
                    record = popleft()
                except IndexError:
                    exhausted = True
                    break
                try:
                    lines.append(encode(record))
                    count += 1
                except Exception as exc:
                    self.write_errors += 1
                    self.warn_once("encode", f"could not encode a record ({exc!r}); it was skipped")
            if exhausted:
                wall = time.time_ns()
                mono = self._clock()
                lines.append(
                    f'{{"kind":"heartbeat","wall":{wall},"mono":{mono},"dropped":{self.dropped_records}}}\n'
                )
            self._enqueue("".join(lines).encode("utf-8", "surrogatepass"), count)

    def _enqueue(self, chunk: bytes, count: int) -> None:
        with self._io_cond:
            full = self._io_pending_bytes + len(chunk) > self._config.max_pending_bytes
            if not full:
                self._io_queue.append((chunk, count))
                self._io_pending_bytes += len(chunk)
                self._io_cond.notify_all()
        if full:
            self._drop(count, f"storage at {self._storage.description} is not keeping up")

    def _drop(self, count: int, why: str) -> None:
        self.dropped_records += count
        self.warn_once("drop", f"dropping records: {why} (counted in the run's heartbeat)")

    # ---------------------------------------------------------------- I/O side
    def _io_loop(self) -> None:
        while True:
            with self._io_cond:
                while not self._io_queue and not self._stop.is_set():
                    self._io_cond.wait(timeout=self._upload_wait())
                    if not self._io_queue and self._storage.remote:
                        break
                if not self._io_queue and self._stop.is_set():
                    self._io_busy = False
                    self._io_cond.notify_all()
                    return
                item = self._io_queue.popleft() if self._io_queue else None
                self._io_busy = item is not None or self._storage.remote
            try:
                if item is not None:
                    self._write_chunk(*item)
                if self._storage.remote:
                    self._maybe_upload(force=False)
            except Exception as exc:
                self.write_errors += 1
                if item is not None:
                    self.dropped_records += item[1]
                self.warn_once("io", f"could not write to {self._storage.description}: {exc!r}")
            finally:
                with self._io_cond:
                    if item is not None:
                        self._io_pending_bytes -= len(item[0])
                    self._io_busy = False
                    self._io_cond.notify_all()

    def _upload_wait(self) -> float | None:
        return self._config.remote_upload_interval_s / 4 if self._storage.remote else None

    def _segment_path(self) -> str:
        return f"{self._prefix}.{self._segment:05d}.jsonl"

    def _header_bytes(self) -> bytes:
        header = self._header(self._segment, time.time_ns(), self._clock())
        return (json.dumps(header, separators=(",", ":"), default=str) + "\n").encode()

    def _write_chunk(self, chunk: bytes, count: int) -> None:
        storage = self._storage
        limit = self._config.remote_segment_bytes if storage.remote else self._config.segment_bytes
        if self._segment_bytes and self._segment_bytes + len(chunk) > limit:
            self._rotate()
        if self._segment_bytes == 0:
            header = self._header_bytes()
            if storage.remote:
                self._segment_data += header
            else:
                storage.append(self._segment_path(), header)
            self._segment_bytes = len(header)
        if storage.remote:
            self._segment_data += chunk
        else:
            storage.append(self._segment_path(), chunk)
        self._segment_bytes += len(chunk)
        self.written_records += count

    def _rotate(self) -> None:
        if self._storage.remote:
            self._maybe_upload(force=True)
            self._segment_data = bytearray()
        else:
            self._storage.close_file(self._segment_path())
        self._segment += 1
        self._segment_bytes = 0

    def _maybe_upload(self, *, force: bool) -> None:
        if not self._segment_data:
            return
        now = time.monotonic()
        if force or now - self._segment_uploaded_at >= self._config.remote_upload_interval_s:
            self._storage.put(self._segment_path(), bytes(self._segment_data))
            self._segment_uploaded_at = now

    # ---------------------------------------------------------------- shutdown
    def flush(self, timeout: float) -> bool:
        """Flush everything buffered now and wait up to ``timeout`` s for it to reach storage."""
        self.flush_once()
        deadline = time.monotonic() + timeout
        with self._io_cond:
            while self._io_queue or self._io_busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._io_cond.wait(timeout=min(left, 0.05))
        return True

    def close(self, timeout: float) -> bool:
        """Final flush, upload, close files and stop the threads. True if everything was written."""
        done = self.flush(timeout)
        self._stop.set()
        self._wake.set()
        with self._io_cond:
            self._io_cond.notify_all()
        if done:
            self._io.join(timeout=max(0.1, timeout))
            try:
                if self._storage.remote:
                    self._maybe_upload(force=True)
                self._storage.close_file(self._segment_path())
            except Exception as exc:
                self.write_errors += 1
                self.warn_once("io", f"could not write to {self._storage.description}: {exc!r}")
                done = False
        else:
            with self._io_cond:
                lost = sum(count for _, count in self._io_queue)
            self.dropped_records += lost
            self.warn_once(
                "close",
                f"storage at {self._storage.description} did not accept the last records within "
                f"{timeout:.1f} s; {self.dropped_records} records were dropped in total",
            )
        return done
