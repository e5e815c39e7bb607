"""torchtitan's structured logs, written by torchtitan's own logger, read as they are by
``goodtrace report`` (--json, --html) and ``goodtrace trace``: converted once into the cache."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import Ran
from helpers.cli import goodtrace as run_goodtrace
from helpers.torchtitan_logs import SLOW_RANK, STEPS, write_logs

pytestmark = pytest.mark.processes

pytest.importorskip("torchtitan.observability.structured_logger")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torchtitan")
    write_logs(out)
    return out


def goodtrace(*args: str, cache: Path) -> Ran:
    return run_goodtrace(*args, env={"GOODTRACE_CACHE_DIR": str(cache)})


def test_the_report_reads_the_logs_as_they_are(logs: Path, tmp_path: Path) -> None:
    done = goodtrace("report", "--json", str(logs), cache=tmp_path)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["path"] == str(logs)  # the directory given, not its conversion in the cache
    (attempt,) = report["attempts"]
    assert attempt["ranks"] == 2 and attempt["ended"] == "completed"
    assert [row["step"] for row in report["steps"]] == list(range(1, STEPS + 1))
    by_step = {row["step"]: row for row in report["steps"]}
    assert by_step[4]["overhead_s"]["checkpoint_save"] >= 0.03
    assert by_step[3]["overhead_s"]["gc"] >= 0.003
    assert "checkpoint_save" in by_step[4]["tags"] and "gc" in by_step[3]["tags"]
    assert by_step[2]["metrics"]["local_valid_tokens"] == 128 + report["reference_rank"]
    assert all(row["host_timed"] for row in report["steps"])
    assert report["warnings"][0].startswith("read from torchtitan's structured logs: every time in them is the host's")
    assert "start-up is counted from the logger's first record" in report["warnings"][0]  # the start-up it cannot see
    assert report["stragglers"] and report["stragglers"][0]["rank"] == SLOW_RANK


def test_trace_and_html_show_every_rank(logs: Path, tmp_path: Path) -> None:
    done = goodtrace("trace", str(logs), "-o", str(tmp_path / "trace.json.gz"), cache=tmp_path)
    assert done.returncode == 0, done.stderr
    events = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {(e.get("pid"), e.get("name")) for e in events if e.get("ph") == "X"}
    assert {name for _, name in names} >= {"fwd_bwd", "optim", "checkpoint_save", "fetching_batch"}
    assert len({pid for pid, name in names if name == "fwd_bwd"}) == 2  # both ranks
    done = goodtrace("report", str(logs), "--html", str(tmp_path / "report.html"), cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "torchtitan times its spans on the host" in (tmp_path / "report.html").read_text()


def test_converted_once_and_again_when_a_log_grows(logs: Path, tmp_path: Path) -> None:
    from goodtrace.read.torchtitan import converted_run, log_files

    first = converted_run(str(logs), cache_dir=str(tmp_path))
    (segment,) = Path(first).glob("rank-00000/*.jsonl")
    stamp = segment.stat().st_mtime_ns
    assert converted_run(str(logs), cache_dir=str(tmp_path)) == first
    assert segment.stat().st_mtime_ns == stamp  # not converted again
    source = Path(log_files(str(logs))[0])
    copy = tmp_path / "copy"
    (copy / "structured_logs").mkdir(parents=True)
    for path in log_files(str(logs)):
        (copy / "structured_logs" / Path(path).name).write_bytes(Path(path).read_bytes())
    grown = copy / "structured_logs" / source.name
    converted = converted_run(str(copy), cache_dir=str(tmp_path))
    before = len((next(Path(converted).glob("rank-00000/*.jsonl"))).read_text().splitlines())
    last = json.loads(grown.read_text().splitlines()[-1])
    with grown.open("a") as file:  # a later instant: the copy is remade with it
        file.write(json.dumps(dict(last, log_type="instant", log_type_name="late_event", seq_id=10**6)) + "\n")
    converted = converted_run(str(copy), cache_dir=str(tmp_path))
    lines = next(Path(converted).glob("rank-00000/*.jsonl")).read_text().splitlines()
    assert len(lines) == before + 1 and any('"late_event"' in line for line in lines)


def test_damaged_logs_are_read_with_what_they_hold_and_say_what_was_left_out(logs: Path, tmp_path: Path) -> None:
    from goodtrace.read.torchtitan import log_files

    copy = tmp_path / "damaged" / "structured_logs"
    copy.mkdir(parents=True)
    for path in log_files(str(logs)):
        lines = Path(path).read_text().splitlines()
        if ".global_rank_0." in path:
            lines.insert(5, "this is not JSON")
            orphan = dict(json.loads(lines[6]), log_type="event", log_type_name="never_started_end", seq_id=-1)
            lines.insert(6, json.dumps(orphan))  # an _end without its _start: times no span
        (copy / Path(path).name).write_text("\n".join(lines) + "\n")
    (copy / "training.global_rank_2.20260101-000000-EMPTY0.jsonl").write_text("")  # no process
    done = goodtrace("report", "--json", str(copy.parent), cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["attempts"][0]["ranks"] == 2 and [r["step"] for r in report["steps"]] == list(range(1, STEPS + 1))
    assert sum(report["skipped_lines"].values()) == 1, report["skipped_lines"]
    assert any("skipped" in w for w in report["warnings"]), report["warnings"]


def test_logs_without_a_step_span_give_a_step_per_set_step_number(logs: Path, tmp_path: Path) -> None:
    """torchtitan's RL trainer, or a loop with torchtitan's logger and set_step() only: no
    `step` span, every record with its step. Each step runs from its first record to its last."""
    from goodtrace.read.torchtitan import log_files

    copy = tmp_path / "set_step_only" / "structured_logs"
    copy.mkdir(parents=True)
    for path in log_files(str(logs)):
        kept = [line for line in Path(path).read_text().splitlines()
                if json.loads(line).get("log_type_name") not in ("step_start", "step_end")]
        (copy / Path(path).name).write_text("\n".join(kept) + "\n")
    done = goodtrace("report", "--json", str(copy.parent), cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [row["step"] for row in report["steps"]] == list(range(1, STEPS + 1))
    assert report["attempts"][0]["ended"] == "completed"
    by_step = {row["step"]: row for row in report["steps"]}
    assert by_step[4]["overhead_s"]["checkpoint_save"] >= 0.03 and "checkpoint_save" in by_step[4]["tags"]
    assert any(w.startswith("All of torchtitan's logs time no `step` span") for w in report["warnings"]), \
        report["warnings"]
