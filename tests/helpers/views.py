"""Every view of a run shows the same step executions (the one run model)."""

from __future__ import annotations

import json
from pathlib import Path

from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from goodtrace.renderers.html import report_data
from goodtrace.renderers.perfetto import PerfettoRenderer


def assert_views_agree(run_dir: Path) -> None:
    """The step executions in --json, the HTML page's data and the trace's steps track are
    identical, to the nanosecond (the reference rank's)."""
    loaded = load_run(run_dir)
    analysis = analyze(loaded)
    rows = [(r.seq, r.step, r.start_ns, r.end_ns) for r in analysis.steps]
    html = report_data(analysis, loaded)["steps"]
    assert list(zip(html["seq"], html["steps"], html["start_ns"], html["end_ns"], strict=True)) == rows
    trace = json.loads(PerfettoRenderer().render(analysis, loaded))
    origin = trace["otherData"]["origin_wall_ns"]
    ref = min(analysis.sessions[i].rank for i in analysis.cuts) + 1
    track = []
    for e in trace["traceEvents"]:
        if e.get("cat") == "step" and e["pid"] == ref:
            ts, dur = round(float(e["ts"]) * 1000), round(float(e["dur"]) * 1000)
            track.append((e["args"]["seq"], e["args"]["step"], origin + ts, origin + ts + dur))
    shared = {r.start_ns for r in analysis.steps if r.shared > 1}
    assert sorted(t for t in track if t[2] not in shared) == sorted(
        (s, n, a, b) for s, n, a, b in rows if a not in shared)
