"""Adapter for torch tensors; imported only when the program passes one to goodtrace.

A CPU tensor is complete on arrival: its step's sync point is the end of that step ("ready"),
and a scalar's value is read when it is passed (a CPU ``item()`` costs a microsecond and never
waits), so a later in-place update cannot change what was recorded.

A CUDA tensor never makes goodtrace synchronise the device:

- as a step's completion, ``prepare`` records a CUDA event on the tensor's current stream and
  keeps only that event (not the tensor); readiness is ``event.query()``, waiting (at the lag,
  a blocking span or ``finish()``) is ``event.synchronize()``, which waits for that event alone,
  never for work queued after it;
- as a metric, ``prepare_read`` starts a non-blocking copy into pinned host memory and records
  an event after it; the number is read from host memory once that event has completed (never
  ``.item()`` on the device tensor, which would wait for the whole stream).

The device barrier (before a blocking span in a step with no completion value yet) waits for
an event recorded on the current stream: everything queued there so far, and nothing that
another stream or a later call queues.

An MPS tensor's completion is an MPS event (``torch.mps.Event``, recorded after the work
queued so far; ``query()`` without waiting), as on CUDA. Other devices (XLA, whose tensors
have no readiness test that does not wait, and MPS in a torch without MPS events) cannot be
dated: ``prepare`` returns :class:`HostTimed`, the step is host-timed and the recorder warns
once. A metric on them is read with ``item()`` when goodtrace reads it (at the lag).
"""

from __future__ import annotations

from typing import Any

import torch

from goodtrace.record.values.protocol import COMPLETE, HostNumber, HostTimed, UnsupportedValue


def cuda_barrier(device: Any = None) -> None:
    """Wait for the work queued so far on ``device``'s current CUDA stream (an event on the
    stream, then waiting for that event; ``torch.cuda.synchronize`` would wait for every
    stream and counts as a synchronising call under ``torch.cuda.set_sync_debug_mode``)."""
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    event.synchronize()


class _CpuTensor(HostNumber):
    """A CPU tensor is computed by the time the op returns: like a host number."""

    def to_float(self, handle: Any) -> float:
        if handle.numel() != 1:
            raise UnsupportedValue(f"a metric must be a scalar tensor, got shape {tuple(handle.shape)}")
        return float(handle.detach().item())


_HOST_FLOAT = HostNumber()  # a CPU scalar already read into a Python float


class _CudaCompletion:
    """A step's completion on CUDA: the handle is one event, recorded after the value's work."""

    host = False

    def ready(self, handle: Any) -> bool | None:
        return bool(handle.query())

    def wait(self, handle: Any) -> None:
        handle.synchronize()

    def to_float(self, handle: Any) -> float:
        raise UnsupportedValue("a completion handle holds no value")

    def barrier(self, handle: Any) -> bool:
        cuda_barrier(handle.device)
        return True


class _CudaRead:
    """A metric on CUDA: ``(host copy, event after the copy)``; read once the event is done."""

    host = False

    def ready(self, handle: Any) -> bool | None:
        return bool(handle[1].query())

    def wait(self, handle: Any) -> None:
        handle[1].synchronize()

    def to_float(self, handle: Any) -> float:
        host, event = handle
        if not event.query():
            event.synchronize()  # only reached when goodtrace chose to wait (finish, or the lag)
        return float(host.item())  # host memory: no device call

    def barrier(self, handle: Any) -> bool:
        cuda_barrier(handle[1].device)
        return True


def mps_event() -> Any:
    """An MPS event recorded now (after the work queued so far), or None where this torch has
    no MPS events or no MPS backend."""
    event_type = getattr(getattr(torch, "mps", None), "Event", None)
    if event_type is None or not torch.backends.mps.is_available():
        return None
    event = event_type()
    event.record()
    return event


class _MpsCompletion(_CudaCompletion):
    """A step's completion on MPS: the handle is one MPS event, recorded after the value's work
    (an event's query and synchronize, as on CUDA; only the barrier differs)."""

    def barrier(self, handle: Any) -> bool:
        torch.mps.synchronize()  # MPS queues everything on one command queue
        return True


class _AnyTensor:
    """Tensors whose device is only known per value (the adapter cache is per type)."""

    host = False
    _cpu = _CpuTensor()
    _cuda = _CudaCompletion()
    _cuda_read = _CudaRead()
    _mps = _MpsCompletion()

    def prepare(self, value: Any) -> Any:
        device = value.device.type
        if device == "cuda":
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(value.device))
            return (self._cuda, event)
        if device == "cpu":
            return COMPLETE
        if device == "mps":
            event = mps_event()
            if event is not None:
                return (self._mps, event)
            return HostTimed("torch mps tensors (no MPS events here)")
        return HostTimed(f"torch {device} tensors")  # XLA: no readiness test that does not wait

    def prepare_read(self, value: Any) -> Any:
        device = value.device.type
        if device == "cuda":
            if value.numel() != 1:  # metadata only: no device access
                raise UnsupportedValue(f"a metric must be a scalar tensor, got shape {tuple(value.shape)}")
            # non_blocking to the CPU allocates the destination in pinned memory, so the copy is
            # asynchronous; the event after it says when the host copy holds the number.
            host = value.detach().to("cpu", non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(value.device))
            return (self._cuda_read, (host, event))
        if device == "cpu" and value.numel() == 1:
            return (_HOST_FLOAT, float(value.detach().item()))
        return (self._cpu, value)

    def ready(self, handle: Any) -> bool | None:
        adapter, inner = handle
        return adapter.ready(inner)  # type: ignore[no-any-return]

    def wait(self, handle: Any) -> None:
        adapter, inner = handle
        adapter.wait(inner)

    def to_float(self, handle: Any) -> float:
        adapter, inner = handle
        return adapter.to_float(inner)  # type: ignore[no-any-return]

    def barrier(self, handle: Any) -> bool:
        adapter, inner = handle
        return adapter.barrier(inner)  # type: ignore[no-any-return]


def adapter_for_value(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        raise UnsupportedValue(f"unsupported torch object {type(value).__qualname__}")
    return _AnyTensor()
