"""Adapter for torch tensors; imported only when the program passes one to goodtrace.

A CPU tensor is complete on arrival: its step's sync point is the end of that step ("ready"),
and a scalar's value is read when it is passed (a CPU ``item()`` costs a microsecond and never
waits), so a later in-place update cannot change what was recorded. For a CUDA tensor, ``prepare`` records a CUDA event on the
current stream (no synchronisation); readiness is ``event.query()`` and waiting is
``event.synchronize()``, so observing a step never syncs more than the loop itself does.
"""

from __future__ import annotations

from typing import Any

import torch

from goodtrace.record.value_types import HostNumber, UnsupportedValue


class _CpuTensor(HostNumber):
    """A CPU tensor is computed by the time the op returns: like a host number."""

    def to_float(self, handle: Any) -> float:
        if handle.numel() != 1:
            raise UnsupportedValue(f"a metric must be a scalar tensor, got shape {tuple(handle.shape)}")
        return float(handle.detach().item())


_HOST_FLOAT = HostNumber()  # a CPU scalar already read into a Python float


class _CudaTensor:
    host = False

    def prepare(self, value: Any) -> Any:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(value.device))
        return (event, value)

    def ready(self, handle: Any) -> bool | None:
        return bool(handle[0].query())

    def wait(self, handle: Any) -> None:
        handle[0].synchronize()

    def to_float(self, handle: Any) -> float:
        event, value = handle
        event.synchronize()
        if value.numel() != 1:
            raise UnsupportedValue(f"a metric must be a scalar tensor, got shape {tuple(value.shape)}")
        return float(value.detach().item())


class _AnyTensor:
    """Tensors whose device is only known per value (the adapter cache is per type)."""

    host = False
    _cpu = _CpuTensor()
    _cuda = _CudaTensor()

    def prepare(self, value: Any) -> Any:
        device = value.device.type
        if device == "cuda":
            return (self._cuda, self._cuda.prepare(value))
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


def adapter_for_value(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        raise UnsupportedValue(f"unsupported torch object {type(value).__qualname__}")
    return _AnyTensor()
