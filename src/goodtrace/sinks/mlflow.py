"""MLflow: metrics through ``mlflow.MlflowClient`` (``pip install 'goodtrace[mlflow]'``).

Logs into the program's active MLflow run when there is one (MLflow keeps it per thread: the
sink takes the run active on the thread that creates it, which is the one calling ``gt.init``,
or else the latest run started on any thread), else creates a run (named after the run
directory) in experiment ``goodtrace`` of ``tracking_uri`` (any MLflow store: a server URL,
``sqlite:///mlflow.db``, ...; default: MLflow's own ``MLFLOW_TRACKING_URI``) and ends it at
the end. The summary goes in as metrics at the last step, attempts as tags. A tracking server
that refuses connections makes the sink fail at once (one warning), instead of MLflow's
minutes of retries; ranks opening one new sqlite store take turns creating it. ``goodtrace
export`` tags its run with the export id and deletes the earlier export's run; its points
carry the step's wall time, events are tags ``goodtrace/event/NAME/N``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from goodtrace.record.live.sink_hub import SinkError, SinkRun
from goodtrace.sinks._base import ScalarSink, rank_suffix

_BATCH = 1000  # MLflow's limit of metrics per log_batch call
_TAG_BATCH = 100  # ... and of tags
EXPORT_TAG = "goodtrace.export_id"  # goodtrace export's run: replaced when the run is exported again
_CONNECT_TIMEOUT_S = 5.0  # a tracking server that does not accept a connection in this is unreachable
_OPEN_TRIES = 5  # ranks racing to create one experiment: the losers find it on the next try


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
        self._events = 0
        self._pending: list[Any] = []  # points not logged yet (goodtrace export logs them in batches)
        self._tags: list[Any] = []  # event tags not logged yet (the same)
        # The run active on the creating thread (gt.init's): the sink opens on its own thread,
        # where MLflow's thread-local active run is never set.
        self._callers_run = _callers_active_run() if use_active_run and tracking_uri is None else None

    @classmethod
    def from_spec(cls, argument: str | None) -> MlflowSink:
        """``mlflow`` or ``mlflow:TRACKING_URI`` (e.g. ``mlflow:sqlite:///mlflow.db``)."""
        return cls(argument or None)

    def start(self, run: SinkRun) -> None:
        import mlflow
        from mlflow import MlflowClient

        active = self._callers_run
        if active is None and self.use_active_run and self.tracking_uri is None:
            active = _any_active_run()
        if active is not None:
            self.run_id, self._own = active[0], False
            self._client = MlflowClient(tracking_uri=active[1])
            return
        uri = self.tracking_uri or mlflow.get_tracking_uri()
        _check_reachable(uri)
        with _store_lock(uri):
            self._client = MlflowClient(tracking_uri=uri)
            experiment_id = self._experiment_id()
        name = self.run_name or os.path.basename(os.path.normpath(run.run_dir))
        tags = {"goodtrace.run_dir": run.run_dir, "goodtrace.rank": str(run.rank)}
        if self.export_id is not None:  # goodtrace export: the earlier export of this run goes
            tags[EXPORT_TAG] = self.export_id
            for old in self._client.search_runs([experiment_id], f"tags.`{EXPORT_TAG}` = '{self.export_id}'"):
                self._client.delete_run(old.info.run_id)
        created = self._client.create_run(experiment_id, run_name=name + rank_suffix(run), tags=tags)
        self.run_id, self._own = created.info.run_id, True

    def _experiment_id(self) -> str:
        """The experiment's id, created if missing (another rank may create it at the same time)."""
        for attempt in range(_OPEN_TRIES):
            try:
                experiment = self._client.get_experiment_by_name(self.experiment)
                if experiment is not None:
                    return str(experiment.experiment_id)
                return str(self._client.create_experiment(self.experiment))
            except Exception:
                if attempt == _OPEN_TRIES - 1:
                    raise
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def scalars(self, step: int, values: Mapping[str, float], wall_time_s: float | None = None) -> None:
        """Logged at once in a live job; in ``goodtrace export``, :data:`_BATCH` points a call
        (a call a step made a week-long run's export take most of an hour on a sqlite store)."""
        from mlflow.entities import Metric

        now = int((time.time() if wall_time_s is None else wall_time_s) * 1000)
        self._pending.extend(Metric(_metric_key(k), float(v), now, int(step)) for k, v in values.items())
        self._log_pending(whole=self.export_id is None)

    def _log_pending(self, *, whole: bool) -> None:
        """The points and event tags not logged yet, as many a call as MLflow takes (with
        ``whole``, the last part too)."""
        for pending, batch, field in ((self._pending, _BATCH, "metrics"), (self._tags, _TAG_BATCH, "tags")):
            done = len(pending) if whole else len(pending) - len(pending) % batch
            for i in range(0, done, batch):
                self._client.log_batch(self.run_id, **{field: pending[i:min(i + batch, done)]})
            del pending[:done]

    def event(self, step: int, name: str, text: str) -> None:
        from mlflow.entities import RunTag

        self._events += 1
        self._tags.append(RunTag(f"{name}/{self._events}", f"step {step}, {text}"))
        self._log_pending(whole=self.export_id is None)

    def summary(self, step: int, numbers: Mapping[str, float], texts: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.scalars(step, numbers)
        self._tags.extend(RunTag(k, v) for k, v in texts.items())  # an attempt a tag: more than a call's 100
        self._log_pending(whole=True)

    def shutdown(self) -> None:
        try:
            if self._client is not None and self.run_id is not None:
                self._log_pending(whole=True)
        finally:
            if self._client is not None and self.run_id is not None and self._own:
                self._client.set_terminated(self.run_id)
            self._client = None


def _callers_active_run() -> tuple[str, str] | None:
    """(run id, tracking URI) of the MLflow run active on this thread, if MLflow is in use."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:  # not imported: no run can be active
        return None
    try:
        active = mlflow.active_run()
        return None if active is None else (str(active.info.run_id), str(mlflow.get_tracking_uri()))
    except Exception:
        return None


def _any_active_run() -> tuple[str, str] | None:
    """The run started last on any thread (a sink object made before ``mlflow.start_run``)."""
    try:
        import mlflow
        from mlflow.tracking import fluent

        latest = getattr(fluent, "_get_latest_active_run", None)  # private; absent in old releases
        active = mlflow.active_run() or (latest() if latest is not None else None)
        return None if active is None else (str(active.info.run_id), str(mlflow.get_tracking_uri()))
    except Exception:
        return None


def _check_reachable(uri: str) -> None:
    """Fail at once when a tracking server refuses connections (MLflow retries for minutes)."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise SinkError(f"mlflow: tracking server {uri} unreachable: {exc}") from None


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """For a ``sqlite:///`` store, one process at a time creates its tables (MLflow's schema
    migrations race when several ranks open a new database at once): a lock on its directory."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    folder = os.path.dirname(os.path.abspath(uri[len("sqlite:///"):])) or "."
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
