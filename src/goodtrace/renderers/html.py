"""The self-contained HTML report (DESIGN.md section 6): one file that opens offline.

Contract: ``render_html(analysis, run)`` returns the whole page as a string. ``analysis`` is a
:class:`goodtrace.analysis.RunAnalysis` (or its ``to_dict()``, or ``None`` for the raw view);
``run`` is the :class:`goodtrace.reader.Run` whose records feed the per-rank heat map and the
gantt chart. The page shows the goodput headline and buckets, step time with its overhead
split (tags, anomalies, attempts), a rank x step heat map and a gantt chart of every rank's
spans for a step range, drawn with the Apache ECharts build vendored in ``assets/`` (pinned; see
``assets/ECHARTS-VERSION``).

Safety: run text (span names, tags, attributes, hosts) reaches the page only as JSON inside a
``<script type="application/json">`` block with ``< > &`` and U+2028/2029 escaped; the page
script puts it into the DOM with ``textContent`` and escapes it in tooltips. A Content Security
Policy allows only the two inline scripts (by hash) and no network access at all.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

from goodtrace import schema
from goodtrace.reader import Run, Session
from goodtrace.renderers.perfetto import DEVICE_CATEGORY, StepInterval, session_clocks, step_intervals

__all__ = ["ECHARTS_VERSION", "HtmlRenderer", "render_html", "report_data"]

ECHARTS_VERSION = "6.1.0"
GANTT_STEPS = 20  # default width of the gantt chart's step range
MAX_HEATMAP_COLUMNS = 240  # more step executions than this are averaged into bins
MAX_GANTT_ITEMS = 600_000  # past this the gantt keeps the first ranks and says so

StepRange = tuple[int | None, int | None]  # inclusive; None = open (as parse_steps returns)

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


def _r(value: float, digits: int = 3) -> float:
    return round(value, digits)


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
        [name, _r(float(b.get("seconds", 0.0)), 6), _r(float(b.get("fraction", 0.0)), 6)]
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
        rows = [r for s in sessions if s.rank == reference_rank for r in _step_rows_from_records(s)]
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
        series["productive"].append(_r(float(row.get("productive_s") or 0.0), 6))
        overhead = row.get("overhead_s") or {}
        for category in categories:
            series[category].append(_r(float(overhead.get(category) or 0.0), 6))
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


def _heatmap(sessions: Sequence[Session], intervals: Mapping[str, list[StepInterval]]) -> dict[str, Any]:
    """Rank x step-execution matrices of step time and compute time (ms), binned when wide."""
    keys = sorted({(s.attempt, iv.step) for s in sessions for iv in intervals[s.session_id]})
    ranks = sorted({s.rank for s in sessions})
    width = max(1, math.ceil(len(keys) / MAX_HEATMAP_COLUMNS))
    column_of = {key: i // width for i, key in enumerate(keys)}
    columns = []
    for start in range(0, len(keys), width):
        group = keys[start:start + width]
        (a0, s0), (a1, s1) = group[0], group[-1]
        label = f"{s0}" if len(group) == 1 else f"{s0}-{s1}"
        if len({a for a, _ in keys}) > 1:
            label = f"a{a0}:{label}" if a0 == a1 else f"a{a0}:{s0}-a{a1}:{s1}"
        columns.append(label)
    row_of = {rank: i for i, rank in enumerate(ranks)}
    n = len(columns)
    sums = {name: [[0.0] * n for _ in ranks] for name in ("step", "compute")}
    counts = [[0] * n for _ in ranks]
    hosts: dict[int, str] = {}
    for session in sessions:
        row = row_of[session.rank]
        hosts.setdefault(session.rank, str(session.header.get(schema.H_HOST)))
        for iv in intervals[session.session_id]:
            col = column_of[(session.attempt, iv.step)]
            sums["step"][row][col] += iv.duration_ns / 1e6
            sums["compute"][row][col] += iv.compute_ns / 1e6
            counts[row][col] += 1

    def matrix(name: str) -> list[list[float | None]]:
        return [[_r(v / c, 3) if c else None for v, c in zip(values, count_row, strict=True)]
                for values, count_row in zip(sums[name], counts, strict=True)]

    has_compute = any(v for row in sums["compute"] for v in row)
    return {"ranks": ranks, "hosts": [hosts.get(r, "?") for r in ranks], "columns": columns,
            "bin": width, "step_ms": matrix("step"), "compute_ms": matrix("compute") if has_compute else None}


def _choose_gantt_range(
    steps: dict[str, Any], sessions: Sequence[Session], intervals: Mapping[str, list[StepInterval]],
    gantt_steps: StepRange | None, gantt_attempt: int | None,
) -> tuple[int, int, int] | None:
    """(attempt, first step, last step): the asked range (in the last attempt that ran any of
    it, unless ``gantt_attempt`` says which), else 20 steps around the slowest step that is not
    the first of its attempt, else the last 20 steps."""
    executed: dict[int, list[int]] = {}
    for session in sessions:
        for iv in intervals[session.session_id]:
            executed.setdefault(session.attempt, []).append(iv.step)
    if not executed:
        return None
    if gantt_steps is not None:
        low, high = gantt_steps
        lo = -(2**62) if low is None else low
        hi = 2**62 if high is None else high
        candidates = [a for a in sorted(executed) if any(lo <= s <= hi for s in executed[a])]
        if gantt_attempt is not None:
            candidates = [a for a in candidates if a == gantt_attempt]
        if not candidates:
            return None
        inside = [s for s in executed[candidates[-1]] if lo <= s <= hi]
        return candidates[-1], min(inside), max(inside)
    totals = [sum(col) for col in zip(*steps["series"].values(), strict=True)] if steps["series"]["productive"] else []
    attempt, centre = max(executed), max(executed[max(executed)])
    if gantt_attempt is not None and gantt_attempt in executed:
        attempt, centre = gantt_attempt, max(executed[gantt_attempt])
    best = -1.0
    for i, total in enumerate(totals):
        a = steps["attempts"][i]
        if gantt_attempt is not None and a != gantt_attempt:
            continue
        if i > 0 and steps["attempts"][i - 1] == a and total > best and a in executed:
            best, attempt, centre = total, a, steps["steps"][i]
    numbers = sorted(set(executed[attempt]))
    pos = numbers.index(centre) if centre in numbers else len(numbers) - 1
    lo = max(0, min(pos - GANTT_STEPS // 2, len(numbers) - GANTT_STEPS))
    chosen = numbers[lo:lo + GANTT_STEPS]
    return attempt, chosen[0], chosen[-1]


def _gantt(
    sessions: Sequence[Session], intervals: Mapping[str, list[StepInterval]],
    to_wall: Mapping[str, Callable[[int], int]], chosen: tuple[int, int, int] | None,
) -> dict[str, Any] | None:
    if chosen is None:
        return None
    attempt, first, last = chosen
    picked = []
    for session in sorted((s for s in sessions if s.attempt == attempt), key=lambda s: s.rank):
        ivs = [iv for iv in intervals[session.session_id] if iv.step >= first and iv.first_step <= last]
        if ivs:
            picked.append((session, ivs[0].t0, ivs[-1].t1, ivs))
    if not picked:
        return None
    origin = min(to_wall[s.session_id](w0) for s, w0, _, _ in picked)
    names: dict[str, int] = {}
    categories: dict[str, int] = {}
    items: list[list[float | int]] = []
    rows: list[str] = []
    marks: list[list[Any]] = []
    truncated = False
    for row, (session, w0, w1, ivs) in enumerate(picked):
        if len(items) > MAX_GANTT_ITEMS:
            truncated = True
            break
        clock = to_wall[session.session_id]
        rows.append(f"rank {session.rank} ({session.header.get(schema.H_HOST)})")
        main_tid = session.header.get("main_tid")
        if row == 0:
            marks = [[_r((clock(iv.t0) - origin) / 1e6), f"step {iv.step}"] for iv in ivs]
        spans = [
            r for r in session.records
            if r.get(schema.F_KIND) == schema.SPAN and int(r[schema.F_T1]) > w0 and int(r[schema.F_T0]) < w1
        ]
        spans.sort(key=lambda r: (int(r[schema.F_T0]), -int(r[schema.F_T1])))
        stacks: dict[Any, list[int]] = {}
        for record in spans:
            t0, t1 = int(record[schema.F_T0]), int(record[schema.F_T1])
            category = str(record.get(schema.F_CATEGORY))
            lane = 2 if category == DEVICE_CATEGORY else (0 if record.get(schema.F_THREAD) == main_tid else 1)
            stack = stacks.setdefault((lane, record.get(schema.F_THREAD)), [])
            while stack and stack[-1] <= t0:
                stack.pop()
            depth = len(stack)
            stack.append(t1)
            name = str(record.get(schema.F_NAME))
            step = record.get(schema.F_STEP)
            items.append([
                row, _r((clock(t0) - origin) / 1e6), _r((clock(t1) - origin) / 1e6),
                names.setdefault(name, len(names)), categories.setdefault(category, len(categories)),
                step if isinstance(step, int) else -1, min(depth, 5), lane,
            ])
    return {"attempt": attempt, "steps": [first, last], "rows": rows, "names": list(names),
            "categories": list(categories), "items": items, "marks": marks, "truncated": truncated}


def report_data(
    analysis: Any, run: Run, *, gantt_steps: StepRange | None = None, gantt_attempt: int | None = None,
) -> dict[str, Any]:
    """Everything the page draws, as one JSON-ready dict (also what the golden tests compare)."""
    as_dict = _as_dict(analysis)
    sessions = list(run.sessions)
    if as_dict is not None:
        # Only the analysed job's sessions (a reused run directory can hold older jobs).
        partition = as_dict.get("partition") or {}
        lo, hi = partition.get("start_wall_ns"), partition.get("end_wall_ns")
        if isinstance(lo, int) and isinstance(hi, int):
            inside = [s for s in sessions if lo - 1_000_000_000 <= s.start_wall_ns <= hi]
            sessions = inside or sessions
    intervals = {s.session_id: step_intervals(s) for s in sessions}
    to_wall = session_clocks(run)
    steps = _steps(run, as_dict, sessions)
    chosen = _choose_gantt_range(steps, sessions, intervals, gantt_steps, gantt_attempt)
    return {
        "format": "goodtrace.html/1",
        "summary": _summary(run, as_dict, sessions),
        "buckets": _buckets(as_dict),
        "steps": steps,
        "heatmap": _heatmap(sessions, intervals),
        "gantt": _gantt(sessions, intervals, to_wall, chosen),
    }


def _script_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def render_html(
    analysis: Any, run: Run, *, gantt_steps: StepRange | None = None, gantt_attempt: int | None = None,
) -> str:
    """The report page: one self-contained HTML string (no network requests when opened)."""
    data = report_data(analysis, run, gantt_steps=gantt_steps, gantt_attempt=gantt_attempt)
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

    def render(self, analysis: Any, run: Run) -> str:
        return render_html(analysis, run, gantt_steps=self.gantt_steps, gantt_attempt=self.gantt_attempt)

