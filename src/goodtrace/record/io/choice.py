"""Which writer a recorder gets: the native one (:mod:`goodtrace.record.io.native`) for a local
or NFS run directory on Linux with the real clock, when it was built; else the Python writer
threads (:mod:`goodtrace.record.io.writer`), which also serve object stores."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from goodtrace.record import fastpath
from goodtrace.record.config import Config
from goodtrace.record.io.encoding import RecordBuffer
from goodtrace.record.io.native import NativeBuffer, NativeWriter
from goodtrace.record.io.storage import LocalStorage, Storage
from goodtrace.record.io.writer import Writer

#: What the recorder appends to: the Python buffer or the native ring.
Buffer = RecordBuffer | NativeBuffer


def open_writer(
    storage: Storage,
    config: Config,
    header: Callable[[int, int, int], dict[str, Any]],
    segment_prefix: str,
    clock: Callable[[], int],
) -> tuple[Buffer, Writer | NativeWriter]:
    """The recorder's buffer and the writer that empties it."""
    if (
        fastpath.native is not None
        and type(storage) is LocalStorage
        and clock is time.perf_counter_ns  # the C thread dates heartbeats with CLOCK_MONOTONIC
        and sys.platform.startswith("linux")
    ):
        writer = NativeWriter(fastpath.native, storage, config, header, segment_prefix)
        return writer.buffer, writer
    buffer = RecordBuffer(config.max_buffer_records)
    return buffer, Writer(storage, buffer, config, header, segment_prefix, clock)
