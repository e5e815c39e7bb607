"""The self-contained HTML report (``goodtrace report --html``): one file that opens offline.

Contract: ``render_html(analysis, run)`` returns the whole page as a string. ``analysis`` is the
:class:`goodtrace.analysis.RunAnalysis` of ``run``, the
:class:`goodtrace.read.loaded.LoadedRun` it came from. The page shows the goodput headline and
buckets, goodput over time (per period fitted to the run's length, or the one asked for), attempts and events, step
time with its overhead split (tags, anomalies, attempts), a rank x step heat map and a gantt
chart of every rank's spans for a step range, drawn with the Apache ECharts build vendored in ``assets/`` (pinned; see ``assets/ECHARTS-VERSION``).

Everything drawn comes from the run model: the step chart is the analysis's step table, the
heat map every rank's step executions as the analysis cut them, the gantt chart the spans of
the chosen steps' intervals, read from the rank files for those intervals only (DuckDB). Memory
holds the heat map (ranks x at most 240 columns), the step chart's columns (at most
``MAX_STEP_BARS`` bars: a longer table is drawn as the means of consecutive rows), one rank's
cut at a time (``RunAnalysis.cuts`` makes the others again when read) and the gantt range's
spans.

Safety: run text (span names, tags, attributes, hosts) reaches the page only as JSON inside a
``<script type="application/json">`` block with ``< > &`` and U+2028/2029 escaped (lone
surrogates replaced); the page script puts it into the DOM with ``textContent`` and escapes it
in tooltips. A Content Security Policy allows only the two inline scripts (by hash) and no
network access at all.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from importlib import resources
from typing import Any

from goodtrace.analysis import RunAnalysis
from goodtrace.analysis.over_time import iso
from goodtrace.analysis.selection import StepRange, choose_range
from goodtrace.read.loaded import LoadedRun, Progress
from goodtrace.read.raw import session_records
from goodtrace.renderers.html_charts import Gantt, Heatmap, rounded
from goodtrace.renderers.json_report import finite

__all__ = ["ECHARTS_VERSION", "html_page", "render_html", "report_data"]

ECHARTS_VERSION = "6.1.0"
MAX_PAGE_EVENTS = 200
MAX_STEP_BARS = 4_000  # a longer step table is drawn as bars of consecutive rows (their mean)
MAX_BAR_TAGS = 8  # tag names shown per bar of several rows

_JSON_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _no_surrogates(value: Any) -> Any:
    """Any string goodtrace accepted, as valid UTF-8 (a lone surrogate becomes U+FFFD)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8") if any(
            "\ud800" <= c <= "\udfff" for c in value) else value
    if isinstance(value, dict):
        return {_no_surrogates(k): _no_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_surrogates(v) for v in value]
    return value


def embed_json(value: Any) -> str:
    """JSON that is inert inside an HTML ``<script type="application/json">`` element (a number
    that is not finite is null, as in ``--json``)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a number that is not finite
        value = finite(value)
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: replacement characters
        text = json.dumps(_no_surrogates(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.translate(_JSON_ESCAPES)


def _asset(name: str) -> str:
    return resources.files("goodtrace.renderers").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


# ------------------------------------------------------------------------------ sections


def _summary(analysis: RunAnalysis, run: LoadedRun) -> dict[str, Any]:
    sessions = [analysis.sessions[i] for i in analysis.cuts]
    program = analysis.program
    summary: dict[str, Any] = {
        "run": os.path.basename(os.path.normpath(analysis.path)) or analysis.path,
        "ranks": len({s.rank for s in sessions}),
        "hosts": len({s.host for s in sessions}),
        "attempts": len(analysis.attempts),
        "problems": [],
        "analysed": True,
        "goodput": _finite(analysis.partition.goodput),
        "total_s": _finite(analysis.partition.total_ns / 1e9),
        "ideal_step_s": _finite(analysis.ideal_step_s),
        "verdict": {"kind": analysis.verdict.kind, "text": analysis.verdict.text,
                    "evidence": analysis.verdict.evidence},
        "host_overhead": "; ".join(analysis.host_overhead.sentences()),
        "warnings": list(analysis.warnings[:50]),
        "stragglers": [{"rank": s.rank, "host": s.host, "reason": s.reason} for s in analysis.stragglers[:50]],
        "attempts_detail": [
            {"index": a.index, "ended": a.ending.text, "first_step": a.first_step, "last_step": a.last_step,
             "duration_s": _finite(a.duration_ns / 1e9)}
            for a in analysis.attempts
        ],
        "events": [e.to_dict() for e in analysis.events[:MAX_PAGE_EVENTS]],
        "events_total": analysis.events_total,
    }
    if program.mfu is not None:
        summary["mfu"] = program.mfu
    if analysis.rewinds:  # rollbacks inside an attempt (absent otherwise: other pages keep their data)
        summary["rewinds"] = [r.to_dict() for r in analysis.rewinds[:MAX_PAGE_EVENTS]]
    if analysis.time_range is not None and analysis.window is not None:  # --since/--until
        summary["time_range"] = {"start": iso(analysis.time_range[0]), "end": iso(analysis.time_range[1]),
                           "goodput": _finite(analysis.window.goodput)}
    return summary


def _buckets(analysis: RunAnalysis) -> list[list[Any]]:
    p = analysis.partition
    return [[name, rounded(ns / 1e9, 6), rounded(p.fraction(name), 6)] for name, ns in p.buckets_ns.items() if ns]


def _steps(analysis: RunAnalysis) -> dict[str, Any]:
    """The step chart: the analysis's step table as columns (no row made); a table
    of more than :data:`MAX_STEP_BARS` rows is drawn as bars of ``bin`` consecutive rows of one
    attempt each (each bar the mean of its rows, so the stack is the mean step time; the
    slowest row's time beside it), so that the page stays a few MiB however long the run."""
    import numpy as np

    columns = analysis.steps.columns()
    n = len(columns.step)
    step, seq, attempt, shared = columns.step, columns.seq, columns.attempt, columns.shared
    start, end, productive, device = columns.start_ns, columns.end_ns, columns.productive_s, columns.device_s
    overhead = columns.overhead_s
    tags = [(i, list(names)) for i, names in columns.tags]
    wanted = {(a.attempt, a.seq) for a in analysis.anomalies}  # the rows of the anomalies alone
    index = {key: i for i, key in enumerate(zip(attempt.tolist(), seq.tolist(), strict=True)) if key in wanted}
    anomalies = [(index[(a.attempt, a.seq)], list(a.overlapped), _finite(a.threshold_s))
                 for a in analysis.anomalies if (a.attempt, a.seq) in index]
    # bars: runs of at most `width` rows, never across an attempt
    width = max(1, math.ceil(n / MAX_STEP_BARS))
    first_of_band = np.flatnonzero(np.diff(attempt)) + 1 if n else np.zeros(0, dtype=np.int64)
    band_starts = [0, *first_of_band.tolist()] if n else []
    bar_starts: list[int] = []
    for b, lo in enumerate(band_starts):
        hi = band_starts[b + 1] if b + 1 < len(band_starts) else n
        bar_starts.extend(range(lo, hi, width))
    starts = np.array(bar_starts, dtype=np.int64)
    ends = np.append(starts[1:], n) if n else starts
    counts = ends - starts
    bar_of = np.repeat(np.arange(len(starts)), counts)

    def mean(values: Any) -> list[float]:
        return [rounded(v, 6) for v in (np.add.reduceat(values, starts) / counts).tolist()] if n else []

    total = productive + sum(overhead.values(), np.zeros(n))
    series = {"productive": mean(productive)}
    for category in sorted(overhead):
        series[category] = mean(overhead[category])
    has_device = bool(np.isfinite(device).any())
    device_bars: list[float | None] = []
    if has_device and width == 1:
        device_bars = [None if math.isnan(v) else v for v in device.tolist()]
    elif has_device:
        known = np.isfinite(device)
        sums = np.add.reduceat(np.where(known, device, 0.0), starts)
        seen = np.add.reduceat(known.astype(np.int64), starts)
        device_bars = [rounded(s / c, 6) if c else None for s, c in zip(sums.tolist(), seen.tolist(), strict=True)]
    bar_tags: dict[int, list[str]] = {}
    for i, names in tags:
        if width == 1:  # a row's own tags, as the step table has them
            bar_tags[i] = names
            continue
        held = bar_tags.setdefault(int(bar_of[i]), [])
        held.extend(name for name in names if name not in held and len(held) < MAX_BAR_TAGS)
    ended = {a.index: a.ending.text for a in analysis.attempts}
    bands = []
    for b, lo in enumerate(band_starts):
        hi = band_starts[b + 1] if b + 1 < len(band_starts) else n
        a = int(attempt[lo])
        bands.append([int(bar_of[lo]), int(bar_of[hi - 1]), f"attempt {a} ({ended.get(a, '?')})"])
    if n:
        why = ""
    elif not any(len(c.exec_step) for c in analysis.cuts.values()):
        why = "no step was recorded: the loop never entered gt.step(n), so there are no step intervals to cut"
    else:
        why = "no step completed on the reference rank (every execution was still in flight when it ended)"
    last = ends - 1
    data: dict[str, Any] = {
        "source": f"analysis of rank {analysis.reference_rank}", "bin": width,
        "steps": step[starts].tolist(), "seq": seq[starts].tolist(), "attempts": attempt[starts].tolist(),
        "start_ns": start[starts].tolist(), "end_ns": end[last].tolist(),
        "shared": (np.maximum.reduceat(shared, starts).tolist() if n else []),
        "tags": [bar_tags.get(b, []) for b in range(len(starts))], "series": series,
        "anomalies": [[int(bar_of[i]), overlapped, threshold] for i, overlapped, threshold in anomalies],
        "bands": bands, "device": device_bars if has_device else None, "why_empty": why,
    }
    if width > 1:  # each bar's last step, row count and slowest row (s)
        data.update(last_steps=step[last].tolist(), counts=counts.tolist(),
                    max_s=[rounded(v, 6) for v in np.maximum.reduceat(total, starts).tolist()])
    return data


def _over_time(analysis: RunAnalysis) -> dict[str, Any] | None:
    """Goodput over time for the page's chart: each period's share of each bucket (the
    analysis's periods, as ``report --json`` gives them)."""
    over = analysis.over_time
    if over is None or not over.periods:
        return None
    rows = over.to_list(analysis.partition.start_wall_ns)
    present = {name for row in rows for name in row["buckets"]}
    names = [name for name in analysis.partition.buckets_ns if name in present]  # productive first
    names += sorted(present - set(names))
    return {
        "every_s": over.every_s,
        "start": [row["start"] for row in rows],
        "end": [row["end"] for row in rows],
        "partial": [row["partial"] for row in rows],
        "goodput": [rounded(row["goodput"], 6) for row in rows],
        "lost_s": [rounded(row["lost_s"], 6) for row in rows],
        "series": {name: [rounded(row["buckets"][name]["fraction"], 6) if name in row["buckets"] else 0.0
                          for row in rows] for name in names},
        "worst": list(over.worst),
    }


def report_data(
    analysis: RunAnalysis, run: LoadedRun, *, gantt_steps: StepRange | None = None,
    gantt_attempt: int | None = None, progress: Progress | None = None,
) -> dict[str, Any]:
    """Everything the page draws, as one JSON-ready dict (also what the golden tests compare)."""
    chosen = choose_range(analysis, gantt_steps, gantt_attempt)
    gantt = Gantt(analysis, chosen)
    done = 0
    for part in gantt.wanted():  # a few hundred rows at a time, until the chart holds what it draws

        def read(label: str, n: int, total: int, before: int = done) -> None:
            if progress is not None:
                progress(label, before + n, len(gantt.order))

        for session, records in session_records(run, part, spans_only=True, progress=read):
            gantt.add(session, records)
        done += len(part)
    columns = analysis.timeline.columns
    legend = sorted(set(columns.labels if columns is not None else ()) | {"productive"})
    return {
        "format": "goodtrace.html/2",
        "summary": _summary(analysis, run),
        "buckets": _buckets(analysis),
        "over_time": _over_time(analysis),
        "steps": _steps(analysis),
        "heatmap": Heatmap(analysis).result(),
        "gantt": gantt.result(),
        "legend": legend,
    }


def _script_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def render_html(
    analysis: RunAnalysis, run: LoadedRun, *, gantt_steps: StepRange | None = None,
    gantt_attempt: int | None = None, progress: Progress | None = None,
) -> str:
    """The report page: one self-contained HTML string (no network requests when opened)."""
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
