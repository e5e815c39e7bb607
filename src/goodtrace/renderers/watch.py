"""The view of ``goodtrace watch``: goodput so far, each rank's last step and its age, hang and
slowdown alarms, the worst recent steps (rich). Draws from :class:`goodtrace.analysis.watching.WatchState`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from goodtrace.analysis.watching import WatchState
from goodtrace.renderers.console import safe
from goodtrace.renderers.text import printable


def render_watch(state: WatchState, now_wall: int, run: str) -> Any:
    """One frame of the view, at wall-clock ``now_wall`` (ns)."""
    parts: list[Any] = []
    head = Text()
    head.append("goodtrace watch ", style="bold")
    head.append(f"{Text.from_markup(safe(run)).plain}  ")
    history = state.history_read()
    if history is not None:  # a long run: its goodput is known once the shown rank is read from its start
        head.append("goodput —", style="bold green")
        head.append(f" (reading the lowest rank's records of this attempt: {100 * history:.0f}%)", style="dim")
    else:
        goodput = state.goodput(now_wall)
        head.append("goodput " + ("—" if goodput is None else f"{100 * goodput:.1f}%"), style="bold green")
        head.append(" (this attempt so far, lowest rank, the report's rules)", style="dim")
    parts.append(head)
    hang = state.hang_line()
    if hang is not None:
        parts.append(Text(f"hang: {hang}", style="bold red"))
    for slowdown in state.slowdowns():
        parts.append(Text(f"slowdown: {slowdown}", style="red"))
    if state.problems:
        latest = next(reversed(state.problems))
        parts.append(Text(f"{state.problem_count} problem(s) reading the run's files; the latest: {printable(latest)}",
                          style="yellow"))
    table = Table(title="Ranks", title_justify="left", show_edge=False)
    for column in ("rank", "host", "last step", "seen", "state"):
        table.add_column(column, justify="left" if column in ("host", "state") else "right")
    for r in state.ranks():
        read = state.reading.get(r.session)
        if read is not None:  # its past so far: what it shows is not its present
            table.add_row(str(r.rank), safe(r.host), "—", "—", f"reading its records: {100 * read:.0f}%")
            continue
        age = max(0.0, (now_wall - r.last_seen_wall) / 1e9) if r.last_seen_wall else None
        status = (f"finished ({r.finished})" if r.finished else "hung" if r.hang is not None else "running")
        table.add_row(str(r.rank), safe(r.host), "—" if r.last_step is None else str(r.last_step),
                      "—" if age is None else f"{age:.1f} s ago", status)
    parts.append(table)
    worst = state.worst_recent()
    if worst:
        slow = Table(title="Worst recent steps", title_justify="left", show_edge=False)
        for column in ("rank", "step", "seconds"):
            slow.add_column(column, justify="right")
        for rank, step, seconds in worst:
            slow.add_row(str(rank), str(step), f"{seconds:.3f}")
        parts.append(slow)
    return Group(*parts)
