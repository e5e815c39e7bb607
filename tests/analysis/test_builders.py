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
    assert json.loads(lines[1]) == {"kind": "step", "step": 0, "t0": p.mono(1.0), "t1": p.mono(2.0)}
    loaded = load(tmp_path)
    (session,) = loaded.sessions
    assert session.start_wall == WALL0 + ns(1.0)
    assert session.last_seen_wall == WALL0 + ns(3.0)
    assert session.finish_completed is True
    assert any("torn" in w for w in loaded.warnings)
