"""Hostile run directories for the CLI fuzz tests: a real run, its mutations, and a CLI client.

``write_seed_run`` records a small run with the real recorder in a child process (two ranks,
two attempts, spans, steps, sync points, metrics, tags, events, a checkpoint). ``mutations()``
is a hypothesis strategy of edits to a copy of it (truncation, corrupt bytes, wrong types,
missing fields, NaN/Inf, huge and negative numbers, deep nesting, hostile strings, raw lines,
non-regular files, whole files of random records); ``apply`` makes them. ``CliWorker`` runs
``goodtrace`` commands in one long-lived process (``cli_worker.py``) with a time limit.
``count_lines`` is the oracle of the skip counts: every non-blank line of every segment file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

SEED_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import goodtrace as gt
    from goodtrace.testing import FakeClock

    run = sys.argv[1]
    for attempt in range(2):
        # the launcher's restart counter: the fake clocks' sessions overlap on the wall clock
        # (they run one after another in one process), as processes claiming one rank at once do
        os.environ["GOODTRACE_ATTEMPT"] = str(attempt)
        for rank in range(2):
            clock = FakeClock(10**12 + attempt * 10**11 + rank * 10**6)
            gt.init(run, rank=rank, world_size=2, clock=clock, flush_interval_s=60)
            with gt.span("init", category="init"):
                clock.advance(0.5)
            for step in range(attempt * 3, attempt * 3 + 6):
                with gt.step(step) as s:
                    with gt.span("data", category="data"):
                        clock.advance(0.01)
                    with gt.span("forward_backward", attrs={"layer": [1, 2], "name": "x"}):
                        clock.advance(0.1 + 0.01 * rank)
                    gt.metric("loss", 1.0 / (step + 1))
                    gt.metric("flops_per_step", 1e12)
                    gt.metric("device/busy_s", 0.09)
                    gt.metric("device/idle_s", 0.001)
                    gt.tag("lr_drop")
                    s.complete_on(1.0)
                if step == 2:
                    with gt.span("save", category="checkpoint_save"):
                        clock.advance(0.2)
                    gt.event("checkpoint", path="/ckpt/2", size=3)
            gt.event("model", params=10, peak_flops=1e15)
            gt.finish(completed=attempt == 1)
    """
)


def write_seed_run(run_dir: Path) -> Path:
    """A real run, written by the recorder in a child process (no recorder state in the tests)."""
    subprocess.run([sys.executable, "-c", SEED_SCRIPT, str(run_dir)], check=True, timeout=120,
                   env=dict(os.environ, GOODTRACE_PURE_PYTHON="0"))
    return run_dir


def segment_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("rank-*/*.jsonl"))


def count_lines(run_dir: Path) -> int:
    """Non-blank lines of every regular segment file (blank: only ASCII whitespace)."""
    total = 0
    for path in segment_files(run_dir):
        if path.is_file():
            total += sum(1 for line in path.read_bytes().split(b"\n") if line.strip())
    return total


# ---------------------------------------------------------------------------------- mutations
DELETE = "<delete>"
FIELDS = ["kind", "t0", "t1", "t", "step", "seq", "after", "name", "cat", "tid", "err", "how", "value", "reduce",
          "mono", "wall", "dropped", "completed", "reason", "offset_ns", "rtt_ns", "attrs", "exception"]
HEADER_FIELDS = ["schema", "session", "segment", "rank", "world", "local_rank", "host", "pid", "restart",
                 "proc_start_mono", "init_mono", "submit_wall", "main_tid", "config", "overhead_categories",
                 "wall", "mono", "kind"]
HOSTILE_STRINGS = [
    "\ud800", "x\udfffy", "[/]", "[bold red]x[/bold red]", "\x1b]0;pwned\x07", "\x1b[31mred\x1b[0m", "\x1b[2J",
    "</script><img src=x onerror=alert(1)>", "<!--", "\u2028\u2029", "a\x00b", "line\nbreak\r\n", "\u202eevil",
    "🙂" * 50, "x" * 5000, "'; DROP TABLE records; --", "%s%n", "header", "span", "", " ",
]
DEEP = "[" * 100_000 + "]" * 100_000


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_VALUES = st.one_of(
    st.just(DELETE),
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, -5, 1, 2**31, 2**53 + 1, 2**61, 2**62, 2**63 - 1, -(2**63), 2**63, 2**64, 10**12,
                     10**30, -(10**30)]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 0.5]),
    st.sampled_from(HOSTILE_STRINGS),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(HOSTILE_STRINGS[:8]), st.integers(), max_size=2),
    st.integers(1, 500).map(_deep),  # json.dumps nests ~1000 deep; deeper lines are in RAW_LINES
)

RAW_LINES = [
    b"garbage", b"{", b"}", b"[1,2]", b"{}", b"null", b"5", b'"kind"', b'{"kind":5}', b'{"kind":null}',
    b'{"kind":"unknown_kind","t":1}', b'{"kind":"metric","name":"loss","step":1,"value":NaN,"t":10}',
    b'{"kind":"span","name":"x","cat":"eval","t0":Infinity,"t1":5}',
    b'{"kind":"span","name":"x","cat":"eval","t0":5,"t1":-Infinity}',
    b'{"kind":"metric","name":"flops_per_step","step":1,"value":1e999,"t":10}',
    b'{"kind":"event","name":"deep","t":1,"attrs":' + DEEP.encode() + b"}", DEEP.encode(),
    b'{"kind":"event","name":"deepish","t":1,"attrs":' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"kind":"event","name":"nan attrs","t":1,"attrs":{"x":NaN,"y":[Infinity]}}',
    b'{"kind":"span","name":"\xff\xfe","cat":"compute","t0":1,"t1":2}', b"\xef\xbb\xbf{}", b"\x00\x00",
    b'{"kind":"span","name":"\\ud800","cat":"log","t0":1,"t1":2}', b'{"kind":"step"}\r', b"\x1b]0;pwned\x07",
    b'{"kind":"sync","step":1,"t":1,"how":"lag"}{"kind":"sync"}', b'{"kind":"header","schema":1}',
    b'{"kind":"span","name":"' + b"x" * 200_000 + b'","cat":"compute","t0":1,"t1":2}',
    b'{"kind":"finish","completed":"yes","t":-1}', b'{"kind":"clock","t":1,"offset_ns":9223372036854775807}',
    b" ", b"\t\r",
]


@dataclasses.dataclass(frozen=True)
class Edit:
    """One mutation: ``op`` with its arguments (file and line are taken modulo the counts)."""

    op: str
    file: int = 0
    line: int = 0
    field: str = ""
    value: Any = None
    data: bytes = b""


def _record_value() -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(0, 10**13), HOSTILE_VALUES)


def random_records() -> st.SearchStrategy[list[dict[str, Any]]]:
    """Whole records built from the schema's kinds with random fields."""
    kinds = st.sampled_from(["span", "step", "sync", "tag", "event", "metric", "heartbeat", "clock", "finish",
                             "header", "other"])
    record = st.builds(
        lambda kind, fields: {"kind": kind, **fields},
        kinds, st.dictionaries(st.sampled_from(FIELDS[1:]), _record_value(), max_size=6),
    )
    return st.lists(record, min_size=1, max_size=12)


def edits() -> st.SearchStrategy[Edit]:
    file, line = st.integers(0, 7), st.integers(0, 80)
    return st.one_of(
        st.builds(Edit, st.just("set"), file, line, st.sampled_from(FIELDS), HOSTILE_VALUES),
        st.builds(Edit, st.just("set"), file, st.just(0), st.sampled_from(HEADER_FIELDS), HOSTILE_VALUES),
        st.builds(Edit, st.just("raw"), file, line, data=st.one_of(st.sampled_from(RAW_LINES), st.binary(max_size=40))),
        st.builds(Edit, st.just("truncate"), file, st.integers(0, 100_000)),
        st.builds(Edit, st.just("bytes"), file, st.integers(0, 100_000), data=st.binary(min_size=1, max_size=6)),
        st.builds(Edit, st.just("duplicate"), file, line),
        st.builds(Edit, st.just("records"), file, value=random_records()),
        st.builds(Edit, st.just("special"), value=st.sampled_from(
            ["fifo", "directory", "dangling", "loop", "empty", "noise", "header_only", "no_header", "crlf"])),
    )


def mutations() -> st.SearchStrategy[list[Edit]]:
    return st.lists(edits(), min_size=1, max_size=4)


def _dumps(value: Any) -> str:
    return json.dumps(value)  # NaN and Infinity as JavaScript literals, surrogates as escapes


def apply(run_dir: Path, edit: Edit) -> None:
    files = [p for p in segment_files(run_dir) if p.is_file() and not p.is_symlink()]
    if edit.op == "special":
        _special(run_dir, str(edit.value), files)
        return
    if not files:
        return
    path = files[edit.file % len(files)]
    data = path.read_bytes()
    lines = data.split(b"\n")
    at = edit.line % max(1, len(lines))
    if edit.op == "set":
        try:
            record = json.loads(lines[at])
        except (ValueError, RecursionError):
            return
        if not isinstance(record, dict):
            return
        if edit.value == DELETE:
            record.pop(edit.field, None)
        else:
            record[edit.field] = edit.value
        lines[at] = _dumps(record).encode("utf-8", "surrogatepass")
        path.write_bytes(b"\n".join(lines))
    elif edit.op == "raw":
        lines.insert(at, edit.data)
        path.write_bytes(b"\n".join(lines))
    elif edit.op == "truncate":
        path.write_bytes(data[: edit.line % (len(data) + 1)])
    elif edit.op == "bytes":
        at = edit.line % (len(data) + 1)
        path.write_bytes(data[:at] + edit.data + data[at + len(edit.data):])
    elif edit.op == "duplicate":
        lines.insert(at, lines[at])
        path.write_bytes(b"\n".join(lines))
    elif edit.op == "records":
        records = b"\n".join(_dumps(r).encode("utf-8", "surrogatepass") for r in edit.value)
        path.write_bytes(b"\n".join([lines[0], records, *lines[1:]]))


def _special(run_dir: Path, what: str, files: list[Path]) -> None:
    rank_dir = run_dir / "rank-00000"
    rank_dir.mkdir(exist_ok=True)
    target = rank_dir / f"zz-{what}.jsonl"
    if target.exists() or target.is_symlink():
        return
    if what == "fifo":
        os.mkfifo(target)
    elif what == "directory":
        target.mkdir()
    elif what == "dangling":
        target.symlink_to(rank_dir / "nowhere.jsonl")
    elif what == "loop":
        target.symlink_to(target.name)
    elif what == "empty":
        target.write_bytes(b"")
    elif what == "noise":
        target.write_bytes(bytes(range(256)) * 3)
    elif what == "header_only" and files:
        target.write_bytes(files[0].read_bytes().split(b"\n")[0])
    elif what == "no_header" and files:
        target.write_bytes(b"\n".join(files[0].read_bytes().split(b"\n")[1:]))
    elif what == "crlf" and files:
        files[0].write_bytes(files[0].read_bytes().replace(b"\n", b"\r\n"))


# ---------------------------------------------------------------------------------- the CLI
@dataclasses.dataclass
class Result:
    code: int | str  # the exit status, "traceback" or "timeout"
    stdout: str
    stderr: str


class CliWorker:
    """``goodtrace`` commands in one process (tests/helpers/cli_worker.py), each with a limit."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        if self.process is None or self.process.poll() is not None:
            env = dict(os.environ, GOODTRACE_PROGRESS="0", COLUMNS="120")
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("cli_worker.py"))], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
        return self.process

    def run(self, *argv: str) -> Result:
        process = self._start()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(list(argv)) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], self.timeout_s)
        if not ready:
            self.close()
            return Result("timeout", "", f"goodtrace {' '.join(argv)} did not finish in {self.timeout_s} s")
        line = process.stdout.readline()
        if not line:
            stderr = process.stderr.read() if process.stderr is not None else ""
            self.close()
            return Result("traceback", "", f"the CLI process died: {stderr[-2000:]}")
        answer = json.loads(line)
        return Result(answer["code"], answer["stdout"], answer["stderr"])

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.communicate()
            self.process = None


def copy_run(source: Path, target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, symlinks=True)
    return target
