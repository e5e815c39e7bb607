"""The writer's encoder and bounded buffer in process: the C loop over plain spans writes the
same bytes as the Python encoder, whatever the records are; the buffer's bound and count are
the same in C and Python."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest

from goodtrace import schema
from goodtrace.record.io import encoding
from goodtrace.record.spans import Span


def _records() -> list[tuple[Any, ...]]:
    keys = [("fwd", "compute", False, Span), ('na\u00efve %s "q"\n', "data", False, Span),
            ("lone \udc80 surrogate", "compute", False, Span)]
    out: list[tuple[Any, ...]] = []
    for i in range(3000):
        key = keys[i % 3]
        if i % 7 == 0:
            out.append((key, i, i + 5, None, 1, None, None))  # no step
        elif i % 11 == 0:
            out.append((key, i, i + 5, 3, 1, {"a": i}, None))  # attributes
        elif i % 13 == 0:
            out.append((schema.STEP, i, 1, 2))
        elif i % 17 == 0:
            out.append((key, 2**70, -(2**63), 3, 1, None, None))  # beyond 64 bits, and the minimum
        elif i % 19 == 0:
            out.append((key, 1, 2, 3, 1, None, ValueError))  # an error
        elif i % 23 == 0:
            out.append((key, -5, 0, -1, 0, None, None))
        else:
            out.append((key, 10**18 + i, 10**18 + i + 5, i, 140234567890123, None, None))
    return out


def _encode(records: list[tuple[Any, ...]]) -> bytes:
    out: list[bytes] = []
    assert encoding._Encoder().encode_many(records, out, pytest.fail) == len(records)
    return b"".join(out)


def test_the_c_loop_writes_what_the_python_encoder_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    if encoding._encode_plain_spans is None:
        pytest.skip("the C extension is not built here")
    records = _records()
    with_c = _encode(records)
    monkeypatch.setattr(encoding, "_encode_plain_spans", None)
    assert with_c == _encode(records)
    lines = with_c.decode("utf-8", "surrogatepass").splitlines()
    assert len(lines) == len(records)
    assert all(isinstance(json.loads(line), dict) for line in lines)


@pytest.mark.parametrize("impl", ["c", "python"])
def test_the_buffer_bound_and_count(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if impl == "c" and encoding._speedups is None:
        pytest.skip("the C extension is not built here")
    if impl == "python":
        monkeypatch.setattr(encoding, "_speedups", None)
    buffer = encoding.RecordBuffer(3)
    for i in range(5):
        buffer.append((i,))
    assert list(buffer.records) == [(0,), (1,), (2,)] and buffer.dropped == 2 and len(buffer) == 3
    buffer.append_always(("finish",))  # the finish record is never refused
    assert len(buffer) == 4 and buffer.dropped == 2
    assert isinstance(buffer.records, collections.deque)
