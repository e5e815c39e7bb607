"""A blocking span on another thread (an asynchronous checkpoint writer) only records: it never
waits for the training thread's pending values (it used to, holding the lock the training
thread needs at its next step end), never dates the training thread's steps, and never runs the
device barrier for the step in progress. The real recorder, in process; the values complete
when the test says."""

from __future__ import annotations

import threading

import goodtrace as gt
from goodtrace import schema
from goodtrace.testing import capture


class Value:
    """A device value that completes when the test sets ``done``; counts the barriers run on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.barriers = 0

    def __goodtrace_ready__(self) -> bool:
        return self.done.is_set()

    def __goodtrace_wait__(self) -> None:
        self.done.wait()

    def __goodtrace_barrier__(self) -> None:
        self.barriers += 1


def test_a_checkpoint_span_on_another_thread_only_records() -> None:
    def save() -> None:
        with gt.span("checkpoint"):  # a blocking category
            pass

    # no readiness thread: only the training thread's observations date the steps
    with capture(rank=0, world_size=1, lag=1, poll_interval_s=0) as cap:
        first = Value()
        with gt.step(0) as s:
            s.complete_on(first)  # pending: the device has not finished step 0
        with gt.step(1) as s:
            writer = threading.Thread(target=save, name="checkpoint-writer")
            writer.start()
            writer.join(timeout=10)
            stuck = writer.is_alive()  # waiting for step 0's value, as the training thread would
            first.done.set()
            writer.join()
            second = Value()
            second.done.set()
            s.complete_on(second)
    assert not stuck
    assert first.barriers == 0 and second.barriers == 0
    # step 0 dated by the training thread at step 1's end (the lag), step 1 ready at its own end
    assert [(r["step"], r["how"]) for r in cap.records(schema.SYNC)] == [(0, schema.SYNC_LAG), (1, schema.SYNC_READY)]
    (span,) = [r for r in cap.records("span") if r["name"] == "checkpoint"]
    assert span["cat"] == schema.CHECKPOINT_SAVE and span["tid"] == writer.ident


def test_a_checkpoint_span_on_the_training_thread_still_settles() -> None:
    with capture(rank=0, world_size=1, lag=1, poll_interval_s=0) as cap:
        value = Value()
        with gt.step(0) as s:
            s.complete_on(value)
        value.done.set()
        with gt.span("checkpoint"):
            pass
    assert [(r["step"], r["how"]) for r in cap.records(schema.SYNC)] == [(0, schema.SYNC_BLOCKING)]
