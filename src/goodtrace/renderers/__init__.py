"""Renderers: turn a run's analysis into something a person looks at, one format per module,
imported lazily by the commands that use them.

One contract, :class:`Renderer`: a renderer is an object built with its options
(``ConsoleRenderer(top=10)``, ``JsonRenderer()``, ``HtmlRenderer(gantt_steps=...)``,
``PerfettoRenderer(selection)``); ``render(analysis, run)`` returns the whole output as text
and ``write(analysis, run, path)`` writes it to a file (what it returns is the format's own
account of the file, or None). Every renderer takes the same :class:`RunAnalysis` and the
``LoadedRun`` it was computed from: the HTML report's gantt chart and the Perfetto trace read
their raw spans from the run; the console and JSON draw from the analysis alone.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from goodtrace.analysis import RunAnalysis
    from goodtrace.read.loaded import LoadedRun

__all__ = ["Renderer", "write_text"]


@runtime_checkable
class Renderer(Protocol):
    def render(self, analysis: RunAnalysis, run: LoadedRun) -> str:
        """The whole output as text."""
        ...

    def write(self, analysis: RunAnalysis, run: LoadedRun, path: str | os.PathLike[str]) -> object:
        """Write the output to ``path``."""
        ...


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """``text`` into the file ``path`` (UTF-8): the ``write`` of the renderers whose output is one string."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
