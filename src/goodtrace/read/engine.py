"""Where the reader's per-session map runs: in this process, on a pool of local processes, or
as Ray tasks; the driver reduces.

The map is :func:`goodtrace.read.fold_batches.fold_json`: files parsed and reduced to the
segment tables (``SEGMENT_NAMES``: each file's rows under its number in the load; the files
the segment cache holds are not sent). A task is a run of consecutive fold batches (so a worker
parses exactly the batches one process would), of whole sessions, or, for a few long
sessions, of files (a file's rows depend on no other file), folded in its own DuckDB connection
(one thread: a worker per core); it writes each segment table as a Parquet file (local pool:
into the driver's temporary directory; Ray: returned as bytes, the only thing that travels)
and returns the lines it skipped, by file. The driver reads the tables into its own, task
after task in session order (as it reads the cache's chunks), and merges the skipped-line
counts: the run model, and every number drawn from it, is the one-process one.

On Ray (:class:`RaySession`, ``pip install 'goodtrace[ray]'``; ``ray`` is imported only when a
run is read on Ray) each task is the same :class:`FoldTask`, run by the same function
(:func:`run_task`): it opens its files itself (the run directory must be at the same path on
every node: a shared filesystem) or, for a run on object storage read on a cluster, fetches
them from the run's URL (:func:`~goodtrace.read.mirror.fetch_files`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from goodtrace.read import duckdb_sql, fold_batches
from goodtrace.read.environment import count_from_environment
from goodtrace.read.file_skips import SHORTEN_TO, FileSkips, shortened_copy
from goodtrace.read.loaded import LoadError, Progress
from goodtrace.record.process import python_path

__all__ = ["ENV_WORKERS", "POOL_MIN_BYTES", "PROBE_S", "Engine", "PoolTask", "RaySession", "RemoteRun", "fold_sessions", "local_workers", "plan_tasks", "run_pool", "unreachable"]

ENV_WORKERS = "GOODTRACE_WORKERS"
# Below this many bytes of JSON lines to fold, an automatic choice folds in this process: the
# pool's fixed costs (a worker started, the tasks' tables written and read back: about 1 s) are
# paid back at about 3 ms a MiB against DuckDB's own threads on 2 cores, from about 350 MiB
# (BENCHMARKS.md, "All local cores and Ray": 0.77x at 131 MiB, 1.21x at 1.3 GiB).
POOL_MIN_BYTES = 512 * 2**20
TASKS_PER_WORKER = 4  # at most, per worker: a slow task (a long session) holds up less of the end
TASK_BYTES = 32 * 2**20  # at least, per task (beyond one per worker): a task costs about 0.1 s
# At most, per task, whatever the workers: a task holds its sessions' tables until it returns
# them (about 0.22 KiB a session-step, about 0.9 GiB at this size; BENCHMARKS.md, "A week on
# 10,000 ranks").
TASK_MAX_BYTES = 2 * 2**30
LOCAL_RAY = "local"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Engine:
    """Where the map runs. ``workers``: local processes (1: this process; None: one per core
    when there is enough to fold, ``GOODTRACE_WORKERS`` when set). ``ray``: the address of a
    Ray cluster (``"local"``: start one here; ``"auto"``: the one the environment names; an
    address), None for no Ray; a Ray connection already open in this process is used as it is."""

    workers: int | None = None
    ray: str | None = None

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.ray is not None and not self.ray.strip():
            raise ValueError("the Ray address is empty (leave it out for a local Ray)")


@dataclasses.dataclass(frozen=True)
class RemoteRun:
    """A run on object storage that this process reads through its local mirror: ``url`` (an
    fsspec URL) and ``mirror`` (the local directory) hold the same files. Ray tasks on a
    cluster fetch their own sessions' files from ``url``, as many bytes as were mirrored."""

    url: str
    mirror: str

    def source(self, path: str) -> tuple[str, int]:
        """The URL of a mirrored file, and its mirrored size."""
        rel = os.path.relpath(path, self.mirror).replace(os.sep, "/")
        return f"{self.url.rstrip('/')}/{rel}", os.path.getsize(path)


def workers_from_environment() -> int | None:
    """``GOODTRACE_WORKERS`` as a number of workers (None when unset)."""
    return count_from_environment(ENV_WORKERS, "workers")


def local_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass
class FoldTask:
    """Whole sessions to fold (their files, their main thread) and where to write the tables
    (None: return their bytes); ``sources``: where the task fetches each file from (its URL and
    the bytes to fetch) when it cannot open the driver's path (a run on object storage read on
    a cluster), None when it can."""

    index: int
    files: dict[int, list[str]]
    fids: dict[str, int]  # each file's number in the load
    main_tids: list[tuple[int, int | None]]
    out_dir: str | None
    sources: dict[str, tuple[str, int]] | None = None
    ranges: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # see fold_json

    def __call__(self) -> FoldResult:
        return run_task(self)


@dataclasses.dataclass
class FoldResult:
    """A task's segment tables (table -> Parquet file, or its bytes), the lines it skipped
    (as :class:`~goodtrace.read.FileSkips` holds them), or DuckDB's error."""

    index: int
    tables: dict[str, str | bytes]
    skipped: dict[str, dict[str, int]]
    shortened: list[str]
    notes: list[str]
    error: str | None = None
    unranged: list[str] = dataclasses.field(default_factory=list)  # see FileSkips.unranged
    long_ranges: list[str] = dataclasses.field(default_factory=list)  # see FileSkips.long_ranges


def run_task(task: FoldTask) -> FoldResult:
    """Fold one task's sessions in a DuckDB connection of its own (runs in the worker)."""
    import duckdb

    tmpdir = tempfile.mkdtemp(prefix="goodtrace-task-")
    skips = FileSkips()
    result = FoldResult(task.index, {}, {}, [], [])
    # fold_json puts a copy without long lines in place of its file: on lists of this task's
    # own, since in the driver's thread task.files are the driver's lists
    files = {sid: list(paths) for sid, paths in task.files.items()}
    driver_path: dict[str, str] = {}  # a fetched file's path here -> the driver's path of it
    fids = dict(task.fids)
    ranges = dict(task.ranges)
    try:
        if task.sources is not None:  # fetched into this node's temporary directory first
            from goodtrace.read.mirror import fetch_files

            # of a file read from a byte on, its header line and the bytes from there
            fetched = fetch_files(task.sources, os.path.join(tmpdir, "fetched"),
                                  starts={p: start for p, (start, _) in task.ranges.items()})
            driver_path = {local: path for path, local in fetched.items()}
            files = {sid: [fetched[p] for p in paths] for sid, paths in task.files.items()}
            fids = {fetched[p]: fid for p, fid in task.fids.items()}
            ranges = {}
            for p, (start, end) in task.ranges.items():  # the copy holds at least that much; the
                left_out = task.sources[p][1] - os.path.getsize(fetched[p])  # bytes left out before it
                ranges[fetched[p]] = (start - left_out, end - left_out)
        con = duckdb_sql.connect(tmpdir, in_memory=True)
        try:
            con.execute("SET threads=1")
            for statement in duckdb_sql.MODEL_TABLES:
                con.execute(statement)
            duckdb_sql.insert_rows(con, "sessmain", task.main_tids)
            try:
                fold_batches.fold_json(con, files, fids, None, 0, 0, skips, ranges)
            except duckdb.Error as exc:
                result.error = str(exc)
                return result
            out_dir = task.out_dir or tmpdir
            # compressed only where the bytes travel (Ray): a local file is read back at once
            compression = "zstd" if task.out_dir is None else "uncompressed"
            for table in duckdb_sql.SEGMENT_NAMES:
                path = os.path.join(out_dir, f"task{task.index:06d}-{table}.parquet")
                con.execute(f"COPY {table} TO {duckdb_sql.sql_str(path)} (FORMAT parquet, COMPRESSION {compression})")
                if task.out_dir is None:
                    with open(path, "rb") as handle:
                        result.tables[table] = handle.read()
                else:
                    result.tables[table] = path
        finally:
            con.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        for copy in skips.substitutes.values():  # copies without long lines: the driver makes its own
            shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    result.skipped = {driver_path.get(path, path): counts for path, counts in skips.by_file.items()}
    result.shortened = [driver_path.get(path, path) for path in skips.substitutes]
    result.notes = skips.notes  # they name files as rank-N/<file>, which a fetched copy keeps
    result.unranged = [driver_path.get(path, path) for path in skips.unranged]
    result.long_ranges = [driver_path.get(path, path) for path in skips.long_ranges]
    return result


def plan_tasks(weights: Sequence[int], tasks: int) -> list[list[int]]:
    """Consecutive units (given by their weights, in bytes) grouped into at most ``tasks`` runs
    of about equal bytes: each run as the indexes of its units."""
    total = sum(weight + 1 for weight in weights)
    groups: list[list[int]] = []
    done = 0
    for index, weight in enumerate(weights):
        # a new group when this unit's middle lies past the next share of the bytes
        if not groups or (done + (weight + 1) / 2) * tasks >= total * len(groups):
            groups.append([])
        groups[-1].append(index)
        done += weight + 1
    return groups


def _workers(engine: Engine, sizes: dict[str, int]) -> int:
    if engine.workers is not None:
        return engine.workers
    return local_workers(sum(sizes.values()), POOL_MIN_BYTES)


def local_workers(size: int, pool_from: int) -> int:
    """How many local processes read ``size`` bytes: ``GOODTRACE_WORKERS`` when set, else a
    process per core from ``pool_from`` bytes on (below, the pool's start costs more than it
    saves), else one."""
    chosen = workers_from_environment()
    if chosen is not None:
        return chosen
    return local_cores() if size >= pool_from else 1


def fold_sessions(
    con: Any, files_by_sid: dict[int, list[str]], fid_of: dict[str, int], main_tids: dict[int, int | None], tmpdir: str,
    engine: Engine, progress: Progress | None, done: int, total: int, skips: FileSkips,
    remote: RemoteRun | None = None, ranges: Mapping[str, tuple[int, int]] | None = None,
) -> int:
    """:func:`~goodtrace.read.fold_batches.fold_json` of ``files_by_sid`` (``fid_of``: each
    file's number) into ``con``'s segment tables, where ``engine`` says; same tables, skipped lines (in ``skips``) and substituted
    files (in ``files_by_sid``) as one process gives. Returns ``done`` plus the files folded.
    ``remote``: the files are the mirror of a run on object storage, which Ray tasks on a
    cluster (not a local Ray) fetch from its URL themselves. ``ranges``: the parts of files
    being written to read (see :func:`~goodtrace.read.fold_batches.fold_json`)."""
    if not files_by_sid:  # all read from the compacted copy
        return done
    ranges = ranges or {}
    sizes = fold_batches.fold_sizes(files_by_sid, ranges)
    if engine.ray is not None:
        with RaySession(engine.ray) as session:
            tasks = _tasks(files_by_sid, fid_of, main_tids, sizes, session.cpus, None, ranges)
            if remote is not None and engine.ray != LOCAL_RAY:
                for task in tasks:
                    task.sources = {p: remote.source(p) for paths in task.files.values() for p in paths}
            results = session.run(tasks, _counter(tasks, "reading rank files on Ray", progress, done, total), tmpdir)
    else:
        workers = _workers(engine, sizes)
        if workers <= 1 or len(sizes) <= 1:
            return fold_batches.fold_json(con, files_by_sid, fid_of, progress, done, total, skips, ranges, sizes)
        out_dir = os.path.join(tmpdir, "tasks")
        os.makedirs(out_dir, exist_ok=True)
        tasks = _tasks(files_by_sid, fid_of, main_tids, sizes, workers, out_dir, ranges)
        workers = min(workers, len(tasks))
        results = run_pool(tasks, workers, _counter(tasks, f"reading rank files ({workers} workers)", progress,
                                                     done, total))
    _reduce(con, results, files_by_sid, skips)
    return done + sum(len(paths) for paths in files_by_sid.values())


def _tasks(
    files_by_sid: dict[int, list[str]], fid_of: dict[str, int], main_tids: dict[int, int | None],
    sizes: dict[str, int], workers: int, out_dir: str | None, ranges: Mapping[str, tuple[int, int]] | None = None,
) -> list[FoldTask]:
    """Tasks for ``workers`` (a few per worker, and none over :data:`TASK_MAX_BYTES` unless one
    file is): runs of whole fold batches (the batches one process parses) when there are a few
    per worker and enough for the cap, else of whole sessions when there are enough of them,
    else of files (a long run of a few ranks: a session's files split between tasks; what the
    fold keeps of a file depends on no other file of its session, only on its main thread)."""
    batches = fold_batches.session_batches(files_by_sid, sizes)
    total = sum(sizes.values())
    capped = -(-total // TASK_MAX_BYTES)  # tasks the cap asks for
    count = max(workers, min(workers * TASKS_PER_WORKER, total // TASK_BYTES), capped)
    units: list[list[tuple[int, str]]]
    if len(batches) >= max(2 * workers, capped):
        units = [[(sid, p) for sid in batch for p in files_by_sid[sid]] for batch in batches]
    elif len(files_by_sid) >= count:
        units = [[(sid, p) for p in files_by_sid[sid]] for sid in sorted(files_by_sid)]
    else:
        units = [[(sid, p)] for sid in sorted(files_by_sid) for p in files_by_sid[sid]]
    groups = plan_tasks([sum(sizes.get(p, 0) for _, p in unit) for unit in units], min(len(units), count))
    tasks = []
    for i, group in enumerate(groups):
        files: dict[int, list[str]] = {}
        for sid, path in (entry for index in group for entry in units[index]):
            files.setdefault(sid, []).append(path)
        tasks.append(FoldTask(i, files, {p: fid_of[p] for paths in files.values() for p in paths},
                              [(sid, main_tids.get(sid)) for sid in files], out_dir,
                              ranges={p: ranges[p] for paths in files.values() for p in paths if ranges and p in ranges}))
    return tasks


def _counter(
    tasks: Sequence[FoldTask], label: str, progress: Progress | None, done: int, total: int,
) -> Callable[[int], None]:
    """What to call when a task is done: the progress, counted in files."""
    files_of = [sum(len(paths) for paths in task.files.values()) for task in tasks]

    def finished(index: int) -> None:
        nonlocal done
        done += files_of[index]
        if progress is not None:
            progress(label, done, total)

    return finished


class PoolTask(Protocol):
    """A task of the local pool (:func:`run_pool`): picklable, called in a worker process (or
    in the driver's thread), its result picklable and numbered as the task (``index``)."""

    @property
    def index(self) -> int: ...

    def __call__(self) -> Any: ...


class _InProcess:
    """The driver's own share of the pool: it runs tasks in a thread of this process (no
    interpreter to start, nothing pickled) while it would otherwise only wait. A task in hand
    cannot be killed: it ends when it does."""

    def run(self, task: PoolTask) -> Any:
        return task()

    def kill(self) -> None:
        pass

    def close(self) -> None:
        pass


def run_pool(tasks: Sequence[PoolTask], workers: int, finished: Callable[[int], None]) -> list[Any]:
    """The tasks on ``workers`` local processes: this one (in a thread) and ``workers - 1``
    started ones (:mod:`goodtrace.read.fold_worker`: fresh interpreters of this goodtrace that
    import nothing of the caller's program); each takes the next task when it is done with one.
    The results in the order they came (each numbered as its task); ``finished(index)`` is
    called as each comes."""
    import queue
    import threading

    from goodtrace.read.fold_worker import WorkerProcess

    todo: queue.SimpleQueue[PoolTask] = queue.SimpleQueue()
    for task in tasks:
        todo.put(task)
    done: queue.SimpleQueue[Any] = queue.SimpleQueue()
    stop = threading.Event()

    def serve(process: WorkerProcess | _InProcess) -> None:
        try:
            while not stop.is_set():
                try:
                    task = todo.get_nowait()
                except queue.Empty:
                    return
                done.put(process.run(task))
        except BaseException as exc:  # handed to the driver, which raises it
            done.put(exc)

    processes: list[WorkerProcess | _InProcess] = [WorkerProcess() for _ in range(workers - 1)]
    processes.insert(0, _InProcess())  # served first: it starts folding while the others start
    threads = [threading.Thread(target=serve, args=(p,), daemon=True) for p in processes]
    for thread in threads:
        thread.start()
    results: list[Any] = []
    try:
        while len(results) < len(tasks):
            item = done.get()
            if isinstance(item, BaseException):
                raise item
            results.append(item)
            finished(item.index)
    except BaseException:
        stop.set()
        for process in processes:
            process.kill()
        raise
    finally:
        for thread in threads:
            thread.join()
        for process in processes:
            process.close()
    return results


def _reduce(
    con: Any, results: Sequence[FoldResult], files_by_sid: dict[int, list[str]], skips: FileSkips,
) -> None:
    """The tasks' tables into ``con``'s, in task order (the rows in the order one process
    inserts them), and what they skipped into ``skips``."""
    import duckdb

    ordered = sorted(results, key=lambda r: r.index)
    for result in ordered:
        if result.error is not None:
            raise duckdb.Error(result.error)
    con.execute("SET preserve_insertion_order=true")  # the files' rows in the order listed
    try:
        for table in duckdb_sql.SEGMENT_NAMES:
            stored = [result.tables[table] for result in ordered]
            tables = [path for path in stored if isinstance(path, str)]
            assert len(tables) == len(stored)  # a Ray task's bytes are written out on arrival
            files = "[" + ", ".join(duckdb_sql.sql_str(path) for path in tables) + "]"
            con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet({files})")
            for path in tables:
                os.remove(path)
    finally:
        con.execute("SET preserve_insertion_order=false")
    for result in ordered:
        for path, counts in result.skipped.items():
            for reason, count in counts.items():
                skips.add(path, reason, count)
        skips.notes.extend(result.notes)
        skips.unranged.update(result.unranged)
        skips.long_ranges.update(result.long_ranges)
        for path in result.shortened:  # the worker's copy is gone: this process makes its own
            found = shortened_copy(path, SHORTEN_TO)
            if found is None:
                continue
            skips.substitutes[path] = found[0]
            for paths in files_by_sid.values():
                if path in paths:
                    paths[paths.index(path)] = found[0]


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
