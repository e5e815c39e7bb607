"""The reader's per-session map as Ray tasks (``pip install 'goodtrace[ray]'``).

Each task is a :class:`~goodtrace.read.engine.FoldTask`: the paths of whole sessions' files,
which the task opens itself (the run directory must be at the same path on every node: a
shared filesystem) or, for a run on object storage read on a cluster, fetches from the run's
URL (:func:`~goodtrace.read.mirror.fetch_files`), and it returns its run-model tables as Parquet bytes; the driver reduces
(:mod:`goodtrace.read.engine`). ``ray`` is imported only here, when a run is read on Ray.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from goodtrace.read.engine import LOCAL_RAY, FoldResult, FoldTask, run_task
from goodtrace.read.loaded import LoadError
from goodtrace.record.process import python_path

__all__ = ["RaySession"]


class RaySession:
    """A connection to Ray for one read (a local Ray started for it with ``"local"``), unless
    this process is connected already; ``cpus``: the cluster's CPUs."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.connected = False
        self.cpus = 1

    def __enter__(self) -> RaySession:
        try:
            import ray
        except ImportError:
            raise LoadError("--ray needs Ray: pip install 'goodtrace[ray]'") from None
        if not ray.is_initialized():
            options: dict[str, Any] = {}
            if self.address == LOCAL_RAY:  # its workers import the goodtrace this process imported
                options["runtime_env"] = {"env_vars": {"PYTHONPATH": python_path()}}
            try:
                ray.init(  # "local" is Ray's own word for a new local cluster, even where RAY_ADDRESS is set
                    address=self.address, include_dashboard=False,
                    logging_level=logging.WARNING, log_to_driver=False, configure_logging=True, **options,
                )
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise LoadError(f"cannot connect to the Ray cluster {self.address!r}: {exc}") from None
            self.connected = True
        resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        self.cpus = max(1, int(resources.get("CPU", 1)))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.connected:
            import ray

            ray.shutdown()

    def run(self, tasks: Sequence[FoldTask], finished: Callable[[int], None], spill_dir: str) -> list[FoldResult]:
        """Every task as a Ray task of one CPU; results as they arrive (``finished`` told of
        each), their tables written to ``spill_dir`` (the driver holds no task's bytes)."""
        import ray

        remote: Any = ray.remote(num_cpus=1)(run_task)
        pending = {remote.remote(task): task.index for task in tasks}
        results: list[FoldResult] = []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                try:
                    result: FoldResult = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    cause = getattr(exc, "cause", None) or exc
                    raise LoadError(f"a Ray task reading the run failed: {type(cause).__name__}: {cause}") from None
                pending.pop(ref)
                for table, stored in result.tables.items():
                    if isinstance(stored, bytes):
                        path = os.path.join(spill_dir, f"task{result.index:06d}-{table}.parquet")
                        with open(path, "wb") as handle:
                            handle.write(stored)
                        result.tables[table] = path
                results.append(result)
                finished(result.index)
        return results
