"""PyTorch integration: tensor completion, FLOPs, compile spans, memory, CUDA step events."""

from __future__ import annotations

import sys
import warnings

import pytest

import goodtrace as gt
from goodtrace.testing import capture

torch = pytest.importorskip("torch")
from goodtrace.integrations.torch import instrument, measure_flops, peak_flops_for  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.processes
def test_import_goodtrace_does_not_import_the_torch_integration() -> None:
    assert "goodtrace.integrations.torch" in sys.modules  # imported by this test module
    import subprocess

    code = "import sys, goodtrace; print(any(m.startswith('torch') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cpu_tensors_complete_on_arrival_and_give_metric_values() -> None:
    weight = torch.ones(3, requires_grad=True)
    with capture() as cap:
        for step in (1, 2):
            with gt.step(step) as s:
                loss = (weight * step).sum()
                s.complete_on(loss)
                gt.metric("loss", loss, "mean")
    syncs = cap.records("sync")
    # complete when their step ends: no lag, no wait
    assert [(r["step"], r["how"]) for r in syncs] == [(1, "ready"), (2, "ready")]
    steps = cap.records("step")
    assert [r["t"] >= s["t1"] for r, s in zip(syncs, steps, strict=True)] == [True, True]
    assert [(r["step"], r["value"]) for r in cap.records("metric")] == [(1, 3.0), (2, 6.0)]


def test_cpu_scalar_metric_is_read_when_passed_not_after_an_in_place_update() -> None:
    total = torch.zeros(())
    with capture() as cap:
        for step in (1, 2, 3):
            with gt.step(step):
                total += step
                gt.metric("total", total, "last")
    assert [r["value"] for r in cap.records("metric")] == [1.0, 3.0, 6.0]


def test_non_scalar_tensor_metric_is_refused_with_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught, capture() as cap:
        warnings.simplefilter("always")
        with gt.step(1):
            gt.metric("vector", torch.ones(4), "mean")
    assert cap.records("metric") == []
    assert any("scalar" in str(w.message) for w in caught)


def test_measure_flops_counts_forward_and_backward_and_keeps_gradients() -> None:
    model = torch.nn.Linear(16, 8, bias=False)
    model.weight.grad = torch.full_like(model.weight, 7.0)
    # forward 2*B*in*out; backward: the weight's gradient as much again (the input needs none)
    assert measure_flops(model, torch.randn(4, 16)) == 2 * 2 * 4 * 16 * 8
    # ... and the input's gradient once more when it requires one
    assert measure_flops(model, torch.randn(4, 16, requires_grad=True)) == 3 * 2 * 4 * 16 * 8
    assert torch.equal(model.weight.grad, torch.full_like(model.weight, 7.0))
    assert measure_flops(model, torch.randn(4, 16), backward=False) == 2 * 4 * 16 * 8


def test_peak_flops_table() -> None:
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == pytest.approx(989e12)
    assert peak_flops_for("NVIDIA H100 PCIe") == pytest.approx(756e12)
    assert peak_flops_for("NVIDIA A100-SXM4-40GB") == pytest.approx(312e12)
    assert peak_flops_for("cpu") is None


def test_instrument_without_init_is_a_noop_and_bad_options_are_errors() -> None:
    disabled = instrument()
    assert disabled.aggregator is None
    disabled.close()
    with pytest.raises(ValueError, match="log_every"):
        instrument(log_every=0)
    with pytest.raises(ValueError, match="flops_per_step"):
        instrument(flops_per_step=-3)


def test_torch_compile_is_recorded_as_compile_spans_and_memory_per_log_step() -> None:
    printed: list[str] = []
    with capture() as cap:
        instrument(log_every=2, printer=printed.append, tokens_per_step=64, flops_per_step=1e6)
        compiled = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="eager")
        for step in (1, 2, 3, 4):
            with gt.step(step) as s:
                s.complete_on(compiled(torch.ones(8)).sum())
    spans = [r for r in cap.records("span") if r["cat"] == "compile"]
    assert len(spans) >= 1 and spans[0]["name"] == "compile" and spans[0]["step"] == 1
    assert spans[0]["t1"] > spans[0]["t0"]
    rss = [r for r in cap.records("metric") if r["name"] == "memory/rss_bytes"]
    assert [r["step"] for r in rss] == [2, 4]
    assert all(r["value"] > 10 * 2**20 and r["reduce"] == "max" for r in rss)
    model_events = [r for r in cap.records("event") if r["name"] == "model"]
    assert model_events[0]["attrs"]["tokens_per_step"] == 64
    # the live line of step 2 carries the compile time in its split, and throughput
    assert printed[0].startswith("step 2 |") and "compile" in printed[0] and "tok/s" in printed[0]
    assert len(printed) == 3 and printed[-1].startswith("goodtrace: finished: goodput ")  # and at finish


@cuda
def test_cuda_tensor_completion_is_lagged_and_step_events_give_device_time() -> None:
    device = torch.device("cuda")
    x = torch.randn(2048, 2048, device=device)
    with capture() as cap:
        instrument(log_every=2, live=False)
        for step in range(1, 6):
            with gt.step(step) as s:
                y = x
                for _ in range(10):
                    y = y @ x
                    y = y / y.norm()
                s.complete_on(y.sum())
                gt.metric("norm", y.norm(), "mean")
    syncs = cap.records("sync")
    assert [r["step"] for r in syncs] == [1, 2, 3, 4, 5]
    # seen complete by the readiness check, by the next step's end, or already at its own end
    assert {r["how"] for r in syncs[:4]} <= {"poll", "lag", "ready"}
    busy = [r for r in cap.records("metric") if r["name"] == "device/busy_s"]
    assert [r["step"] for r in busy] == [1, 2, 3, 4, 5]
    assert all(r["value"] > 0 for r in busy)
    idle = [r for r in cap.records("metric") if r["name"] == "device/idle_s"]
    assert [r["step"] for r in idle] == [2, 3, 4, 5]
    cuda_mem = [r for r in cap.records("metric") if r["name"] == "memory/cuda_peak_allocated_bytes"]
    assert [r["step"] for r in cuda_mem] == [2, 4] and cuda_mem[0]["value"] >= 2048 * 2048 * 4
