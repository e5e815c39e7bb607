"""PyTorch integration: device step timing, compile spans, memory, FLOPs, live aggregation, clocks.

``instrument()`` (after ``goodtrace.init``, on every rank) hooks the active recorder:

* **Device barrier**: with CUDA in use, a blocking span (checkpoint, eval) that starts in a
  step before its ``complete_on`` first waits for the current stream
  (:func:`goodtrace.record.values.torch_values.cuda_barrier`), so the span never holds the wait for
  the step, from the first step on.
* **CUDA step events**: an event on the current stream when each step begins and ends. Once
  they have completed (``query()``, never a synchronisation) the step's device time
  (``device/busy_s``: begin→end event) and the device-idle gap before it (``device/idle_s``:
  previous end→begin, i.e. time the stream had nothing queued) are recorded as metrics of that
  step. Absent without CUDA, never faked.
* **torch.compile**: dynamo's compile start/end callbacks become ``compile`` spans.
* **Memory** every ``log_every`` steps: host RSS, and on CUDA the peak allocated/reserved
  bytes of the log interval (metrics ``memory/*``, reduced with ``max``), from the allocator's
  counters without resetting them (:mod:`goodtrace.integrations.torch_memory`): the program's
  own ``max_memory_allocated()`` is untouched.
* **FLOPs**: given (``flops_per_step``) or measured once with :func:`measure_flops`; with
  ``tokens_per_step`` and the device peak they give tokens/s, TFLOP/s and MFU in the live line,
  and are recorded once as the ``model`` event for offline analysis.
* **Live aggregation** (``goodtrace.record.live.aggregator``) over a dedicated gloo group created here, and
  **clock alignment** (``goodtrace.record.clocksync``) at start-up and every ``clock_sync_every`` steps:
  one rank per host measures (ranks of a host share its monotonic clock), hosts in parallel, on
  a background thread over a dedicated gloo group; the training thread only asks for a round.

``instrument`` is collective when ``torch.distributed`` is initialised: all ranks call it.

Versions: torch 2.1 or newer (``torch.utils.flop_counter``). Compile spans need dynamo's
compile callbacks (torch 2.3; before it they are off, with one warning), whose arguments
changed in 2.8 (none before, a ``CallbackArgs`` since: both are accepted). Clock alignment
addresses peers by group rank (``group_dst``/``group_src``) from torch 2.6 and by global rank
before it.
"""

from __future__ import annotations

import collections
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from goodtrace import schema
from goodtrace.accelerators import peak_flops_for_device
from goodtrace.integrations._common import Disabled, Integration, announce_model, check_cadence
from goodtrace.integrations._common import warn as _warn
from goodtrace.integrations.torch_collectives import GlooTransport, _ClockRounds, sync_clocks
from goodtrace.integrations.torch_memory import CudaPeaks
from goodtrace.record.clocksync import (
    BackgroundClockSync,
    OffsetSample,
)
from goodtrace.record.live.aggregator import LiveAggregator
from goodtrace.record.live.transport import LocalTransport, RootedTransport, Transport
from goodtrace.record.values.torch_values import cuda_barrier

__all__ = [
    "GlooTransport",
    "TorchIntegration",
    "instrument",
    "measure_flops",
    "peak_flops_for",
    "sync_clocks",
]

def peak_flops_for(device_name: str) -> float | None:
    """The dense 16-bit peak of a known accelerator (by its CUDA device name), else None."""
    return peak_flops_for_device(device_name)


def measure_flops(model: torch.nn.Module, *args: Any, backward: bool = True, **kwargs: Any) -> int:
    """FLOPs of one training step of ``model(*args, **kwargs)`` (forward, and backward of the
    output's sum or of the loss it returns), counted once with PyTorch's FLOP counter.

    Pass the plain module, not a DistributedDataParallel wrapper (its backward would run a
    collective). Gradients the call produces are discarded; existing gradients are kept.
    """
    from torch.utils.flop_counter import FlopCounterMode

    saved = [(p, p.grad) for p in model.parameters()]
    for parameter, _ in saved:
        parameter.grad = None  # backward would accumulate into existing gradients in place
    try:
        with FlopCounterMode(display=False) as counter:
            out = model(*args, **kwargs)
            if backward:
                loss = _scalar_of(out)
                if loss is not None and loss.requires_grad:
                    loss.backward()  # type: ignore[no-untyped-call]
        return int(counter.get_total_flops())
    finally:
        for parameter, grad in saved:
            parameter.grad = grad


def _scalar_of(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out if out.numel() == 1 else out.float().sum()
    if isinstance(out, (tuple, list)):
        for item in reversed(out):  # (logits, loss) conventions: prefer a scalar
            if isinstance(item, torch.Tensor) and item.numel() == 1:
                return item
        for item in out:
            if isinstance(item, torch.Tensor):
                return item.float().sum()
    if isinstance(out, dict):
        loss = out.get("loss")
        if isinstance(loss, torch.Tensor):
            return loss
    return None


# ------------------------------------------------------------------------------ integration


class _CudaStepTimer:
    """Events at step boundaries on the current CUDA stream, resolved once they completed."""

    _MAX_OUTSTANDING = 256

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.device = torch.cuda.current_device()
        self._begin: Any = None
        self._begin_step: int | None = None
        self._prev_end: Any = None
        self._outstanding: collections.deque[tuple[int, Any, Any, Any]] = collections.deque()

    def begin(self, number: int) -> None:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        self._begin = event
        self._begin_step = number

    def end(self, number: int) -> None:
        if self._begin is None or self._begin_step != number:
            return
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end.record(torch.cuda.current_stream(self.device))
        self._outstanding.append((number, self._prev_end, self._begin, end))
        self._prev_end = end
        self._begin = None
        if len(self._outstanding) > self._MAX_OUTSTANDING:
            self._outstanding.popleft()
        self.poll(block=False)

    def poll(self, block: bool) -> None:
        while self._outstanding:
            number, prev_end, begin, end = self._outstanding[0]
            if block:
                end.synchronize()
            elif not end.query():
                return
            self._outstanding.popleft()
            busy = begin.elapsed_time(end) / 1e3
            self.recorder.metric(schema.DEVICE_BUSY_METRIC, busy, "mean", number)
            if prev_end is not None:
                self.recorder.metric(schema.DEVICE_IDLE_METRIC, max(0.0, prev_end.elapsed_time(begin) / 1e3), "max", number)


def _cuda_in_use() -> bool:
    """CUDA is available and the program has already initialised it (never initialise it here)."""
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        try:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return int(peak) * (1 if sys.platform == "darwin" else 1024)
        except Exception:
            return None


class TorchIntegration(Integration):
    """The hooks ``instrument()`` installed; ``close()`` (run by ``finish()``) removes them."""

    def __init__(
        self,
        recorder: Any,
        *,
        log_every: int,
        tokens_per_step: float | None,
        flops_per_step: float | None,
        peak_flops: float | None,
        live: bool,
        cuda_events: bool,
        memory: bool,
        compile_spans: bool,
        clock_sync_every: int,
        clock_sync_rounds: int,
        printer: Callable[[str], None] | None,
        group_timeout_s: float,
        device_barrier: bool = True,
    ) -> None:
        super().__init__(recorder)
        self.log_every = log_every
        self.memory = memory
        self.clock_sync_every = clock_sync_every
        self.clock_sync_rounds = clock_sync_rounds
        self.group: Any = None
        self.aggregator: LiveAggregator | None = None
        self.cuda_timer: _CudaStepTimer | None = None
        self.clock_offsets: list[OffsetSample] = []
        self._compile_wanted = compile_spans
        self._compile_hooks: tuple[Any, Any] | None = None
        self._compile_t0: dict[int, int] = {}
        self._cuda_peaks: CudaPeaks | None = None

        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if distributed:
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=group_timeout_s))
        if cuda_events and _cuda_in_use():
            self.cuda_timer = _CudaStepTimer(recorder)
        if device_barrier and _cuda_in_use() and getattr(recorder, "device_barrier", False) is None:
            recorder.device_barrier = cuda_barrier
        if peak_flops is None and _cuda_in_use():
            peak_flops = peak_flops_for(torch.cuda.get_device_name())
        self.peak_flops = peak_flops
        announce_model(recorder, tokens_per_step, flops_per_step, peak_flops)
        self._clock_sync: BackgroundClockSync | None = None
        self._group_timeout_s = group_timeout_s
        if self.group is not None:
            self._start_clock_sync(group_timeout_s)
        if live:
            transport: Transport | RootedTransport = GlooTransport(self.group) if self.group is not None else LocalTransport()
            self.aggregator = LiveAggregator(
                recorder, transport, log_every=log_every, tokens_per_step=tokens_per_step,
                flops_per_step=flops_per_step, peak_flops=peak_flops, printer=printer,
            )
        self._maybe_hook_compile()
        self._listen(recorder.step_begin_listeners, self._on_step_begin)
        self._listen(recorder.step_listeners, self._on_step_end, first=True)
        self._listen(recorder.finish_listeners, self._on_finish)

    # -------------------------------------------------------------- hooks
    def _on_step_begin(self, number: int, t0: int) -> None:
        if self._compile_hooks is None and self._compile_wanted:
            self._maybe_hook_compile()
        if self.cuda_timer is not None:
            try:
                self.cuda_timer.begin(number)
            except Exception as exc:
                self.cuda_timer = None
                _warn(f"CUDA step events disabled: {exc!r}")

    def _on_step_end(self, number: int, t0: int, t1: int) -> None:
        if self.cuda_timer is not None:
            self.cuda_timer.end(number)
        if self.memory and number % self.log_every == 0:
            self._record_memory(number)
        if self._clock_sync is not None and self.clock_sync_every and number % self.clock_sync_every == 0:
            self._clock_sync.request()  # the whole cost here: the round runs on its own thread

    def _record_memory(self, number: int) -> None:
        rss = _rss_bytes()
        if rss is not None:
            self.recorder.metric("memory/rss_bytes", float(rss), "max", number)
        if _cuda_in_use():  # the allocator's counters, read, never reset (integrations/torch_memory.py)
            if self._cuda_peaks is None:
                self._cuda_peaks = CudaPeaks()
            for name, peak in self._cuda_peaks.read().items():
                self.recorder.metric(name, peak, "max", number)

    def _start_clock_sync(self, timeout_s: float) -> None:
        """Collective, once: which rank leads each host, for clock rounds on goodtrace's gloo group."""
        import torch.distributed as dist

        try:
            group = self.group  # the live line's: one gloo group (one mesh of sockets), not two
            shared = self.recorder.clock is time.perf_counter_ns  # the host's CLOCK_MONOTONIC
            rank = dist.get_rank(group)
            key = str(self.recorder.identity.host) if shared else f"{self.recorder.identity.host}#rank{rank}"
            keys: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(keys, key, group=group)
            rounds = _ClockRounds(group, self.recorder.clock, self.clock_sync_rounds, [str(k) for k in keys])
        except Exception as exc:
            _warn(f"clock alignment is off ({exc!r}); alignment falls back to wall-clock anchors")
            return
        self._clock_sync = BackgroundClockSync(rounds.measure, self._clock_result, self._clock_failed,
                                               clock=self.recorder.clock)
        self._clock_sync.request()  # at start-up

    def _clock_result(self, sample: OffsetSample, t0: int, t1: int) -> None:
        self.clock_offsets.append(sample)
        self.recorder.record_clock_offset(sample.offset_ns, sample.rtt_ns, 0)

    def _clock_failed(self, exc: BaseException) -> None:
        _warn(f"clock alignment failed ({exc!r}); later alignment falls back to wall-clock anchors")

    def _maybe_hook_compile(self) -> None:
        if not self._compile_wanted or self._compile_hooks is not None:
            return
        if "torch._dynamo" not in sys.modules:  # importing dynamo costs seconds: wait for the user to
            return
        try:
            from torch._dynamo.callback import callback_handler
        except Exception:  # torch < 2.3: dynamo has no compile callbacks
            self._compile_wanted = False
            _warn(f"compile spans need torch 2.3 or newer (torch._dynamo.callback); torch {torch.__version__} "
                  "has none, so torch.compile time is part of the step time")
            return

        # torch 2.3-2.7 call the callbacks with no argument, 2.8+ with a CallbackArgs: take
        # either, and never raise into torch.compile
        def on_start(*args: Any) -> None:
            try:
                self._compile_t0[threading.get_ident()] = self.recorder.clock()
            except Exception:
                pass

        def on_end(*args: Any) -> None:
            try:
                t0 = self._compile_t0.pop(threading.get_ident(), None)
                if t0 is None:
                    return
                t1 = self.recorder.clock()
                info = args[0] if args else None
                trigger = getattr(getattr(info, "callback_trigger", None), "name", None)
                compile_id = getattr(info, "compile_id", None)
                self.recorder.record_span(
                    "compile", schema.COMPILE, t0, t1,
                    {"compile_id": None if compile_id is None else str(compile_id), "trigger": trigger},
                )
            except Exception:
                pass

        try:
            callback_handler.register_start_callback(on_start)
            callback_handler.register_end_callback(on_end)
        except Exception as exc:
            self._compile_wanted = False
            _warn(f"compile spans are off: dynamo refused the compile callbacks ({exc!r})")
            return
        self._compile_hooks = (on_start, on_end)

    # -------------------------------------------------------------- lifecycle
    def _before_close(self) -> None:
        """Let requested clock rounds finish (bounded); resolve outstanding CUDA events before
        the last interval."""
        if self._clock_sync is not None:
            self._clock_sync.close(timeout=min(30.0, self._group_timeout_s))
        if self.cuda_timer is not None:
            self.recorder.settle(schema.SYNC_FINISH)
            self.cuda_timer.poll(block=True)

    def _after_unhook(self) -> None:
        if getattr(self.recorder, "device_barrier", None) is cuda_barrier:
            self.recorder.device_barrier = None
        if self._clock_sync is not None:  # any ending: stop asking, never wait for a round here
            self._clock_sync.close(timeout=0.0)
        if self._compile_hooks is not None:
            try:
                from torch._dynamo.callback import callback_handler

                callback_handler.remove_start_callback(self._compile_hooks[0])
                callback_handler.remove_end_callback(self._compile_hooks[1])
            except Exception:
                pass
            self._compile_hooks = None



class _Disabled(Disabled):
    """What :func:`instrument` returns when goodtrace is not recording."""

    cuda_timer = None
    clock_offsets: list[OffsetSample] = []


def instrument(
    *,
    log_every: int = 10,
    tokens_per_step: float | None = None,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    live: bool = True,
    cuda_events: bool = True,
    memory: bool = True,
    compile_spans: bool = True,
    clock_sync_every: int = 1000,
    clock_sync_rounds: int = 16,
    printer: Callable[[str], None] | None = None,
    group_timeout_s: float = 120.0,
    device_barrier: bool = True,
) -> TorchIntegration | _Disabled:
    """Hook PyTorch into the active recorder (call after ``goodtrace.init``, on every rank).

    Arguments (all keyword, all optional):

    * ``log_every`` (10): a live line every that many steps, gathered across ranks;
    * ``tokens_per_step`` / ``flops_per_step``: this rank's tokens and model FLOPs per
      optimizer step (see :func:`measure_flops`), for tokens/s, TFLOP/s and MFU;
    * ``peak_flops``: the peak FLOP/s of one device, the device this rank drives (default: a
      table of known accelerators; none on CPU, so no MFU);
    * ``live`` (True): print rank 0's live line; False keeps the aggregation for the sinks only;
    * ``cuda_events`` (True): time each step on the device with CUDA events (device/busy_s,
      device/idle_s);
    * ``memory`` (True): record memory (RSS; CUDA allocated and peak) as metrics;
    * ``compile_spans`` (True): record ``torch.compile``'s compilations as ``compile`` spans;
    * ``clock_sync_every`` (1000) / ``clock_sync_rounds`` (16): re-measure the ranks' clock
      offsets every that many steps (0: only at start-up), with that many round trips;
    * ``printer``: receives rank 0's live lines (default: stdout);
    * ``group_timeout_s`` (120): timeout of the gloo group the live gather and clock
      measurement use;
    * ``device_barrier`` (True): with CUDA in use, a blocking span that starts inside a step
      before its ``complete_on`` first waits for the current stream (so it measures the save
      alone); False never synchronises the device (such a span then holds the step's wait).

    ``finish()`` completes the log intervals and removes the hooks.
    """
    import goodtrace

    check_cadence(log_every, clock_sync_every, clock_sync_rounds)
    for label, value in (("tokens_per_step", tokens_per_step), ("flops_per_step", flops_per_step),
                         ("peak_flops", peak_flops)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
            raise ValueError(f"{label} must be a non-negative number, got {value!r}")
    recorder = goodtrace.recorder()
    if not recorder.enabled:
        return _Disabled()
    return TorchIntegration(
        recorder, log_every=log_every, tokens_per_step=tokens_per_step, flops_per_step=flops_per_step,
        peak_flops=peak_flops, live=live, cuda_events=cuda_events, memory=memory, compile_spans=compile_spans,
        clock_sync_every=clock_sync_every, clock_sync_rounds=clock_sync_rounds, printer=printer,
        group_timeout_s=group_timeout_s, device_barrier=device_barrier,
    )
