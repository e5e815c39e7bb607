"""torchtitan's structured logs as a goodtrace run: a converted copy in the cache, read as it is.

torchtitan (``torchtitan.observability.structured_logger``) writes one JSON-lines file per
process, ``[structured_logs/]SOURCE.global_rank_R.STAMP-XXXXXX.jsonl``: spans as ``NAME_start``
/ ``NAME_end`` record pairs (paired per asyncio task, last opened first closed; ``NAME_error``
marks a span that raised), instants (``log_trace_instant``), scalars (``metric_value``), each
record with the step of ``set_step`` and the step's tags, the rank, host and pid, and its time
(``time.time()`` when the record was logged). :func:`converted_run` turns a directory of them
into goodtrace segment files in ``$GOODTRACE_CACHE_DIR`` (rebuilt when a source file's size or
modification time changes): each file one session; the ``step`` span each step's execution
(in a file with no ``step`` span, each run of records with one step number, first record to
last); the other spans with a category (``fwd_bwd`` compute, ``fetching_batch`` data,
``checkpoint_save``, ``eval``, ``gc_collect`` gc, ...); scalars metrics; instants events; step
tags tags; ``torch_distributed_teardown`` ending the process as completed. Nothing in it is
timed on the device: :data:`CAVEAT` says so wherever the run is shown (with what the
conversion found: :func:`conversion_notes`). :func:`recorded_beside` finds goodtrace's own
recording of the same trainer, which the commands read first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from typing import Any

from goodtrace import schema
from goodtrace.read.mirror import mirror_cache_dir
from goodtrace.record.start_end_spans import STEP_SPAN, TEARDOWN_SPAN, OpenSpans, category_of, edge_of

__all__ = ["CAVEAT", "conversion_notes", "converted_run", "is_torchtitan_logs", "log_files", "recorded_beside",
           "recorded_note"]

CONVERTER_VERSION = 2
STATE_FILE = "TORCHTITAN.json"
FILE_NAME = re.compile(r"^(?P<source>.+)\.global_rank_(?P<rank>\d+)\.(?P<stamp>[^.]+)\.jsonl$")
METRIC_RECORD = "metric_value"
CAVEAT = (
    "read from torchtitan's structured logs: every time in them is the host's (torchtitan times its spans on "
    "the host and stamps each record with time.time()), and a step is its `step` span, so under asynchronous "
    "CUDA dispatch a step ends when the host has queued its work, not when the device has done it; start-up "
    "is counted from the logger's first record (the logs do not say when the process started), so the "
    "process's start-up before it (imports, distributed init) is not in the report"
)
STEPS_FROM_RECORDS = (
    "{files} of torchtitan's logs time no `step` span (a loop with set_step() only): each step there runs "
    "from its first record to its last, by the step number set_step() gave them"
)
RECORDED_BESIDE = "goodtrace"  # the handler's run directory in torchtitan's output folder


def log_files(path: str) -> list[str]:
    """torchtitan's JSON-lines files in ``path`` or ``path/structured_logs``, sorted."""
    found: list[str] = []
    for folder in (path, os.path.join(path, "structured_logs")):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found += [os.path.join(folder, n) for n in names
                  if FILE_NAME.match(n) and os.path.isfile(os.path.join(folder, n))]
    return sorted(found)


def is_torchtitan_logs(path: str) -> bool:
    """A local directory of torchtitan's structured logs (and no goodtrace rank directories)."""
    if not os.path.isdir(path):
        return False
    if any(name.startswith("rank-") for name in os.listdir(path)):
        return False
    return bool(log_files(path))


def recorded_beside(path: str) -> str | None:
    """goodtrace's own recording of the trainer that wrote the logs in ``path``: the directory
    goodtrace's torchtitan handler writes by default, ``path/goodtrace``, when it holds rank
    directories; else None."""
    run = os.path.join(path, RECORDED_BESIDE)
    try:
        return run if any(name.startswith("rank-") for name in os.listdir(run)) else None
    except OSError:
        return None


def recorded_note(typed: str, recorded: str) -> str:
    """What a report of torchtitan's output folder ``typed`` (as the user typed it) says when it
    reads :func:`recorded_beside`'s recording ``recorded`` instead of the logs."""
    here = os.path.join(typed, os.path.basename(recorded))
    logs = os.path.join(typed, "structured_logs")
    in_folder = os.path.isdir(os.path.join(os.path.dirname(recorded), "structured_logs"))
    other = f"`goodtrace report {logs}` reads the logs instead" if in_folder else "the logs alone read as they are"
    return (f"{typed} holds torchtitan's structured logs and goodtrace's recording of the same trainer ({here}, "
            f"written by goodtrace's torchtitan handler): this is that recording, its steps timed on the device; "
            f"{other}")


def conversion_notes(converted: str) -> tuple[str, ...]:
    """What the report says of a conversion made by :func:`converted_run`: :data:`CAVEAT`
    first, then what the conversion itself found (steps taken from the records' numbers)."""
    try:
        with open(os.path.join(converted, STATE_FILE)) as file:
            notes = json.load(file).get("notes") or []
    except (OSError, ValueError, AttributeError):
        notes = []
    return (CAVEAT, *(str(note) for note in notes))


def converted_run(path: str, cache_dir: str | None = None) -> str:
    """The goodtrace run directory converted from the torchtitan logs in ``path`` (made, or
    remade when a source file changed; the files of the trainer's source only, ``training``
    when several processes' kinds wrote logs)."""
    files = _trainer_files(log_files(path))
    state = {"version": CONVERTER_VERSION,
             "files": [[os.path.basename(f), os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files]}
    target = mirror_cache_dir("torchtitan:" + os.path.realpath(path), cache_dir)
    try:
        with open(os.path.join(target, STATE_FILE)) as file:
            if json.load(file) == state:
                return target
    except (OSError, ValueError):
        pass
    building = f"{target}.part-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    sessions = [session for session in map(_read, files) if session.lines]  # an empty file: no process
    world = len({s.rank for s in sessions}) or 1
    for session in sessions:
        rank_dir = os.path.join(building, f"rank-{session.rank:05d}")
        os.makedirs(rank_dir, exist_ok=True)
        with open(os.path.join(rank_dir, f"{session.session}.00000.jsonl"), "w") as out:
            for record in session.records(world):
                out.write((record if isinstance(record, str) else json.dumps(record, separators=(",", ":"))) + "\n")
    os.makedirs(building, exist_ok=True)
    numbered = sum(1 for session in sessions if session.steps_from_records)
    if numbered:
        files_text = "all" if numbered == len(sessions) else f"{numbered} of the {len(sessions)}"
        state["notes"] = [STEPS_FROM_RECORDS.format(files=files_text.capitalize())]
    with open(os.path.join(building, STATE_FILE), "w") as file:
        json.dump(state, file)
    # the old conversion is moved aside, not removed in place: another reader may be reading it
    # (its paths are then the new conversion's, the same files of the same logs)
    old = f"{target}.old-{os.getpid()}"
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with contextlib.suppress(OSError):
        os.replace(target, old)
    try:
        os.replace(building, target)
    except OSError:  # another reader's conversion took its place first: the same one
        shutil.rmtree(building, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return target


def _trainer_files(files: list[str]) -> list[str]:
    sources = {FILE_NAME.match(os.path.basename(f)).group("source") for f in files}  # type: ignore[union-attr]
    if len(sources) <= 1:
        return files
    keep = "training" if "training" in sources else sorted(sources)[0]
    return [f for f in files if FILE_NAME.match(os.path.basename(f)).group("source") == keep]  # type: ignore[union-attr]


class _Session:
    """One torchtitan log file: one process of one rank."""

    def __init__(self, path: str, lines: list[dict[str, Any]], unreadable: list[str]) -> None:
        match = FILE_NAME.match(os.path.basename(path))
        assert match is not None
        self.rank = int(match.group("rank"))
        self.session = re.sub(r"[^A-Za-z0-9_-]", "-", f"torchtitan-{match.group('stamp')}-{self.rank}")
        self.lines = lines
        self.unreadable = unreadable  # copied as they are: goodtrace's reader counts and names them
        first = lines[0] if lines else {}
        self.host = str(first.get("host_name") or "")
        self.pid = int(first.get("pid") or 0)
        self.local_rank = int(first.get("local_rank") or 0)
        # no `step` span in the file (a loop with set_step() only): its steps from the records' numbers
        self.steps_from_records = (
            not any(edge_of(line.get("log_type"), str(line.get("log_type_name") or "")) == ("end", STEP_SPAN)
                    for line in lines)
            and any(_step_of(line) is not None for line in lines))

    def records(self, world: int) -> Iterator[dict[str, Any] | str]:
        times = [_time_ns(line) for line in self.lines]
        start = min(times) if times else 0
        end = max(times) if times else 0
        yield {
            schema.F_KIND: schema.HEADER, schema.H_SCHEMA: schema.SCHEMA_VERSION, "version": "torchtitan",
            schema.H_SESSION: self.session, schema.H_RANK: self.rank, schema.H_WORLD: world,
            schema.H_LOCAL_RANK: self.local_rank, schema.H_HOST: self.host, schema.H_PID: self.pid,
            schema.H_RESTART: None, schema.H_PROC_START: start, schema.H_PROC_START_SOURCE: "import",
            schema.H_INIT: start, schema.H_SUBMIT_WALL: None, "rank_source": "torchtitan",
            schema.H_SEGMENT: 0, schema.F_WALL: start, schema.F_MONO: start,  # one clock: the host's wall clock
        }
        yield from self._body()
        yield from self.unreadable
        yield {schema.F_KIND: schema.HEARTBEAT, schema.F_WALL: end, schema.F_MONO: end, schema.F_DROPPED: 0}

    def _body(self) -> Iterator[dict[str, Any]]:
        open_spans: OpenSpans[int] = OpenSpans()  # per task: each open span's t0
        tags: set[tuple[int, str]] = set()
        seq = 0
        numbered: tuple[int, int, int] | None = None  # steps from the records: the step now, its first and last time
        for line in self.lines:
            name = str(line.get("log_type_name") or "")
            t = _time_ns(line)
            step = _step_of(line)
            edge = edge_of(line.get("log_type"), name)
            if self.steps_from_records and step is not None and (edge is None or edge.name != TEARDOWN_SPAN):
                if numbered is not None and numbered[0] != step:  # the step before ended at its last record
                    yield _step_record(*numbered, seq)
                    seq += 1
                    numbered = None
                numbered = (step, t if numbered is None else numbered[1], t)
            elif numbered is not None and edge is not None and edge.name == TEARDOWN_SPAN:
                yield _step_record(*numbered, seq)  # the teardown follows the last step
                seq += 1
                numbered = None
            for tag in line.get("step_tags") or ():
                if step is not None and (step, str(tag)) not in tags:
                    tags.add((step, str(tag)))
                    yield {schema.F_KIND: schema.TAG, schema.F_STEP: step, schema.F_NAME: str(tag), schema.F_T: t}
            task = line.get("task_name")
            if edge is not None and edge.edge == "start":
                open_spans.start(task, edge.name, t)
            elif edge is not None and edge.edge == "error":
                open_spans.raised(task, edge.name)
            elif edge is not None:
                base = edge.name
                ended = open_spans.end(task, base)
                if ended is None:
                    continue  # its start is not in the file (a torn or rotated log): nothing to time
                t0, raised = ended
                if base == STEP_SPAN and step is not None:
                    yield _step_record(step, t0, t, seq)
                    seq += 1
                    continue
                yield {schema.F_KIND: schema.SPAN, schema.F_NAME: base, schema.F_CATEGORY: category_of(base),
                       schema.F_T0: t0, schema.F_T1: max(t0, t), schema.F_STEP: step,
                       schema.F_THREAD: line.get("tid"), schema.F_ERROR: raised, schema.F_ATTRS: None}
                if base == TEARDOWN_SPAN:
                    yield {schema.F_KIND: schema.FINISH, schema.F_COMPLETED: True, schema.F_T: t,
                           schema.F_REASON: "finish"}
            elif name == METRIC_RECORD and isinstance(line.get("value"), (int, float)):
                yield {schema.F_KIND: schema.METRIC, schema.F_NAME: str(line.get("event_name")),
                       schema.F_STEP: step, schema.F_VALUE: float(line["value"]), schema.F_REDUCE: "mean",
                       schema.F_T: t}
            elif line.get("log_type") == "instant" and name:
                yield {schema.F_KIND: schema.EVENT, schema.F_NAME: name, schema.F_T: t, schema.F_STEP: step,
                       schema.F_ATTRS: None}
        if numbered is not None:
            yield _step_record(*numbered, seq)


def _step_record(step: int, t0: int, t1: int, seq: int) -> dict[str, Any]:
    return {schema.F_KIND: schema.STEP, schema.F_STEP: step, schema.F_T0: t0, schema.F_T1: t1, schema.F_SEQ: seq}


def _step_of(line: dict[str, Any]) -> int | None:
    step = line.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _time_ns(line: dict[str, Any]) -> int:
    value = line.get("time_us")
    return int(value) * 1000 if isinstance(value, int) else 0


def _read(path: str) -> _Session:
    lines: list[dict[str, Any]] = []
    unreadable: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as file:
        for text in file:
            try:
                record = json.loads(text)
            except ValueError:
                if text.strip():
                    unreadable.append(text.rstrip("\n"))  # not JSON: the reader skips and counts it
                continue
            if isinstance(record, dict) and isinstance(record.get("time_us"), int):
                lines.append(record)
    lines.sort(key=lambda r: (r.get("seq_id", 0) if isinstance(r.get("seq_id"), int) else 0, r["time_us"]))
    return _Session(path, lines, unreadable)
