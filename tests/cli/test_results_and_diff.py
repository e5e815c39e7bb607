"""The first hour's results: ``goodtrace.report()`` (the API) against ``report --json``,
``report --brief``, ``goodtrace diff`` of two demo-like runs, of two attempts and of two step
ranges of one run, and the run named as the user typed it. Runs are written by the builders
(synthetic records, known figures); the CLI runs in this process (tests/helpers/cli.py)."""

from __future__ import annotations

import gc
import json
import re
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.renderers.json_report import finite
from helpers.builders import Proc
from helpers.cli import Ran
from helpers.cli import goodtrace as run_goodtrace

pytestmark = pytest.mark.unit

STEP_S, DATA_S = 0.030, 0.005  # a demo-like step: 30 ms, of which 5 ms data loading


def goodtrace(*args: str) -> Ran:
    return run_goodtrace(*args, env={"COLUMNS": "200"})


def demo_like(run_dir: Path, *, data_s: float = DATA_S, step_s: float = STEP_S, crash_after: int | None = None,
              steps: int = 100) -> Path:
    """Two ranks: 2 s of init, ``steps`` synchronous steps (``data_s`` of data loading at the
    start of each), a 0.1 s checkpoint after every 25th. ``crash_after``: attempt 0 is lost
    after that step, and attempt 1 starts 1 s later, restores for 0.2 s and runs steps 51 to
    ``steps`` with three times the data loading (each step 2 x ``data_s`` longer)."""
    for rank in (0, 1):
        a0 = Proc(run_dir, rank=rank, world=2, restart=0, host=f"node{rank}")
        a0.span("init", 0.0, 2.0)
        t = 2.0
        for k in range(1, (crash_after or steps) + 1):
            a0.span("data", t, t + data_s, step=k)
            a0.step(k, t, t + step_s).sync(k, t + step_s)
            t += step_s
            if k % 25 == 0:
                a0.span("checkpoint", t, t + 0.1)
                t += 0.1
        if crash_after is None:
            a0.finish(t + 0.01)
            a0.write()
            continue
        a0.heartbeat(t + 0.05)  # lost: no finish record
        a0.write()
        t += 1.0
        a1 = Proc(run_dir, rank=rank, world=2, restart=1, start=t, host=f"node{rank}")
        a1.span("init", t, t + 1.0)
        a1.span("restore", t + 1.0, t + 1.2)
        t += 1.2
        for k in range(51, steps + 1):
            a1.span("data", t, t + 3 * data_s, step=k)
            a1.step(k, t, t + step_s + 2 * data_s).sync(k, t + step_s + 2 * data_s)
            t += step_s + 2 * data_s
        a1.finish(t + 0.01)
        a1.write()
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "a": str(demo_like(root / "a")),
        "b": str(demo_like(root / "b", data_s=DATA_S + 0.009, step_s=STEP_S + 0.009)),  # 9 ms more data per step
        "restarted": str(demo_like(root / "restarted", crash_after=60)),
    }


def _json(done: Ran) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _as_json(analysis: Any) -> Any:
    return json.loads(json.dumps(finite(analysis.to_dict()), allow_nan=False))


# --------------------------------------------------------------------------- goodtrace.report()


@pytest.mark.parametrize("name", ["a", "restarted"])
def test_the_api_is_report_json(runs: dict[str, str], name: str) -> None:
    assert _as_json(gt.report(runs[name])) == _json(goodtrace("report", runs[name], "--json"))


def test_the_api_takes_the_commands_options(runs: dict[str, str]) -> None:
    options = {"since": "step:10", "until": "step:80", "every": 5, "flops_per_step": 2e9, "accelerator": "h100",
               "devices_per_rank": 2, "data_rule": "synchronous"}
    result = gt.report(runs["restarted"], **options)
    printed = _json(goodtrace("report", runs["restarted"], "--json", "--since", "step:10", "--until", "step:80",
                              "--every", "5", "--flops-per-step", "2e9", "--accelerator", "h100",
                              "--devices-per-rank", "2", "--data-rule", "synchronous"))
    assert _as_json(result) == printed
    assert result.time_range is not None and result.over_time is not None and result.over_time.every_s == 5.0
    assert printed["program"]["mfu"] is not None and printed["path"] == runs["restarted"]


def test_the_api_refuses_what_the_command_refuses(runs: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(gt.ReportError, match="does not exist"):
        gt.report(tmp_path / "nothing")
    with pytest.raises(gt.ReportError, match="--data-rule"):
        gt.report(runs["a"], data_rule="sometimes")
    with pytest.raises(gt.ReportError, match="--every must be a positive duration"):
        gt.report(runs["a"], every=0)
    with pytest.raises(TypeError, match="to_dict"):
        gt.report(runs["a"], json=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'step'"):
        gt.report(runs["a"], step=3)
    with pytest.raises(TypeError, match="takes a number"):
        gt.report(runs["a"], flops_per_step="many")


def test_the_api_leaves_the_callers_collector_alone(runs: dict[str, str]) -> None:
    before = gc.get_threshold()
    gt.report(runs["a"])
    assert gc.get_threshold() == before


def test_the_run_is_named_as_typed(runs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory of torchtitan's logs is read from its conversion in the cache; the report
    names the directory the user gave, not the cache's."""
    import goodtrace.cli.analysed as analysed

    typed = str(tmp_path / "outputs")
    Path(typed).mkdir()
    monkeypatch.setattr(analysed, "is_torchtitan_logs", lambda path: path == typed)
    monkeypatch.setattr(analysed, "converted_run", lambda path: runs["a"])  # "the cache"
    done = goodtrace("report", typed)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"goodtrace report {typed}  (") and runs["a"] not in done.stdout
    assert _json(goodtrace("report", typed, "--json"))["path"] == typed
    assert gt.report(typed).path == typed


# --------------------------------------------------------------------------- report --brief


def test_brief_is_goodput_the_verdict_and_the_three_largest_losses(runs: dict[str, str]) -> None:
    done = goodtrace("report", runs["restarted"], "--brief")
    assert done.returncode == 0, done.stderr
    result = gt.report(runs["restarted"])
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    assert lines[0].startswith(f"Goodput {result.partition.goodput * 100:.1f}% of ")
    assert "2 attempts" in lines[0]
    assert lines[1] == f"Verdict: {result.verdict.text}; {result.verdict.evidence}"
    buckets = result.partition.buckets_ns
    lost = sorted((ns, name) for name, ns in buckets.items() if name not in ("productive", "teardown") and ns)
    top3 = [name for _, name in reversed(lost[-3:])]
    assert top3 == ["startup", "data", "disruption"]
    shown = re.findall(r"(\w[\w ()-]*?) ([0-9.]+) s \(([0-9.]+)%\)", lines[2].removeprefix("Largest losses: "))
    assert [name for name, _, _ in shown] == ["startup", "data", "disruption"]
    assert [float(s) for _, s, _ in shown] == [round(buckets[n] / 1e9, 3) for n in top3]
    both = goodtrace("report", runs["a"], "--brief", "--json")
    assert both.returncode == 2 and "give one" in both.stderr


# --------------------------------------------------------------------------- goodtrace diff


def test_diff_of_two_runs_names_the_change(runs: dict[str, str]) -> None:
    out = _json(goodtrace("diff", runs["a"], runs["b"], "--json"))
    a, b = gt.report(runs["a"]), gt.report(runs["b"])
    assert out["a"]["goodput"] == a.partition.goodput and out["b"]["goodput"] == b.partition.goodput
    assert out["change"]["goodput"] == pytest.approx(b.partition.goodput - a.partition.goodput)
    assert out["a"]["step_time"]["median_s"] == a.step_stats.median_s
    assert out["b"]["step_time"]["p90_s"] == b.step_stats.p90_s
    assert out["change"]["step_time"]["median_s"]["s"] == pytest.approx(0.009)
    assert out["change"]["per_step_s"]["data"] == pytest.approx(0.009)
    assert out["change"]["per_step_s"]["compute"] == pytest.approx(0.0, abs=1e-9)
    for name, bucket in out["change"]["buckets"].items():
        assert bucket["seconds"] == pytest.approx((b.partition.buckets_ns.get(name, 0)
                                                   - a.partition.buckets_ns.get(name, 0)) / 1e9)
    pct = round((b.step_stats.mean_s / a.step_stats.mean_s - 1) * 100)
    assert out["largest_change"] == f"step time +{pct} %: data +9.0 ms per step, compute unchanged"
    assert out["a"]["verdict"] == a.verdict.line and out["a"]["mfu"] is None
    done = goodtrace("diff", runs["a"], runs["b"])
    assert done.returncode == 0, done.stderr
    assert f"Largest change: {out['largest_change']}" in done.stdout
    assert re.search(r"step time, median\s+│\s+0\.030 s\s+│\s+0\.039 s\s+│\s+\+9\.0 ms \(\+30 %\)", done.stdout)
    assert re.search(r"per step: data\s+│\s+0\.005 s\s+│\s+0\.014 s\s+│\s+\+9\.0 ms", done.stdout)
    assert re.search(r"goodput\s+│\s+" + re.escape(f"{a.partition.goodput * 100:.1f}%"), done.stdout)


def test_diff_of_two_attempts_of_one_run(runs: dict[str, str]) -> None:
    out = _json(goodtrace("diff", runs["restarted"], "--attempts", "0", "1", "--json"))
    whole = gt.report(runs["restarted"])
    first, second = whole.attempts
    assert out["a"]["attempt"] == 0 and out["b"]["attempt"] == 1
    assert out["a"]["time_s"] == first.duration_ns / 1e9 and out["b"]["time_s"] == second.duration_ns / 1e9
    assert out["a"]["step_time"]["count"] == 60 and out["b"]["step_time"]["count"] == 50
    assert out["a"]["per_step_s"]["data"] == pytest.approx(DATA_S)
    assert out["b"]["per_step_s"]["data"] == pytest.approx(3 * DATA_S)
    assert out["change"]["step_time"]["median_s"]["s"] == pytest.approx(2 * DATA_S)
    assert out["b"]["buckets"]["startup"]["seconds"] == pytest.approx(1.2)  # init, then the restore
    assert out["a"]["buckets"]["wasted_progress"]["seconds"] > 0  # steps 51-60, re-done by attempt 1
    assert out["a"]["verdict"] is None and out["a"]["mfu"] is None  # the job's figures: a whole run only
    assert any(s.startswith("step time +") and "data +10.0 ms per step" in s for s in out["sentences"])
    assert out["largest_change"] in out["sentences"]


def test_diff_of_two_step_ranges_is_report_since_until(runs: dict[str, str]) -> None:
    out = _json(goodtrace("diff", runs["a"], "--steps", "1:25", "26:50", "--json"))
    first = gt.report(runs["a"], since="step:1", until="step:25")
    second = gt.report(runs["a"], since="step:26", until="step:50")
    assert out["a"]["steps"] == "1:25" and out["b"]["label"] == f"{runs['a']} steps 26:50"
    assert first.window is not None and second.window is not None
    assert out["a"]["goodput"] == first.window.goodput and out["b"]["goodput"] == second.window.goodput
    assert out["a"]["step_time"]["count"] == first.step_stats.count == 25
    assert out["b"]["step_time"]["mean_s"] == second.step_stats.mean_s
    # the checkpoint after step 25 lies in step 26's interval (semantics 2): 0.1 s over 25 steps
    assert out["largest_change"] == "step time +13 %: checkpoint_save +4.0 ms per step, compute unchanged"


@pytest.mark.parametrize(("args", "message"), [
    ((), "one run: give --attempts K L or --steps A:B C:D"),
    (("--steps", "1:2", "3:x"), "--steps: bad step range '3:x'"),
    (("--attempts", "0", "1", "--steps", "1:2", "3:4"), "give one"),
    (("--attempts", "0", "5"), "the run has no attempt 5 (it has [0])"),
])
def test_diff_errors_are_one_line(runs: dict[str, str], args: tuple[str, ...], message: str) -> None:
    done = goodtrace("diff", runs["a"], *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
