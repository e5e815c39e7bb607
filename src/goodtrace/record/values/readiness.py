"""The readiness thread: a step's completion is dated when its value became ready, not when
someone looked at it.

One daemon thread per recorder (``goodtrace-ready``) tests the watched completion values with
their adapter's non-blocking ``ready`` every poll interval, and hands each value it finds
complete to the recorder with the time of that poll and of the poll before it (the value was
not ready then), so its true ready time lies in ``(not_ready_t, t]``. With nothing to watch it
sleeps on a lock until the training thread hands it a value. It never waits on a value and
never synchronises a device; the training thread never waits on it: the two share only a dict
of watched entries and a one-shot claim per entry (``list.pop``, atomic), so exactly one of
them writes its sync point; each publishes the time it saw the value complete before it tries
to claim it, and the one that writes takes the earlier of the two.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from goodtrace.record.errors import warn
from goodtrace.record.threads import Thread


class Pending:
    """A step's completion value goodtrace has not observed yet. ``ctx`` is the step execution
    it belongs to (a :class:`goodtrace.record.recorder.StepContext`, or None when not known)."""

    # The readiness thread's findings live in the instance dict, made on first use in that
    # thread: creating a Pending on the training thread's hot path sets six slots only.
    __slots__ = ("__dict__", "claim", "ctx", "ordinal", "seq", "step", "value")

    not_ready_t = 0  # latest time it was seen not ready (0: never tested)
    seen_t = 0  # the readiness thread saw it complete at this time (0: not yet)
    observed: tuple[int, str] | None = None  # the training thread saw it complete: (time, how)

    def __init__(
        self, ctx: Any, step: int | None, seq: int | None, ordinal: int, value: tuple[Any, Any]
    ) -> None:
        self.ctx = ctx
        self.step = step
        self.seq = seq
        self.ordinal = ordinal  # how many steps had ended when its step began (for the lag)
        self.value = value  # (adapter, handle): one tuple, so it is replaced atomically
        self.claim = [True]  # popped by the one thread that writes its record

    def take(self) -> bool:
        """Claim the right to write this value's record: True exactly once, in any thread."""
        try:
            self.claim.pop()
            return True
        except IndexError:
            return False

    @property
    def taken(self) -> bool:
        return not self.claim


def ready_state(value: tuple[Any, Any]) -> bool | None:
    """Whether a watched ``(adapter, handle)`` value is complete: True, False, or None where
    its adapter cannot tell, or fails (a check never raises into the caller)."""
    adapter, handle = value
    try:
        state: bool | None = adapter.ready(handle)
    except Exception:
        return None
    return state


class PendingMetric:
    """A metric value not read yet (only the training thread, or a thread starting a blocking
    span, reads them, under the recorder's settle lock: no claim needed)."""

    __slots__ = ("ctx", "metric", "ordinal", "step", "value")

    def __init__(
        self, ctx: Any, step: int | None, ordinal: int, value: tuple[Any, Any], metric: tuple[str, str, int]
    ) -> None:
        self.ctx = ctx
        self.step = step
        self.ordinal = ordinal
        self.value = value
        self.metric = metric  # (name, reduce, t)


class ReadinessThread:
    """Tests watched completions every ``interval_s`` and calls ``on_ready(entry, t)`` (in its
    own thread) for each it finds complete and claims."""

    def __init__(
        self, clock: Callable[[], int], interval_s: float, on_ready: Callable[[Pending, int], None]
    ) -> None:
        self._clock = clock
        self._interval = interval_s
        self._on_ready = on_ready
        self.watched: dict[Pending, None] = {}  # insertion-ordered; both threads add and remove
        self.idle = False
        self._stopped = False
        self._wake = threading.Lock()
        self._wake.acquire()  # released by wake(): a one-slot semaphore the thread sleeps on
        self._failed = False
        self.thread = Thread(target=self._run, name="goodtrace-ready", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def watch(self, entry: Pending) -> None:
        """Test ``entry`` from now on (training thread: a dict store and a flag test)."""
        self.watched[entry] = None
        if self.idle:
            self.wake()

    def wake(self) -> None:
        self.idle = False
        try:
            self._wake.release()
        except RuntimeError:  # already released: the thread wakes anyway
            pass

    def stop(self, timeout_s: float) -> None:
        """Stop polling; wait up to ``timeout_s`` for a poll in progress to end."""
        self._stopped = True
        self.wake()
        thread = self.thread
        if timeout_s > 0 and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        watched = self.watched
        sleep = time.sleep
        while not self._stopped:
            if not watched:
                self.idle = True
                if not watched and not self._stopped:  # watch() sees idle and wakes us
                    self._wake.acquire()
                self.idle = False
                continue
            try:
                self.poll()
            except Exception as exc:  # never die: the training thread's observation still works
                if not self._failed:
                    self._failed = True
                    warn(f"internal error in the readiness check: {exc!r}")
            sleep(self._interval)

    def poll(self) -> None:
        """Test every watched value once (also called directly by tests)."""
        watched = self.watched
        try:
            entries = list(watched)  # one C call under the GIL: a consistent snapshot
        except RuntimeError:  # changed size while copied (free-threaded builds): next poll
            return
        clock = self._clock
        before = clock()
        complete = []
        for entry in entries:
            if not entry.claim:  # the training thread dated it
                watched.pop(entry, None)
                continue
            state = ready_state(entry.value)
            if state is True:
                complete.append(entry)
            elif state is False:
                entry.not_ready_t = before  # tested after `before`: not ready then either
            else:  # cannot tell: only waiting dates it
                watched.pop(entry, None)
        if complete:
            t = clock()  # after the tests: every value found complete was complete by now
            for entry in complete:
                entry.seen_t = t
                if entry.take():
                    self._on_ready(entry, t)
                watched.pop(entry, None)
