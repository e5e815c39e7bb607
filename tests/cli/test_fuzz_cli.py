"""Property-based fuzzing of every CLI command over hostile run directories.

Each example copies a real run (written by the recorder), mutates it (tests/helpers/fuzz.py:
truncation, corrupt bytes, wrong types, missing fields, NaN/Inf, huge and negative numbers,
deep nesting, hostile strings, raw lines, non-regular files, whole files of random records),
and runs ``report --json``, ``report --html`` (which prints the console report too), ``trace``,
``records``, ``records --json``, ``watch --once``, ``compact`` and ``report --json`` again (from
the compacted copy). Every command must exit 0 or with one clean error line (exit 2), show no
traceback and write no raw control character; JSON output must be strict JSON (no NaN); and
every line of the run must be accounted for: each reader's records, headers and skipped lines
add up to the non-blank lines of the files, and the compacted copy reports the same numbers as
the JSON lines.

Fixed seed and budget: ``GOODTRACE_FUZZ_EXAMPLES`` examples (default 60, about two and a half
minutes of one core here), in four parts with seeds SEED..SEED+3 that parallel workers share;
set it higher for a longer run (e.g. 1000), and ``GOODTRACE_FUZZ_SEED`` for other inputs than
CI's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, seed, settings

from goodtrace.read.discovery import read_header
from goodtrace.read.validate import check_header
from helpers.fuzz import (
    CliWorker,
    Edit,
    Result,
    apply,
    copy_run,
    count_lines,
    mutations,
    segment_files,
    write_seed_run,
)

EXAMPLES = int(os.environ.get("GOODTRACE_FUZZ_EXAMPLES", "60"))
# Shrinking a failure re-runs every command many times: off unless asked for
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if os.environ.get("GOODTRACE_FUZZ_SHRINK") else [])
SEED = int(os.environ.get("GOODTRACE_FUZZ_SEED", "20261123"))
SHARDS = 4
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_seed_run(tmp_path_factory.mktemp("seed") / "run")


@pytest.fixture(scope="module")
def cli() -> Iterator[CliWorker]:
    worker = CliWorker()
    yield worker
    worker.close()


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def check_clean(result: Result, command: str) -> None:
    """Exit 0, or 2 with one error line; no traceback; no raw control character."""
    shown = f"goodtrace {command}: exit {result.code}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    assert result.code in (0, 2), shown
    assert "Traceback" not in result.stderr, shown
    if result.code == 2:
        lines = result.stderr.rstrip("\n").split("\n")
        assert lines[-1].startswith(f"goodtrace {command.split()[0]}: error: "), shown
    assert not CONTROL.search(result.stdout) and not CONTROL.search(result.stderr), shown


def accepted_headers(run_dir: Path) -> int:
    """Segment files whose first line is a header the DuckDB loader reads (one line each)."""
    count = 0
    for path in segment_files(run_dir):
        if path.is_file() and check_header(read_header(str(path))).header is not None:
            count += 1
    return count


def run_commands(cli: CliWorker, run_dir: Path, out: Path) -> dict[str, Result]:
    html, trace = out / "report.html", out / "trace.json"
    commands = {
        "report --json": ("report", str(run_dir), "--json"),
        "report --html": ("report", str(run_dir), "--html", str(html)),  # the console report, and the HTML
        "trace": ("trace", str(run_dir), "-o", str(trace)),
        "records": ("records", str(run_dir)),
        "records --json": ("records", str(run_dir), "--json"),
        "watch --once": ("watch", str(run_dir), "--once"),
        "compact": ("compact", str(run_dir)),
        "report --json (compacted)": ("report", str(run_dir), "--json"),
    }
    results: dict[str, Result] = {}
    for name, argv in commands.items():
        for stale in (html, trace):
            stale.unlink(missing_ok=True)
        result = results[name] = cli.run(*argv)
        check_clean(result, name)
        if result.code != 0:
            continue
        if "--json" in name:
            strict_json(result.stdout)
        if name == "report --html":
            html.read_bytes().decode("utf-8")  # valid UTF-8 (lone surrogates replaced)
        if name == "trace":
            strict_json(trace.read_text(encoding="utf-8"))
    return results


def check_counts(results: dict[str, Result], run_dir: Path, lines: int, headers: int) -> None:
    """Every non-blank line is a header, a record or a skipped line, for each reader."""
    records = results["records --json"]
    if records.code == 0:
        listed = strict_json(records.stdout)
        kept = sum(s["records"] + s["segments"] for s in listed["sessions"])
        assert kept + sum(listed["skipped"].values()) == lines, (listed["skipped"], listed["problems"][:20])
    report = results["report --json"]
    if report.code == 0:
        first = strict_json(report.stdout)
        assert headers + first["records"] + sum(first["skipped_lines"].values()) == lines, (
            headers, first["records"], first["skipped_lines"], first["warnings"])
        again = results["report --json (compacted)"]
        if results["compact"].code == 0 and again.code == 0:
            second = strict_json(again.stdout)
            assert (second["records"], second["skipped_lines"]) == (first["records"], first["skipped_lines"])
            assert second["partition"] == first["partition"] and second["steps"] == first["steps"]


@pytest.mark.processes
def test_the_seed_run_reads_clean(seed_run: Path, cli: CliWorker, tmp_path: Path) -> None:
    run_dir = copy_run(seed_run, tmp_path / "run")  # the seed itself stays without a compacted copy
    results = run_commands(cli, run_dir, tmp_path)
    assert all(r.code == 0 for r in results.values()), {k: r.stderr for k, r in results.items() if r.code}
    report = strict_json(results["report --json"].stdout)
    assert report["skipped_lines"] == {} and report["records"] > 100
    check_counts(results, run_dir, count_lines(run_dir), accepted_headers(run_dir))


@pytest.mark.slow
@pytest.mark.parametrize("shard", [pytest.param(i, marks=pytest.mark.xdist_group(f"fuzz-{i}")) for i in range(SHARDS)])
def test_every_command_survives_any_run_directory(
    shard: int, seed_run: Path, cli: CliWorker, tmp_path: Path
) -> None:
    """One of SHARDS parts of the budget, each with its own seed, so that parallel workers
    share the examples."""

    @seed(SEED + shard)
    @settings(max_examples=max(1, EXAMPLES // SHARDS), deadline=None, database=None, phases=PHASES,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(edits=mutations())
    def example(edits: list[Edit]) -> None:
        run_dir = copy_run(seed_run, tmp_path / "run")
        for edit in edits:
            apply(run_dir, edit)
        lines, headers = count_lines(run_dir), accepted_headers(run_dir)
        results = run_commands(cli, run_dir, tmp_path)
        check_counts(results, run_dir, lines, headers)
        for name, result in results.items():  # what the examples reached (--hypothesis-show-statistics)
            event(f"{name}: exit {result.code}")
        if results["report --json"].code == 0:
            for reason in strict_json(results["report --json"].stdout)["skipped_lines"]:
                event(f"skipped: {reason}")

    example()
