"""Regenerate the golden run directories under tests/data/runs
(``PYTHONPATH=tests python tests/data/make_golden.py``: it uses ``tests/helpers``).

restart_2ranks: two ranks; attempt 0 checkpoints after step 2 and crashes in step 5; attempt 1
restores and runs steps 3..7. Rank 1 computes slower and reaches every sync point 0.2 s late;
its last file ends in a torn line. schema_v0: one rank written with the older schema 0 header.
Expected figures are in tests/cli/test_report_cli.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers.builders import Proc

HERE = Path(__file__).parent


def restart_2ranks(root: Path) -> None:
    for rank, late, compute in ((0, 0.0, 0.8), (1, 0.2, 1.2)):
        a0 = Proc(root, rank=rank, world=2, restart=0, host=f"node{rank}")
        a0.span("init", 0, 1 + late)
        t = 1.0 + late
        for k in range(3):
            a0.step(k, t, t + 1).span("forward_backward", t + 0.1, t + 0.1 + compute * 0.8, step=k)
            a0.sync(k, t + 1, "host").metric("loss", k, 2.0 - k / 10, t + 1)
            t += 1
        a0.span("checkpoint", t, t + 0.5, step=2).tag(2, "checkpoint", t)
        t += 0.5
        for k in range(3, 5):
            a0.step(k, t, t + 1).span("forward_backward", t + 0.1, t + 0.1 + compute * 0.8, step=k)
            a0.sync(k, t + 1, "host")
            t += 1
        a0.heartbeat(t + 0.5)
        a0.write()
        a1 = Proc(root, rank=rank, world=2, restart=1, start=10.0, host=f"node{rank}")
        a1.span("restore", 10, 11 + late)
        t = 11.0 + late
        for k in range(3, 8):
            a1.step(k, t, t + 1).span("forward_backward", t + 0.1, t + 0.1 + compute * 0.8, step=k)
            a1.sync(k, t + 1, "host")
            t += 1
        a1.finish(t + 0.5)
        a1.write(torn=rank == 1)


def schema_v0(root: Path) -> None:
    p = Proc(root, schema_version=0)
    p.loop(range(3), 0.0)
    p.finish(3.0)
    p.write()


def main() -> None:
    for name, build in (("restart_2ranks", restart_2ranks), ("schema_v0", schema_v0)):
        target = HERE / "runs" / name
        shutil.rmtree(target, ignore_errors=True)
        build(target)
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
