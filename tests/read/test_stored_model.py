"""The reduction ``goodtrace compact`` stores beside the Parquet copy (a chunk of the segment
cache): a report on the copy reads it instead of extracting it again, and must give exactly
what extraction gives; a stored reduction it cannot trust (another version, a table missing,
a segment that grew since) is not used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import analyze
from goodtrace.read.compact import COMPACT_DIR, COMPACT_MANIFEST, MODEL_PREFIX
from goodtrace.read.duckdb_sql import SEGMENT_NAMES
from goodtrace.read.load import compact_run, load_run

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = [DATA / "runs" / "restart_2ranks", DATA / "golden_trace_small" / "run"]


def _figures(run: Path, **kwargs: Any) -> dict[str, Any]:
    loaded = load_run(run, **kwargs)
    result = analyze(loaded).to_dict()
    result.pop("path", None)
    result.pop("form", None)
    return result


def _manifest(run: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((run / COMPACT_DIR / COMPACT_MANIFEST).read_text())
    return manifest


@pytest.mark.parametrize("source", RUNS, ids=lambda p: p.parent.name if p.name == "run" else p.name)
def test_the_stored_model_gives_what_extraction_gives(source: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(source, run, ignore=shutil.ignore_patterns(COMPACT_DIR))
    from_json = _figures(run)
    compact_run(run)
    model = _manifest(run)["model"]
    assert set(model["tables"]) == set(SEGMENT_NAMES)
    assert all((run / COMPACT_DIR / name).is_file() for name in model["tables"].values())
    assert load_run(run).form == "parquet"
    assert _figures(run) == from_json


def test_the_stored_model_is_what_the_report_reads(tmp_path: Path) -> None:
    """Proof that the stored tables are used (not extracted again): a stored table emptied by
    hand changes the report; the same report without the stored model is the JSON lines'."""
    import duckdb

    run = tmp_path / "run"
    shutil.copytree(RUNS[0], run, ignore=shutil.ignore_patterns(COMPACT_DIR))
    from_json = _figures(run)
    compact_run(run)
    steps = run / COMPACT_DIR / _manifest(run)["model"]["tables"]["seg_steps"]
    duckdb.sql(f"COPY (SELECT * FROM read_parquet('{steps}') WHERE false) TO '{steps}' (FORMAT parquet)")
    assert _figures(run)["steps"] != from_json["steps"]
    manifest = _manifest(run)
    manifest["model"]["version"] = -1  # a model of another goodtrace: extracted again
    (run / COMPACT_DIR / COMPACT_MANIFEST).write_text(json.dumps(manifest))
    assert _figures(run) == from_json


def test_a_missing_stored_table_falls_back_to_extraction(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUNS[0], run, ignore=shutil.ignore_patterns(COMPACT_DIR))
    from_json = _figures(run)
    compact_run(run)
    (run / COMPACT_DIR / _manifest(run)["model"]["tables"]["seg_spans"]).unlink()
    assert load_run(run).form == "parquet"
    assert _figures(run) == from_json


def test_compacting_again_replaces_the_stored_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUNS[0], run, ignore=shutil.ignore_patterns(COMPACT_DIR))
    compact_run(run)
    first = set(_manifest(run)["model"]["tables"].values())
    compact_run(run)
    second = set(_manifest(run)["model"]["tables"].values())
    on_disk = {p.name for p in (run / COMPACT_DIR).iterdir() if p.name.startswith(MODEL_PREFIX)}
    assert first.isdisjoint(second) and on_disk == second


def test_a_session_that_grew_after_compaction_is_extracted_again(tmp_path: Path) -> None:
    """The session's file changed size: it is read from JSON and extracted whole; the other
    sessions keep the stored model. The result is the one of the JSON lines alone."""
    run = tmp_path / "run"
    shutil.copytree(RUNS[0], run, ignore=shutil.ignore_patterns(COMPACT_DIR))
    compact_run(run)
    segment = sorted(run.glob("rank-*/*.jsonl"))[0]
    last = json.loads(segment.read_text().splitlines()[-1])
    with segment.open("a") as handle:  # one more heartbeat, a second later
        handle.write(json.dumps({"kind": "heartbeat", "wall": last.get("wall", 0) + 10**9,
                                 "mono": last.get("mono", last.get("t", 0)) + 10**9, "dropped": 0}) + "\n")
    assert load_run(run).form == "parquet+jsonl"
    assert _figures(run) == _figures(run, use_compact=False)
