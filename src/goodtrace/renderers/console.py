"""The console report (``goodtrace report RUN``): rich tables on a terminal or a pipe.

``render_console(analysis, console)`` prints: the headline goodput, the bucket table (seconds
and % of the job, startup parts beneath startup), attempts, step-time statistics, the slowest
steps with their overhead split, anomalies, the per-rank spread and stragglers, program
goodput (MFU) when FLOPs are known, and warnings. ``rich`` is imported here only.
"""

from __future__ import annotations

import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from goodtrace.analysis import Partition, RunAnalysis
from goodtrace.analysis.over_time import iso
from goodtrace.analysis.steps import seconds_text
from goodtrace.renderers.text import printable

BUCKET_LABELS = {
    "productive": "productive (goodput)",
    "warmup": "warm-up (first step, inferred)",
    "wasted_progress": "wasted progress (re-done steps)",
    "checkpoint_save": "checkpoint save",
    "checkpoint_restore": "checkpoint restore",
    "in_progress": "in progress (running now)",
}


def safe(text: object) -> str:
    """Run text (names, hosts, warnings) for the console: control characters (ESC, OSC, ...)
    shown as escapes, lone surrogates replaced, rich markup escaped. Names are data."""
    return escape(printable(text))


def duration_text(seconds: float) -> str:
    """A duration as the console shows it: "1.23 s", "12.3 s", "4:05.6", "1:02:03.4"."""
    if seconds < 60:
        return seconds_text(seconds) if seconds < 10 else f"{seconds:.1f} s"
    minutes, sec = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{sec:04.1f}" if hours else f"{minutes}:{sec:04.1f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _seconds(value: float | None) -> str:
    return "—" if value is None else duration_text(value)


def bucket_table(partition: Partition, title: str, of: str = "job") -> Table:
    """The partition's buckets (and the startup's parts), each as a share of its total: the
    job's, or a window's (``of``)."""
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("bucket")
    table.add_column("seconds", justify="right")
    table.add_column(f"% of {of}", justify="right")
    total = partition.total_ns
    for name, value in partition.buckets_ns.items():
        if value == 0 and name != "productive":
            continue
        style = "bold green" if name == "productive" else None
        table.add_row(safe(BUCKET_LABELS.get(name, name)), f"{value / 1e9:.3f}", f"{value / total * 100:.2f}%"
                      if total else "—", style=style)
        if name == "startup":
            for part, part_ns in partition.startup_parts_ns.items():
                if part_ns:
                    table.add_row(f"  {safe(part)}", f"{part_ns / 1e9:.3f}", f"{part_ns / total * 100:.2f}%",
                                  style="dim")
    table.add_row("total", f"{total / 1e9:.3f}", "100.00%", style="bold")
    return table


def render_console(analysis: RunAnalysis, console: Console | None = None, *, top: int = 10) -> None:
    console = console or Console()
    p = analysis.partition
    head = Text()
    head.append("goodtrace report ", style="bold")
    head.append(f"{Text.from_markup(safe(analysis.path)).plain}  ")
    of_job = f" in job {analysis.job} of {analysis.jobs}" if analysis.jobs > 1 else ""
    head.append(f"({analysis.records:,} records, {analysis.spread.ranks} rank(s), "
                f"{len(analysis.attempts)} attempt(s){of_job}, form: {analysis.form})", style="dim")
    console.print(head)
    if analysis.jobs > 1:
        console.print(f"[yellow]this run directory holds {analysis.jobs} jobs; showing job {analysis.job} "
                      "(--job N for another)[/yellow]")
    console.print(
        Text.assemble(
            ("Goodput ", "bold"), (f"{p.goodput * 100:.1f}%", "bold green"),
            f" of {duration_text(p.total_ns / 1e9)} job time "
            f"(productive {duration_text(p.seconds('productive'))}, rank {analysis.reference_rank}'s timeline)",
        )
    )
    verdict = analysis.verdict
    console.print(Text.assemble(("Verdict: ", "bold"), (printable(verdict.text), "bold yellow"),
                                f"; {printable(verdict.evidence)}"), highlight=False)  # names in it are data
    console.print()
    console.print(bucket_table(p, "Where the time went"))
    console.print(f"[dim]host overhead: {safe('; '.join(analysis.host_overhead.sentences()))}[/dim]")
    _worst_periods(console, analysis)
    if analysis.window is not None:
        w = analysis.window
        start = (w.start_wall_ns - p.start_wall_ns) / 1e9
        console.print()
        console.print(bucket_table(w, f"Window {start:.1f} s - {start + w.total_ns / 1e9:.1f} s: "
                                      f"goodput {w.goodput * 100:.1f}%", of="window"))
    if analysis.time_range is not None:
        a, b = analysis.time_range
        console.print(f"[dim]time range {iso(a)} to {iso(b)} (--since/--until): the step table, slowest steps, "
                      "anomalies and goodput over time keep to it; the rest is the whole job[/dim]")
    if analysis.rolling:
        table = Table(title="Rolling goodput", title_justify="left", show_edge=False)
        for column in ("from", "to", "goodput"):
            table.add_column(column, justify="right")
        for r in analysis.rolling:
            table.add_row(duration_text(r.start_s), duration_text(r.end_s), _pct(r.goodput))
        console.print()
        console.print(table)
    console.print()
    _attempts(console, analysis)
    console.print()
    _steps(console, analysis, top)
    _ranks(console, analysis)
    _hangs(console, analysis)
    _events(console, analysis, top)
    _program(console, analysis)
    if analysis.warnings:
        console.print()
        for warning in analysis.warnings:
            console.print(f"[yellow]warning:[/yellow] {safe(warning)}", highlight=False)


def largest_losses(analysis: RunAnalysis, n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` buckets that lost the most time (name, ns), largest first: the buckets of the
    verdict's loss groups (teardown and a running attempt's tail are no loss there either)."""
    lost = [(name, ns) for loss in analysis.verdict.losses for name, ns in loss.buckets.items() if ns > 0]
    return sorted(lost, key=lambda item: -item[1])[:n]


def render_brief(analysis: RunAnalysis, console: Console | None = None) -> None:
    """``goodtrace report RUN --brief``: the goodput, the verdict and the three largest losses,
    each a line."""
    console = console or Console()
    p = analysis.partition
    attempts = f", {len(analysis.attempts)} attempts" if len(analysis.attempts) > 1 else ""
    console.print(Text.assemble(("Goodput ", "bold"), (f"{p.goodput * 100:.1f}%", "bold green"),
                                f" of {duration_text(p.total_ns / 1e9)} job time ({printable(analysis.path)}, "
                                f"rank {analysis.reference_rank}'s timeline{attempts})"), highlight=False)
    verdict = analysis.verdict
    console.print(Text.assemble(("Verdict: ", "bold"), (printable(verdict.text), "bold yellow"),
                                f"; {printable(verdict.evidence)}"), highlight=False)
    losses = largest_losses(analysis)
    if not losses:
        console.print(Text.assemble(("Largest losses: ", "bold"), "none"), highlight=False)
        return
    total = p.total_ns
    items = [f"{printable(BUCKET_LABELS.get(name, name))} {duration_text(ns / 1e9)} "
             f"({ns / total * 100:.1f}%)" if total else printable(name) for name, ns in losses]
    console.print(Text.assemble(("Largest losses: ", "bold"), ", ".join(items)), highlight=False)


def _clock(wall_ns: int, with_date: bool) -> str:
    """A UTC wall time as ``03:00`` (``03:00:20`` off the minute; ``11-24 03:00`` with the date)."""
    moment = datetime.datetime.fromtimestamp(wall_ns // 1_000_000_000, tz=datetime.timezone.utc)
    text = moment.strftime("%H:%M" if moment.second == 0 else "%H:%M:%S")
    return moment.strftime("%m-%d ") + text if with_date else text


def _period_name(every_s: float) -> str:
    names = {3600.0: "hours", 86_400.0: "days", 7 * 86_400.0: "weeks"}
    return names.get(every_s, f"periods of {_every(every_s)}")


def _every(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def worst_periods_line(analysis: RunAnalysis) -> str | None:
    """``worst hours (UTC): 03:00-04:00 41.0% (checkpoint_save 30.0%), ...`` or None."""
    over = analysis.over_time
    if over is None or not over.worst:
        return None
    periods = over.periods
    dates = {datetime.datetime.fromtimestamp(p.start_wall_ns // 10**9, tz=datetime.timezone.utc).date()
             for p in periods}
    with_date = len(dates) > 1
    items = []
    for k in over.worst:
        p = periods[k]
        text = f"{_clock(p.start_wall_ns, with_date)}-{_clock(p.end_wall_ns, False)} {_pct(p.goodput)}"
        loss = p.top_loss()
        if loss is not None:
            name, ns = loss
            text += f" ({name} {_pct(ns / p.length_ns)})"
        items.append(text)
    return f"worst {_period_name(over.every_s)} (UTC): " + ", ".join(items)


def _worst_periods(console: Console, analysis: RunAnalysis) -> None:
    line = worst_periods_line(analysis)
    if line is not None:
        title, rest = line.split(": ", 1)
        console.print(Text.assemble((title, "bold"), ": ", printable(rest)), highlight=False)


def _events(console: Console, analysis: RunAnalysis, top: int) -> None:
    if not analysis.events:
        return
    console.print()
    shown = analysis.events[: max(top, 20)]
    table = Table(title=f"Events ({analysis.events_total}; first {len(shown)})", title_justify="left", show_edge=False)
    for column in ("at", "rank", "attempt", "step", "event"):
        table.add_column(column, justify="left" if column == "event" else "right")
    for e in shown:
        attrs = "" if not e.attrs else " " + ", ".join(f"{k}={v}" for k, v in list(e.attrs.items())[:4])
        table.add_row(f"+{duration_text(max(0.0, e.time_s))}", str(e.rank), str(e.attempt),
                      "—" if e.step is None else str(e.step), safe((e.name + attrs)[:200]))
    console.print(table)


def _attempts(console: Console, analysis: RunAnalysis) -> None:
    table = Table(title="Attempts", title_justify="left", show_edge=False)
    for column in ("#", "started", "duration", "ended", "steps", "ranks"):
        table.add_column(column, justify="right" if column != "ended" else "left")
    origin = analysis.partition.start_wall_ns
    for a in analysis.attempts:
        steps = "—" if a.first_step is None else f"{a.first_step}-{a.last_step}"
        style = {"crashed": "red", "killed": "red", "lost": "red", "preempted": "yellow", "running": "cyan"}.get(a.ended)
        table.add_row(str(a.index), f"+{duration_text((a.start_wall - origin) / 1e9)}", duration_text(a.duration_ns / 1e9),
                      safe(a.ending.text), steps, f"{a.ranks}/{a.world}", style=style)
    console.print(table)
    for r in analysis.rewinds:  # rollbacks inside an attempt (the analysis words them)
        console.print(f"  attempt {r.attempt}: {safe(r.text())}", style="yellow", highlight=False)


def _steps(console: Console, analysis: RunAnalysis, top: int) -> None:
    s = analysis.step_stats
    if s.count == 0:
        console.print("[yellow]no steps recorded[/yellow]")
        return
    console.print(
        f"[bold]Step time[/bold] over {s.count} step executions: mean {duration_text(s.mean_s)}, "
        f"median {duration_text(s.median_s)}, p90 {duration_text(s.p90_s)}, p99 {duration_text(s.p99_s)}, "
        f"max {duration_text(s.max_s)}; ideal (median productive) {_seconds(s.ideal_s)}",
        highlight=False,
    )
    if s.shared_steps or s.host_timed_steps or s.repeated_steps or s.decreasing_steps:
        console.print(f"[dim]{s.shared_steps} step(s) are interval averages (sparse completion), "
                      f"{s.host_timed_steps} host-timed, {s.repeated_steps} repeated, "
                      f"{s.decreasing_steps} going back[/dim]")
    table = Table(title=f"Slowest steps (top {top})", title_justify="left", show_edge=False)
    for column in ("step", "attempt", "step time", "= productive + overhead", "tags"):
        table.add_column(column, justify="right" if column in ("step", "attempt", "step time") else "left")
    for r in analysis.slowest_steps(top):
        flags = (" (avg)" if r.shared > 1 else "") + (" (host-timed)" if r.host_timed else "")
        flags += " (repeated)" if r.repeated else ""
        table.add_row(str(r.step), str(r.attempt), duration_text(r.step_time_s) + flags,
                      safe(r.explain().split("= ", 1)[1]),
                      safe(", ".join(r.tags)) + ("" if r.counted else " re-done later"))
    console.print(table)
    if analysis.anomalies:
        table = Table(title=f"Anomalies: productive time above {_seconds(analysis.anomaly_threshold_s)}",
                      title_justify="left", show_edge=False)
        for column in ("step", "attempt", "productive", "overlapping"):
            table.add_column(column)
        for a in analysis.anomalies[:top]:
            table.add_row(str(a.step), str(a.attempt), duration_text(a.productive_s), safe(", ".join(a.overlapped)) or "—")
        console.print()
        console.print(table)


def _ranks(console: Console, analysis: RunAnalysis) -> None:
    spread = analysis.spread
    if spread.ranks > 1:
        console.print()
        console.print(
            f"[bold]Per-rank spread[/bold] ({spread.ranks} ranks, {spread.analysed} analysed): goodput "
            f"{_pct(spread.goodput_min)} - {_pct(spread.goodput_max)} (median {_pct(spread.goodput_median)}); "
            f"median step time {_seconds(spread.step_time_median_min_s)} - {_seconds(spread.step_time_median_max_s)}",
            highlight=False,
        )
    for s in analysis.stragglers:
        console.print(f"[red]straggler:[/red] rank {s.rank} on {safe(s.host)}: {safe(s.reason)}", highlight=False)
    for d in analysis.slowdowns:
        console.print(f"[red]slowdown:[/red] rank {d.rank} on {safe(d.host)}: {safe(d.reason)}", highlight=False)


def _hangs(console: Console, analysis: RunAnalysis, frames: int = 12) -> None:
    """Each attempt's first rank that stopped (analysis.hangs): its stack, innermost last, and
    where the others wait: one of them (a rank waiting in a collective first), with its stack."""
    for h in analysis.hangs:
        if not h.first:
            continue
        console.print()
        console.print(f"[red]hang:[/red] rank {h.rank} on {safe(h.host)} stopped first, at step {h.step}, in "
                      f"{safe(h.where)}, {h.silent_s or 0:.1f} s without progress (bound {h.bound_s or 0:.1f} s); "
                      f"its stack (innermost last):", highlight=False)
        for line in h.stack.rstrip("\n").splitlines()[-2 * frames:] or ["  (no stack recorded)"]:
            console.print(printable(line), highlight=False, markup=False, soft_wrap=True)
        if h.native:
            console.print("[dim]native frames (py-spy):[/dim]")
            for line in h.native.splitlines()[: frames + 1]:
                console.print(printable(line), highlight=False, markup=False, soft_wrap=True)
        others = [o for o in analysis.hangs if o.attempt == h.attempt and not o.first]
        if others:  # where the others wait: the first of them, with its stack
            w = sorted(others, key=lambda o: (not o.waiting, o.rank))[0]
            more = f" (and {len(others) - 1} more rank(s))" if len(others) > 1 else ""
            console.print(f"[yellow]waiting:[/yellow] rank {w.rank} on {safe(w.host)}{more}, at step {w.step}, in "
                          f"{safe(w.where)}; its stack (innermost last):", highlight=False)
            for line in w.stack.rstrip("\n").splitlines()[-2 * frames:] or ["  (no stack recorded)"]:
                console.print(printable(line), highlight=False, markup=False, soft_wrap=True)


def _program(console: Console, analysis: RunAnalysis) -> None:
    g = analysis.program
    console.print()
    parts: list[Any] = [f"runtime goodput {_pct(g.runtime_goodput)}"]
    if g.scheduling_goodput is not None:
        parts.append(f"scheduling goodput {_pct(g.scheduling_goodput)}")
    else:
        parts.append("scheduling goodput unknown (set GOODTRACE_SUBMIT_TIME)")
    if g.mfu is not None:
        parts.append(f"program goodput (MFU) {_pct(g.mfu)} on {g.devices} device(s)")
        parts.append(f"ML productivity goodput {_pct(g.ml_productivity_goodput)}")
    else:
        missing = [] if g.flops_per_step is not None else ["--flops-per-step"]
        if g.peak_flops_per_device is None:
            missing.append("--accelerator or --peak-tflops")
        parts.append(f"MFU: pass {' and '.join(missing)}" if missing else "MFU: unknown")
    console.print("[bold]Goodput product[/bold]: " + "; ".join(parts), highlight=False)
