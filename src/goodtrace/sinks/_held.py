"""The job's goodput so far from what the job holds: each attempt's own figures, never the run.

A sink inside the job must not read or analyse the run directory (``load_run`` and ``analyze``
over every earlier step, on every host at once, after each restart). Instead each attempt
leaves a few numbers of its own in its rank directory, ``rank-NNNNN/attempts.json``: per
attempt (session) its start on the wall clock, its productive seconds so far (the live line's,
by the report's partition rules), the first and last step it executed, the wall time of its last
line, and how it ended. The sinks of this rank write it (through the storage layer, replaced
whole: a rename locally, one PUT on an object store) when they open, at most every
:data:`WRITE_EVERY_S` as lines come, and when they close; the next attempt reads that one small
file once, O(attempts), and lists the rank directory once for sessions that left no figures
(an attempt killed before its sinks opened, or run without sinks: their start, from the session
name, still counts, their productive time is unknown and counts 0).

:func:`job_goodput` is then (counted productive seconds of the earlier attempts + this attempt's
productive seconds) / (now - the job's start: its submission when known, else its first
attempt's start). An earlier attempt's steps that a later attempt executed again are wasted
progress, as in the report (semantics 4.4); the figures hold no per-step times, so the part of
an attempt's productive time that was re-done is taken in proportion to the steps re-done, as if
its steps had taken equal productive time each (:func:`counted_productive`). The report's
figure (``goodtrace report``, ``goodtrace export``) is exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from goodtrace.record.io.storage import is_url, local_path, open_storage
from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.sink_hub import SinkRun
from goodtrace.record.process import process_start_mono_ns, submit_wall_ns

__all__ = ["FILE_NAME", "AttemptFigures", "Held", "counted_productive", "held", "job_goodput"]

FILE_NAME = "attempts.json"
VERSION = 1
WRITE_EVERY_S = 30.0
MAX_ATTEMPTS = 10_000  # a file of more is not this layout's: ignored


@dataclasses.dataclass(frozen=True)
class AttemptFigures:
    """One attempt's own figures (one rank's timeline)."""

    session: str
    start_wall_ns: int
    productive_s: float = 0.0
    first_step: int | None = None
    last_step: int | None = None
    end_wall_ns: int | None = None  # its last line (or close)
    completed: bool | None = None  # None: running, killed, or unknown
    restart: int | None = None  # the launcher's restart counter
    submit_wall_ns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> AttemptFigures | None:
        if not isinstance(raw, dict):
            return None
        try:
            known: dict[str, Any] = {f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw}
            figures = cls(**known)
        except TypeError:
            return None
        ints = (figures.start_wall_ns, figures.first_step, figures.last_step, figures.end_wall_ns,
                figures.restart, figures.submit_wall_ns)
        if not isinstance(figures.session, str) or not isinstance(figures.start_wall_ns, int) or not all(
                v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in ints):
            return None
        if not isinstance(figures.productive_s, (int, float)) or not 0 <= figures.productive_s < 1e12:
            return None
        return figures


def counted_productive(attempts: Sequence[tuple[int | None, int | None, float]]) -> float:
    """Productive seconds that still count, of attempts ``(first step, last step, productive
    seconds)`` in time order: each one's, less the share of its steps a later attempt executed
    again (equal productive time per step assumed). O(attempts^2) on a handful of attempts."""
    total = 0.0
    for k, (first, last, productive) in enumerate(attempts):
        if first is None or last is None or last < first or productive <= 0:
            total += max(0.0, productive) if first is None else 0.0
            continue
        later = sorted((f, la) for f, la, _ in attempts[k + 1:] if f is not None and la is not None and la >= f)
        redone, cursor = 0, first
        for f, la in later:
            low, high = max(f, cursor), min(la, last)
            if high >= low:
                redone += high - low + 1
                cursor = high + 1
        total += productive * (1 - redone / (last - first + 1))
    return total


def job_goodput(earlier: Sequence[AttemptFigures], current: AttemptFigures, now_wall_ns: int) -> float | None:
    """The job's goodput so far: earlier attempts' counted productive time plus the current
    attempt's, over the time since the job started (None before it)."""
    starts = [a.start_wall_ns for a in (*earlier, current)]
    submitted = [a.submit_wall_ns for a in (*earlier, current) if a.submit_wall_ns is not None]
    start = min(submitted[:1] + starts)
    total_s = (now_wall_ns - start) / 1e9
    if total_s <= 0:
        return None
    productive = counted_productive([(a.first_step, a.last_step, a.productive_s) for a in (*earlier, current)])
    return max(0.0, min(1.0, productive / total_s))


def same_job(earlier: Sequence[AttemptFigures], current: AttemptFigures) -> list[AttemptFigures]:
    """The attempts of ``earlier`` that belong to ``current``'s job, as the report tells jobs
    apart in a reused run directory (semantics 4.3): a new job starts after an attempt that
    completed when the next starts at or before its last step, where the launcher's restart
    counter goes backwards, or where the submit time differs."""
    chain = [*earlier, current]
    begin = 0
    for i in range(1, len(chain)):
        before, now = chain[i - 1], chain[i]
        if (before.completed and before.last_step is not None and now.first_step is not None
                and now.first_step <= before.last_step) or (
                before.restart is not None and now.restart is not None and now.restart < before.restart) or (
                before.submit_wall_ns != now.submit_wall_ns
                and before.submit_wall_ns is not None and now.submit_wall_ns is not None):
            begin = i
    return chain[begin:-1]


class Held:
    """This rank's attempt figures: read once, kept up to date from the live lines, written back."""

    def __init__(self, run: SinkRun) -> None:
        self.run = run
        self.rank_dir = f"rank-{run.rank:05d}"
        self.path = f"{self.rank_dir}/{FILE_NAME}"
        self._lock = threading.Lock()
        self._storage: Any = None
        self._written_at = 0.0
        start_mono, _ = process_start_mono_ns()
        start_wall = time.time_ns() - max(0, time.perf_counter_ns() - start_mono)
        self.current = AttemptFigures(session=run.session, start_wall_ns=start_wall, restart=run.restart,
                                      submit_wall_ns=submit_wall_ns())
        self.earlier = self._read()
        self.write()

    # ------------------------------------------------------------------ reading
    def _read(self) -> list[AttemptFigures]:
        """The earlier attempts' figures, and a bare entry for each earlier session of this
        rank that left none (its start from the session name)."""
        found: dict[str, AttemptFigures] = {}
        try:
            raw = self._read_bytes(self.path)
            document = json.loads(raw) if raw is not None else {}
            entries = document.get("attempts", []) if isinstance(document, dict) else []
            for entry in entries[:MAX_ATTEMPTS] if isinstance(entries, list) else []:
                figures = AttemptFigures.from_json(entry)
                if figures is not None and figures.session != self.run.session:
                    found[figures.session] = figures
        except (OSError, ValueError):
            pass
        try:
            for session in self._sessions():
                if session not in found and session != self.run.session:
                    start = _session_start(session)
                    if start is not None:
                        found[session] = AttemptFigures(session=session, start_wall_ns=start)
        except Exception:
            pass
        return sorted(found.values(), key=lambda a: (a.start_wall_ns, a.session))

    def _read_bytes(self, path: str) -> bytes | None:
        if is_url(self.run.run_dir):
            import fsspec

            fs, root = fsspec.core.url_to_fs(self.run.run_dir)
            try:
                return bytes(fs.cat_file(root.rstrip("/") + "/" + path))
            except FileNotFoundError:
                return None
        try:
            with open(os.path.join(local_path(self.run.run_dir), *path.split("/")), "rb") as handle:
                return handle.read(16 << 20)
        except FileNotFoundError:
            return None

    def _sessions(self) -> set[str]:
        """Sessions with segments in this rank's directory (one listing)."""
        if is_url(self.run.run_dir):
            import fsspec

            fs, root = fsspec.core.url_to_fs(self.run.run_dir)
            names = [p.rsplit("/", 1)[-1] for p in fs.ls(root.rstrip("/") + "/" + self.rank_dir, detail=False)]
        else:
            try:
                names = os.listdir(os.path.join(local_path(self.run.run_dir), self.rank_dir))
            except FileNotFoundError:
                return set()
        return {name.split(".", 1)[0] for name in names if name.endswith(".jsonl")}

    # ------------------------------------------------------------------ the live lines
    def update(self, line: LiveLine) -> None:
        with self._lock:
            first = self.current.first_step if self.current.first_step is not None else line.first_step
            self.current = dataclasses.replace(
                self.current, productive_s=float(line.productive_s or 0.0), first_step=first,
                last_step=line.step, end_wall_ns=line.wall_ns if line.wall_ns is not None else time.time_ns())
        if time.monotonic() - self._written_at >= WRITE_EVERY_S:
            self.write()

    def job_goodput(self, line: LiveLine) -> float | None:
        if line.productive_s is None or line.wall_ns is None:
            return None
        with self._lock:
            current = self.current
        earlier = same_job(self.earlier, current)
        if not earlier:  # the job's first attempt: the job so far is this attempt, to the digit
            return line.goodput
        return job_goodput(earlier, current, line.wall_ns)

    def job_figures(self) -> tuple[list[AttemptFigures], AttemptFigures]:
        with self._lock:
            return same_job(self.earlier, self.current), self.current

    def finished(self, completed: bool | None) -> None:
        with self._lock:
            self.current = dataclasses.replace(self.current, completed=completed,
                                               end_wall_ns=self.current.end_wall_ns or time.time_ns())
        self.write()

    # ------------------------------------------------------------------ writing
    def write(self) -> None:
        """Replace the rank's figures file (never raises: a sink must not fail for it)."""
        self._written_at = time.monotonic()
        with self._lock:
            entries = [a.to_json() for a in self.earlier if a.end_wall_ns is not None or a.productive_s]
            entries.append(self.current.to_json())
        data = json.dumps({"version": VERSION, "attempts": entries}, separators=(",", ":")).encode()
        try:
            if self._storage is None:
                self._storage = open_storage(self.run.run_dir)
            self._storage.put(self.path, data)
        except Exception:
            pass


def _session_start(session: str) -> int | None:
    head = session.split("-", 1)[0]
    return int(head) if head.isdigit() and len(head) >= 19 else None


_held: dict[tuple[str, int, str], Held] = {}
_held_lock = threading.Lock()


def held(run: SinkRun) -> Held:
    """The one :class:`Held` of this process's rank and session (shared by its sinks)."""
    key = (run.run_dir, run.rank, run.session)
    with _held_lock:
        found = _held.get(key)
        if found is None:
            _held.clear()  # one run at a time per process
            found = _held[key] = Held(run)
        return found
