"""``goodtrace diff A B``: two runs side by side (or two attempts of one run, ``--attempts K L``,
or two step ranges of one, ``--steps A:B C:D``): goodput, each bucket, step time, the overhead
of each category per step, throughput and MFU, and the largest change in words.

Every number is a side's report analysis (``report``'s own path,
:func:`goodtrace.cli.commands.report.analysed`): an attempt is the time range from its start to
its end (``--since``/``--until`` at those instants), a step range is ``--since step:A --until
step:B``; a side's buckets are then the time range's, its step figures those of the step
executions in it. Nothing here applies a rule of its own: it subtracts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

HELP = "compare two runs, two attempts (--attempts K L) or two step ranges (--steps A:B C:D) side by side"

# report's options that choose how a run is analysed, and so each side's numbers
_ANALYSIS_OPTIONS = ("job", "ideal_step", "data_rule", "flops_per_step", "accelerator", "peak_tflops",
                     "devices_per_rank", "workers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="one or two run directories (path or fsspec URL), or directories of torchtitan's "
                             "structured logs: two runs, or one run with --attempts or --steps")
    parser.add_argument("--attempts", nargs=2, type=int, metavar=("K", "L"),
                        help="compare attempt K with attempt L (of the one run, or K of the first and L of the "
                             "second; 0 = the first launch)")
    parser.add_argument("--steps", nargs=2, metavar=("A:B", "C:D"),
                        help="compare steps A to B with steps C to D, both ends included (of the one run, or "
                             "A:B of the first and C:D of the second; also A: or :B)")
    parser.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    from goodtrace.cli.commands.report import add_analysis_arguments, add_workers_argument

    add_analysis_arguments(parser)
    add_workers_argument(parser)


def run(args: argparse.Namespace) -> int:
    from goodtrace.cli import CommandError

    compared = compare(args)
    if args.json:
        from goodtrace.renderers.json_report import finite
        from goodtrace.renderers.json_text import dumps_indented

        try:
            print(dumps_indented(finite(compared), 2))
        except (TypeError, ValueError) as exc:  # pragma: no cover - the object is numbers and strings
            raise CommandError(f"cannot write the comparison as JSON: {exc}") from None
        return 0
    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "120"))
    render(compared, Console(width=width, highlight=False))
    return 0


def _sides(args: argparse.Namespace) -> list[tuple[str, dict[str, Any], str]]:
    """Each side: its run, the selection (``attempt`` or ``steps``) and its label."""
    from goodtrace.cli import CommandError
    from goodtrace.cli.ranges import parse_steps

    if len(args.runs) > 2:
        raise CommandError(f"diff compares two sides: give two runs, or one run with --attempts or --steps "
                           f"(got {len(args.runs)} runs)")
    if args.attempts and args.steps:
        raise CommandError("--attempts and --steps both choose what is compared: give one")
    if len(args.runs) == 1 and not (args.attempts or args.steps):
        raise CommandError("one run: give --attempts K L or --steps A:B C:D to compare two parts of it "
                           "(or give two runs)")
    paths = args.runs if len(args.runs) == 2 else args.runs * 2
    selections: list[dict[str, Any]] = [{}, {}]
    if args.attempts:
        selections = [{"attempt": k} for k in args.attempts]
    if args.steps:
        for selection, text in zip(selections, args.steps, strict=True):
            try:
                first, last = parse_steps(text)
            except ValueError as exc:
                raise CommandError(f"--steps: {exc}") from None
            selection["steps"] = (first, last)
    out = []
    for path, selection in zip(paths, selections, strict=True):
        label = path
        if "attempt" in selection:
            label += f" attempt {selection['attempt']}"
        if "steps" in selection:
            label += " steps " + ":".join("" if v is None else str(v) for v in selection["steps"])
        out.append((path, selection, label))
    return out


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """The comparison's object (what ``--json`` prints): each side, the changes, and the largest
    in words."""
    from goodtrace.cli import CommandError
    from goodtrace.cli.commands.report import analysed, arguments

    options = {name: getattr(args, name) for name in _ANALYSIS_OPTIONS}
    whole: dict[str, Any] = {}  # each run's whole analysis, when an attempt is asked for
    sides = []
    for path, selection, label in _sides(args):
        values: dict[str, Any] = {}
        if "steps" in selection:
            first, last = selection["steps"]
            values = {"since": None if first is None else f"step:{first}",
                      "until": None if last is None else f"step:{last}"}
        if "attempt" in selection:
            from goodtrace.analysis.time_range import RangeEdge

            if path not in whole:
                whole[path] = analysed(arguments(path, **options))
            attempts = whole[path].attempts_by_index()
            attempt = attempts.get(selection["attempt"])
            if attempt is None:
                raise CommandError(f"{path}: the run has no attempt {selection['attempt']} "
                                   f"(it has {sorted(attempts)})")
            values = {"since": RangeEdge(wall_ns=attempt.start_wall, text=f"attempt {attempt.index}'s start"),
                      "until": RangeEdge(wall_ns=attempt.end_wall, text=f"attempt {attempt.index}'s end")}
        analysis = analysed(arguments(path, **options, **values))
        sides.append(side_of(analysis, label, selection))
    a, b = sides
    changes = changes_of(a, b)
    return {"schema": "goodtrace.diff/1", "a": a, "b": b, "change": changes,
            "largest_change": largest_change(a, b, changes), "sentences": sentences(a, b, changes)}


def side_of(analysis: Any, label: str, selection: dict[str, Any]) -> dict[str, Any]:
    """One side's figures, each taken from its analysis: the partition of its time (the time
    range's when it has one), the step statistics and step table of its step executions, the
    program's MFU and the verdict (a whole job's figures: for a whole run only)."""
    part = analysis.window if analysis.time_range is not None else analysis.partition
    stats = analysis.step_stats
    per_step: dict[str, float] = {}
    if stats.count:
        columns = analysis.steps.columns()
        per_step["compute"] = float(columns.productive_s.mean())
        for name, values in columns.overhead_s.items():
            per_step[name] = float(values.mean())
    whole = analysis.time_range is None
    steps = None
    if "steps" in selection:
        steps = ":".join("" if v is None else str(v) for v in selection["steps"])
    return {
        "label": label,
        "path": analysis.path,
        "attempt": selection.get("attempt"),
        "steps": steps,
        "time_s": part.total_ns / 1e9,
        "goodput": part.goodput,
        "verdict": analysis.verdict.line if whole else None,  # the job's: for a whole run only
        "buckets": {name: {"seconds": ns / 1e9, "fraction": part.fraction(name)}
                    for name, ns in part.buckets_ns.items() if ns or name == "productive"},
        "step_time": {"count": stats.count, "mean_s": stats.mean_s if stats.count else None,
                      "median_s": stats.median_s if stats.count else None,
                      "p90_s": stats.p90_s if stats.count else None},
        "per_step_s": per_step,
        "steps_per_s": 1.0 / stats.mean_s if stats.count and stats.mean_s > 0 else None,
        "mfu": analysis.program.mfu if whole else None,
    }


def _minus(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _ratio(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None or not a else b / a - 1.0


def changes_of(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """B minus A for every figure (``pct``: B / A - 1)."""
    buckets = list(dict.fromkeys([*a["buckets"], *b["buckets"]]))
    zero = {"seconds": 0.0, "fraction": 0.0}
    per_step = list(dict.fromkeys([*a["per_step_s"], *b["per_step_s"]]))
    both = bool(a["step_time"]["count"] and b["step_time"]["count"])
    return {
        "goodput": b["goodput"] - a["goodput"],
        "buckets": {name: {"seconds": b["buckets"].get(name, zero)["seconds"] - a["buckets"].get(name, zero)["seconds"],
                           "fraction": b["buckets"].get(name, zero)["fraction"] - a["buckets"].get(name, zero)["fraction"]}
                    for name in buckets},
        "step_time": {key: {"s": _minus(b["step_time"][key], a["step_time"][key]),
                            "pct": _ratio(b["step_time"][key], a["step_time"][key])}
                      for key in ("mean_s", "median_s", "p90_s")},
        "per_step_s": {name: b["per_step_s"].get(name, 0.0) - a["per_step_s"].get(name, 0.0) for name in per_step}
        if both else {},
        "steps_per_s_pct": _ratio(b["steps_per_s"], a["steps_per_s"]),
        "mfu": _minus(b["mfu"], a["mfu"]),
    }


def signed_duration(seconds: float) -> str:
    """``+9.1 ms``, ``-1.20 s``, ``+40 us``: a change of a duration in units that fit (``0``
    below half a microsecond)."""
    size = abs(seconds)
    if size < 5e-7:
        return "0"
    if size >= 1:
        return f"{seconds:+.2f} s"
    if size >= 1e-3:
        return f"{seconds * 1e3:+.1f} ms"
    return f"{seconds * 1e6:+.0f} us"


def _pct_text(fraction: float) -> str:
    value = fraction * 100
    return f"{value:+.0f} %" if abs(value) >= 10 else f"{value:+.1f} %"


def _step_sentence(a: dict[str, Any], b: dict[str, Any], changes: dict[str, Any]) -> tuple[str, float] | None:
    """``step time +12 %: data +9.1 ms per step, compute unchanged`` and the relative change; the
    parts named are the per-step figures that moved most (at least a tenth of the change)."""
    if not changes["per_step_s"]:
        return None
    mean_a, mean_b = a["step_time"]["mean_s"], b["step_time"]["mean_s"]
    if not mean_a:
        return None
    pct = mean_b / mean_a - 1.0
    if abs(pct) < 0.01:
        return f"step time unchanged ({_pct_text(pct)}, mean {signed_duration(mean_b - mean_a)})", pct
    moved = sorted(changes["per_step_s"].items(), key=lambda item: -abs(item[1]))
    named = [(name, d) for name, d in moved if abs(d) >= 0.1 * abs(mean_b - mean_a)][:3] or moved[:1]
    parts = [f"{name} {signed_duration(d)} per step" for name, d in named]
    compute = changes["per_step_s"].get("compute", 0.0)
    if "compute" not in dict(named) and abs(compute) < 0.01 * mean_a:
        parts.append("compute unchanged")
    return f"step time {_pct_text(pct)}: " + ", ".join(parts), pct


def _goodput_sentence(a: dict[str, Any], b: dict[str, Any], changes: dict[str, Any]) -> tuple[str, float]:
    """``goodput 40.1% -> 52.3% (+12.2 points): startup -8.1 points, ...`` and the relative change."""
    ga, gb = a["goodput"], b["goodput"]
    rel = (gb - ga) / ga if ga else (math.inf if gb else 0.0)
    if abs(gb - ga) < 0.001:
        return f"goodput unchanged ({gb * 100:.1f}%)", rel
    moved = sorted(((name, c["fraction"]) for name, c in changes["buckets"].items() if name != "productive"),
                   key=lambda item: -abs(item[1]))
    parts = [f"{name} {d * 100:+.1f} points" for name, d in moved[:2] if abs(d) >= 0.005]
    head = f"goodput {ga * 100:.1f}% -> {gb * 100:.1f}% ({(gb - ga) * 100:+.1f} points)"
    return head + (": " + ", ".join(parts) if parts else ""), rel


def sentences(a: dict[str, Any], b: dict[str, Any], changes: dict[str, Any]) -> list[str]:
    """The changes in words: step time, then goodput."""
    step = _step_sentence(a, b, changes)
    return [*([step[0]] if step else []), _goodput_sentence(a, b, changes)[0]]


def largest_change(a: dict[str, Any], b: dict[str, Any], changes: dict[str, Any]) -> str:
    """The one of :func:`sentences` whose figure moved most, relative to A's."""
    step = _step_sentence(a, b, changes)
    goodput = _goodput_sentence(a, b, changes)
    if step is not None and abs(step[1]) >= abs(goodput[1]):
        return step[0]
    return goodput[0]


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _points(value: float | None) -> str:
    if value is None:
        return "—"
    return "0.0 pts" if abs(value) < 0.0005 else f"{value * 100:+.1f} pts"


def render(compared: dict[str, Any], console: Any) -> None:
    """The console form: the sides, the largest change, the buckets and the step figures."""
    from rich.table import Table
    from rich.text import Text

    from goodtrace.renderers.console import BUCKET_LABELS, duration_text, safe
    from goodtrace.renderers.text import printable

    a, b, change = compared["a"], compared["b"], compared["change"]
    console.print(Text.assemble(("goodtrace diff ", "bold"), ("A ", "bold"), printable(a["label"]),
                                ("  B ", "bold"), printable(b["label"])), highlight=False)
    console.print(Text.assemble(("Largest change: ", "bold"), (printable(compared["largest_change"]), "bold yellow")),
                  highlight=False)
    for sentence in compared["sentences"]:
        if sentence != compared["largest_change"]:
            console.print(f"[dim]also: {safe(sentence)}[/dim]", highlight=False)
    console.print()
    table = Table(title="Where the time went (share of each side's time)", title_justify="left", show_edge=False)
    for column in ("", "A", "B", "change"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("time", duration_text(a["time_s"]), duration_text(b["time_s"]),
                  signed_duration(b["time_s"] - a["time_s"]))
    table.add_row("goodput", _pct(a["goodput"]), _pct(b["goodput"]), _points(change["goodput"]), style="bold green")
    zero = {"seconds": 0.0, "fraction": 0.0}
    for name, delta in change["buckets"].items():
        if name == "productive":
            continue
        sa, sb = a["buckets"].get(name, zero), b["buckets"].get(name, zero)
        table.add_row(safe(BUCKET_LABELS.get(name, name)), f"{_pct(sa['fraction'])} ({sa['seconds']:.3f} s)",
                      f"{_pct(sb['fraction'])} ({sb['seconds']:.3f} s)", _points(delta["fraction"]))
    console.print(table)
    console.print()
    table = Table(title="Steps", title_justify="left", show_edge=False)
    for column in ("", "A", "B", "change"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("step executions", str(a["step_time"]["count"]), str(b["step_time"]["count"]), "")
    for key, label in (("mean_s", "step time, mean"), ("median_s", "step time, median"), ("p90_s", "step time, p90")):
        va, vb, d = a["step_time"][key], b["step_time"][key], change["step_time"][key]
        table.add_row(label, "—" if va is None else duration_text(va), "—" if vb is None else duration_text(vb),
                      "—" if d["s"] is None else f"{signed_duration(d['s'])} ({_pct_text(d['pct'] or 0.0)})")
    for name, delta in change["per_step_s"].items():
        va, vb = a["per_step_s"].get(name, 0.0), b["per_step_s"].get(name, 0.0)
        table.add_row(f"per step: {safe(name)}", duration_text(va), duration_text(vb), signed_duration(delta))
    sa, sb = a["steps_per_s"], b["steps_per_s"]
    table.add_row("throughput (steps/s)", "—" if sa is None else f"{sa:.3g}", "—" if sb is None else f"{sb:.3g}",
                  "—" if change["steps_per_s_pct"] is None else _pct_text(change["steps_per_s_pct"]))
    if a["mfu"] is not None or b["mfu"] is not None:
        table.add_row("MFU", _pct(a["mfu"]), _pct(b["mfu"]), _points(change["mfu"]))
    console.print(table)
