"""Metric sinks, seen from inside the job: a small protocol, name lookup, and one thread per sink.

A sink (TensorBoard, W&B, MLflow, Prometheus: ``goodtrace.sinks``, or any object with the
methods of :class:`Sink`) receives rank 0's live line every log step and, at ``finish()``,
is closed after the rank's files are complete. Every call
runs on the sink's own daemon thread: the training thread only puts the line in a bounded
queue. A sink that raises, or whose queue fills because it is slow, is dropped with one
warning; it never slows or breaks the loop.

Names (``gt.init(sinks=["tensorboard:runs/tb"])`` or ``GOODTRACE_SINKS``) are resolved
without importing any sink module here: a table of ``module:attribute`` strings for the
built-in sinks, then the ``goodtrace.sinks`` entry-point group for sinks of other packages.
The module is imported only when the name is used, and only by :func:`resolve`.
"""

from __future__ import annotations

import dataclasses
import importlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from goodtrace.record.config import ConfigError
from goodtrace.record.errors import warn
from goodtrace.record.live.line import LiveLine
from goodtrace.record.threads import Thread

__all__ = [
    "BUILTIN_SINKS",
    "Sink",
    "SinkError",
    "SinkHub",
    "SinkRun",
    "attach_sinks",
    "parse_specs",
    "resolve",
]

# name -> "module:factory"; the factory takes the text after "name:" (or None) and returns a Sink.
BUILTIN_SINKS: dict[str, str] = {
    "tensorboard": "goodtrace.sinks.tensorboard:TensorBoardSink.from_spec",
    "wandb": "goodtrace.sinks.wandb:WandbSink.from_spec",
    "mlflow": "goodtrace.sinks.mlflow:MlflowSink.from_spec",
    "prometheus": "goodtrace.sinks.prometheus:PrometheusSink.from_spec",
}
ENTRY_POINT_GROUP = "goodtrace.sinks"

RANK_ZERO = "zero"  # only global rank 0 (TensorBoard, W&B, MLflow by default)
ALL_RANKS = "all"  # every rank
FIRST_ON_HOST = "host"  # local rank 0 of every host (one Prometheus endpoint per host)
RANK_CHOICES = (RANK_ZERO, ALL_RANKS, FIRST_ON_HOST)

# session -> whether the attempt completed (finish's ending), set before the sinks close
ENDINGS: dict[str, bool | None] = {}


class SinkError(ConfigError):
    """A sink name or specification is invalid; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class SinkRun:
    """What a sink is told about the job when it opens."""

    run_dir: str
    session: str
    rank: int
    world_size: int
    local_rank: int
    host: str
    restart: int | None


@runtime_checkable
class Sink(Protocol):
    """What ``gt.init(sinks=[...])`` accepts. Every method runs on the sink's own thread.

    ``ranks`` says where the sink runs: ``"zero"`` (rank 0), ``"all"``, or ``"host"``
    (local rank 0 of each host). ``open`` is called once, ``write`` once per live line,
    ``close`` once at the end: ``finished`` is True when the rank's files are complete
    (``finish()`` or interpreter exit). The built-in sinks' summary comes from the figures the
    job holds (``goodtrace.sinks._held``): they never read the run back inside the job.
    A sink that buffers may also have ``flush()``: it is called on the recorder's heartbeat
    cadence (every ``flush_interval_s``) when lines came since the last one, so a killed rank's
    backend files end where goodtrace's own do.
    """

    name: str
    ranks: str

    def open(self, run: SinkRun) -> None: ...

    def write(self, line: LiveLine) -> None: ...

    def close(self, finished: bool) -> None: ...


def parse_specs(text: str) -> list[str]:
    """``"tensorboard:runs/tb, prometheus"`` -> ``["tensorboard:runs/tb", "prometheus"]``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def resolve(spec: str | Sink) -> Sink:
    """A sink object from ``name`` or ``name:argument`` (objects are returned as they are)."""
    if not isinstance(spec, str):
        if not isinstance(spec, Sink):
            raise SinkError(
                f"a sink must be a name such as 'tensorboard:DIR' or an object with name, ranks, open(), "
                f"write() and close(); got {spec!r}"
            )
        if spec.ranks not in RANK_CHOICES:
            raise SinkError(f"sink {spec.name!r}: ranks must be one of {RANK_CHOICES}, got {spec.ranks!r}")
        return spec
    name, _, argument = spec.partition(":")
    name = name.strip().lower()
    target = BUILTIN_SINKS.get(name)
    if target is None:
        target = _entry_point(name)
    if target is None:
        known = sorted(set(BUILTIN_SINKS) | _entry_point_names())
        raise SinkError(f"unknown sink {name!r} in {spec!r}; known sinks: {', '.join(known)}")
    module_name, _, attribute = target.partition(":")
    try:
        factory: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SinkError(f"sink {name!r} cannot be loaded: {exc}") from None
    for part in attribute.split("."):
        factory = getattr(factory, part)
    sink = factory(argument.strip() or None)
    return resolve(sink)


def _entry_point(name: str) -> str | None:
    for entry in _entry_points():
        if entry.name == name:
            return str(entry.value)
    return None


def _entry_point_names() -> set[str]:
    return {entry.name for entry in _entry_points()}


def _entry_points() -> Sequence[Any]:
    try:
        from importlib.metadata import entry_points

        return list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception:
        return []


class _Worker:
    """One sink on its own daemon thread, fed through a bounded queue."""

    _STOP = object()

    def __init__(
        self, sink: Sink, run: SinkRun, max_queued: int, warn: Callable[[str, str], None], flush_interval_s: float
    ) -> None:
        self.sink = sink
        self.flush_interval_s = flush_interval_s
        self.run = run
        self.dropped = False
        self.opened = False  # open() returned: the sink takes lines from here on
        self.settled = threading.Event()  # opened, or failed to
        self._warn = warn
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queued)
        self._thread = Thread(target=self._loop, name=f"goodtrace-sink-{sink.name}", daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        if self.dropped:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(f"it is too slow ({self._queue.maxsize} live lines waiting)")

    def close(self, finished: bool) -> None:
        if self.dropped:
            return
        try:
            self._queue.put_nowait(("close", finished))
        except queue.Full:
            self._drop(f"it is too slow ({self._queue.maxsize} live lines waiting at finish)")

    def join(self, deadline: float) -> None:
        if self.dropped:
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._drop("it did not close in time")

    def _drop(self, why: str) -> None:
        if not self.dropped:
            self.dropped = True
            self._warn(f"sink:{self.sink.name}", f"sink {self.sink.name!r} dropped: {why}")

    def _loop(self) -> None:
        try:
            self.sink.open(self.run)
        except Exception as exc:
            self._drop(f"it failed to open: {exc!r}"[:500])
            self.settled.set()
            return
        self.opened = True
        self.settled.set()
        flush = getattr(self.sink, "flush", None)
        unflushed = False
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_flush - time.monotonic()) if unflushed else None)
            except queue.Empty:
                item = None
            if unflushed and callable(flush) and time.monotonic() >= next_flush and not self.dropped:
                unflushed = False  # on the heartbeat cadence, as goodtrace's own files
                try:
                    flush()
                except Exception as exc:
                    self._warn(f"flush:{self.sink.name}", f"sink {self.sink.name!r} could not flush: {exc!r}"[:500])
            if item is None:
                continue
            if isinstance(item, LiveLine) and not unflushed:
                unflushed = True
                next_flush = time.monotonic() + self.flush_interval_s
            if self.dropped:  # dropped for falling behind: stop writing, release the backend
                try:
                    self.sink.close(False)
                except Exception:
                    pass
                return
            try:
                if isinstance(item, LiveLine):
                    self.sink.write(item)
                    continue
                self.sink.close(bool(item[1]))
                return
            except Exception as exc:
                self._drop(f"it failed: {exc!r}"[:500])
                try:
                    self.sink.close(False)
                except Exception:
                    pass
                return


class SinkHub:
    """The sinks of one recorder: hands each live line to every sink that runs on this rank.

    ``on_line`` is what the live aggregator calls (training thread): a ``put_nowait`` per sink.
    ``close`` (after the rank's files are closed) closes every sink and waits for them for at
    most ``close_timeout_s``.
    """

    def __init__(
        self, sinks: Sequence[Sink], run: SinkRun, *, max_queued: int = 1000, close_timeout_s: float = 60.0,
        flush_interval_s: float = 1.0,
    ) -> None:
        self.run = run
        self.close_timeout_s = close_timeout_s
        self._warned: set[str] = set()
        self._closed = False
        self.workers = [
            _Worker(sink, run, max_queued, self._warn, flush_interval_s) for sink in sinks
            if _runs_here(sink.ranks, run)
        ]

    @property
    def active(self) -> list[Sink]:
        """The sinks running on this rank that have not been dropped."""
        return [w.sink for w in self.workers if not w.dropped]

    def wait_open(self, timeout_s: float) -> None:
        """Wait (at init, before the loop) until every sink opened or failed, for at most
        ``timeout_s``: a backend that sets itself up while the loop runs (MLflow creating its
        tables, W&B starting its service) competes with the loop for the GIL and slows its steps
        for longer than it would have delayed the start. A sink still opening then goes on in
        the background, with a warning."""
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            if not worker.settled.wait(max(0.0, deadline - time.monotonic())):
                self._warn(f"opening:{worker.sink.name}", f"sink {worker.sink.name!r} still opening after "
                           f"{timeout_s:g} s; training starts, it takes live lines once open")

    def on_line(self, line: LiveLine) -> None:
        for worker in self.workers:
            worker.put(line)

    def close(self, finished: bool) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self.workers:
            worker.close(finished)
        deadline = time.monotonic() + self.close_timeout_s
        for worker in self.workers:
            worker.join(deadline)

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message)  # never raises, whatever the warnings filter (a sink thread must not die of it)


def _runs_here(ranks: str, run: SinkRun) -> bool:
    if ranks == ALL_RANKS:
        return True
    if ranks == FIRST_ON_HOST:
        return run.local_rank == 0
    return run.rank == 0


def attach_sinks(
    recorder: Any, sinks: Sequence[Sink], *, log_every: int = 10, open_timeout_s: float | None = None
) -> SinkHub | None:
    """Start the sinks that run on this rank and hook them to the recorder's live lines.

    Waits up to ``open_timeout_s`` (default: the recorder's ``finish_timeout_s``) for the sinks
    to open (see :meth:`SinkHub.wait_open`), and at the end up to ``finish_timeout_s`` for them
    to close.
    Live lines come from the live aggregator that ``instrument()`` (torch, JAX) attaches; when
    the program calls none, a rank-local one (this rank's own numbers, every ``log_every``
    steps, printing nothing) is started when the first step begins. The sinks close after the
    recorder's files do (``finish()`` or interpreter exit), so their summary includes the last line.
    """
    identity = recorder.identity
    run = SinkRun(
        run_dir=str(recorder.run_dir), session=str(recorder.session), rank=int(identity.rank),
        world_size=int(identity.world_size), local_rank=int(identity.local_rank), host=str(identity.host),
        restart=identity.restart,
    )
    timeout_s = float(recorder.config.finish_timeout_s)
    hub = SinkHub(sinks, run, flush_interval_s=float(recorder.config.flush_interval_s), close_timeout_s=timeout_s)
    if not hub.workers:
        return None
    recorder.sink_hub = hub
    recorder.line_listeners.append(hub.on_line)
    hub.wait_open(timeout_s if open_timeout_s is None else open_timeout_s)

    started = False

    def stand_in(number: int, t0: int) -> None:
        nonlocal started
        if started:
            return
        started = True
        if recorder.live_aggregator is None:
            from goodtrace.record.live.aggregator import LiveAggregator
            from goodtrace.record.live.transport import LocalTransport

            aggregator = LiveAggregator(recorder, LocalTransport(), log_every=log_every, printer=_silent)
            aggregator.replaceable = True
            recorder.finish_listeners.append(lambda completed, reason: aggregator.close())

    def after_finish(completed: bool | None, reason: str) -> None:
        ENDINGS[run.session] = completed  # how the attempt ended, for the sinks' attempt figures
        hub.close(finished=reason != "signal")  # preempted: close at once, no summary

    recorder.step_begin_listeners.append(stand_in)
    recorder.after_finish_listeners.append(after_finish)
    return hub


def _silent(text: str) -> None:
    return None
