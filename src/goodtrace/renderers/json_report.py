"""The JSON form of a run's analysis (``goodtrace report --json``): one object, stable keys.

``render_json(analysis)`` returns the text; the object is ``RunAnalysis.to_dict()`` (schema
``goodtrace.report/1``). Numbers are seconds or fractions; bucket values also carry exact ns.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from goodtrace.analysis import RunAnalysis
from goodtrace.read.loaded import LoadedRun
from goodtrace.renderers import write_text


def report_object(analysis: RunAnalysis, *, include_steps: bool = True) -> dict[str, Any]:
    return analysis.to_dict(include_steps=include_steps)


def finite(value: Any) -> Any:
    """``value`` with every float that JSON cannot hold (NaN, infinities) as null. The reader
    lets none reach the numbers; this keeps the output valid JSON whatever a field holds."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def render_json(analysis: RunAnalysis, *, include_steps: bool = True, indent: int | None = 2) -> str:
    report = report_object(analysis, include_steps=include_steps)
    try:
        return json.dumps(report, indent=indent, allow_nan=False)
    except ValueError:  # a non-finite float somewhere: written as null
        return json.dumps(finite(report), indent=indent, allow_nan=False)


@dataclasses.dataclass(frozen=True)
class JsonRenderer:
    """``JsonRenderer(include_steps=False).render(analysis, run)``: the renderer-object form
    (the JSON draws from the analysis alone; ``run`` is the contract's)."""

    include_steps: bool = True
    indent: int | None = 2

    def render(self, analysis: RunAnalysis, run: LoadedRun | None = None) -> str:
        return render_json(analysis, include_steps=self.include_steps, indent=self.indent)

    def write(self, analysis: RunAnalysis, run: LoadedRun | None, path: str | os.PathLike[str]) -> None:
        write_text(path, self.render(analysis, run))
