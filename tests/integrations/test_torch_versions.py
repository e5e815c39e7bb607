"""The torch integration on the older APIs it declares (torch 2.1+), emulated on this torch.

Read from the releases' sources: dynamo's compile callbacks exist from torch 2.3 and are called
with no argument until 2.7 (a ``CallbackArgs`` from 2.8); ``dist.send``/``dist.recv`` take
``group_dst``/``group_src`` from 2.6 (a global ``dst``/``src`` before). Each test puts this
torch in the older shape and checks the feature works, or degrades with one warning.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.testing import capture
from helpers.ranks import run_ranks

torch = pytest.importorskip("torch")
from goodtrace.integrations import torch as gtorch  # noqa: E402
from goodtrace.integrations import torch_collectives  # noqa: E402


def _import_dynamo() -> None:
    """The integration hooks compile only once the program imported dynamo (seconds: not at
    module level, which the spawned workers below import too)."""
    import torch._dynamo  # noqa: F401


def test_compile_callbacks_called_without_arguments_as_before_torch_2_8() -> None:
    _import_dynamo()
    with capture(record_gc=False) as cap:
        integration = gtorch.instrument(live=False, memory=False)
        assert isinstance(integration, gtorch.TorchIntegration)
        hooks = integration._compile_hooks
        assert hooks is not None
        on_start, on_end = hooks
        with gt.step(1):
            on_start()  # torch 2.3-2.7: callback()
            on_end()
    (span,) = [r for r in cap.records("span") if r["cat"] == "compile"]
    assert span["step"] == 1 and span["attrs"] == {"compile_id": None, "trigger": None}


def test_without_dynamo_callbacks_compile_spans_are_off_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    _import_dynamo()
    monkeypatch.setitem(sys.modules, "torch._dynamo.callback", None)  # torch < 2.3: no such module
    with warnings.catch_warnings(record=True) as caught, capture(record_gc=False) as cap:
        warnings.simplefilter("always")
        gtorch.instrument(live=False, memory=False)
        for step in (1, 2):
            with gt.step(step):
                pass
    messages = [str(w.message) for w in caught if "compile spans need torch 2.3" in str(w.message)]
    assert len(messages) == 1
    assert [r for r in cap.records("span") if r["cat"] == "compile"] == []


def _old_p2p_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Three ranks; ranks 1 and 2 measure their offset in a group of their own, whose group
    ranks (0, 1) are not their global ranks, through send/recv with torch 2.5's signatures."""
    import time

    import torch.distributed as dist

    real_send, real_recv = dist.send, dist.recv

    def send(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> None:  # torch <= 2.5
        real_send(tensor, dst=dst, group=group, tag=tag)

    def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> int:
        return int(real_recv(tensor, src=src, group=group, tag=tag))

    dist.send, dist.recv = send, recv
    torch_collectives._p2p_takes_group_ranks.cache_clear()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.new_group([1, 2], backend="gloo")
    result: dict[str, Any] = {"by_group_rank": torch_collectives._p2p_takes_group_ranks()}
    if rank in (1, 2):
        sample = gtorch.sync_clocks(group, time.perf_counter_ns, rounds=8)
        result.update(offset_ns=sample.offset_ns, rtt_ns=sample.rtt_ns)
    dist.barrier()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.processes
def test_clock_sync_addresses_peers_by_global_rank_before_torch_2_6(tmp_path: Path) -> None:
    run_ranks(_old_p2p_worker, 3, str(tmp_path))
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(3)]
    assert [r["by_group_rank"] for r in results] == [False] * 3
    assert results[1]["offset_ns"] == 0 and results[1]["rtt_ns"] == 0  # group rank 0: the reference
    # one host, one monotonic clock: the true offset is 0, and the estimate is within rtt / 2
    assert results[2]["rtt_ns"] > 0 and abs(results[2]["offset_ns"]) <= results[2]["rtt_ns"] // 2 + 1
