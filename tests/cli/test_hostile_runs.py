"""The files that made the CLI fail (issue 12), each through ``goodtrace.cli.main`` as the
``goodtrace`` command runs it (in this process, tests/helpers/cli.py).

Headers with fields of any type (missing, strings, NaN, Infinity, huge numbers), a world size of
10**12, a FIFO named ``*.jsonl``, NaN and Infinity literals, JSON nested 100,000 deep, a 40 MB
line mid-file and a torn 100 MB last line, names that are markup, terminal escapes or lone
surrogates, and impossible values (negative durations, reversed sync points, negative or
impossible FLOPs). Every command exits 0 or with one error line, never shows a traceback, writes
strict JSON, and names what it skipped; the numbers leave the bad records out, and say so.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import Ran, goodtrace
from helpers.fuzz import copy_run, segment_files, write_seed_run

pytestmark = pytest.mark.processes

COMMANDS: dict[str, tuple[str, ...]] = {
    "report": ("report",),
    "report --json": ("report", "--json"),
    "report --html": ("report", "--html", "{out}/r.html"),
    "trace": ("trace", "-o", "{out}/t.json"),
    "records": ("records",),
    "records --json": ("records", "--json"),
    "compact": ("compact",),
    "watch --once": ("watch", "--once"),
}


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def every_command(run_dir: Path, out: Path) -> dict[str, Ran]:
    """Each command on the run: exit 0 or one error line, no traceback, no raw escape, strict JSON."""
    results = {}
    for name, argv in COMMANDS.items():
        args = [a.format(out=out) for a in argv]
        done = results[name] = goodtrace(args[0], str(run_dir), *args[1:])
        assert "Traceback" not in done.stderr, (name, done.stderr[-3000:])
        assert done.returncode in (0, 2), (name, done.returncode, done.stderr[-3000:])
        if done.returncode == 2:
            assert done.stderr.rstrip("\n").split("\n")[-1].startswith(f"goodtrace {args[0]}: error: "), done.stderr
        assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr, name
        if name.endswith("--json") and done.returncode == 0:
            strict_json(done.stdout)
        if name == "trace" and done.returncode == 0:
            strict_json((out / "t.json").read_text(encoding="utf-8"))
        if name == "report --html" and done.returncode == 0:
            (out / "r.html").read_bytes().decode("utf-8")
    return results


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_seed_run(tmp_path_factory.mktemp("seed") / "run")


@pytest.fixture(scope="module")
def seed_report(seed_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = copy_run(seed_run, tmp_path_factory.mktemp("clean") / "run")
    done = goodtrace("report", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = strict_json(done.stdout)
    return report


def edit_lines(path: Path, change: Callable[[int, dict[str, Any]], dict[str, Any] | None]) -> None:
    """Rewrite a segment's records through ``change(line index, record)`` (None: unchanged)."""
    lines = path.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        if line.strip():
            changed = change(i, json.loads(line))
            if changed is not None:
                lines[i] = json.dumps(changed).encode("utf-8", "surrogatepass")
    path.write_bytes(b"\n".join(lines))


MISSING = object()


def with_field(record: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    out = dict(record)
    if value is MISSING:
        out.pop(field, None)
    else:
        out[field] = value
    return out


def test_headers_with_fields_of_any_type(seed_run: Path, seed_report: dict[str, Any], tmp_path: Path) -> None:
    """Next to the real run, copies of a segment whose header has one bad field: a required
    field refuses the copy (named, its lines counted), an optional one is ignored (named)."""
    run_dir = copy_run(seed_run, tmp_path / "run")
    source = segment_files(run_dir)[0]
    bad_values = {"missing": MISSING, "string": "x", "nan": math.nan, "inf": math.inf, "huge": 10**30,
                  "negative": -5, "list": [1], "null": None}
    refused = 0
    for field in ("rank", "world", "mono", "wall", "schema", "proc_start_mono", "init_mono", "pid", "restart",
                  "session", "main_tid", "host", "config"):
        for label, value in bad_values.items():
            rank_dir = run_dir / f"rank-{90 + refused % 5:05d}"
            rank_dir.mkdir(exist_ok=True)
            target = rank_dir / f"{field}-{label}.00000.jsonl"
            target.write_bytes(source.read_bytes())
            edit_lines(target, lambda i, r, f=field, v=value: with_field(r, f, v) if i == 0 else None)
            refused += 1
    results = every_command(run_dir, tmp_path)
    assert all(done.returncode == 0 for done in results.values()), {k: v.stderr for k, v in results.items()}
    report = strict_json(results["report --json"].stdout)
    warnings = "\n".join(report["warnings"])
    assert "world-huge.00000.jsonl: header world size 1000000000000000000000000000000 is not a world size" in warnings
    assert "rank-string.00000.jsonl: header rank 'x' is not a rank" in warnings
    assert "mono-nan.00000.jsonl: header clock anchor" in warnings
    # the same problem in many files is one line: the count and the first few files
    pid = [w for w in report["warnings"] if "header field(s) pid out of range or of the wrong type; ignored" in w]
    assert len(pid) == 1 and "in 6 segment files: " in pid[0] and "pid-huge.00000.jsonl" in pid[0], pid
    assert report["skipped_lines"]["file_skipped"] > 0
    records = strict_json(results["records --json"].stdout)
    assert any("world-inf.00000.jsonl: header world size inf is not a world size" in p for p in records["problems"])


def test_one_problem_in_every_file_is_one_warning_line(seed_run: Path, tmp_path: Path) -> None:
    """A run whose every header has the same flaw (another writer's version) is not a wall of
    warnings: each command says it once, with the number of files and the first few."""
    run_dir = copy_run(seed_run, tmp_path / "run")
    files = segment_files(run_dir)
    assert len(files) > 3
    for path in files:
        edit_lines(path, lambda i, r: with_field(r, "init_mono", "soon") if i == 0 else None)
    results = every_command(run_dir, tmp_path)
    line = "header field(s) init_mono out of range or of the wrong type; ignored"
    report = strict_json(results["report --json"].stdout)
    folded = [w for w in report["warnings"] if line in w]
    assert len(folded) == 1 and f"in {len(files)} segment files: " in folded[0], report["warnings"]
    for name in ("report", "trace"):
        shown = results[name].stdout + results[name].stderr
        assert shown.count(line) == 1, shown
    records = strict_json(results["records --json"].stdout)
    assert sum(line in p for p in records["problems"]) == 1, records["problems"]


def test_a_world_of_a_trillion_ranks_is_refused_clearly(seed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(seed_run, tmp_path / "run")
    for path in segment_files(run_dir):
        edit_lines(path, lambda i, r: with_field(r, "world", 10**12) if i == 0 else None)
    results = every_command(run_dir, tmp_path)
    for name in ("report", "report --json", "report --html", "trace"):
        assert results[name].returncode == 2
        assert "header world size 1000000000000 is not a world size (1 to 1048576)" in results[name].stderr
    assert "goodtrace records: warning: " in results["records"].stderr  # its warnings, on stderr
    assert "header world size 1000000000000" in results["records"].stderr


def test_a_fifo_named_like_a_segment_is_skipped_not_opened(seed_run: Path, seed_report: dict[str, Any],
                                                            tmp_path: Path) -> None:
    run_dir = copy_run(seed_run, tmp_path / "run")
    os.mkfifo(run_dir / "rank-00000" / "waiting.00000.jsonl")
    (run_dir / "rank-00001" / "folder.jsonl").mkdir()
    results = every_command(run_dir, tmp_path)
    assert all(done.returncode == 0 for done in results.values())
    report = strict_json(results["report --json"].stdout)
    assert "rank-00000/waiting.00000.jsonl: a FIFO, not a segment file; skipped" in report["warnings"]
    assert "rank-00001/folder.jsonl: a directory, not a segment file; skipped" in report["warnings"]
    assert report["records"] == seed_report["records"]


def test_nan_infinity_and_deep_nesting(seed_run: Path, seed_report: dict[str, Any], tmp_path: Path) -> None:
    run_dir = copy_run(seed_run, tmp_path / "run")
    path = segment_files(run_dir)[0]
    edit_lines(path, lambda i, r: with_field(r, "pid", math.nan) if i == 0 else None)
    lines = path.read_bytes().split(b"\n")
    deep = b"[" * 100_000 + b"]" * 100_000
    lines[3:3] = [
        b'{"kind":"metric","name":"flops_per_step","step":1,"value":NaN,"t":1000000000000}',
        b'{"kind":"metric","name":"device/busy_s","step":1,"value":Infinity,"t":1000000000000}',
        b'{"kind":"span","name":"x","cat":"eval","t0":Infinity,"t1":5}',
        b'{"kind":"event","name":"nan attrs","t":1000000000000,"attrs":{"x":NaN,"y":[1e999]}}',
        b'{"kind":"event","name":"deep","t":1000000000000,"attrs":' + deep + b"}",
        deep,
    ]
    path.write_bytes(b"\n".join(lines))
    results = every_command(run_dir, tmp_path)
    assert all(done.returncode == 0 for done in results.values())
    report = strict_json(results["report --json"].stdout)
    assert report["skipped_lines"] == {"invalid_metric": 2, "invalid_span": 1, "unreadable": 1}
    assert report["records"] == seed_report["records"] + 2  # the two events are records
    assert report["program"]["mfu"] == seed_report["program"]["mfu"]
    records = strict_json(results["records --json"].stdout)
    assert [s["pid"] for s in records["sessions"]].count(None) == 1  # the NaN pid, ignored


def test_lines_over_the_limit_are_skipped_and_the_rest_is_read(seed_run: Path, seed_report: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """A 40 MB event attribute mid-file and a torn 100 MB last line: DuckDB refused the whole
    run ("maximum_object_size"); now each is one skipped line and every other record counts."""
    run_dir = copy_run(seed_run, tmp_path / "run")
    path = segment_files(run_dir)[0]
    lines = path.read_bytes().split(b"\n")
    lines.insert(5, b'{"kind":"event","name":"huge","t":1000000000000,"attrs":{"x":"' + b"a" * 40_000_000 + b'"}}')
    path.write_bytes(b"\n".join(lines))
    with open(segment_files(run_dir)[1], "ab") as handle:
        handle.write(b'{"kind":"event","name":"torn","t":1,"attrs":{"x":"' + b"b" * 100_000_000)
    results = every_command(run_dir, tmp_path)
    assert all(done.returncode == 0 for done in results.values()), {k: v.stderr[-500:] for k, v in results.items()}
    report = strict_json(results["report --json"].stdout)
    assert report["skipped_lines"] == {"too_long": 1, "torn_last_line": 1}
    assert report["records"] == seed_report["records"] and report["partition"] == seed_report["partition"]
    assert f"{path.parent.name}/{path.name}: line(s) 6 longer than 32 MiB; skipped (the rest of the file is read)" \
        in report["warnings"]
    records = strict_json(results["records --json"].stdout)
    assert records["skipped"] == {"too_long": 1, "torn_last_line": 1}
    again = goodtrace("report", str(run_dir), "--json")  # from the compacted copy
    assert strict_json(again.stdout)["skipped_lines"] == report["skipped_lines"]


def test_names_are_data(seed_run: Path, tmp_path: Path) -> None:
    """Markup, terminal escapes, script tags and lone surrogates in names reach every view as
    text: escaped on the console, inert in the HTML, valid JSON in the trace."""
    run_dir = copy_run(seed_run, tmp_path / "run")
    hostile = "[/]\x1b]0;pwned\x07\x1b[31m</script><img src=x onerror=alert(1)>"
    for path in segment_files(run_dir):
        def change(i: int, r: dict[str, Any]) -> dict[str, Any] | None:
            if i == 0:
                return with_field(r, "host", "node\ud800" + hostile)
            if r.get("kind") in ("tag", "event") or r.get("cat") == "checkpoint_save":
                return with_field(r, "name", hostile)
            return None

        edit_lines(path, change)
    results = every_command(run_dir, tmp_path)
    assert all(done.returncode == 0 for done in results.values()), {k: v.stderr for k, v in results.items()}
    console = results["report"].stdout
    assert "[/]\\x1b]0;pwned\\x07\\x1b[31m</script>" in console  # shown as text, escapes visible
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "</script><img" not in page and "\\u003c/script\\u003e\\u003cimg" in page
    trace = strict_json((tmp_path / "t.json").read_text(encoding="utf-8"))
    assert any(e.get("name") == hostile for e in trace["traceEvents"])


def test_impossible_values_are_left_out_and_flagged(seed_run: Path, seed_report: dict[str, Any],
                                                    tmp_path: Path) -> None:
    def report_of(change: Callable[[int, dict[str, Any]], dict[str, Any] | None], name: str) -> dict[str, Any]:
        run_dir = copy_run(seed_run, tmp_path / name)
        for path in segment_files(run_dir):
            edit_lines(path, change)
        done = goodtrace("report", str(run_dir), "--json")
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = strict_json(done.stdout)
        return result

    # a span that ends before it starts: skipped and counted, never a negative duration
    flipped = report_of(lambda i, r: {**r, "t0": r["t1"], "t1": r["t0"]} if r.get("cat") == "checkpoint_save" else None,
                        "flipped")
    assert flipped["skipped_lines"] == {"invalid_span": 2}
    assert any("span record with a missing, non-numeric or impossible field: 2" in w for w in flipped["warnings"])
    # sync points that go back in time: ignored and said so
    reversed_syncs = report_of(
        lambda i, r: {**r, "t": 3 * 10**12 - r["t"]} if r.get("kind") == "sync" else None, "reversed")
    assert any("sync point(s) were ignored" in w for w in reversed_syncs["warnings"])
    # negative FLOPs: no MFU, and why; FLOPs that give MFU over 100 %: flagged
    negative = report_of(lambda i, r: {**r, "value": -1e12} if r.get("name") == "flops_per_step" else None, "neg")
    assert negative["program"]["mfu"] is None and any("is not positive" in w for w in negative["warnings"])
    absurd = report_of(lambda i, r: {**r, "value": 1e30} if r.get("name") == "flops_per_step" else None, "absurd")
    assert absurd["program"]["mfu"] > 1 and any("above 100%" in w for w in absurd["warnings"])
    # a corrupt line mid-file: the report names the file and counts it, as records lists it
    run_dir = copy_run(seed_run, tmp_path / "corrupt")
    path = segment_files(run_dir)[0]
    lines = path.read_bytes().split(b"\n")
    lines.insert(4, b'{"kind":"span","name":"cut')
    path.write_bytes(b"\n".join(lines))
    done = goodtrace("report", str(run_dir))
    assert f"{path.parent.name}/{path.name}: 1 line skipped" in done.stdout.replace("\n", "")
    records = goodtrace("records", str(run_dir))
    assert f"{path.name}: line 5 is not valid JSON; skipped" in records.stderr
