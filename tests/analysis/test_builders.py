"""The record builders of ``helpers.builders`` write what the readers expect."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.builders import WALL0, Proc, load, ns


def test_proc_writes_the_writer_format(tmp_path: Path) -> None:
    p = Proc(tmp_path, start=1.0)
    p.loop(range(2), 1.0)
    p.finish(3.0)
    path = p.write(torn=True)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "header"
    assert json.loads(lines[1]) == {"kind": "step", "step": 0, "t0": p.mono(1.0), "t1": p.mono(2.0), "seq": 0}
    loaded = load(tmp_path)
    (session,) = loaded.sessions
    assert session.start_wall == WALL0 + ns(1.0)
    assert session.last_seen_wall == WALL0 + ns(3.0)
    assert session.finish_completed is True
    assert any("torn" in w for w in loaded.warnings)


def _kinds(path: Path) -> dict[str, set[str]]:
    """Per record kind, the union of the keys its lines carry."""
    keys: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        keys.setdefault(record["kind"], set()).update(record)
    return keys


def test_proc_writes_the_keys_the_real_writer_writes(tmp_path: Path) -> None:
    """The builders are only worth what they imitate: every kind they write carries the keys the
    real recorder writes for it (the real one may add optional keys, never the reverse)."""
    import goodtrace as gt
    from goodtrace.testing import FakeClock

    real_dir, built_dir = tmp_path / "real", tmp_path / "built"
    clock = FakeClock()
    gt.init(real_dir, clock=clock, rank=0, world_size=1, record_gc=False)
    try:
        for k in range(3):
            with gt.step(k) as s:
                with gt.span("data"):
                    clock.advance(0.01)
                gt.tag("eval_step", step=k)
                gt.metric("loss", 1.0 / (k + 1), step=k)
                s.complete_on(1.0)
                clock.advance(0.1)
        gt.event("note", detail="x")
    finally:
        gt.finish(completed=True)
    (real,) = (real_dir / "rank-00000").glob("*.jsonl")
    p = Proc(built_dir)
    t = p.loop(range(3), 0.0, step_s=0.11, data_s=0.01)
    p.tag(0, "eval_step", 0.05).metric("loss", 0, 1.0, 0.05).event("note", t).finish(t)
    built = p.write()
    real_keys, built_keys = _kinds(real), _kinds(built)
    for kind in ("header", "step", "sync", "span", "tag", "metric", "event", "finish"):
        assert kind in real_keys, f"the real recorder wrote no {kind!r} record"
        missing = built_keys[kind] - real_keys[kind]
        assert not missing, f"the builders write {kind!r} keys the writer never does: {missing}"
        lost = {k for k in real_keys[kind] - built_keys[kind] if k not in OPTIONAL.get(kind, set())}
        assert not lost, f"the builders leave out {kind!r} keys the writer always writes: {lost}"


# keys the real writer adds that the builders leave to tests that need them
OPTIONAL = {"sync": {"after"}}
