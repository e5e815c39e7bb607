"""Nothing a user passes, and no warnings filter, makes a recording call raise into the loop.

The loop runs in a child process under ``python -W error`` plus ``warnings.simplefilter("error")``
(every warning is an exception there, as under ``pytest -W error``), with the torch integration
and its live line when torch is installed. It passes every public call what issue 12 found
leaking (``gt.step(inf)``, ``category=["c"]``, ``reduce=["x"]``) and worse: objects whose
``__repr__``/``__hash__``/``__eq__``/``__int__`` raise, lone surrogates, control characters, a
1 MB name and a 40 MB event attribute, with a sink that fails to open. The child must exit 0
with no traceback, and the files must hold what could be recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from goodtrace.read.sessions import read_run
from goodtrace.record.arguments import MAX_NAME_CHARS
from goodtrace.record.io.writer import MAX_ATTRS_CHARS

pytestmark = pytest.mark.processes

SCRIPT = r'''
import json, sys, warnings
import goodtrace as gt

warnings.simplefilter("error")  # on top of -W error


class Hostile:
    def __repr__(self): raise RuntimeError("repr")
    def __str__(self): raise RuntimeError("str")
    def __hash__(self): raise RuntimeError("hash")
    def __eq__(self, other): raise RuntimeError("eq")
    def __int__(self): raise RuntimeError("int")
    def __index__(self): raise RuntimeError("index")
    def __float__(self): raise RuntimeError("float")
    def __bool__(self): raise RuntimeError("bool")


class FailingSink:
    name, ranks = "failing", "zero"
    def open(self, run): raise RuntimeError("cannot open")
    def write(self, line): pass
    def close(self, finished): pass


class CountingSink:
    name, ranks, lines = "counting", "zero", 0
    def open(self, run): pass
    def write(self, line): CountingSink.lines += 1
    def close(self, finished): pass


hostile = Hostile()
run_dir, with_torch = sys.argv[1], sys.argv[2] == "1"
gt.init(run_dir, record_gc=False, flush_interval_s=0.05, sinks=[FailingSink(), CountingSink()])
lines = []
if with_torch:
    import torch
    from goodtrace.integrations.torch import instrument
    instrument(log_every=2, memory=False, printer=lines.append)
names = ["\ud800lone surrogate", "ctrl\x1b]0;title\x07\x1b[31m\x00", "n" * 1_000_000, "[/]"]
for number in (1, float("inf"), float("nan"), 2**80, "x", hostile, 7, None):
    with gt.step(number) as s:
        with gt.span("x", category=["c"]):
            pass
        with gt.span("y", category="no_such_category"):
            pass
        with gt.span(hostile):
            pass
        with gt.span(hostile, category=hostile, attrs=hostile):
            pass
        for name in names:
            with gt.span(name):
                pass
            gt.metric(name, 1.0)
            gt.tag(name)
            gt.event(name)
        gt.metric("m", 1.0, reduce=["x"])
        gt.metric("m2", 2.0, reduce=hostile, step=float("inf"))
        gt.metric(hostile, 3.0, step=hostile)
        gt.metric(["list", "name"], hostile)
        if with_torch:
            gt.metric("tensor", torch.tensor(4.0), reduce="sum")
        gt.tag(None, step="x")
        gt.tag("t", step=2**70)
        gt.event(123, big="x" * 40_000_000, h=hostile)
        gt.recorder().event("e", hostile)
        s.complete_on(hostile)
        gt.complete_on(1.0, step=hostile)
result = {"flush": gt.flush(timeout="soon"), "flush_nan": gt.flush(float("nan")),
          "finish": gt.finish(completed="yes"), "live_lines": len(lines), "sink_lines": CountingSink.lines}
print(json.dumps(result))
'''


def _torch_installed() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_any_argument_under_warnings_as_errors_never_raises(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with_torch = _torch_installed()
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", SCRIPT, str(run_dir), "1" if with_torch else "0"],
        capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["flush"] is True and result["flush_nan"] is True and result["finish"] is True
    # the warnings could not be raised: they were written to stderr instead, once per kind
    assert "GoodtraceWarning (not raised" in out.stderr
    assert out.stderr.count("invalid category ['c']") == 1

    # no line of the files is longer than the attribute cap plus the record around it
    for path in run_dir.rglob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            assert len(line) < MAX_ATTRS_CHARS + 4096, (path, len(line))
    run = read_run(run_dir)
    assert run.problems == []
    steps = [record["step"] for _, record in run.records("step")]
    # 1 and 7 as given; every unusable number replaced by the count of steps ended before it
    assert steps == [1, 1, 2, 3, 4, 5, 7, 7]
    span_names = {record["name"] for _, record in run.records("span")}
    assert {"x", "y", "<Hostile object>", "\ud800lone surrogate", "ctrl\x1b]0;title\x07\x1b[31m\x00",
            "n" * MAX_NAME_CHARS, "[/]"} <= span_names
    categories = {record["name"]: record["cat"] for _, record in run.records("span")}
    assert categories["x"] == "compute" and categories["y"] == "no_such_category"
    assert categories["<Hostile object>"] == "compute"
    metrics = [record for _, record in run.records("metric") if record.get("step") is not None]
    by_name: dict[str, list[dict[str, object]]] = {}
    for record in metrics:
        by_name.setdefault(str(record["name"]), []).append(record)
    assert [(r["reduce"], r["value"]) for r in by_name["m"]] == [("mean", 1.0)] * 8
    assert [r["step"] for r in by_name["m2"]] == steps  # the unusable step= became the current step
    assert [r["value"] for r in by_name["<Hostile object>"]] == [3.0] * 8
    assert "['list', 'name']" not in by_name  # a value that is no number is not recorded
    if with_torch:
        assert [r["value"] for r in by_name["tensor"]] == [4.0] * 8
        # the log intervals of log steps 2 and 4 (the step numbers ran 1, 1, 2, 3, 4, 5, 7, 7); no
        # last log interval: finish(completed="yes") is not a normal end, so nothing collective runs
        assert result["live_lines"] == 2 and result["sink_lines"] == 2
    assert out.stderr.count("sink 'failing' dropped") == 1
    events = [record for _, record in run.records("event") if record["name"] == "123"]
    assert len(events) == 8
    big = events[0]["attrs"]
    assert isinstance(big, dict) and big["big"] == "x" * 1000 and big["h"] == "<Hostile object>"
    assert [r["attrs"] for _, r in run.records("event") if r["name"] == "e"] == [{"value": "<Hostile object>"}] * 8
    tags = [record for _, record in run.records("tag")]
    assert sum(1 for t in tags if t["name"] == "None") == 8
    assert [t["step"] for t in tags if t["name"] == "t"] == steps
    (finish,) = [record for _, record in run.records("finish")]
    assert finish["completed"] is False  # completed="yes" is no answer: recorded as stopped early


NAMES_CHILD = """
import json, sys, warnings
import goodtrace as gt
rec = gt.init(sys.argv[1], flush_interval_s=0.2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for step in range(3):
        with gt.step(step):
            with gt.span("fwd"):
                pass
            gt.metric("loss", 1.0)
            for i in range(10_000):
                gt.metric(f"m/{step}/{i}", float(i))  # 10,000 new names every step
            gt.tag("done")
    ok = gt.finish()
print(json.dumps({"ok": ok, "refused": rec.refused_metric_names, "warnings": [str(w.message) for w in caught]}))
"""


def test_new_metric_names_past_the_cap_are_refused_with_one_warning_and_nothing_else_is(tmp_path: Path) -> None:
    from goodtrace.record.arguments import MAX_METRIC_NAMES

    out = subprocess.run([sys.executable, "-c", NAMES_CHILD, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["ok"] is True  # nothing was dropped
    assert result["refused"] == 3 * 10_000 + 1 - MAX_METRIC_NAMES
    capped = [w for w in result["warnings"] if "distinct metric names" in w]
    assert len(capped) == 1 and f"{MAX_METRIC_NAMES:,}" in capped[0]
    (session,) = read_run(str(tmp_path)).sessions
    metrics = session.of_kind("metric")
    assert len({r["name"] for r in metrics}) == MAX_METRIC_NAMES
    assert [r["step"] for r in metrics if r["name"] == "loss"] == [0, 1, 2]  # a known name goes on
    assert [r["step"] for r in session.of_kind("step")] == [0, 1, 2]
    assert len(session.of_kind("span")) >= 3 and len(session.of_kind("tag")) == 3
