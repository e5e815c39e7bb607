"""What the analytical reader returns: plain dataclasses, no I/O.

A :class:`LoadedRun` holds one :class:`SessionInfo` per session (one process of one rank), the
:class:`SessionRecords` every session contributes to the run model (its step executions, sync
points, main-thread overhead spans, per-execution compute time, clock samples, events: compact
columns, so that 10,000 ranks of a long run fit in memory), and the per-step
:class:`SessionDetail` of the few sessions whose steps the report lists (the reference rank:
tags, metric values and span time per step, as columns).
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any, NamedTuple, overload

from goodtrace import schema

__all__ = [
    "NO_TIME",
    "SAMPLE_STEPS",
    "EventColumns",
    "EventRecord",
    "FileRange",
    "HangEvent",
    "Labels",
    "LoadError",
    "LoadedRun",
    "Progress",
    "SessionDetail",
    "SessionInfo",
    "SessionRecords",
]

Progress = Callable[[str, int, int], None]  # (what, done, total)

NO_TIME = -(2**63)  # a missing time or number in the integer columns below

# The steps the cross-rank figures compare (docs/semantics.md section 7): about SAMPLE_STEPS
# of an attempt's step range, every step of a short one.
SAMPLE_STEPS = 32


def sample_stride(lo: int | None, hi: int | None) -> int:
    """The sample of a step range ``lo`` to ``hi``: the step numbers that are multiples of this
    stride, the largest power of two that is at most ``(hi - lo) // SAMPLE_STEPS`` (1 for a
    short or an empty range). The analysis takes it of each attempt's range, so that every rank
    of the attempt is sampled at the same steps, whatever part of the range its records cover;
    the loader keeps each session's span starts by the stride of the session's own range, a
    power of two that divides its attempt's (a session's range lies within its attempt's), so
    they hold every step of the attempt's sample."""
    if lo is None or hi is None:
        return 1
    return 1 << (max(1, (hi - lo) // SAMPLE_STEPS).bit_length() - 1)


class EventRecord(NamedTuple):
    """An event of a session's timeline: its name, time (the session's monotonic ns), step,
    and attributes (None when it had none, or they were too large to keep)."""

    name: str
    t: int
    step: int | None
    attrs: dict[str, Any] | None


class HangEvent(NamedTuple):
    """A hang event (``hang``, ``hang_resumed``) of a session, its attributes as read ({} when
    they could not be)."""

    name: str
    t: int
    step: int | None
    attrs: dict[str, Any]


class LoadError(RuntimeError):
    """The records exist but cannot be read (the message says which and why)."""


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """One process of one rank (all its segments), summarised. Times are that process's
    monotonic ns; ``wall()`` converts them with the header's (wall, mono) anchor."""

    index: int
    session: str
    rank: int
    world: int
    host: str
    pid: int
    restart: int | None
    proc_start: int
    init: int
    submit_wall: int | None
    wall_anchor: int
    mono_anchor: int
    last_seen: int
    finish_completed: bool | None = None
    finish_t: int | None = None
    finish_reason: str | None = None
    finish_exception: str | None = None  # the uncaught exception that ended the process
    has_finish: bool = False
    last_heartbeat: int | None = None
    flush_interval_s: float = schema.DEFAULT_FLUSH_INTERVAL_S
    main_tid: int | None = None
    overhead_categories: frozenset[str] = frozenset()
    blocking_categories: frozenset[str] = frozenset()
    lag: int = 1
    dropped: int = 0
    schema_version: int = schema.SCHEMA_VERSION
    first_step: int | None = None
    last_step: int | None = None
    step_count: int = 0
    sync_count: int = 0
    preempt_events: int = 0
    records: int = 0
    rank_source: str | None = None  # where the process's rank came from (the header's rank_source)

    def wall(self, mono: int) -> int:
        """This session's monotonic ns -> wall-clock ns (the header anchor)."""
        return self.wall_anchor + (mono - self.mono_anchor)

    @property
    def start_wall(self) -> int:
        return self.wall(self.proc_start)

    @property
    def last_seen_wall(self) -> int:
        return self.wall(self.last_seen)


def _ints() -> array[int]:
    return array("q")


class EventColumns(Sequence[tuple[str, int, "int | None"]]):
    """A session's events (name, t, step or None) as columns: the names (the reader hands in one
    shared object per distinct name), the times and steps int64 (:data:`NO_TIME` for no step),
    24 bytes an event where a tuple of Python objects takes about 180 (every rank's are held to
    the end)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.t: array[int] = array("q")
        self.step: array[int] = array("q")

    def append(self, event: tuple[str, int, int | None]) -> None:
        name, t, step = event
        self.names.append(name)
        self.t.append(t)
        self.step.append(NO_TIME if step is None else step)

    @overload
    def __getitem__(self, index: int) -> tuple[str, int, int | None]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int, int | None]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, int, int | None] | list[tuple[str, int, int | None]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        step = self.step[index]
        return self.names[index], self.t[index], None if step == NO_TIME else step

    def __len__(self) -> int:
        return len(self.t)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


class Labels(Sequence[str]):
    """A long column of a few distinct strings (how each sync point was taken, each span's
    category) as codes into its ``names``: 4 bytes a row rather than a reference each, and the
    analysis compares codes, a few comparisons a column, not a string a row."""

    __slots__ = ("codes", "names")

    def __init__(self, codes: array[int] | None = None, names: Sequence[str] = ()) -> None:
        self.codes: array[int] = codes if codes is not None else array("i")
        self.names: tuple[str, ...] = tuple(names)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self.names[code] for code in self.codes[index]]
        return self.names[self.codes[index]]

    def __len__(self) -> int:
        return len(self.codes)

    def __contains__(self, name: object) -> bool:
        return any(code in self.codes for code, known in enumerate(self.names) if known == name)

    def __iter__(self) -> Iterator[str]:
        names = self.names
        return (names[code] for code in self.codes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass
class SessionRecords:
    """The records of one session that the run model is built from, as columns.

    Step executions in entry order (``seq`` 0, 1, ... numbers them: the recorder writes it, for
    older files it is the entry order); sync points (``sync_seq`` is -1 where the record names
    no execution; the time of the check before, which a record may keep, is read by no view
    and not loaded); main-thread spans
    of every category but ``compute`` (overhead and data), sorted by start; the outermost
    main-thread compute time of each execution (compute spans belong to the execution entered
    last before they started); device metrics by step; clock samples; a sample of span start
    times (for arrival lateness); events.
    """

    step_seq: array[int] = dataclasses.field(default_factory=_ints)
    step_number: array[int] = dataclasses.field(default_factory=_ints)
    step_t0: array[int] = dataclasses.field(default_factory=_ints)
    step_t1: array[int] = dataclasses.field(default_factory=_ints)
    sync_seq: array[int] = dataclasses.field(default_factory=_ints)
    sync_step: array[int] = dataclasses.field(default_factory=_ints)
    sync_t: array[int] = dataclasses.field(default_factory=_ints)
    sync_how: Sequence[str] = dataclasses.field(default_factory=list)  # the reader's: Labels
    span_category: Sequence[str] = dataclasses.field(default_factory=list)  # the reader's: Labels
    span_t0: array[int] = dataclasses.field(default_factory=_ints)
    span_t1: array[int] = dataclasses.field(default_factory=_ints)
    span_step: array[int] = dataclasses.field(default_factory=_ints)
    compute_seq: array[int] = dataclasses.field(default_factory=_ints)  # executions with compute time...
    compute_ns: array[int] = dataclasses.field(default_factory=_ints)  # ... and theirs, ns
    device: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)  # metric -> step -> value
    clock: array[int] = dataclasses.field(default_factory=_ints)  # t, offset_ns, rtt_ns of each sample, flat
    starts_step: array[int] = dataclasses.field(default_factory=_ints)  # a sample of span starts: step,
    starts_name: list[str] = dataclasses.field(default_factory=list)  # ... span name,
    starts_t0: array[int] = dataclasses.field(default_factory=_ints)  # ... and start time
    events: Sequence[tuple[str, int, int | None]] = dataclasses.field(default_factory=EventColumns)  # (name, t, step)


def _codes() -> array[int]:
    return array("i")


def _floats() -> array[float]:
    return array("d")


@dataclasses.dataclass
class SessionDetail:
    """What the step table and its explanations read of the reference rank's sessions, per
    step and as columns (never one object per record: a week-long run has millions): tags and
    metric values that name a step (in time order), each span name's time per step (sorted by
    step; ``span_names`` in order of first appearance; names as codes into ``names``), the model FLOPs the integration
    recorded, events with their attributes, and the last ``model`` event's attributes."""

    names: tuple[str, ...] = ()  # the names the *_name columns hold codes of
    tag_step: array[int] = dataclasses.field(default_factory=_ints)
    tag_name: array[int] = dataclasses.field(default_factory=_codes)
    tag_t: array[int] = dataclasses.field(default_factory=_ints)  # when each tag was recorded
    metric_step: array[int] = dataclasses.field(default_factory=_ints)
    metric_name: array[int] = dataclasses.field(default_factory=_codes)
    metric_value: array[float] = dataclasses.field(default_factory=_floats)
    span_step: array[int] = dataclasses.field(default_factory=_ints)
    span_name: array[int] = dataclasses.field(default_factory=_codes)
    span_ns: array[int] = dataclasses.field(default_factory=_ints)
    span_first: array[int] = dataclasses.field(default_factory=_ints)  # the first start of the name in the step
    span_names: tuple[str, ...] = ()  # the span names in order of first appearance
    flops: list[float] = dataclasses.field(default_factory=list)  # flops_per_step metric values
    # name, t, step, attributes (a JSON object, when small)
    events: list[EventRecord] = dataclasses.field(default_factory=list)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # attrs of the last "model" event


class FileRange(NamedTuple):
    """What one JSON segment file held when it was loaded: the earliest and the latest time of
    its records (its session's clock), and the lowest and highest step of its tags, events and
    metrics (None: none has a step). A view of a few steps reads only the files that reach them
    (:mod:`goodtrace.read.raw`)."""

    first_t: int
    last_t: int
    first_mark_step: int | None
    last_mark_step: int | None


@dataclasses.dataclass
class LoadedRun:
    """What the analysis reads: every session's summary and model records, and the step
    detail of the reference rank's sessions."""

    path: str
    sessions: list[SessionInfo]
    details: dict[int, SessionDetail]
    # each session's model columns: a dict, or the loader's source that fetches them when asked
    session_records: MutableMapping[int, SessionRecords] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    form: str = "jsonl"  # "jsonl", "parquet" or "parquet+jsonl"
    records: int = 0
    # where each session's records are, for views that read raw records again (see read.raw)
    files: dict[int, list[str]] = dataclasses.field(default_factory=dict)  # JSON segment files
    # per JSON segment file (as in files): what it held as loaded (a file without a timed record
    # is not in it)
    file_ranges: dict[str, FileRange] = dataclasses.field(default_factory=dict)
    parquet_fids: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # rows of the Parquet copy
    parquet_path: str | None = None
    # lines that are no valid record, by reason (goodtrace.read.validate.SKIP_REASONS)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    # the analysis consumed the step/sync/span columns of session_records (analyze(release_records=True))
    released: bool = False
    # per session with a hang event: (name, t, step, attrs) of its hang events (read.raw.hang_details)
    hang_events: dict[int, list[HangEvent]] = dataclasses.field(default_factory=dict)
    # bytes of JSON lines this load parsed for the run model (the rest came from the segment
    # cache, as whole closed files or as the first part of files still being written)
    read_bytes: int = 0

    def close(self) -> None:
        """Release what the loader holds open for the analysis (its DuckDB connection and
        files); what the analysis kept of each session stays."""
        close = getattr(self.session_records, "close", None)
        if close is not None:
            close()
