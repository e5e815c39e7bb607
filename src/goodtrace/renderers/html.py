"""The self-contained HTML report (DESIGN.md section 6): one file that opens offline.

Contract: ``render_html(analysis, run)`` returns the whole page as a string. ``analysis`` is a
:class:`goodtrace.analysis.RunAnalysis` (or its ``to_dict()``, or ``None`` for the raw view);
``run`` is the :class:`goodtrace.read.sessions.Run` whose records feed the per-rank heat map and the
gantt chart. The page shows the goodput headline and buckets, step time with its overhead
split (tags, anomalies, attempts), a rank x step heat map and a gantt chart of every rank's
spans for a step range, drawn with the Apache ECharts build vendored in ``assets/`` (pinned; see
``assets/ECHARTS-VERSION``).

Memory: ``run`` may be a :class:`goodtrace.read.sessions.Run` in memory, or (for any size) a run
directory or the :class:`goodtrace.read.sessions.RunIndex` of :func:`index_for_html`. The run is then
read one session at a time: the index gives every session's steps (enough to choose the gantt
range and lay out the heat map), then each session's records are read once, added to the heat
map's sums and dropped, except the spans inside the gantt range. What is held is the heat
map (ranks x at most 240 columns), the reference rank's step table and the gantt's spans.

Safety: run text (span names, tags, attributes, hosts) reaches the page only as JSON inside a
``<script type="application/json">`` block with ``< > &`` and U+2028/2029 escaped; the page
script puts it into the DOM with ``textContent`` and escapes it in tooltips. A Content Security
Policy allows only the two inline scripts (by hash) and no network access at all.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

from goodtrace import schema
from goodtrace.analysis.clock import session_clocks
from goodtrace.analysis.intervals import step_intervals, step_summaries, summarise_steps
from goodtrace.analysis.selection import StepRange
from goodtrace.read.sessions import Run, RunIndex, Session, index_run
from goodtrace.renderers.html_charts import Gantt, Heatmap, choose_gantt_range, rounded

__all__ = ["ECHARTS_VERSION", "HtmlRenderer", "html_page", "index_for_html", "render_html", "report_data"]

ECHARTS_VERSION = "6.1.0"

_JSON_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                 0x2028: "\\u2028", 0x2029: "\\u2029"}


def embed_json(value: Any) -> str:
    """JSON that is inert inside an HTML ``<script type="application/json">`` element."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).translate(_JSON_ESCAPES)


def _asset(name: str) -> str:
    return resources.files("goodtrace.renderers").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def _as_dict(analysis: Any) -> dict[str, Any] | None:
    if analysis is None:
        return None
    if isinstance(analysis, Mapping):
        return dict(analysis)
    to_dict = getattr(analysis, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            return dict(result)
    raise TypeError(f"expected a RunAnalysis, its to_dict() or None, got {type(analysis).__name__}")


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


# ------------------------------------------------------------------------------ sections


def _summary(run: Run, analysis: dict[str, Any] | None, sessions: Sequence[Session]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "run": os.path.basename(os.path.normpath(run.path)) or run.path,
        "ranks": len({s.rank for s in sessions}),
        "hosts": len({str(s.header.get(schema.H_HOST)) for s in sessions}),
        "attempts": len({s.attempt for s in sessions}),
        "problems": list(run.problems[:50]),
        "analysed": analysis is not None,
    }
    if analysis is None:
        return summary
    partition = analysis.get("partition") or {}
    summary.update(
        goodput=_finite(analysis.get("goodput")),
        total_s=_finite(partition.get("total_s")),
        ideal_step_s=_finite(analysis.get("ideal_step_s")),
        data_rule=(analysis.get("data_rule") or {}).get("text"),
        warnings=[str(w) for w in analysis.get("warnings") or []][:50],
        stragglers=[
            {"rank": s.get("rank"), "host": s.get("host"), "reason": s.get("reason")}
            for s in analysis.get("stragglers") or []
        ][:50],
        attempts_detail=[
            {"index": a.get("index"), "ended": a.get("ended"), "first_step": a.get("first_step"),
             "last_step": a.get("last_step"), "duration_s": _finite(a.get("duration_s"))}
            for a in analysis.get("attempts") or []
        ],
    )
    program = analysis.get("program") or {}
    if _finite(program.get("mfu")) is not None:
        summary["mfu"] = program["mfu"]
    return summary


def _buckets(analysis: dict[str, Any] | None) -> list[list[Any]]:
    if analysis is None:
        return []
    buckets = (analysis.get("partition") or {}).get("buckets") or {}
    return [
        [name, rounded(float(b.get("seconds", 0.0)), 6), rounded(float(b.get("fraction", 0.0)), 6)]
        for name, b in buckets.items()
        if isinstance(b, Mapping) and b.get("ns")
    ]


def _step_rows_from_records(session: Session) -> list[dict[str, Any]]:
    """The step table of one session from raw records (when no analysis is given)."""
    tags: dict[int, list[str]] = {}
    for record in session.of_kind(schema.TAG):
        if isinstance(record.get(schema.F_STEP), int):
            tags.setdefault(int(record[schema.F_STEP]), []).append(str(record.get(schema.F_NAME)))
    rows = []
    for iv in step_intervals(session):
        rows.append({
            "step": iv.step, "attempt": session.attempt, "step_time_s": iv.duration_ns / 1e9,
            "productive_s": iv.productive_ns / 1e9,
            "overhead_s": {k: v / 1e9 for k, v in iv.overhead_ns.items()},
            "shared": iv.step - iv.first_step + 1, "tags": tags.get(iv.step, []),
        })
    return rows


def _steps(run: Run, analysis: dict[str, Any] | None, sessions: Sequence[Session]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = list((analysis or {}).get("steps") or [])
    source = "analysis (reference rank)"
    if not rows:
        reference_rank = min((s.rank for s in sessions), default=0)
        rows = [r for s in sessions if s.rank == reference_rank for r in _step_rows_from_records(run.load(s))]
        source = f"records of rank {reference_rank}"
    categories = sorted({k for r in rows for k in (r.get("overhead_s") or {})})
    series: dict[str, list[float]] = {"productive": []}
    for category in categories:
        series[category] = []
    labels, attempts, shared, tags = [], [], [], []
    device: list[float | None] = []  # device-busy seconds where measured (CUDA events)
    for row in rows:
        device.append(_finite(row.get("device_s")))
        labels.append(int(row.get("step", 0)))
        attempts.append(int(row.get("attempt", 0)))
        shared.append(int(row.get("shared", 1) or 1))
        tags.append([str(t) for t in row.get("tags") or []])
        series["productive"].append(rounded(float(row.get("productive_s") or 0.0), 6))
        overhead = row.get("overhead_s") or {}
        for category in categories:
            series[category].append(rounded(float(overhead.get(category) or 0.0), 6))
    index = {(a, s): i for i, (a, s) in enumerate(zip(attempts, labels, strict=True))}
    anomalies = []
    for anomaly in (analysis or {}).get("anomalies") or []:
        i = index.get((int(anomaly.get("attempt", -1)), int(anomaly.get("step", -1))))
        if i is not None:
            anomalies.append([i, [str(x) for x in anomaly.get("overlapped") or []],
                              _finite(anomaly.get("threshold_s"))])
    ended = {a.get("index"): a.get("ended") for a in (analysis or {}).get("attempts") or []}
    bands = []
    start = 0
    for i in range(1, len(attempts) + 1):
        if i == len(attempts) or attempts[i] != attempts[start]:
            label = f"attempt {attempts[start]}"
            if ended.get(attempts[start]):
                label += f" ({ended[attempts[start]]})"
            bands.append([start, i - 1, label])
            start = i
    return {"source": source, "steps": labels, "attempts": attempts, "shared": shared, "tags": tags,
            "series": series, "anomalies": anomalies, "bands": bands,
            "device": device if any(v is not None for v in device) else None}


def index_for_html(
    run_dir: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None
) -> RunIndex:
    """The run's index with the step summaries the report needs (see the module's docstring)."""
    return index_run(run_dir, summarise=summarise_steps(), progress=progress)


def report_data(
    analysis: Any, run: Run | str | os.PathLike[str], *, gantt_steps: StepRange | None = None,
    gantt_attempt: int | None = None, progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Everything the page draws, as one JSON-ready dict (also what the golden tests compare).
    ``run``: in memory, a :class:`RunIndex` or a run directory (read one session at a time)."""
    if not isinstance(run, Run):
        run = index_for_html(run, None if progress is None else functools.partial(progress, "reading"))
    as_dict = _as_dict(analysis)
    sessions = list(run.sessions)
    if as_dict is not None:
        # Only the analysed job's sessions (a reused run directory can hold older jobs).
        partition = as_dict.get("partition") or {}
        lo, hi = partition.get("start_wall_ns"), partition.get("end_wall_ns")
        if isinstance(lo, int) and isinstance(hi, int):
            inside = [s for s in sessions if lo - 1_000_000_000 <= s.start_wall_ns <= hi]
            sessions = inside or sessions
    summaries = step_summaries(run, sessions)
    to_wall = session_clocks(run)
    steps = _steps(run, as_dict, sessions)
    executed: dict[int, set[int]] = {}
    for session in sessions:
        numbers = summaries[session.session_id].steps
        executed.setdefault(session.attempt, set()).update(numbers)
    executed = {a: numbers for a, numbers in executed.items() if numbers}
    chosen = choose_gantt_range(steps, executed, gantt_steps, gantt_attempt)
    heatmap = Heatmap(sessions, summaries)
    gantt = Gantt(chosen)
    # One pass over the records, one session at a time.
    for done, indexed in enumerate(sessions, 1):
        session = run.load(indexed)
        intervals = step_intervals(session)
        heatmap.add(indexed, intervals)
        gantt.add(indexed, session, intervals)
        del session, intervals
        if progress is not None:
            progress("reading spans", done, len(sessions))
    return {
        "format": "goodtrace.html/1",
        "summary": _summary(run, as_dict, sessions),
        "buckets": _buckets(as_dict),
        "steps": steps,
        "heatmap": heatmap.result(),
        "gantt": gantt.result(to_wall),
    }


def _script_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def render_html(
    analysis: Any, run: Run | str | os.PathLike[str], *, gantt_steps: StepRange | None = None,
    gantt_attempt: int | None = None, progress: Callable[[str, int, int], None] | None = None,
) -> str:
    """The report page: one self-contained HTML string (no network requests when opened).
    ``run``: in memory, a :class:`RunIndex` or a run directory (read one session at a time)."""
    return html_page(report_data(analysis, run, gantt_steps=gantt_steps, gantt_attempt=gantt_attempt,
                                 progress=progress))


def html_page(data: dict[str, Any]) -> str:
    """The page for :func:`report_data`'s result (what :func:`render_html` returns)."""
    echarts = _asset("echarts.min.js")
    app = _asset("report.js")
    template = _asset("report.html")
    csp = (
        "default-src 'none'; script-src " + _script_hash(echarts) + " " + _script_hash(app)
        + "; style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'; "
        "base-uri 'none'; form-action 'none'"
    )
    # The template's markers are replaced in one pass, so that no inserted text (the data, the
    # library) is itself searched for markers.
    parts = {"@@CSP@@": csp, "@@ECHARTS_VERSION@@": ECHARTS_VERSION, "@@DATA@@": embed_json(data),
             "@@ECHARTS@@": echarts, "@@APP@@": app}
    out: list[str] = []
    rest = template
    while True:
        positions = [(rest.find(marker), marker) for marker in parts if marker in rest]
        if not positions:
            out.append(rest)
            break
        at, marker = min(positions)
        out.append(rest[:at])
        out.append(parts[marker])
        rest = rest[at + len(marker):]
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class HtmlRenderer:
    """``HtmlRenderer(gantt_steps=(A, B)).render(analysis, run)``: the renderer-object form."""

    gantt_steps: StepRange | None = None
    gantt_attempt: int | None = None

    def render(self, analysis: Any, run: Run | str | os.PathLike[str]) -> str:
        return render_html(analysis, run, gantt_steps=self.gantt_steps, gantt_attempt=self.gantt_attempt)

