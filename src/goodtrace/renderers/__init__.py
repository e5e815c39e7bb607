"""Renderers: turn a run's analysis into something a person looks at, one format per module,
imported lazily by the commands that use them: ``console`` (``render_console``), ``json_report``
(``render_json``, ``write_json``), ``html`` (``render_html``), ``perfetto`` (``PerfettoRenderer``,
the trace), ``watch`` (the live view). Each takes the :class:`~goodtrace.analysis.RunAnalysis`;
the HTML report's gantt chart and the Perfetto trace also read their raw spans from the
``LoadedRun`` it was computed from.
"""
