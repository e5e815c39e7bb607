"""Benchmark: ``goodtrace export`` of a long run, the time per exported step row against the run's
length, per backend.

``goodtrace export RUN --to ...`` analyses the run (as ``report`` does), then writes one point
per step row of the step table and the summary. Writes runs of 2 ranks x each of ``--steps``
steps (``report_incremental.py``'s writer, 64 MiB segments), then times, each in a fresh
process: ``report --json --no-steps`` (the baseline: the analysis alone, in the same run, the
segment cache filled first), and ``export --to tensorboard DIR``, ``--to mlflow sqlite:///...``
and ``--to wandb --wandb-mode offline``. It prints, per backend, the time, the time above the
baseline per row, and the peak RSS; then each one's time per row added from the shortest run to
the longest (a row's own cost, without the start-up and the backend's import). ``--json``: the last line is one JSON object with every figure. ``--quick``: 2,000
and 20,000 steps (under a minute). Backends whose package is missing are left out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from report_incremental import RankWriter
from report_scale import goodtrace_cmd, timed

BACKENDS = {"tensorboard": "tensorboardX", "mlflow": "mlflow", "wandb": "wandb"}


def measure(root: Path, steps: int, backends: list[str]) -> dict[str, Any]:
    timed(goodtrace_cmd("report", str(root), "--json", "--no-steps"))  # the segment cache filled
    base_s, base_peak, _ = timed(goodtrace_cmd("report", str(root), "--json", "--no-steps"))
    row: dict[str, Any] = {"steps": steps, "report_s": round(base_s, 2), "report_peak_mib": round(base_peak)}
    for backend in backends:
        target = root.parent / backend
        where = {"tensorboard": [str(target)], "mlflow": [f"sqlite:///{target}.db"],
                 "wandb": ["goodtrace-bench", "--wandb-mode", "offline", "--wandb-dir", str(target)]}[backend]
        os.environ.update(WANDB_SILENT="true", WANDB_DISABLE_GIT="true", WANDB_CONFIG_DIR=str(root.parent / "wb"))
        seconds, peak, _ = timed(goodtrace_cmd("export", str(root), "--to", backend, *where))
        row[f"{backend}_s"], row[f"{backend}_peak_mib"] = round(seconds, 2), round(peak)
        row[f"{backend}_us_per_row"] = round((seconds - base_s) / steps * 1e6, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000],
                        help="steps per rank of each run (default 10,000 and 100,000)")
    parser.add_argument("--quick", action="store_true", help="2,000 and 20,000 steps")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    sizes = [2_000, 20_000] if args.quick else sorted(args.steps)
    backends = [b for b, module in BACKENDS.items() if importlib.util.find_spec(module) is not None]
    rows = []
    for steps in sizes:
        work = Path(tempfile.mkdtemp(prefix="goodtrace-export-"))
        try:
            root = work / "run"
            for rank in range(2):
                RankWriter(root, rank, 2, 64 * 2**20).steps(steps)
            rows.append(measure(root, steps, backends))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        row = rows[-1]
        print(f"2 ranks x {steps:,} steps: report --json {row['report_s']} s; " + "; ".join(
            f"{b} {row[f'{b}_s']} s ({row[f'{b}_us_per_row']} us a row above it, peak {row[f'{b}_peak_mib']} MiB)"
            for b in backends))
    # a row's own cost: the growth from the shortest run to the longest per row added (start-up,
    # the backend's import and the analysis's fixed part left out)
    added = (rows[-1]["steps"] - rows[0]["steps"]) or 1
    growth = {f"{b}_us_per_added_row": round((rows[-1][f"{b}_s"] - rows[0][f"{b}_s"]) / added * 1e6, 1)
              for b in backends}
    growth["report_us_per_added_row"] = round((rows[-1]["report_s"] - rows[0]["report_s"]) / added * 1e6, 1)
    print(f"per row added from {sizes[0]:,} to {sizes[-1]:,} steps: " + ", ".join(
        f"{name.removesuffix('_us_per_added_row')} {value} us" for name, value in growth.items()))
    if args.json:
        print(json.dumps({"benchmark": "export_rows", "python": sys.version.split()[0], "ranks": 2, "runs": rows,
                          **growth}))


if __name__ == "__main__":
    main()
