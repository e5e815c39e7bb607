"""goodtrace's torchtitan handler, fed torchtitan-shaped records in this process: spans pair per
asyncio task (last opened first closed), a ``NAME_error`` ends its span as raised, an end
without its start records nothing, and the converter of saved logs pairs the same records the
same way (one pairing, ``goodtrace.record.start_end_spans``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from goodtrace import schema
from goodtrace.integrations.torchtitan import GoodtraceHandler
from goodtrace.read.sessions import read_run
from goodtrace.read.torchtitan import converted_run
from goodtrace.testing import capture

# (log_type, log_type_name, task): two tasks interleave; "eval" raises; "gc_collect" ends twice
RECORDS: list[tuple[str, str, str | None]] = [
    ("event", "checkpoint_save_start", "a"),
    ("event", "eval_start", "b"),
    ("event", "gc_collect_start", "a"),
    ("event", "eval_error", "b"),
    ("event", "checkpoint_save_end", "a"),  # its gc_collect is still open: the last of its name closes
    ("event", "eval_end", "b"),
    ("event", "gc_collect_end", "a"),
    ("event", "gc_collect_end", "a"),  # no start left: nothing
]


def _spans(records: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return sorted((r[schema.F_NAME], r[schema.F_CATEGORY], bool(r[schema.F_ERROR])) for r in records)


EXPECTED = [("checkpoint_save", schema.CHECKPOINT_SAVE, False), ("eval", schema.EVAL, True),
            ("gc_collect", schema.GC, False)]


def test_the_handler_pairs_spans_per_task_and_ends_a_raised_one_as_raised(tmp_path: Path) -> None:
    handler = GoodtraceHandler()
    with capture(tmp_path / "run") as cap:
        for kind, name, task in RECORDS:
            record = logging.LogRecord("torchtitan", logging.INFO, __file__, 0, "", None, None)
            record.log_type, record.log_type_name, record.task_name = kind, name, task
            handler.emit(record)
    assert _spans(cap.records(schema.SPAN)) == EXPECTED


def test_the_converter_pairs_the_same_records_the_same_way(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    with open(logs / "training.global_rank_0.stamp-000001.jsonl", "w") as file:
        for i, (kind, name, task) in enumerate(RECORDS):
            file.write(json.dumps({"log_type": kind, "log_type_name": name, "task_name": task,
                                   "time_us": 1_000_000 + 1000 * i, "seq_id": i}) + "\n")
    run = read_run(converted_run(str(logs), str(tmp_path / "cache")))
    assert _spans([r for _, r in run.records(schema.SPAN)]) == EXPECTED
