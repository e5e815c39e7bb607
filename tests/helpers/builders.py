"""Helpers that write small run directories in the writer's JSON-lines format, with times
given in seconds on one job clock (so every expected bucket is computed by hand). Imported by
the analysis, reader and CLI tests; ``tests/analysis/test_builders.py`` checks them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from goodtrace import schema
from goodtrace.read.load import LoadedRun, load_run

WALL0 = 1_700_000_000 * 10**9  # the job clock's zero, on the wall clock


def ns(seconds: float) -> int:
    return round(seconds * 1e9)


class Proc:
    """One process of one rank. Times are seconds on the job clock; each process has its own
    monotonic origin (``mono_base``) so the wall-clock conversion is exercised."""

    def __init__(
        self,
        run_dir: Path | str,
        *,
        rank: int = 0,
        world: int = 1,
        start: float = 0.0,
        restart: int | None = None,
        submit: float | None = None,
        main_tid: int = 1,
        lag: int = 1,
        overhead: tuple[str, ...] = (),
        host: str = "node0",
        mono_base: int | None = None,
        schema_version: int = schema.SCHEMA_VERSION,
        wall_skew: float = 0.0,
        seq: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.start = start
        self.mono_base = mono_base if mono_base is not None else 7_000_000_000_000 + 1_000_000_007 * rank
        self.session = f"{ns(start) + WALL0:020d}-{1000 + rank}-{rank:08x}"
        self.lines: list[dict[str, Any]] = []
        header: dict[str, Any] = {
            "kind": "header", "schema": schema_version, "version": "test", "session": self.session,
            "rank": rank, "world": world, "local_rank": rank, "host": host, "pid": 1000 + rank,
            "restart": restart, "proc_start_mono": self.mono(start), "proc_start_source": "os",
            "init_mono": self.mono(start), "submit_wall": None if submit is None else WALL0 + ns(submit),
            "main_tid": main_tid, "rank_source": "argument", "overhead_categories": sorted(overhead),
            "config": {"lag": lag, "overhead_categories": list(overhead)}, "segment": 0,
            "wall": WALL0 + ns(start + wall_skew), "mono": self.mono(start),
        }
        if schema_version < 1:
            for key in ("proc_start_mono", "main_tid", "submit_wall", "overhead_categories"):
                header.pop(key)
        self.header = header
        self.main_tid = main_tid
        self.use_seq = seq  # False writes the files of writers before executions were numbered
        self.seq = 0
        self.seq_of: dict[int, int] = {}  # step -> seq of its latest execution

    def mono(self, t: float) -> int:
        return self.mono_base + ns(t)

    def span(self, name: str, t0: float, t1: float, cat: str | None = None, step: int | None = None,
             tid: int | None = None) -> Proc:
        self.lines.append({
            "kind": "span", "name": name, "cat": cat or schema.category_for_name(name), "t0": self.mono(t0),
            "t1": self.mono(t1), "step": step, "tid": self.main_tid if tid is None else tid, "err": False,
            "attrs": None,
        })
        return self

    def step(self, k: int, t0: float, t1: float) -> Proc:
        line: dict[str, Any] = {"kind": "step", "step": k, "t0": self.mono(t0), "t1": self.mono(t1)}
        if self.use_seq:
            self.seq_of[k] = line["seq"] = self.seq
            self.seq += 1
        self.lines.append(line)
        return self

    def sync(self, k: int, t: float, how: str = "host", after: float | None = None) -> Proc:
        """Step ``k``'s sync point (its latest execution's, when executions are numbered)."""
        line: dict[str, Any] = {"kind": "sync", "step": k, "t": self.mono(t), "how": how}
        if self.use_seq and k in self.seq_of:
            line["seq"] = self.seq_of[k]
        if after is not None:
            line["after"] = self.mono(after)
        self.lines.append(line)
        return self

    def tag(self, k: int, name: str, t: float) -> Proc:
        self.lines.append({"kind": "tag", "step": k, "name": name, "t": self.mono(t)})
        return self

    def event(self, name: str, t: float, step: int | None = None) -> Proc:
        self.lines.append({"kind": "event", "name": name, "t": self.mono(t), "step": step, "attrs": None})
        return self

    def metric(self, name: str, k: int, value: float, t: float) -> Proc:
        self.lines.append({"kind": "metric", "name": name, "step": k, "value": value, "reduce": "mean",
                           "t": self.mono(t)})
        return self

    def clock(self, offset_ns: int, t: float) -> Proc:
        """A clock-offset measurement: reference clock = this clock + offset_ns."""
        self.lines.append({"kind": "clock", "offset_ns": offset_ns, "rtt_ns": 1000,
                           "attrs": {"reference_rank": 0}, "t": self.mono(t)})
        return self

    def heartbeat(self, t: float) -> Proc:
        self.lines.append({"kind": "heartbeat", "wall": WALL0 + ns(t), "mono": self.mono(t), "dropped": 0})
        return self

    def finish(self, t: float, completed: bool | None = True, reason: str = "finish") -> Proc:
        self.lines.append({"kind": "finish", "completed": completed, "t": self.mono(t), "reason": reason})
        return self.heartbeat(t)

    def loop(self, steps: range, t0: float, step_s: float = 1.0, how: str = "host",
             data_s: float = 0.0) -> float:
        """A synchronous loop: step k runs [t, t+step_s] and is synced at its exit."""
        t = t0
        for k in steps:
            if data_s:
                self.span("data", t, t + data_s, step=k)
            self.step(k, t, t + step_s)
            self.sync(k, t + step_s, how)
            t += step_s
        return t

    def write(self, *, torn: bool = False, segment_lines: int | None = None, first_segment: int = 0) -> Path:
        """The session's file (``segment_lines``: its records in files of that many lines each,
        as the writer rotates its segments, each file its header, numbered from
        ``first_segment``; the last file's path)."""
        rank_dir = self.run_dir / f"rank-{self.rank:05d}"
        rank_dir.mkdir(parents=True, exist_ok=True)
        size = segment_lines or max(1, len(self.lines))
        parts = [self.lines[i:i + size] for i in range(0, len(self.lines), size)] or [[]]
        for segment, lines in enumerate(parts, start=first_segment):
            path = rank_dir / f"{self.session}.{segment:05d}.jsonl"
            head = dict(self.header, segment=segment)
            text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in [head, *lines])
            if torn and segment == first_segment + len(parts) - 1:
                text += '{"kind":"span","name":"tor'
            path.write_text(text)
        return path


def load(run_dir: Path | str) -> LoadedRun:
    return load_run(os.fspath(run_dir))


def buckets_s(partition: Any) -> dict[str, float]:
    """Non-zero buckets in seconds (exact to the ns)."""
    return {k: v / 1e9 for k, v in partition.buckets_ns.items() if v}


H0 = 2800.0  # job time of 2023-11-14T23:00:00Z, the first whole UTC hour after WALL0


def hourly_run(run_dir: Path) -> Path:
    """A run with known hourly buckets: it starts at 22:30 UTC (H0 - 1800), 10 min of init, 60
    steps of 60 s, a 5 min checkpoint, 30 more steps, 100 s of teardown. Per UTC hour:
    22:30-23:00 1,200 s productive + 600 startup; 23:00-00:00 3,300 + 300 checkpoint_save;
    00:00-00:16:40 900 + 100 teardown."""
    s0 = H0 - 1800
    p = Proc(run_dir, start=s0)
    p.span("init", s0, s0 + 600)
    t = p.loop(range(60), s0 + 600, step_s=60.0)  # to H0 + 2400
    p.span("checkpoint", t, t + 300)
    t = p.loop(range(60, 90), t + 300, step_s=60.0)  # to H0 + 4500
    p.finish(t + 100)
    p.write()
    return run_dir


# ---------------------------------------------------------------------------- tests of helpers
