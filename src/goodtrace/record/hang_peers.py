"""Which rank stopped first, and the line that says so (docs/semantics.md section 12).

The rule (the lowest step, then a rank not waiting in a collective, then the earliest last
progress) and the line's words are here, in
the recording layer, so that rank 0's line while the job hangs and the report afterwards
(goodtrace.analysis.hangs) say the same. While the job hangs, rank 0 reads the other ranks'
``hang`` events from the tails of their newest segment files (a local run directory only; the
standard library only).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from goodtrace import schema

__all__ = ["PeerHang", "in_collective", "last_span_written", "peer_hangs", "stop_order", "summary_line",
           "where_text"]

TAIL_BYTES = 256 * 1024  # of each rank's newest segment: where a recent hang event is
NO_STEP = 2**62
# A rank waits for its peers when its training thread is in one of the framework's collectives:
# a frame of these files (path endings) in its stack, or an open span named so (a word of these)
COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "jax/experimental/multihost_utils.py",
                    "jax/_src/distributed.py")
COLLECTIVE_WORDS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "reducescatter",
                    "all_to_all", "alltoall", "broadcast", "barrier", "collective")


def in_collective(in_span: Any, stack: Any) -> bool:
    """Whether a hung rank is waiting in a collective (for the rank that stopped): its open span
    is named as a collective, or a frame of its stack (``traceback.format_stack``'s text) is in
    torch.distributed's or JAX's collectives."""
    if isinstance(in_span, str) and any(word in in_span.lower() for word in COLLECTIVE_WORDS):
        return True
    if not isinstance(stack, str):
        return False
    for line in stack.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            path = line[6:line.find('"', 6)].replace("\\", "/")
            if path.endswith(COLLECTIVE_FILES):
                return True
    return False


def stop_order(step: int | None, since: int, rank: int, waiting: bool = False) -> tuple[int, bool, int, int]:
    """The sort key of "stopped first": the lowest step (the others went on to the collective
    it never entered), then a rank that is not waiting in a collective (:func:`in_collective`)
    before one that is (when the ranks' last progress is the same instant, the step's entry
    after the previous collective, the one waiting is not the one that stopped), then the
    earliest last progress (on one clock), then the rank."""
    return (NO_STEP if step is None else step, waiting, since, rank)


def summary_line(rank: int, host: str, where: str, step: int | None, since: str,
                 waiting: Sequence[tuple[int | None, str]]) -> str:
    """"rank 3 (host h3) stuck in block (train.py:120), after 'forward', at step 20, since
    41.2 s; 3 ranks waiting at step 20 in all_reduce (distributed_c10d.py:3252)"."""
    counts: dict[tuple[int | None, str], int] = {}
    for key in waiting:
        counts[key] = counts.get(key, 0) + 1
    line = f"rank {rank} (host {host}) stuck in {where}, at step {step}, since {since}"
    for (at, place), count in sorted(counts.items(), key=lambda item: (-item[1], str(item[0]))):
        line += f"; {count} rank{'s' if count > 1 else ''} waiting at step {at} in {place}"
    return line


def where_text(function: Any, location: Any, span: Any = None, phase: Any = None, in_span: Any = None) -> str:
    """"block (train.py:120), in 'data', after 'forward' in checkpoint_save": where, the span
    it is in (open), the last one it closed in the step, its blocking phase."""
    at = f"{function} ({location})" if isinstance(location, str) and location else "an unknown place"
    return (at + (f", in {in_span!r}" if isinstance(in_span, str) else "")
            + (f", after {span!r}" if isinstance(span, str) else "") + (f" in {phase}" if isinstance(phase, str) else ""))


class PeerHang:
    """A rank's newest hang event as rank 0 read it: ``since_wall`` via its file's anchors."""

    __slots__ = ("function", "host", "in_span", "location", "rank", "since_wall", "step", "waiting")

    def __init__(self, rank: int, host: str, step: int | None, since_wall: int, function: Any, location: Any,
                 in_span: Any = None, waiting: bool = False) -> None:
        self.rank, self.host, self.step, self.since_wall = rank, host, step, since_wall
        self.function, self.location = function, location
        self.in_span, self.waiting = in_span, waiting


def _newest_segment(rank_dir: str) -> str | None:
    try:
        names = [n for n in os.listdir(rank_dir) if n.endswith(".jsonl")]
    except OSError:
        return None
    paths = [os.path.join(rank_dir, n) for n in names]
    files = [p for p in paths if os.path.isfile(p)]
    return max(files, key=os.path.getmtime) if files else None


def _read_hang(path: str) -> PeerHang | None:
    try:
        with open(path, "rb") as handle:
            header = json.loads(handle.readline())
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read()
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or header.get(schema.F_KIND) != schema.HEADER:
        return None
    found = None
    for line in tail.split(b"\n"):
        if b'"name":"hang"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        attrs = record.get(schema.F_ATTRS)
        if record.get(schema.F_KIND) == schema.EVENT and isinstance(attrs, dict):
            found = attrs
    wall, mono = header.get(schema.F_WALL), header.get(schema.F_MONO)
    if found is None or not isinstance(wall, int) or not isinstance(mono, int) or not isinstance(found.get("since"), int):
        return None
    step = found.get("step")
    return PeerHang(int(header.get(schema.H_RANK, -1)), str(header.get(schema.H_HOST, "?")),
                    step if isinstance(step, int) else None, wall + found["since"] - mono,
                    found.get("function"), found.get("location"), found.get("in_span"),
                    in_collective(found.get("in_span"), found.get("stack")))


def last_span_written(rank_dir: str, session: str, thread: int, after: int) -> tuple[str, int] | None:
    """The span of ``thread`` that ended last after ``after`` in the tail of this session's
    newest segment file: (name, end). The watchdog looks here when its view of the buffer
    missed it (the writer had taken it already)."""
    try:
        names = [n for n in os.listdir(rank_dir) if n.startswith(session) and n.endswith(".jsonl")]
        path = max((os.path.join(rank_dir, n) for n in names), key=os.path.getmtime) if names else None
        if path is None:
            return None
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return None
    best: tuple[str, int] | None = None
    marker = f'"{schema.F_THREAD}":{thread},'.encode()
    for line in tail.split(b"\n"):
        if marker not in line or b'"kind":"span"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        t1, name = record.get(schema.F_T1), record.get(schema.F_NAME)
        if isinstance(t1, int) and isinstance(name, str) and t1 > after and (best is None or t1 > best[1]):
            best = (name, t1)
    return best


def peer_hangs(run_dir: str) -> tuple[list[PeerHang], int]:
    """Every rank's newest hang event in a local run directory, and how many rank directories
    there are."""
    try:
        rank_dirs = [os.path.join(run_dir, n) for n in os.listdir(run_dir) if n.startswith("rank-")]
    except OSError:
        return [], 0
    hangs = []
    for rank_dir in rank_dirs:
        path = _newest_segment(rank_dir)
        hang = _read_hang(path) if path is not None else None
        if hang is not None:
            hangs.append(hang)
    return hangs, len(rank_dirs)
