"""Hang detection inside the job: a watchdog thread that notices when the training thread has
made no progress (no step entered or ended, no span closed) for longer than a bound learned from
the rank's own history, and records a ``hang`` event with the training thread's stack.

The bound is ``step_factor`` x the median time between step entries, and, inside a blocking
phase (a checkpoint, an eval), also ``phase_factor`` x the longest phase of that category seen
before (the ceiling for a phase never seen), never below ``floor_s`` nor above ``ceiling_s``
(docs/semantics.md section 12). Standard library only; the training thread pays nothing but
the listener calls at step entry and exit: progress inside a step is seen by looking at the
newest records of the recorder's buffer from the watchdog's thread.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from types import FrameType
from typing import TYPE_CHECKING, Any

from goodtrace.record.errors import warn
from goodtrace.record.hang_peers import last_span_written, peer_hangs, stop_order, summary_line, where_text
from goodtrace.record.io.storage import is_url, local_path
from goodtrace.record.threads import Thread

if TYPE_CHECKING:
    from goodtrace.record.recorder import Recorder

__all__ = ["HANG_EVENT", "HANG_EXIT_CODE", "HANG_OVER_EVENT", "HangPolicy", "HangWatchdog", "detect_hangs"]

HANG_EVENT = "hang"  # a rank's training thread stopped making progress
HANG_OVER_EVENT = "hang_over"  # ... and made progress again (a stall, not a hang)
HANG_EXIT_CODE = 75  # on_hang="abort": EX_TEMPFAIL, "try again": the launcher restarts the job
MAX_STACK_FRAMES = 40
NATIVE_TIMEOUT_S = 10.0
_HISTORY = 256  # step-entry intervals the median is taken over
_PEEK = 16  # newest buffer records looked at per check
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _positive(name: str, value: object, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > minimum or value != value:
        raise ValueError(f"detect_hangs({name}=...) takes a number above {minimum:g}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HangPolicy:
    """When a silent training thread counts as hung, and what happens then."""

    step_factor: float = 10.0  # silent for more than this many median step times...
    phase_factor: float = 2.0  # ... and, in a blocking phase, than this x its longest seen
    floor_s: float = 30.0  # the bound is never shorter...
    ceiling_s: float = 1800.0  # ... nor longer (also the bound in a phase never seen before)
    min_steps: int = 5  # step entries before any bound is learned (until then: no alarm)
    check_interval_s: float = 0.1  # how often the watchdog looks
    on_hang: str = "record"  # "record", or "abort": exit with HANG_EXIT_CODE after recording
    native: bool = True  # also dump native frames with py-spy where it is installed

    def __post_init__(self) -> None:
        _positive("step_factor", self.step_factor)
        _positive("phase_factor", self.phase_factor)
        _positive("floor_s", self.floor_s)
        _positive("ceiling_s", self.ceiling_s)
        _positive("check_interval_s", self.check_interval_s)
        if self.ceiling_s < self.floor_s:
            raise ValueError(f"detect_hangs: ceiling_s ({self.ceiling_s:g}) is below floor_s ({self.floor_s:g})")
        if isinstance(self.min_steps, bool) or not isinstance(self.min_steps, int) or self.min_steps < 2:
            raise ValueError(f"detect_hangs(min_steps=...) takes an integer >= 2, got {self.min_steps!r}")
        if self.on_hang not in ("record", "abort"):
            raise ValueError(f"detect_hangs(on_hang=...) takes 'record' or 'abort', got {self.on_hang!r}")


class HangWatchdog:
    """One daemon thread per process (``goodtrace-hang``), started by :func:`detect_hangs`."""

    def __init__(self, recorder: Recorder, policy: HangPolicy) -> None:
        self.recorder, self.policy = recorder, policy
        self.clock = recorder.clock
        self.training_thread: int | None = None  # the thread that enters steps
        self.training_native_id: int | None = None  # ... its operating-system id (py-spy's)
        self.steps = 0
        self.step: int | None = None
        self.intervals: deque[int] = deque(maxlen=_HISTORY)  # ns between step entries
        self.last_entry: int | None = None
        self.last_progress: int | None = None
        self.last_span: str | None = None  # the last span the training thread closed in this step
        self.last_span_t = 0  # ... when
        self.phase: tuple[str, int] | None = None  # (blocking category, since) while in one
        self.longest_phase: dict[str, int] = {}  # category -> longest ns seen
        self.hung_since: int | None = None  # the last progress before the recorded hang
        self.hangs = 0
        self._seen: Any = None  # the newest buffer record already looked at
        self._stop = threading.Event()
        self._aborting = False
        self._thread = Thread(target=self._run, name="goodtrace-hang", daemon=True)

    # ------------------------------------------------------------------ training thread (hooks)
    def on_step_begin(self, step: int, t0: int) -> None:
        if self.training_thread is None:
            self.training_thread, self.training_native_id = threading.get_ident(), threading.get_native_id()
        if self.last_entry is not None:
            self.intervals.append(t0 - self.last_entry)
        self.last_entry = t0
        self.steps += 1
        self.step = step
        self.phase = None
        self.last_span, self.last_span_t = None, t0
        self._progress(t0)

    def on_step_end(self, step: int, t0: int, t1: int) -> None:
        self._progress(t1)

    def on_blocking_span(self, category: str, t0: int) -> None:
        self.phase = (category, t0)
        self._progress(t0)

    def on_overhead_span(self, category: str, t0: int, t1: int) -> None:
        if self.training_thread is not None and threading.get_ident() != self.training_thread:
            return  # another thread's span (a gc pause the watchdog's own thread paid): no progress
        if self.phase is not None and self.phase[0] == category:
            self.phase = None
            self.longest_phase[category] = max(self.longest_phase.get(category, 0), t1 - t0)
        self._progress(t1)

    def _progress(self, t: int) -> None:
        if self.last_progress is None or t > self.last_progress:
            self.last_progress = t

    # ------------------------------------------------------------------ the watchdog's thread
    def start(self) -> None:
        hooks = self.recorder
        hooks.step_begin_listeners.append(self.on_step_begin)
        hooks.step_listeners.append(self.on_step_end)
        hooks.overhead_span_listeners.append(self.on_overhead_span)
        hooks.blocking_span_listeners.append(self.on_blocking_span)
        hooks.finish_listeners.append(self._on_finish)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _on_finish(self, completed: bool | None, reason: str) -> None:
        """At finish (the training thread): stop, and say so if a recorded hang was over."""
        self.stop()
        if not self._aborting:  # (aborting: the watchdog's thread waits for this finish)
            self._thread.join(1.0)
        if self.hung_since is not None and self.last_progress is not None and self.last_progress > self.hung_since:
            self._over()

    def _over(self) -> None:
        assert self.hung_since is not None and self.last_progress is not None
        self.recorder.event(HANG_OVER_EVENT, {"since": self.hung_since,
                                              "silent_s": (self.last_progress - self.hung_since) / 1e9})
        self.hung_since = None

    def bound_ns(self) -> int | None:
        """The silence that counts as a hang now; None while too few steps were seen."""
        policy = self.policy
        if len(self.intervals) < policy.min_steps - 1:
            return None
        bound = policy.step_factor * statistics.median(self.intervals.copy())
        if self.phase is not None:
            longest = self.longest_phase.get(self.phase[0])
            bound = max(bound, policy.phase_factor * longest if longest is not None else policy.ceiling_s * 1e9)
        return int(min(max(bound, policy.floor_s * 1e9), policy.ceiling_s * 1e9))

    def _run(self) -> None:
        while not self._stop.wait(self.policy.check_interval_s):
            if self.recorder.finished:
                return
            try:
                self.check(self.clock())
            except Exception as exc:  # the watchdog must never take the job down
                warn(f"the hang watchdog stopped: {exc!r}")
                return

    def _peek(self) -> None:
        """Progress inside a step: the training thread's newest closed spans in the buffer (the
        Python writer's deque; the native writer's ring is not looked into: its spans are read
        back from the file before a hang is recorded, :meth:`_written_progress`)."""
        records = getattr(self.recorder.buffer, "records", None)
        if records is None:
            return
        newest: Any = None
        for back in range(1, _PEEK + 1):
            try:
                record = records[-back]
            except IndexError:  # drained by the writer meanwhile, or fewer records
                break
            if record is self._seen:
                break
            if newest is None:
                newest = record
            key = record[0]
            if type(key) is tuple and len(record) >= 5 and record[4] == self.training_thread:
                if record[2] > self.last_span_t:
                    self.last_span, self.last_span_t = key[0], record[2]
                self._progress(record[2])
        if newest is not None:
            self._seen = newest

    def check(self, now: int) -> None:
        """One look: record a hang when the silence exceeds the bound, and its end."""
        self._peek()
        if self.last_progress is None:
            return
        if self.hung_since is not None:
            if self.last_progress > self.hung_since:  # it moved again: a stall, over
                self._over()
            return
        bound = self.bound_ns()
        if bound is None or now - self.last_progress <= bound:
            return
        self._written_progress()
        if now - self.last_progress <= bound:
            return  # progress since: a span the buffer view missed, or a step begun during the flush
        # what the training thread was doing, read while it is silent; if it moved on while the
        # stack was taken, that was no hang (its state and the stack would disagree)
        since, step, span = self.last_progress, self.step, self.last_span
        frame = sys._current_frames().get(self.training_thread) if self.training_thread is not None else None
        if self.last_progress != since or self.step != step:
            return
        self.hung_since = since
        self.hangs += 1
        self._record(now, bound, step, span, frame)

    def _written_progress(self) -> None:
        """Spans the writer took from the buffer before the watchdog saw them: written out
        now, the newest of the training thread's in this step read back from the file (local
        run directories), taken as progress."""
        run_dir = str(self.recorder.run_dir)
        if is_url(run_dir) or self.training_thread is None:
            return
        self.recorder.flush(NATIVE_TIMEOUT_S)
        rank_dir = os.path.join(local_path(run_dir), f"rank-{self.recorder.identity.rank:05d}")
        found = last_span_written(rank_dir, self.recorder.session, self.training_thread, self.last_span_t)
        if found is not None:
            self.last_span, self.last_span_t = found
            self._progress(found[1])

    def _record(self, now: int, bound: int, step: int | None, span: str | None, frame: FrameType | None) -> None:
        stack = traceback.format_stack(frame)[-MAX_STACK_FRAMES:] if frame is not None else []
        location, function = _where(frame)
        assert self.hung_since is not None
        attrs: dict[str, Any] = {
            "step": step,
            "span": span,
            "in_span": open_span(frame),
            "phase": None if self.phase is None else self.phase[0],
            "since": self.hung_since,
            "silent_s": (now - self.hung_since) / 1e9,
            "bound_s": bound / 1e9,
            "median_step_s": statistics.median(self.intervals.copy()) / 1e9 if self.intervals else None,
            "location": location,
            "function": function,
            "stack": "".join(stack),
            "native": _native_stack(self.training_native_id) if self.policy.native else None,
            "action": self.policy.on_hang,
        }
        self.recorder.event(HANG_EVENT, attrs)
        self.recorder.flush(NATIVE_TIMEOUT_S)  # on disk now: the job may be killed at any moment
        rank = self.recorder.identity.rank
        after = (f", in {attrs['in_span']!r}" if attrs["in_span"] else "") + (
            f", after {attrs['span']!r}" if attrs["span"] else "")
        where = f" in {function} ({location})" if location else ""
        print(f"goodtrace: rank {rank} made no progress for {attrs['silent_s']:.1f} s (bound {bound / 1e9:.1f} s) "
              f"at step {step}{where}{after}", file=sys.stderr, flush=True)
        if self.policy.on_hang == "abort":  # at once: the launcher restarts, the report names the first
            self._abort()
        elif rank == 0 and (self.recorder.identity.world_size or 1) > 1:
            # on its own thread: the watchdog goes on looking (a stall may end)
            Thread(target=self._announce, args=(bound,), name="goodtrace-hang-line", daemon=True).start()

    def _announce(self, bound: int) -> None:
        """Rank 0: the line naming the rank that stopped first and where the others wait (a
        local run directory only), as soon as every rank's hang event is in the files, or
        once the others had time to record theirs (two flush intervals and a quarter of the
        bound, at least 1 s, at most 60 s) with those that are. The files are looked at
        every check interval at first, then less often (up to every flush interval)."""
        run_dir = str(self.recorder.run_dir)
        if is_url(run_dir):
            return
        flush_s = self.recorder.config.flush_interval_s
        deadline = time.monotonic() + 2 * flush_s + min(max(1.0, 0.25 * bound / 1e9), 60.0)
        pause = self.policy.check_interval_s
        while True:
            if self._stop.wait(max(0.0, min(pause, deadline - time.monotonic()))):
                return
            hangs, ranks = peer_hangs(local_path(run_dir))
            if hangs and len(hangs) >= ranks:
                break
            if time.monotonic() >= deadline:
                if not hangs:
                    return
                break
            pause = min(2 * pause, flush_s)
        first = min(hangs, key=lambda h: stop_order(h.step, h.since_wall, h.rank, h.waiting))
        since = time.strftime("%H:%M:%S UTC", time.gmtime(first.since_wall / 1e9))
        line = summary_line(first.rank, first.host, where_text(first.function, first.location, in_span=first.in_span),
                            first.step, since,
                            [(h.step, where_text(h.function, h.location, in_span=h.in_span))
                             for h in hangs if h is not first])
        quiet = ranks - len(hangs)
        print(f"goodtrace: hang: {line}" + (f"; {quiet} rank(s) recorded no hang" if quiet > 0 else ""),
              file=sys.stderr, flush=True)

    def _abort(self) -> None:
        """Finish the files (bounded: the training thread is stuck, a collective may be too),
        then leave with HANG_EXIT_CODE so the launcher restarts the job."""
        if self._stop.is_set():  # the process is finishing already (an exception, a signal): its way
            return
        self._aborting = True
        closing = Thread(target=self.recorder.finish, args=(False, "hang"), daemon=True)
        closing.start()
        closing.join(self.recorder.config.finish_timeout_s + 5.0)
        os._exit(HANG_EXIT_CODE)


def _where(frame: FrameType | None) -> tuple[str | None, str | None]:
    """The innermost frame of the program (not goodtrace's, not the standard library's
    threading): ``file.py:line`` and its function."""
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep) and os.path.basename(path) != "threading.py":
            return f"{os.path.basename(path)}:{frame.f_lineno}", frame.f_code.co_name
        frame = frame.f_back
    return None, None


def open_span(frame: FrameType | None) -> str | None:
    """The innermost span open on the thread whose innermost frame is ``frame`` (spans record
    nothing until they close): walking out from it, the first frame of the program that is in
    the body of a ``with ...span(NAME...)`` statement, or runs a function decorated with
    ``@...span(NAME...)`` (bare ``@...span``: its qualified name), read from the frame's source.
    NAME is a string literal or a variable of the frame holding a string; None where no such
    span is found (one entered by hand, a name made by an expression, no source)."""
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep):
            found = _span_in_frame(frame)
            if found is not None:
                return found
        frame = frame.f_back
    return None


@functools.lru_cache(maxsize=64)
def _source_tree(filename: str) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _span_name(call: ast.expr, frame: FrameType) -> str | None:
    """NAME of ``...span(NAME, ...)`` (a literal, or a string variable of ``frame``)."""
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    if not ((isinstance(func, ast.Name) and func.id == "span") or (isinstance(func, ast.Attribute) and func.attr == "span")):
        return None
    args = list(call.args[:1]) + [k.value for k in call.keywords if k.arg == "name"]
    if not args:
        return None
    arg = args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        value = frame.f_locals.get(arg.id, frame.f_globals.get(arg.id))
        return value if isinstance(value, str) else None
    return None


def _span_in_frame(frame: FrameType) -> str | None:
    """The innermost span ``frame`` is in (:func:`open_span`), from its own source only."""
    tree = _source_tree(frame.f_code.co_filename)
    if tree is None:
        return None
    line, code = frame.f_lineno, frame.f_code
    scope: ast.AST = tree
    if code.co_name != "<module>":  # the frame's own function: the def holding the line, by name
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.name == code.co_name and n.lineno <= line <= (n.end_lineno or n.lineno)]
        if not defs:
            return None
        scope = max(defs, key=lambda n: n.lineno)  # the innermost
    inner: tuple[int, str] | None = None
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # another frame's code
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.body and (
                node.body[0].lineno <= line <= (node.end_lineno or node.lineno)):
            for item in node.items:
                name = _span_name(item.context_expr, frame)
                if name is not None and (inner is None or node.lineno >= inner[0]):
                    inner = (node.lineno, name)
        pending.extend(ast.iter_child_nodes(node))
    if inner is not None:
        return inner[1]
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for decorator in scope.decorator_list:
            name = _span_name(decorator, frame)
            if name is not None:
                return name
            if (isinstance(decorator, ast.Name) and decorator.id == "span") or (
                    isinstance(decorator, ast.Attribute) and decorator.attr == "span"):
                return str(getattr(code, "co_qualname", code.co_name))  # (3.11 on)
    return None


def _native_stack(thread: int | None) -> str | None:
    """The training thread's part of ``py-spy dump --native`` of this process when py-spy is
    installed (None otherwise; its error when it could not attach)."""
    tool = shutil.which("py-spy")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "dump", "--native", "--pid", str(os.getpid())], capture_output=True,
                              text=True, timeout=NATIVE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"py-spy failed: {exc!r}"
    if done.returncode != 0:
        return f"py-spy failed ({done.returncode}): {done.stderr.strip()[:500]}"
    sections = done.stdout.split("\nThread ")
    mine = [part for part in sections[1:] if thread is not None and part.startswith(f"{thread} ")]
    return "Thread " + mine[0].rstrip() if mine else done.stdout


def detect_hangs(**options: Any) -> HangWatchdog | None:
    """Start hang detection on the active recorder (call after ``gt.init``); options are the
    fields of :class:`HangPolicy`. Returns the watchdog, or None (with a warning) when
    recording is off. A wrong option raises ``ValueError`` here, before the job runs."""
    from goodtrace.record import api

    policy = HangPolicy(**options)
    recorder = api.recorder()
    if not hasattr(recorder, "blocking_span_listeners") or getattr(recorder, "finished", True):
        warn("detect_hangs(): recording is off (call gt.init first); no hang detection")
        return None
    watchdog = HangWatchdog(recorder, policy)  # type: ignore[arg-type]
    watchdog.start()
    return watchdog
