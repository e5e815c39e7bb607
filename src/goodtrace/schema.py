"""The record schema shared by the recorder (writer) and the readers.

This is a leaf module: it imports nothing of goodtrace. It fixes the record kinds, the field
names of the JSON-lines files, the schema version, the span categories and the badput buckets.
Bump ``SCHEMA_VERSION`` whenever a field changes meaning; readers accept every version listed
in ``READABLE_VERSIONS`` and warn on newer ones.
"""

from __future__ import annotations

from typing import Final

SCHEMA_VERSION: Final = 1
READABLE_VERSIONS: Final = frozenset({1})

# --------------------------------------------------------------------------------------------
# Record kinds. In memory a record is a tuple whose first item is one of these interned strings;
# on disk it is one JSON object per line whose "kind" field holds it.
# --------------------------------------------------------------------------------------------
HEADER: Final = "header"  # first line of every segment: who wrote it, schema, clock anchor
SPAN: Final = "span"  # named host interval: name, category, t0, t1, step, thread, attrs, error
STEP: Final = "step"  # host entry/exit of a step context: step, t0 (enter), t1 (exit), seq
SYNC: Final = "sync"  # a step's sync point: step, t (when its value was ready), how, seq, after
TAG: Final = "tag"  # label on a step: step, name, t
EVENT: Final = "event"  # named instant: name, t, step, attrs
METRIC: Final = "metric"  # named value at a step: name, step, value, reduce, t
HEARTBEAT: Final = "heartbeat"  # each flush: wall, mono (a clock anchor), dropped so far
CLOCK: Final = "clock"  # offset of this rank's clock to the reference rank: offset_ns, rtt_ns
FINISH: Final = "finish"  # finish() or interpreter exit: completed (true/false/null), t, reason, exception

RECORD_KINDS: Final = (HEADER, SPAN, STEP, SYNC, TAG, EVENT, METRIC, HEARTBEAT, CLOCK, FINISH)

# A rollback inside one process (``gt.event("rollback", to_step=N)``): the state of step N was
# restored. Its EVENT record carries N in its step field (not the step in progress) and
# ``to_step`` in its attributes; one without a usable ``to_step`` has no step.
EVENT_ROLLBACK: Final = "rollback"

# How a sync point was obtained (SYNC "how" field).
SYNC_LAG: Final = "lag"  # observed when a later step ended (the normal, free case)
SYNC_READY: Final = "ready"  # already complete when its step ended (the loop had synchronised)
SYNC_HOST: Final = "host"  # a host value (Python number, NumPy, CPU tensor): complete on arrival
SYNC_BLOCKING: Final = "blocking"  # observed because a blocking span started
SYNC_FINISH: Final = "finish"  # observed at finish() / exit
SYNC_POLL: Final = "poll"  # dated by the background readiness check (before anyone looked at it)
SYNC_BARRIER: Final = "barrier"  # a framework device barrier ran before a blocking span
SYNC_HOWS: Final = (SYNC_LAG, SYNC_READY, SYNC_HOST, SYNC_BLOCKING, SYNC_FINISH, SYNC_POLL, SYNC_BARRIER)

# Field names on disk (JSON), defined here. The encoders spell them out for speed (record/io/
# encoding.py, writer.py's heartbeat, native_writer.c); tests/record/test_field_names.py holds
# every name they write, and the header's, to these constants.
F_KIND: Final = "kind"
F_NAME: Final = "name"
F_CATEGORY: Final = "cat"
F_T0: Final = "t0"
F_T1: Final = "t1"
F_T: Final = "t"
F_STEP: Final = "step"
F_THREAD: Final = "tid"
F_ATTRS: Final = "attrs"
F_ERROR: Final = "err"
F_HOW: Final = "how"
F_VALUE: Final = "value"
F_REDUCE: Final = "reduce"
F_WALL: Final = "wall"
F_MONO: Final = "mono"
F_DROPPED: Final = "dropped"
F_COMPLETED: Final = "completed"
F_REASON: Final = "reason"
F_OFFSET: Final = "offset_ns"
F_RTT: Final = "rtt_ns"
# The execution a step or sync record belongs to: 0, 1, 2, ... in step-entry order within the
# session. Step numbers may repeat or go back; executions never do (older files lack it: the
# readers number executions by the order of step records, and match sync records in order).
F_SEQ: Final = "seq"
# On a sync record: the latest time the value was seen *not* ready (the readiness check before
# the one that dated it), so the true ready time lies in (after, t]. Absent when not polled.
F_READY_AFTER: Final = "after"
# On a finish record: the qualified type name of the uncaught exception that ended the process.
F_EXCEPTION: Final = "exception"

# Header fields.
H_SCHEMA: Final = "schema"
H_SESSION: Final = "session"  # unique id of one process incarnation
H_SEGMENT: Final = "segment"  # 0, 1, 2, ... within the session
H_RANK: Final = "rank"
H_WORLD: Final = "world"
H_LOCAL_RANK: Final = "local_rank"
H_HOST: Final = "host"
H_PID: Final = "pid"
H_RESTART: Final = "restart"  # launcher restart counter when the launcher gives one, else null
H_PROC_START: Final = "proc_start_mono"  # OS process start, on this process's monotonic clock
H_PROC_START_SOURCE: Final = "proc_start_source"  # "os" or "import" (fallback)
H_INIT: Final = "init_mono"  # when init() ran
H_SUBMIT_WALL: Final = "submit_wall"  # job submission time (wall ns) when known
H_CONFIG: Final = "config"
DEFAULT_FLUSH_INTERVAL_S: Final = 1.0  # the recorder's flush interval; a header's config that names none is read with it
H_VERSION: Final = "version"  # goodtrace package version
H_MAIN_TID: Final = "main_tid"  # the thread that called init(): its spans are the main thread's
H_RANK_SOURCE: Final = "rank_source"  # where the rank came from (argument, launcher variable, ...)
H_OVERHEAD_CATEGORIES: Final = "overhead_categories"  # the built-in and declared overhead categories

# --------------------------------------------------------------------------------------------
# Categories and buckets.
# --------------------------------------------------------------------------------------------
COMPUTE: Final = "compute"
DATA: Final = "data"
INIT: Final = "init"
COMPILE: Final = "compile"
CHECKPOINT_SAVE: Final = "checkpoint_save"
CHECKPOINT_RESTORE: Final = "checkpoint_restore"
EVAL: Final = "eval"
GC: Final = "gc"
PROFILE: Final = "profile"
LOG: Final = "log"

PRODUCTIVE_CATEGORIES: Final = frozenset({COMPUTE, DATA})
OVERHEAD_CATEGORIES: Final = frozenset(
    {INIT, COMPILE, CHECKPOINT_SAVE, CHECKPOINT_RESTORE, EVAL, GC, PROFILE, LOG}
)
BUILTIN_CATEGORIES: Final = PRODUCTIVE_CATEGORIES | OVERHEAD_CATEGORIES

# Spans of these categories settle pending step completions before their start time is taken.
BLOCKING_CATEGORIES: Final = frozenset({CHECKPOINT_SAVE, CHECKPOINT_RESTORE, EVAL, PROFILE})

# Default name -> category table (lower-cased names; see category_for_name).
DEFAULT_CATEGORY_BY_NAME: Final[dict[str, str]] = {
    "checkpoint": CHECKPOINT_SAVE,
    "ckpt": CHECKPOINT_SAVE,
    "save": CHECKPOINT_SAVE,
    "checkpoint_save": CHECKPOINT_SAVE,
    "save_checkpoint": CHECKPOINT_SAVE,
    "restore": CHECKPOINT_RESTORE,
    "load_checkpoint": CHECKPOINT_RESTORE,
    "checkpoint_restore": CHECKPOINT_RESTORE,
    "checkpoint_load": CHECKPOINT_RESTORE,
    "eval": EVAL,
    "evaluate": EVAL,
    "evaluation": EVAL,
    "validate": EVAL,
    "validation": EVAL,
    "gc": GC,
    "compile": COMPILE,
    "init": INIT,
    "setup": INIT,
    "profile": PROFILE,
    "profiler": PROFILE,
    "log": LOG,
    "logging": LOG,
    "data": DATA,
    "dataloader": DATA,
    "data_loading": DATA,
    "next_batch": DATA,
}


def category_for_name(name: str) -> str:
    """The default category of a span name: the table above, else ``compute``."""
    return DEFAULT_CATEGORY_BY_NAME.get(name.strip().lower(), COMPUTE)


# Badput buckets of the time partition (docs/semantics.md section 3.1), in report order.
BUCKET_PRODUCTIVE: Final = "productive"
BUCKET_SCHEDULING: Final = "scheduling"
BUCKET_STARTUP: Final = "startup"
BUCKET_WASTED_PROGRESS: Final = "wasted_progress"
BUCKET_DISRUPTION: Final = "disruption"
BUCKET_TEARDOWN: Final = "teardown"
BUCKET_DATA: Final = DATA
BUCKET_WARMUP: Final = "warmup"  # a first step's excess over the ideal without compile evidence (inferred)
BASE_BUCKETS: Final = (
    BUCKET_PRODUCTIVE,
    BUCKET_SCHEDULING,
    BUCKET_STARTUP,
    COMPILE,
    BUCKET_WARMUP,
    CHECKPOINT_SAVE,
    CHECKPOINT_RESTORE,
    EVAL,
    GC,
    PROFILE,
    LOG,
    INIT,
    BUCKET_DATA,
    BUCKET_WASTED_PROGRESS,
    BUCKET_DISRUPTION,
    BUCKET_TEARDOWN,
)

# Device time (framework integrations): spans of this category hold accelerator-busy intervals;
# these per-step metrics come from CUDA events (goodtrace.integrations.torch).
DEVICE_CATEGORY: Final = "device"
DEVICE_BUSY_METRIC: Final = "device/busy_s"  # device time of the step (begin -> end event)
DEVICE_IDLE_METRIC: Final = "device/idle_s"  # the stream's idle gap before the step
DEVICE_METRICS: Final = (DEVICE_BUSY_METRIC, DEVICE_IDLE_METRIC)

REDUCTIONS: Final = frozenset({"mean", "sum", "min", "max", "std", "last"})

# Environment variables of launchers that count restarts (attempt discovery).
RESTART_COUNTER_ENV: Final = ("GOODTRACE_ATTEMPT", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
