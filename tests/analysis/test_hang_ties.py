"""Which rank stopped first when every rank's last progress is the same instant (the step's
entry right after the previous step's collective): the rank waiting in a collective (its open
span, or its stack in torch.distributed's or JAX's collectives) is not the one that stopped
(docs/semantics.md section 12). Hang events written as the watchdog writes them, on one clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import analyze
from helpers.builders import Proc, load

HANG_AT = 20
C10D = '  File "/env/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2050, in all_reduce\n' \
       '    work = group.allreduce([tensor], opts)\n'
TRAIN = '  File "/job/train.py", line 40, in main\n    loss = step(batch)\n'
LOADER = '  File "/job/train.py", line 31, in main\n    batch = next(it)\n' \
         '  File "/env/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1329, in _next_data\n' \
         '    idx, data = self._get_data()\n'


def _hang(p: Proc, since: float, stack: str, in_span: str | None, function: str, location: str) -> None:
    attrs: dict[str, Any] = {"step": HANG_AT, "span": None, "in_span": in_span, "phase": None,
                             "since": p.mono(since), "silent_s": 31.0, "bound_s": 30.0, "location": location,
                             "function": function, "stack": stack, "native": None, "action": "record"}
    p.lines.append({"kind": "event", "name": "hang", "t": p.mono(since + 31.0), "step": HANG_AT, "attrs": attrs})


def _run(run: Path, stuck: int, waiting_by: str) -> None:
    for rank in (0, 1):
        p = Proc(run, rank=rank, world=2, host=f"h{rank}")
        t = p.loop(range(HANG_AT), 1.0)
        p.step(HANG_AT, t, t + 1.0)  # entered, never ended; both ranks at the same instant
        if rank == stuck:
            _hang(p, t, LOADER, "data", "_next_data", "dataloader.py:1329")
        elif waiting_by == "stack":
            _hang(p, t, TRAIN + C10D, None, "all_reduce", "distributed_c10d.py:2050")
        else:
            _hang(p, t, TRAIN, "grad_all_reduce", "main", "train.py:40")
        p.heartbeat(t + 32.0)
        p.write()


@pytest.mark.parametrize("stuck", [0, 1])
@pytest.mark.parametrize("waiting_by", ["stack", "span"])
def test_the_rank_waiting_in_a_collective_is_not_named_first(tmp_path: Path, stuck: int, waiting_by: str) -> None:
    _run(tmp_path, stuck, waiting_by)
    result = analyze(load(tmp_path), now_wall_ns=None)
    hangs = {h.rank: h for h in result.hangs}
    assert hangs[0].since_s == hangs[1].since_s  # a tie on the last progress...
    assert [h.rank for h in result.hangs if h.first] == [stuck]  # ...broken by who waits
    assert (hangs[stuck].waiting, hangs[1 - stuck].waiting) == (False, True)
    assert hangs[stuck].in_span == "data" and "in 'data'" in hangs[stuck].where
    (line,) = [w for w in result.warnings if w.startswith("hang:")]
    assert line.startswith(f"hang: rank {stuck} (host h{stuck}) stuck in _next_data (dataloader.py:1329), in 'data'")
    waits = "all_reduce (distributed_c10d.py:2050)" if waiting_by == "stack" else "main (train.py:40), in 'grad_all_reduce'"
    assert f"1 rank waiting at step {HANG_AT} in {waits}" in line
    as_json = {h["rank"]: h for h in result.to_dict()["hangs"]}
    assert as_json[stuck]["in_span"] == "data" and "next(it)" in as_json[stuck]["stack"]
    assert as_json[1 - stuck]["waiting"] is True


def test_what_counts_as_waiting_in_a_collective() -> None:
    from goodtrace.record.hang_peers import in_collective

    assert in_collective(None, TRAIN + C10D) and in_collective("all_reduce", "")
    assert in_collective("Barrier", None) and in_collective("grad_allgather", TRAIN)
    jax = '  File "/env/lib/python3.11/site-packages/jax/experimental/multihost_utils.py", line 9, in sync_global_devices\n'
    assert in_collective(None, TRAIN + jax)
    windows = '  File "C:\\env\\Lib\\site-packages\\torch\\distributed\\distributed_c10d.py", line 2, in barrier\n'
    assert in_collective(None, windows)
    assert not in_collective("data", LOADER) and not in_collective(None, None) and not in_collective(3, 4)


def test_the_console_shows_both_stacks(tmp_path: Path) -> None:
    """The report names where the stuck rank is and where the others wait, each with its stack."""
    import io

    from rich.console import Console

    from goodtrace.renderers.console import render_console

    _run(tmp_path, 1, "stack")
    out = io.StringIO()
    render_console(analyze(load(tmp_path), now_wall_ns=None), Console(file=out, width=200))
    text = out.getvalue()
    stuck, waiting = text.index("stopped first"), text.index("waiting: rank 0 on h0")
    assert stuck < text.index("idx, data = self._get_data()") < waiting  # the stuck rank's stack
    assert waiting < text.index("work = group.allreduce([tensor], opts)")  # and the waiting one's
