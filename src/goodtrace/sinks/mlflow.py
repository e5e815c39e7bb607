"""MLflow: metrics through ``mlflow.MlflowClient`` (``pip install 'goodtrace[mlflow]'``).

Logs into the program's active MLflow run when there is one, else creates a run (named after
the run directory) in experiment ``goodtrace`` of ``tracking_uri`` (any MLflow store: a
server URL, ``sqlite:///mlflow.db``, ...; default: MLflow's own ``MLFLOW_TRACKING_URI``) and
ends it at the end. The summary goes in as metrics at the last step, attempts as tags.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from goodtrace.record.live.sinks import SinkRun
from goodtrace.sinks._base import ScalarSink, rank_suffix

_BATCH = 1000  # MLflow's limit of metrics per log_batch call


def _metric_key(name: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . space /``: nothing to change in ours."""
    return name


class MlflowSink(ScalarSink):
    """Log goodtrace's numbers to an MLflow run."""

    name = "mlflow"

    def __init__(
        self, tracking_uri: str | None = None, *, experiment: str = "goodtrace", run_name: str | None = None,
        all_ranks: bool = False, summary: bool = True, use_active_run: bool = True,
    ) -> None:
        super().__init__(all_ranks=all_ranks, summary=summary)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.use_active_run = use_active_run
        self.run_id: str | None = None
        self._client: Any = None
        self._own = False

    @classmethod
    def from_spec(cls, argument: str | None) -> MlflowSink:
        """``mlflow`` or ``mlflow:TRACKING_URI`` (e.g. ``mlflow:sqlite:///mlflow.db``)."""
        return cls(argument or None)

    def start(self, run: SinkRun) -> None:
        import mlflow
        from mlflow import MlflowClient

        active = mlflow.active_run() if self.use_active_run and self.tracking_uri is None else None
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        if active is not None:
            self.run_id, self._own = active.info.run_id, False
            return
        experiment = self._client.get_experiment_by_name(self.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self._client.create_experiment(self.experiment))
        name = self.run_name or os.path.basename(os.path.normpath(run.run_dir))
        tags = {"goodtrace.run_dir": run.run_dir, "goodtrace.rank": str(run.rank)}
        created = self._client.create_run(experiment_id, run_name=name + rank_suffix(run), tags=tags)
        self.run_id, self._own = created.info.run_id, True

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_metric_key(k), float(v), now, int(step)) for k, v in values.items()]
        for i in range(0, len(metrics), _BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[i:i + _BATCH])

    def summary(self, step: int, numbers: Mapping[str, float], texts: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.scalars(step, numbers)
        if texts:
            self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in texts.items()])

    def shutdown(self) -> None:
        if self._client is not None and self.run_id is not None and self._own:
            self._client.set_terminated(self.run_id)
        self._client = None
