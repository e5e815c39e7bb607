"""JAX integration: compile spans from JAX's own listeners, clock offsets and live metric
reduction across ``jax.distributed`` processes.

Versions: jax 0.4.30 or newer (the oldest tested; the APIs used go back to 0.4.26). On CPU,
dispatch is asynchronous from 0.4.32 (before it steps complete as they return, which goodtrace
times right too) and processes gather across each other from 0.5.1 (CPU collectives); without
them the live line is off, with one warning.

Contract:

- :func:`install` (idempotent; also run by ``gt.init`` when JAX was imported first, and by
  :func:`instrument`) registers
  listeners with ``jax.monitoring`` so that every compile phase becomes a ``compile`` span
  (:mod:`goodtrace.record.values.jax_compile`, re-exported here).
- :func:`instrument` gives the recorder JAX's device barrier
  (:func:`goodtrace.record.values.jax_values.device_barrier`): a blocking span (checkpoint, eval) that
  starts in a step before its ``complete_on`` first waits for what JAX dispatched, so the span
  never holds the wait for the step, from the first step on.
- :func:`measure_clock_offset` (collective) measures this process's monotonic-clock offset to
  process 0 by ping-pong (``goodtrace.record.clocksync``) through the ``jax.distributed`` key-value
  store, between two global barriers (``reference = local + offset_ns``, error <= rtt/2): it
  blocks its caller. :func:`instrument`'s own rounds (at start-up and every ``clock_sync_every``
  steps) run on a background thread instead (:class:`goodtrace.record.clocksync.BackgroundClockSync`,
  as with PyTorch): the step-end hook only asks for a round, each process pings process 0
  through the store on that thread, and process 0 serves every process at once.
- :class:`JaxTransport` carries ``goodtrace.record.live.aggregator`` log intervals: one all-gather per log step, built
  from ``jax.experimental.multihost_utils``, dispatched asynchronously, read when done.

:func:`instrument` sets all of this up for the active recorder. Importing this module imports
jax; ``import goodtrace`` never does.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

import goodtrace
from goodtrace.integrations._common import Disabled, Integration, announce_model, check_cadence
from goodtrace.integrations._common import warn as _warn
from goodtrace.record.clocksync import BackgroundClockSync, OffsetSample, measure_offset, ping_reference
from goodtrace.record.recorder import Recorder
from goodtrace.record.threads import block_program_signals
from goodtrace.record.values.jax_compile import (
    COMPILE_EVENTS,
    CompileStats,
    compile_stats,
    install,
    is_installed,
    uninstall,
)
from goodtrace.record.values.jax_values import JaxTree, device_barrier

__all__ = [
    "COMPILE_EVENTS",
    "ClockOffset",
    "CompileStats",
    "JaxIntegration",
    "JaxTransport",
    "JaxTree",
    "compile_stats",
    "install",
    "instrument",
    "is_installed",
    "measure_clock_offset",
    "uninstall",
]

# ------------------------------------------------------------------------------ processes


def _client() -> Any:
    """The ``jax.distributed`` coordination client, or None when not initialised."""
    from jax._src import distributed

    return getattr(distributed.global_state, "client", None)


@dataclasses.dataclass(frozen=True)
class ClockOffset:
    """``reference_clock = local_clock + offset_ns`` (monotonic ns), to within ``rtt_ns / 2``."""

    offset_ns: int
    rtt_ns: int
    rank: int
    world_size: int
    reference_rank: int = 0

    @property
    def error_bound_ns(self) -> int:
        return self.rtt_ns // 2


_clock_rounds = itertools.count()


def measure_clock_offset(
    *,
    rounds: int = 16,
    reference_rank: int = 0,
    timeout_s: float = 60.0,
    record: bool = True,
    clock: Callable[[], int] | None = None,
) -> ClockOffset:
    """Collective (every process calls it, in the same order): this process's clock offset to
    ``reference_rank``, measured between two global barriers by ``rounds`` ping-pongs through
    the ``jax.distributed`` key-value store, keeping the one with the shortest round trip.

    Single-process (or jax.distributed not initialised): offset 0, round trip 0. With
    ``record`` the result is written as a ``clock`` record of the active recorder. The clock
    is the recorder's (``time.perf_counter_ns`` when not recording).
    """
    rank, world = jax.process_index(), jax.process_count()
    rec = goodtrace.recorder()
    if clock is None:
        clock = rec.clock if isinstance(rec, Recorder) else time.perf_counter_ns
    client = _client()
    if world == 1 or client is None:
        sample = OffsetSample(0, 0)
    else:
        timeout_ms = max(1, int(timeout_s * 1000))
        prefix = f"goodtrace/clock/{next(_clock_rounds)}"
        sent: dict[int, int] = {}
        received: dict[int, int] = {}

        def send(peer: int, values: Sequence[int]) -> None:
            number = sent[peer] = sent.get(peer, -1) + 1
            client.key_value_set(f"{prefix}/{rank}-{peer}/{number}", ",".join(str(int(v)) for v in values))

        def recv(peer: int) -> Sequence[int]:
            number = received[peer] = received.get(peer, -1) + 1
            raw = client.blocking_key_value_get(f"{prefix}/{peer}-{rank}/{number}", timeout_ms)
            return [int(part) for part in str(raw).split(",")]

        client.wait_at_barrier(f"{prefix}/begin", timeout_ms)
        sample = measure_offset(
            rank=rank, world_size=world, clock=clock, send=send, recv=recv,
            rounds=rounds, reference_rank=reference_rank,
        )
        client.wait_at_barrier(f"{prefix}/end", timeout_ms)
        if rank == reference_rank:
            try:
                client.key_value_delete(f"{prefix}/")
            except Exception:
                pass
    result = ClockOffset(sample.offset_ns, sample.rtt_ns, rank, world, reference_rank)
    if record and isinstance(rec, Recorder):
        rec.record_clock_offset(result.offset_ns, result.rtt_ns, reference_rank)
    return result


class _KeyValueRounds:
    """The integration's clock rounds through the ``jax.distributed`` key-value store, on
    :class:`BackgroundClockSync`'s thread: each process pings the reference ``rounds`` times;
    the reference answers every process at once, one thread per process it serves (at most
    ``SERVERS`` together), instead of one process after another. Keys are per round, process
    and ping; each key has one reader, which deletes it once its round is done (the reference
    may start its next round while a peer still reads its last answer)."""

    SERVERS = 64

    def __init__(self, client: Any, rank: int, world: int, clock: Callable[[], int], rounds: int,
                 timeout_s: float) -> None:
        self.client, self.rank, self.world, self.clock, self.rounds = client, rank, world, clock, rounds
        self.timeout_ms = max(1, int(timeout_s * 1000))
        self._number = itertools.count()

    def _key(self, round_number: int, sender: int, receiver: int, ping: int) -> str:
        return f"goodtrace/clockbg/{round_number}/{sender}-{receiver}/{ping}"

    def _values(self, key: str) -> list[int]:
        return [int(part) for part in str(self.client.blocking_key_value_get(key, self.timeout_ms)).split(",")]

    def _set(self, key: str, values: Sequence[int]) -> None:
        self.client.key_value_set(key, ",".join(str(int(v)) for v in values))

    def _delete_read(self, round_number: int, sender: int, receiver: int) -> None:
        """Drop the keys ``receiver`` read from ``sender`` in a round (kept, harmlessly, if the
        store refuses)."""
        try:
            self.client.key_value_delete(f"goodtrace/clockbg/{round_number}/{sender}-{receiver}/")
        except Exception:
            pass

    def measure(self) -> OffsetSample:
        number = next(self._number)
        if self.rank != 0:
            pings = itertools.count()
            answers = itertools.count()
            sample = ping_reference(
                reference_rank=0, clock=self.clock, rounds=self.rounds,
                send=lambda peer, values: self._set(self._key(number, self.rank, 0, next(pings)), values),
                recv=lambda peer: self._values(self._key(number, 0, self.rank, next(answers))))
            self._delete_read(number, 0, self.rank)
            return sample

        def serve(peer: int) -> None:
            for ping in range(self.rounds):
                self._values(self._key(number, peer, 0, ping))
                t1 = self.clock()
                self._set(self._key(number, 0, peer, ping), (t1, self.clock()))
            self._delete_read(number, peer, 0)

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(self.SERVERS, self.world - 1)),
                                thread_name_prefix="goodtrace-clock-serve", initializer=block_program_signals) as pool:
            for done in [pool.submit(serve, peer) for peer in range(1, self.world)]:
                done.result()  # a peer that never pings fails the round (its timeout), as before
        return OffsetSample(0, 0)


# ------------------------------------------------------------------------------ live metrics


def _replicate_rows(rows: Any) -> Any:
    return rows


class _JaxGather:
    """An all-gather in flight: ``done()`` probes the replicated result without waiting."""

    def __init__(self, out: Any, width: int) -> None:
        self._out = out
        self._width = width

    def done(self) -> bool:
        return bool(self._out.is_ready())

    def wait(self) -> list[list[float]]:
        rows = np.asarray(self._out.addressable_data(0)).view(np.float64)
        return [[float(x) for x in row[: self._width]] for row in rows]


class JaxTransport:
    """The ``goodtrace.record.live.aggregator`` transport over ``jax.distributed``: one row per process.

    Each vector travels as the raw bits of its float64 values (uint32 pairs, exact even with
    ``jax_enable_x64`` off), padded to ``capacity`` values (the next power of two beyond it)
    so that one compiled gather serves every log step. The rows become one global array
    (``multihost_utils.host_local_array_to_global_array``), replicated by a jitted identity
    that JAX dispatches without waiting; ``wait()`` reads it, as ``process_allgather`` does.
    Construction compiles the gather (collective: every process constructs one).
    """

    def __init__(self, capacity: int = 1024) -> None:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.rank = jax.process_index()
        self.world_size = jax.process_count()
        self.capacity = max(1, capacity)
        devices = np.array(jax.devices()).reshape(self.world_size, jax.local_device_count())
        self._mesh = Mesh(devices, ("processes", "local_devices"))
        self._rows_spec = PartitionSpec("processes")  # type: ignore[no-untyped-call]
        replicated = NamedSharding(self._mesh, PartitionSpec())  # type: ignore[no-untyped-call]
        self._replicate = jax.jit(_replicate_rows, out_shardings=replicated)
        self.all_gather([0.0]).wait()

    def all_gather(self, vector: list[float]) -> _JaxGather:
        from jax.experimental import multihost_utils

        width = self.capacity
        while width < len(vector):
            width *= 2
        padded = np.zeros(width, dtype=np.float64)
        padded[: len(vector)] = vector
        bits = padded.view(np.uint32)[None, :]
        rows = multihost_utils.host_local_array_to_global_array(bits, self._mesh, self._rows_spec)
        return _JaxGather(self._replicate(rows), len(vector))


# ------------------------------------------------------------------------------ together


class JaxIntegration(Integration):
    """What :func:`instrument` hooked into the recorder; ``finish()`` closes it (collectively)."""

    def __init__(
        self,
        recorder: Recorder,
        *,
        log_every: int,
        live: bool,
        tokens_per_step: float | None,
        flops_per_step: float | None,
        peak_flops: float | None,
        clock_sync_every: int,
        clock_sync_rounds: int,
        printer: Callable[[str], None] | None,
    ) -> None:
        from goodtrace.record.live.aggregator import LiveAggregator
        from goodtrace.record.live.transport import LocalTransport, Transport

        super().__init__(recorder)
        self.clock_sync_every = clock_sync_every
        self.clock_sync_rounds = clock_sync_rounds
        self.clock_offsets: list[ClockOffset] = []
        self.aggregator: LiveAggregator | None = None
        self.distributed = jax.process_count() > 1 and _client() is not None
        announce_model(recorder, tokens_per_step, flops_per_step, peak_flops)
        self._clock_sync: BackgroundClockSync | None = None
        if self.distributed:
            rounds = _KeyValueRounds(_client(), jax.process_index(), jax.process_count(), recorder.clock,
                                     clock_sync_rounds, timeout_s=60.0)
            self._clock_sync = BackgroundClockSync(rounds.measure, self._clock_result, self._clock_failed,
                                                   clock=recorder.clock)
            self._clock_sync.request()  # at start-up
        transport: Transport = LocalTransport()
        if live and self.distributed:
            try:
                transport = JaxTransport()  # compiles its gather now, not inside a step
            except Exception as exc:  # e.g. CPU processes without CPU collectives (jax < 0.5.1)
                live = False
                _warn(f"the live line is off: JAX cannot gather across processes here ({exc!r}); on CPU "
                      "it needs CPU collectives (the default from jax 0.5.1; before it, "
                      "jax.config.update('jax_cpu_collectives_implementation', 'gloo') before "
                      "jax.distributed.initialize)")
        if live:
            self.aggregator = LiveAggregator(
                recorder, transport, log_every=log_every, tokens_per_step=tokens_per_step,
                flops_per_step=flops_per_step, peak_flops=peak_flops, devices=jax.local_device_count(),
                printer=printer,
            )
        self._listen(recorder.finish_listeners, self._on_finish)
        self._listen(recorder.step_listeners, self._on_step_end, first=True)
        if recorder.device_barrier is None:
            recorder.device_barrier = device_barrier

    def _before_close(self) -> None:
        """Let requested clock rounds finish (bounded), so their records are in the files."""
        if self._clock_sync is not None:
            self._clock_sync.close(timeout=30.0)

    def _after_unhook(self) -> None:
        if self.recorder.device_barrier is device_barrier:
            self.recorder.device_barrier = None
        if self._clock_sync is not None:  # any ending: stop asking, never wait for a round here
            self._clock_sync.close(timeout=0.0)

    def _on_step_end(self, number: int, t0: int, t1: int) -> None:
        if (self._clock_sync is not None and self.clock_sync_every and number % self.clock_sync_every == 0
                and number and sys.exc_info()[0] is None):  # a step that raised: perhaps a crash, no round
            self._clock_sync.request()  # the whole cost here: the round runs on its own thread

    def _clock_result(self, sample: OffsetSample, t0: int, t1: int) -> None:
        offset = ClockOffset(sample.offset_ns, sample.rtt_ns, jax.process_index(), jax.process_count(), 0)
        self.clock_offsets.append(offset)
        self.recorder.record_clock_offset(offset.offset_ns, offset.rtt_ns, 0)

    def _clock_failed(self, exc: BaseException) -> None:
        _warn(f"clock alignment failed ({exc!r}); later alignment falls back to wall-clock anchors")


class _Disabled(Disabled):
    """What :func:`instrument` returns when goodtrace is not recording."""

    clock_offsets: list[ClockOffset] = []


def instrument(
    *,
    log_every: int = 10,
    live: bool = True,
    tokens_per_step: float | None = None,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    clock_sync_every: int = 1000,
    clock_sync_rounds: int = 16,
    printer: Callable[[str], None] | None = None,
) -> JaxIntegration | _Disabled:
    """Hook JAX into the active recorder (after ``goodtrace.init``; collective: every process).

    Installs the compile listeners; with ``jax.distributed`` initialised, measures the clock
    offset to process 0 now and every ``clock_sync_every`` steps (0: only now); with ``live``,
    reduces metrics across processes every ``log_every`` steps (``goodtrace.record.live.aggregator``; process 0
    prints one line per log step through ``printer``, default stdout). ``peak_flops`` is the
    peak FLOP/s of one device (the live MFU counts every device of this process). Rank and world size
    were already taken from ``jax.distributed`` by ``init``. ``finish()`` closes it.
    """
    import goodtrace

    check_cadence(log_every, clock_sync_every, clock_sync_rounds)
    install()
    rec = goodtrace.recorder()
    if not isinstance(rec, Recorder):
        return _Disabled()
    return JaxIntegration(
        rec, log_every=log_every, live=live, tokens_per_step=tokens_per_step, flops_per_step=flops_per_step,
        peak_flops=peak_flops, clock_sync_every=clock_sync_every, clock_sync_rounds=clock_sync_rounds,
        printer=printer,
    )


