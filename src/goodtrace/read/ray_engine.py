"""The reader's per-session map as Ray tasks (``pip install 'goodtrace[ray]'``).

Each task is a :class:`~goodtrace.read.engine.FoldTask`: the paths of whole sessions' files,
which the task opens itself (the run directory must be at the same path on every node: a
shared filesystem), and it returns its run-model tables as Parquet bytes; the driver reduces
(:mod:`goodtrace.read.engine`). ``ray`` is imported only here, when a run is read on Ray.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import goodtrace
from goodtrace.read.engine import LOCAL_RAY, FoldResult, FoldTask, run_task
from goodtrace.read.loaded import LoadError

__all__ = ["run_on_ray"]


def _connect(address: str) -> bool:
    """Connect to Ray (a local one started here for ``"local"``), unless this process already
    is; whether this call connected (and so disconnects after)."""
    try:
        import ray
    except ImportError:
        raise LoadError("--ray needs Ray: pip install 'goodtrace[ray]'") from None
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {}
    if address == LOCAL_RAY:  # its workers import the goodtrace this process imported
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(goodtrace.__file__)))
        paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        options["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
    try:
        ray.init(
            address=None if address == LOCAL_RAY else address, include_dashboard=False,
            logging_level=logging.WARNING, log_to_driver=False, configure_logging=True, **options,
        )
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise LoadError(f"cannot connect to the Ray cluster {address!r}: {exc}") from None
    return True


def run_on_ray(address: str, tasks: Sequence[FoldTask], finished: Callable[[int], None]) -> list[FoldResult]:
    """Every task as a Ray task of one CPU; results as they arrive (``finished`` told of each)."""
    import ray

    connected = _connect(address)
    try:
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
                results.append(result)
                finished(result.index)
        return results
    finally:
        if connected:
            ray.shutdown()
