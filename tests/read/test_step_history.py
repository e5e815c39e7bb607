"""A session's step completions read back from a point of its files (what ``goodtrace watch``
reads of a rank's past after its present): the last N in file order, across files, past lines
longer than a block, and to the session's first byte when it holds fewer."""

from __future__ import annotations

import json
from pathlib import Path

from goodtrace.read.follow import BLOCK, StepHistory, marked_lines


def _files(tmp_path: Path) -> tuple[list[str], list[int]]:
    """Three files of one session: a header each, step completions among other lines (one
    longer than a block); returns their paths and the steps completed, in order."""
    paths, steps, step = [], [], 0
    for k in range(3):
        lines = [json.dumps({"kind": "header", "session": "s", "segment": k})]
        for _ in range(40):
            lines.append(json.dumps({"kind": "span", "name": "forward", "t0": step, "t1": step + 1}))
            lines.append(json.dumps({"kind": "sync", "seq": step, "step": step, "t": 10 * step, "how": "x"}))
            steps.append(step)
            step += 1
            if step == 50:
                lines.append(json.dumps({"kind": "event", "name": "x", "t": 1, "attrs": {"pad": "y" * (BLOCK + 5)}}))
        path = tmp_path / f"s.{k:05d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths, steps


def _read(paths: list[str], wanted: int, budget: int) -> tuple[list[int], int]:
    history = StepHistory(paths, wanted, len(paths) - 1, Path(paths[-1]).stat().st_size)
    calls = 0
    while not history.done:
        history.read_back(lambda p, a, n: Path(p).read_bytes()[a:a + n], lambda p: Path(p).stat().st_size, budget)
        calls += 1
        assert calls < 1000
    problems: list[str] = []
    steps = [r["step"] for r in history.records("s", problems, {})]
    assert problems == []
    return steps, calls


def test_the_last_step_completions_in_file_order(tmp_path: Path) -> None:
    paths, steps = _files(tmp_path)
    assert _read(paths, 5, 2**30)[0] == steps[-5:]
    assert _read(paths, 85, 2**30)[0] == steps[-85:]  # across a file and past the long line
    everything, calls = _read(paths, 10_000, 64 * 1024)  # fewer than wanted: to the first byte, a part a call
    assert everything == steps and calls > 3


def test_marked_lines_are_found_by_their_mark() -> None:
    data = b'{"kind":"span"}\n{"kind":"sync","step":1}\n{"kind": "sync", "step":2}\n{"kind":"metric"}\n'
    assert marked_lines(data) == [b'{"kind":"sync","step":1}', b'{"kind": "sync", "step":2}']
    assert marked_lines(data, data.index(b'{"kind": ')) == [b'{"kind": "sync", "step":2}']
