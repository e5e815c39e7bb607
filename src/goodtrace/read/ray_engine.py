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
import socket
from collections.abc import Callable, Sequence
from typing import Any

from goodtrace.read.engine import LOCAL_RAY, FoldResult, FoldTask, run_task
from goodtrace.read.loaded import LoadError
from goodtrace.record.process import python_path

__all__ = ["PROBE_S", "RaySession", "unreachable"]

# Ray retries a cluster address that nothing answers at 20 times, about 35 s each: a mistyped
# or stale ``--ray ADDRESS`` held the report some 12 minutes before it failed. The address is
# tried once first, for this long.
PROBE_S = 10.0


def unreachable(address: str) -> str | None:
    """Why nothing answers at the Ray cluster ``address`` (``auto`` or ``host:port`` resolved as
    Ray resolves them; ``ray://host:port``, Ray Client's, as it is), or None when something does
    or it cannot be told here (then ``ray.init`` says). One TCP connection, closed at once."""
    if address.startswith("ray://"):
        target: str | None = address[len("ray://"):].split("/", 1)[0]
    else:
        try:  # Ray's own reading of the address: RAY_ADDRESS and the last cluster for "auto", the node's IP for localhost
            from ray._private.services import canonicalize_bootstrap_address

            target = canonicalize_bootstrap_address(address)
        except Exception:  # a form Ray rejects (ray.init says why), or Ray's internals moved
            return None
    if not target:  # none found for "auto": ray.init says so at once
        return None
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S):
            return None
    except ValueError:
        return None
    except OSError as exc:
        return f"nothing answers at {target} ({exc or type(exc).__name__})"


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
            else:
                why = unreachable(self.address)
                if why is not None:
                    raise LoadError(f"cannot connect to the Ray cluster {self.address!r}: {why}")
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
