"""The JSON form of a run's analysis (``goodtrace report --json``): one object, stable keys.

``render_json(analysis)`` returns the text; the object is ``RunAnalysis.to_dict()`` (schema
``goodtrace.report/1``). Numbers are seconds or fractions; bucket values also carry exact ns.
"""

from __future__ import annotations

import json
from typing import Any

from goodtrace.analysis import RunAnalysis


def report_object(analysis: RunAnalysis, *, include_steps: bool = True) -> dict[str, Any]:
    return analysis.to_dict(include_steps=include_steps)


def render_json(analysis: RunAnalysis, *, include_steps: bool = True, indent: int | None = 2) -> str:
    return json.dumps(report_object(analysis, include_steps=include_steps), indent=indent, allow_nan=False)
