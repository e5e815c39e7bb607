"""Field names on disk are defined once, in ``goodtrace.schema`` (``F_*``, ``H_*``), but the
Python encoder (``record/io/encoding.py``, ``writer.py``) and the native writer
(``record/io/native_writer.c``) spell them out for speed. These tests hold them to the schema:
a run recorded through the public API with each writer holds only the schema's field names, the
same ones per kind from both, and every key the C source writes is one of the schema's."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace import schema
from goodtrace.record import fastpath

SOURCES = Path(schema.__file__).resolve().parent / "record" / "io"
KINDS = {schema.HEADER, schema.SPAN, schema.STEP, schema.SYNC, schema.TAG, schema.EVENT, schema.METRIC,
         schema.HEARTBEAT, schema.CLOCK, schema.FINISH}


def _names(prefix: str) -> set[str]:
    return {value for name, value in vars(schema).items() if name.startswith(prefix) and isinstance(value, str)}


RECORD_FIELDS = _names("F_")
HEADER_FIELDS = _names("H_") | {schema.F_KIND, schema.F_WALL, schema.F_MONO}


def _record(run_dir: Path, **options: Any) -> dict[str, set[str]]:
    """Every kind of record, through the public API; the keys written per kind."""
    gt.init(run_dir, record_gc=False, **options)
    for k in range(3):
        with gt.step(k) as s:
            with gt.span("forward"):
                pass
            with gt.span("data", attrs={"batch": k}):
                pass
            gt.metric("loss", 0.5 * k)
            gt.tag("eval") if k == 1 else None
            s.complete_on(float(k))
    gt.event("checkpoint_saved", path="/x")
    gt.finish()
    keys: dict[str, set[str]] = {}
    for path in sorted(run_dir.rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            keys.setdefault(record[schema.F_KIND], set()).update(record)
    return keys


def _check(keys: dict[str, set[str]]) -> None:
    assert set(keys) <= KINDS, set(keys) - KINDS
    assert {schema.HEADER, schema.SPAN, schema.STEP, schema.SYNC, schema.METRIC, schema.HEARTBEAT} <= set(keys)
    for kind, names in keys.items():
        allowed = HEADER_FIELDS if kind == schema.HEADER else RECORD_FIELDS
        assert names <= allowed, f"{kind}: {sorted(names - allowed)} are not schema field names"


def test_python_writer_writes_only_schema_field_names(tmp_path: Path) -> None:
    # a clock other than perf_counter_ns gets the Python writer (record/io/choice.py)
    _check(_record(tmp_path, clock=lambda: time.perf_counter_ns()))


@pytest.mark.skipif(fastpath.native is None, reason="the native writer is not built here")
def test_native_writer_writes_the_same_field_names_as_the_python_writer(tmp_path: Path) -> None:
    native = _record(tmp_path / "native")
    _check(native)
    assert native == _record(tmp_path / "python", clock=lambda: time.perf_counter_ns())


def test_every_key_in_the_c_writer_is_a_schema_field_name() -> None:
    source = (SOURCES / "native_writer.c").read_text(encoding="utf-8")
    keys = set(re.findall(r'\\"([A-Za-z_0-9]+)\\":', source))
    assert {schema.F_KIND, schema.F_STEP, schema.F_T0, schema.F_SEQ, schema.F_DROPPED} <= keys  # it parsed
    assert keys <= RECORD_FIELDS, sorted(keys - RECORD_FIELDS)
    kinds = set(re.findall(r'\\"kind\\":\\"([a-z]+)\\"', source))
    assert kinds and kinds <= KINDS, kinds
