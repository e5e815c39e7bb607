"""Following a run while it is written (read.follow): each record is delivered once, and each
poll reads only the bytes appended since the previous one."""

from __future__ import annotations

import time
from pathlib import Path

import goodtrace as gt
from goodtrace.read.follow import RunFollower


def _sizes(run_dir: Path) -> int:
    return sum(f.stat().st_size for f in run_dir.glob("rank-*/*.jsonl"))


def test_each_record_once_and_only_new_bytes(tmp_path: Path) -> None:
    follower = RunFollower(str(tmp_path))
    gt.init(tmp_path, flush_interval_s=0.05)
    kinds: list[str] = []
    polls = 0
    for step in range(60):
        with gt.step(step) as s:
            with gt.span("forward"):
                time.sleep(0.002)
            s.complete_on(1.0)
        if step % 10 == 9:
            gt.flush()
            kinds += [record["kind"] for _, _, record in follower.poll()]
            polls += 1
    gt.finish()
    kinds += [record["kind"] for _, _, record in follower.poll()]
    assert kinds.count("step") == 60 and kinds.count("span") == 60 and kinds.count("finish") == 1
    assert kinds.count("header") == 0  # headers are kept apart (follower.headers), one per file
    assert len(follower.headers) == len(list(tmp_path.glob("rank-*/*.jsonl")))
    # every byte read once: whole lines were appended at each flush
    assert follower.bytes_read == _sizes(tmp_path) and polls == 6
    before = follower.bytes_read
    assert list(follower.poll()) == [] and follower.bytes_read == before  # nothing new: nothing read


def test_a_line_still_being_written_waits_for_the_next_poll(tmp_path: Path) -> None:
    gt.init(tmp_path)
    with gt.step(0):
        pass
    gt.finish()
    (segment,) = tmp_path.glob("rank-*/*.jsonl")
    complete = segment.read_bytes()
    with segment.open("ab") as handle:
        handle.write(b'{"kind":"event","name":"late","t":5')  # half a line
    follower = RunFollower(str(tmp_path))
    first = [record for _, _, record in follower.poll()]
    assert all(record.get("name") != "late" for record in first)
    assert follower.offsets[str(segment)] == len(complete)
    with segment.open("ab") as handle:
        handle.write(b',"step":0,"attrs":null}\n')
    (late,) = [record for _, _, record in follower.poll()]
    assert late["name"] == "late" and late["t"] == 5
