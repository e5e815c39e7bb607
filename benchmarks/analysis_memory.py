"""Benchmark: what the analysis holds per step and rank on the driver, after the fold.

Writes runs with ``report_steps.py``'s generator at ``--ranks`` R x ``--steps`` S, at 10 R x S and
at R x 10 S (what grows with step-rank pairs shows on both axes; what grows with the ranks alone,
or the steps alone, on one), loads each
(one worker: the read is not what is measured) and, in a fresh process per run and mode, analyses
it as ``report --json`` does (``release_records``), tracing Python's allocations from the end of the
load:

* ``peak``: the most the analysis held at once above the loaded run (tracemalloc);
* ``kept``: what stays allocated while the result lives;
* the split of what it holds: the reference rank's cuts, every other session's cuts, the
  loaded records' parts the analysis keeps (device metrics, clock samples, span-start samples,
  events), by their buffers' bytes.

Two modes in the same run: ``views`` (every session's cut kept for the HTML report's gantt and
the trace: the baseline, as every report did before) and ``report`` (``analyze(keep_cuts=False)``,
what ``report`` without ``--html`` runs: a rank's figures computed as its sessions are cut, its cut
released). The loaded records are fetched a block of sessions at a time (at most
``BLOCK_ROWS`` executions, a bound that does not grow with the run): ``--block-rows`` (20,000)
lowers it so that what grows beyond one block shows at these sizes. ``--quick``: S = 1,000 on 8 and 80 ranks and 10 S on 8; ``--json``: the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from report_steps import write_rank

_MEASURE = r"""
import json, sys, tracemalloc
from array import array
from goodtrace.analysis import analyze
from goodtrace.read import load, model_fetch
from goodtrace.read.engine import Engine

def size(x):
    if isinstance(x, array):
        return x.buffer_info()[1] * x.itemsize
    if isinstance(x, (list, tuple)):
        return 8 * len(x) + sum(size(v) for v in x if isinstance(v, (array, list, tuple, dict)))
    if isinstance(x, dict):
        return 16 * len(x) + sum(size(v) for v in x.values() if isinstance(v, (array, list, tuple, dict)))
    return getattr(x, "nbytes", 0)

def cut_bytes(cut):
    return sum(size(getattr(cut, f)) for f in cut.__dataclass_fields__)

model_fetch.BLOCK_ROWS = int(sys.argv[3])  # the executions whose columns the analysis fetches at once
loaded = load.load_run(sys.argv[1], engine=Engine(workers=1))
keep = sys.argv[2] == "views"
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
analysis = analyze(loaded, now_wall_ns=1_800_000_000 * 10**9, release_records=True, keep_cuts=keep)
kept, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
reference = {a.reference_session for a in analysis.attempts}
records = sum(size(r.device) + size(r.clock) + size(r.starts_step) + size(r.starts_name) + size(r.starts_t0)
              + size(r.events) for r in loaded.session_records.values())
print(json.dumps({
    "peak_mib": (peak - base) / 2**20, "kept_mib": (kept - base) / 2**20,
    "reference_cuts_mib": sum(cut_bytes(c) for i, c in analysis.cuts.items() if i in reference) / 2**20,
    "other_cuts_mib": sum(cut_bytes(c) for i, c in analysis.cuts.items() if i not in reference) / 2**20,
    "records_kept_mib": records / 2**20,
    "report": analysis.to_dict(include_steps=True),
}))
"""


def _measure(run: Path, mode: str, block_rows: int) -> dict[str, Any]:
    env = dict(os.environ, GOODTRACE_PROGRESS="0")
    env.pop("GOODTRACE_WORKERS", None)
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(run), mode, str(block_rows)], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"a measurement failed: {done.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def measure(root: Path, ranks: int, steps: int, block_rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, r, n in (("small", ranks, steps), ("wide", 10 * ranks, steps), ("long", ranks, 10 * steps)):
        run = root / label
        for rank in range(r):
            write_rank(run, rank, r, n)
        rows = {mode: _measure(run, mode, block_rows) for mode in ("views", "report")}
        same = rows["views"].pop("report") == rows["report"].pop("report")
        out[label] = {"ranks": r, "steps": n, "identical_report": same, **rows}
        shutil.rmtree(run)
    for axis in ("wide", "long"):  # what one more step-rank pair adds, along the ranks and along the steps
        pairs = out[axis]["ranks"] * out[axis]["steps"] - ranks * steps
        for mode in ("views", "report"):
            for figure in ("peak_mib", "kept_mib"):
                grew = out[axis][mode][figure] - out["small"][mode][figure]
                out[f"{mode}_{figure[:-4]}_b_per_pair_{axis}"] = grew * 2**20 / pairs
    out["peak_ratio"] = out["wide"]["report"]["peak_mib"] / out["wide"]["views"]["peak_mib"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2_000)
    parser.add_argument("--block-rows", type=int, default=20_000,
                        help="step executions the analysis fetches at once (the reader's BLOCK_ROWS, 500,000; "
                             "smaller here so that runs this small show what grows beyond one block)")
    parser.add_argument("--quick", action="store_true", help="8 and 80 ranks x 1,000 steps, 8 x 10,000")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ranks, steps = (8, 1_000) if args.quick else (args.ranks, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(Path(tmp), ranks, steps, args.block_rows)
    for label in ("small", "wide", "long"):
        row = out[label]
        print(f"{row['ranks']} ranks x {row['steps']:,} steps (report identical: {row['identical_report']})")
        for mode in ("views", "report"):
            m = row[mode]
            print(f"  {mode:7s} peak {m['peak_mib']:8.1f} MiB, kept {m['kept_mib']:8.1f} MiB; cuts: reference "
                  f"{m['reference_cuts_mib']:.1f} MiB, others {m['other_cuts_mib']:.1f} MiB; records kept "
                  f"{m['records_kept_mib']:.1f} MiB")
    for axis, words in (("wide", "10x the ranks"), ("long", "10x the steps")):
        for mode in ("views", "report"):
            print(f"{words}, {mode}: peak grows {out[f'{mode}_peak_b_per_pair_{axis}']:.1f} B, kept "
                  f"{out[f'{mode}_kept_b_per_pair_{axis}']:.1f} B a step and rank")
    print(f"peak at {out['wide']['ranks']} ranks, report / views: {out['peak_ratio']:.2f}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
