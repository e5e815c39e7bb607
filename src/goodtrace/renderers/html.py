"""The self-contained HTML report (DESIGN.md section 6): one file that opens offline.

Contract: ``render_html(analysis, run)`` returns the whole page as a string. ``analysis`` is a
:class:`goodtrace.analysis.RunAnalysis` (or its ``to_dict()``, or ``None`` for the raw view);
``run`` is the :class:`goodtrace.reader.Run` whose records feed the per-rank heat map and the
gantt chart. The page shows the goodput headline and buckets, step time with its overhead
split (tags, anomalies, attempts), a rank x step heat map and a gantt chart of every rank's
spans for a step range, drawn with the Apache ECharts build vendored in ``assets/`` (pinned; see
``assets/ECHARTS-VERSION``).

Memory: ``run`` may be a :class:`goodtrace.reader.Run` in memory, or (for any size) a run
directory or the :class:`goodtrace.reader.RunIndex` of :func:`index_for_html`. The run is then
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from goodtrace import schema
from goodtrace.reader import Run, RunIndex, Session, index_run
from goodtrace.renderers.perfetto import (
    DEVICE_CATEGORY,
    StepInterval,
    StepSummary,
    session_clocks,
    step_intervals,
    step_summaries,
    summarise_steps,
)

__all__ = ["ECHARTS_VERSION", "HtmlRenderer", "html_page", "index_for_html", "render_html", "report_data"]

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


class _Heatmap:
    """Rank x step-execution matrices of step time and compute time (ms), binned when wide.

    The columns come from the sessions' step summaries; each session's intervals are added
    as its records are read (in session order, so the sums are those of one pass)."""

    def __init__(self, sessions: Sequence[Session], summaries: Mapping[str, StepSummary]) -> None:
        keys = sorted({(s.attempt, step) for s in sessions for step in summaries[s.session_id].steps})
        self.ranks = sorted({s.rank for s in sessions})
        width = max(1, math.ceil(len(keys) / MAX_HEATMAP_COLUMNS))
        self.column_of = {key: i // width for i, key in enumerate(keys)}
        self.width = width
        columns = []
        for start in range(0, len(keys), width):
            group = keys[start:start + width]
            (a0, s0), (a1, s1) = group[0], group[-1]
            label = f"{s0}" if len(group) == 1 else f"{s0}-{s1}"
            if len({a for a, _ in keys}) > 1:
                label = f"a{a0}:{label}" if a0 == a1 else f"a{a0}:{s0}-a{a1}:{s1}"
            columns.append(label)
        self.columns = columns
        self.row_of = {rank: i for i, rank in enumerate(self.ranks)}
        n = len(columns)
        self.sums = {name: [[0.0] * n for _ in self.ranks] for name in ("step", "compute")}
        self.counts = [[0] * n for _ in self.ranks]
        self.hosts: dict[int, str] = {}
        for session in sessions:
            self.hosts.setdefault(session.rank, str(session.header.get(schema.H_HOST)))

    def add(self, session: Session, intervals: Iterable[StepInterval]) -> None:
        row = self.row_of[session.rank]
        steps, compute, counts = self.sums["step"][row], self.sums["compute"][row], self.counts[row]
        for iv in intervals:
            col = self.column_of[(session.attempt, iv.step)]
            steps[col] += iv.duration_ns / 1e6
            compute[col] += iv.compute_ns / 1e6
            counts[col] += 1

    def result(self) -> dict[str, Any]:
        def matrix(name: str) -> list[list[float | None]]:
            return [[_r(v / c, 3) if c else None for v, c in zip(values, count_row, strict=True)]
                    for values, count_row in zip(self.sums[name], self.counts, strict=True)]

        has_compute = any(v for row in self.sums["compute"] for v in row)
        return {"ranks": self.ranks, "hosts": [self.hosts.get(r, "?") for r in self.ranks],
                "columns": self.columns, "bin": self.width, "step_ms": matrix("step"),
                "compute_ms": matrix("compute") if has_compute else None}


def _choose_gantt_range(
    steps: dict[str, Any], executed: Mapping[int, set[int]],
    gantt_steps: StepRange | None, gantt_attempt: int | None,
) -> tuple[int, int, int] | None:
    """(attempt, first step, last step): the asked range (in the last attempt that ran any of
    it, unless ``gantt_attempt`` says which), else 20 steps around the slowest step that is not
    the first of its attempt, else the last 20 steps. ``executed``: the steps of each attempt."""
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
    numbers = sorted(executed[attempt])
    pos = numbers.index(centre) if centre in numbers else len(numbers) - 1
    lo = max(0, min(pos - GANTT_STEPS // 2, len(numbers) - GANTT_STEPS))
    chosen = numbers[lo:lo + GANTT_STEPS]
    return attempt, chosen[0], chosen[-1]


# One span kept for the gantt: t0, t1 (its session's clock), category, thread, name, step.
_GanttSpan = tuple[int, int, str, Any, str, Any]


@dataclasses.dataclass
class _GanttRow:
    session: Session  # as indexed: header and attempt only
    w0: int
    w1: int
    marks: list[tuple[int, int]]  # (t0, step) of each interval in the range
    spans: list[_GanttSpan] | None  # None: dropped, the row is past MAX_GANTT_ITEMS


class _Gantt:
    """The gantt chart of every rank's spans for the chosen (attempt, first, last) range.

    Sessions come in any order, one at a time; only their spans inside the range are kept.
    Rows are laid out in rank order at the end, up to MAX_GANTT_ITEMS spans: a row that
    certainly lies past that limit (the rows of lower rank already hold more) is dropped at
    once, so memory stays bounded for any range."""

    def __init__(self, chosen: tuple[int, int, int] | None) -> None:
        self.chosen = chosen
        self.rows: dict[int, _GanttRow] = {}
        self.kept = 0
        self._strings: dict[str, str] = {}

    def add(self, indexed: Session, session: Session, intervals: Sequence[StepInterval]) -> None:
        if self.chosen is None or indexed.attempt != self.chosen[0]:
            return
        _, first, last = self.chosen
        ivs = [iv for iv in intervals if iv.step >= first and iv.first_step <= last]
        if not ivs:
            return
        w0, w1 = ivs[0].t0, ivs[-1].t1
        intern = self._strings.setdefault
        spans: list[_GanttSpan] = [
            (int(r[schema.F_T0]), int(r[schema.F_T1]), intern(str(r.get(schema.F_CATEGORY)), str(r.get(schema.F_CATEGORY))),
             r.get(schema.F_THREAD), intern(str(r.get(schema.F_NAME)), str(r.get(schema.F_NAME))), r.get(schema.F_STEP))
            for r in session.records
            if r.get(schema.F_KIND) == schema.SPAN and int(r[schema.F_T1]) > w0 and int(r[schema.F_T0]) < w1
        ]
        self.rows[indexed.rank] = _GanttRow(indexed, w0, w1, [(iv.t0, iv.step) for iv in ivs], spans)
        self.kept += len(spans)
        if self.kept > MAX_GANTT_ITEMS:
            self._drop_rows_past_the_limit()

    def _drop_rows_past_the_limit(self) -> None:
        before = 0
        for rank in sorted(self.rows):
            row = self.rows[rank]
            if before > MAX_GANTT_ITEMS and row.spans is not None:
                self.kept -= len(row.spans)
                row.spans, row.marks = None, []
            before += len(row.spans or ())

    def result(self, to_wall: Mapping[str, Callable[[int], int]]) -> dict[str, Any] | None:
        if self.chosen is None or not self.rows:
            return None
        attempt, first, last = self.chosen
        picked = [self.rows[rank] for rank in sorted(self.rows)]
        origin = min(to_wall[p.session.session_id](p.w0) for p in picked)
        names: dict[str, int] = {}
        categories: dict[str, int] = {}
        items: list[list[float | int]] = []
        rows: list[str] = []
        marks: list[list[Any]] = []
        truncated = False
        for row, picked_row in enumerate(picked):
            if len(items) > MAX_GANTT_ITEMS:
                truncated = True
                break
            session, spans = picked_row.session, picked_row.spans
            assert spans is not None  # dropped rows lie past the limit
            clock = to_wall[session.session_id]
            rows.append(f"rank {session.rank} ({session.header.get(schema.H_HOST)})")
            main_tid = session.header.get("main_tid")
            if row == 0:
                marks = [[_r((clock(t0) - origin) / 1e6), f"step {step}"] for t0, step in picked_row.marks]
            spans.sort(key=lambda r: (r[0], -r[1]))
            stacks: dict[Any, list[int]] = {}
            for t0, t1, category, tid, name, step in spans:
                lane = 2 if category == DEVICE_CATEGORY else (0 if tid == main_tid else 1)
                stack = stacks.setdefault((lane, tid), [])
                while stack and stack[-1] <= t0:
                    stack.pop()
                depth = len(stack)
                stack.append(t1)
                items.append([
                    row, _r((clock(t0) - origin) / 1e6), _r((clock(t1) - origin) / 1e6),
                    names.setdefault(name, len(names)), categories.setdefault(category, len(categories)),
                    step if isinstance(step, int) else -1, min(depth, 5), lane,
                ])
        return {"attempt": attempt, "steps": [first, last], "rows": rows, "names": list(names),
                "categories": list(categories), "items": items, "marks": marks, "truncated": truncated}


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
    chosen = _choose_gantt_range(steps, executed, gantt_steps, gantt_attempt)
    heatmap = _Heatmap(sessions, summaries)
    gantt = _Gantt(chosen)
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

