"""The view of ``goodtrace watch``: goodput so far, each rank's last step and its age, hang and
slowdown alarms, the worst recent steps (rich). Draws from :class:`goodtrace.analysis.watching.WatchState`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from goodtrace.analysis.attempts import LOST
from goodtrace.analysis.watching import HANGING, RECENT_STEPS, WatchState
from goodtrace.renderers.console import duration_text, safe
from goodtrace.renderers.text import printable

MAX_ROWS = 32  # ranks shown in the table (more: those that most need a look, and a line for the others)
MAX_SLOWDOWNS = 5  # slowdown lines shown (more: how many)


def render_watch(state: WatchState, now_wall: int, run: str, rows: int = MAX_ROWS) -> Any:
    """One frame of the view, at wall-clock ``now_wall`` (ns), with at most ``rows`` ranks in its table."""
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
    slowdowns = state.slowdowns()
    for slowdown in slowdowns[:MAX_SLOWDOWNS]:
        parts.append(Text(f"slowdown: {slowdown}", style="red"))
    if len(slowdowns) > MAX_SLOWDOWNS:
        parts.append(Text(f"slowdown: {len(slowdowns) - MAX_SLOWDOWNS} more ranks", style="red"))
    if state.history:  # the ranks' present is shown; their slowdowns wait for their recent step times
        read = sum(state.history.values()) / len(state.history)
        parts.append(Text(f"slowdowns: reading the last {RECENT_STEPS:,} step times of {len(state.history)} "
                          f"rank(s): {100 * read:.0f}%", style="dim"))
    if state.problems:
        latest = next(reversed(state.problems))
        parts.append(Text(f"{state.problem_count} problem(s) reading the run's files; the latest: {printable(latest)}",
                          style="yellow"))
    shown, others = state.rank_rows(now_wall, rows)
    title = "Ranks" if not others else (
        f"Ranks: the {len(shown)} of {len(shown) + len(others)} that most need a look "
        "(lost, hung, furthest behind, longest unseen)")
    table = Table(title=title, title_justify="left", show_edge=False)
    for column in ("rank", "host", "last step", "seen", "state"):
        table.add_column(column, justify="left" if column in ("host", "state") else "right")
    for r, status in shown:
        if status is None:  # its past so far: what it shows is not its present
            read = state.reading.get(r.session, 0.0)
            table.add_row(str(r.rank), safe(r.host), "—", "—", f"reading its records: {100 * read:.0f}%")
            continue
        table.add_row(str(r.rank), safe(r.host), "—" if r.last_step is None else str(r.last_step),
                      f"{duration_text(max(0.0, (now_wall - r.last_seen_wall) / 1e9))} ago",
                      Text(status.text, style="red" if status.kind in (LOST, HANGING) else ""))
    parts.append(table)
    if others:
        counts = Counter(others)
        parts.append(Text(f"and {len(others)} more: " + ", ".join(
            f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), style="dim"))
    worst = state.worst_recent()
    if worst:
        slow = Table(title="Worst recent steps", title_justify="left", show_edge=False)
        for column in ("rank", "step", "seconds"):
            slow.add_column(column, justify="right")
        for rank, step, seconds in worst:
            slow.add_row(str(rank), str(step), f"{seconds:.3f}")
        parts.append(slow)
    return Group(*parts)

