"""Torch tensors of devices other than CPU and CUDA as completion values: an MPS tensor is
dated by an MPS event; a tensor whose completion goodtrace cannot test without waiting (XLA,
meta) gives its step no sync point, so the step is host-timed, with one warning.

Only CPU torch is installed here. The device tensors are real torch tensors all the same:
``meta`` tensors are built in, and XLA/MPS ones are torch's wrapper subclasses
(``Tensor._make_wrapper_subclass``) that report that device and hold no data; goodtrace
decides by ``tensor.device.type`` and never touches their data. Their class says it lives in
``torch`` because a real XLA/MPS tensor's type is ``torch.Tensor``, which is how goodtrace picks
its torch adapter. MPS events cannot be made without an MPS backend, so the one substitution is
goodtrace's own ``mps_event`` returning a small event object with the MPS event's
``query``/``synchronize``, completed by the test."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import goodtrace as gt  # noqa: E402
from goodtrace import schema  # noqa: E402
from goodtrace.analysis import analyze  # noqa: E402
from goodtrace.read.load import load_run  # noqa: E402
from goodtrace.record.values import torch_values  # noqa: E402
from goodtrace.testing import capture  # noqa: E402


class DeviceTensor(torch.Tensor):  # type: ignore[misc]
    """A tensor on ``device`` with no data: any operation on it fails (goodtrace must not run one)."""

    __module__ = "torch"  # as torch.Tensor's (see the module docstring)

    @staticmethod
    def __new__(cls, device: str) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, (1,), device=device)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise AssertionError(f"goodtrace ran {func} on a device tensor")


def _loop(values: list[Any]) -> None:
    for k, value in enumerate(values):
        with gt.step(k) as s:
            s.complete_on(value)


@pytest.mark.parametrize("device", ["xla", "meta", "mps"])
def test_a_tensor_without_a_readiness_test_makes_its_steps_host_timed(tmp_path: Path, device: str) -> None:
    def tensor() -> Any:
        return torch.empty(1, device="meta") if device == "meta" else DeviceTensor(device)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(tmp_path, rank=0, world_size=1) as cap:
            _loop([tensor() for _ in range(4)])
    assert cap.records(schema.SYNC) == []  # no step dated from a value that was never tested
    said = [str(w.message) for w in caught if f"torch {device} tensors" in str(w.message)]
    assert len(said) == 1 and "host-timed" in said[0]
    analysis = analyze(load_run(tmp_path))
    assert len(analysis.steps) == 4 and all(row.host_timed for row in analysis.steps)
    assert any("host-timed" in w for w in analysis.warnings)


def test_a_cpu_tensor_is_complete_on_arrival() -> None:
    with capture(rank=0, world_size=1) as cap:
        _loop([torch.ones(1) for _ in range(3)])
    assert [(r["step"], r["how"]) for r in cap.records(schema.SYNC)] == [(k, schema.SYNC_READY) for k in range(3)]


class StandInMpsEvent:
    """What goodtrace uses of ``torch.mps.Event``: ``query()`` never waits, ``synchronize()`` does."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.done.wait()


def test_an_mps_tensor_is_dated_by_its_event(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[StandInMpsEvent] = []

    def recorded() -> StandInMpsEvent:
        events.append(StandInMpsEvent())
        return events[-1]

    monkeypatch.setattr(torch_values, "mps_event", recorded)
    with capture(rank=0, world_size=1, lag=1) as cap:
        with gt.step(0) as s:
            s.complete_on(DeviceTensor("mps"))
        assert len(events) == 1 and cap.run is None
        events[0].done.set()  # the device finished step 0
        with gt.step(1) as s:
            s.complete_on(DeviceTensor("mps"))
        events[1].done.set()
    syncs = cap.records(schema.SYNC)
    assert [r["step"] for r in syncs] == [0, 1]
    assert all(r["how"] != schema.SYNC_READY for r in syncs)  # dated from the event, not assumed done
