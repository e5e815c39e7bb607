"""Metric sinks: goodtrace's numbers where users already look (one module per backend).

``tensorboard`` (event files), ``wandb`` (W&B runs, offline too), ``mlflow`` (any tracking
store) and ``prometheus`` (an exporter), each an optional extra imported only when used. They
implement the recording layer's sink protocol (``goodtrace.record.live.sink_hub``): live lines during
training on the sink's own thread, and at the end the run's summary from the analysis
(``goodtrace.analysis.analyze``), which is also what ``goodtrace export`` replays.
"""

from goodtrace.sinks._base import ScalarSink, line_scalars, replay, row_scalars, summary_values

__all__ = ["ScalarSink", "line_scalars", "replay", "row_scalars", "summary_values"]
