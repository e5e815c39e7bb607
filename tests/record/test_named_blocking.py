"""A span made blocking by its name alone (``save``, ``eval``, ``restore``, ``profile``) says so
once, when it first waits for the device, naming the span and how to silence it; one whose
category was given (``category=``, ``init(categories=...)``) or that does not wait says nothing."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import goodtrace as gt
from goodtrace import schema
from goodtrace.record import spans
from goodtrace.testing import SimulatedDevice, capture

pytestmark = pytest.mark.unit


@contextmanager
def caught() -> Iterator[list[str]]:
    """goodtrace's warnings issued inside, as their messages."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield messages
    messages.extend(str(w.message) for w in seen if issubclass(w.category, gt.GoodtraceWarning))


def _named(messages: list[str]) -> list[str]:
    return [m for m in messages if "is blocking: its name makes its category" in m]


def test_a_name_that_blocks_warns_once_when_it_first_waits() -> None:
    device = SimulatedDevice()
    with caught() as messages, capture(poll_interval_s=0) as cap:  # no readiness thread: the span dates the step
        for k in range(3):
            with gt.step(k) as s:
                s.complete_on(device.launch(0.002))
            with gt.span("save"):  # settles step k first
                pass
            with gt.span("eval"):
                pass
    save, evaluate = _named(messages)
    assert save.startswith("goodtrace: span 'save' is blocking: its name makes its category 'checkpoint_save'")
    assert "waits for the pending steps" in save and "gt.span('save', category='checkpoint_save')" in save
    assert "span 'eval'" in evaluate and "category='eval'" in evaluate
    # the spans are what they were: blocking, so each waited for its step (a blocking sync point)
    assert [r["cat"] for r in cap.records(schema.SPAN) if r["name"] == "save"] == [schema.CHECKPOINT_SAVE] * 3
    assert [r["how"] for r in cap.records(schema.SYNC)] == [schema.SYNC_BLOCKING] * 3
    # once warned, the name's key is a plain blocking span: no check on the later waits
    assert spans._keys.get("save", (None, None, None, None))[3] in (None, spans.BlockingSpan)


def test_a_named_blocking_span_pays_the_check_only_until_it_warned() -> None:
    with caught(), capture():
        with gt.step(0):
            pass
        first = gt.span("restore")
        assert type(first) is spans.NamedBlockingSpan
        with first:
            pass
        second = gt.span("restore")
        assert type(second) is spans.BlockingSpan  # no check at the point of the next wait


@pytest.mark.parametrize("how", ["category", "table", "other thread", "compute name"])
def test_no_warning_where_the_category_was_given_or_nothing_waits(how: str) -> None:
    options: dict[str, Any] = {"categories": {"profile": schema.PROFILE}} if how == "table" else {}
    with caught() as messages, capture(**options):
        with gt.step(0):
            pass
        if how == "category":
            with gt.span("profile", category=schema.PROFILE):
                pass
        elif how == "table":
            with gt.span("profile"):
                pass
        elif how == "other thread":  # an asynchronous checkpoint writer: records, never waits
            thread = threading.Thread(target=lambda: gt.span("save").__enter__().__exit__(None, None, None))
            thread.start()
            thread.join()
        else:
            with gt.span("forward"):
                pass
    assert _named(messages) == []
