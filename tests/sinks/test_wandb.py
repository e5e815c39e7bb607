"""W&B sink in offline mode (no account, no network): the offline run's transaction log read
back with wandb's own reader (``wandb.sdk.internal.datastore``) and W&B's record protos."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.sinks import STEPS, CaptureSink, train
from helpers.sinks_expected import JOB_GOODPUT, expected_live, expected_summary

wandb = pytest.importorskip("wandb")
pytest.importorskip("wandb.sdk.internal.datastore", reason="wandb>=0.30 dropped its Python reader")
from helpers.wandb_offline import read_offline_run  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
                        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                        "WANDB_DISABLE_GIT": "true"}.items():
        monkeypatch.setenv(name, value)


def test_live_lines_and_the_summary_read_back_from_the_offline_run(tmp_path: Path) -> None:
    from goodtrace.sinks.wandb import WandbSink

    capture = CaptureSink()
    train(tmp_path / "run", [capture, WandbSink("goodtrace-test", mode="offline", dir=tmp_path)])
    history, summary = read_offline_run(tmp_path)
    rows = {int(row["goodtrace/step"]): row for row in history if "goodtrace/step" in row}
    live = expected_live(capture.lines)
    assert sorted(rows) == sorted(live) == [10, 20, STEPS]
    for step, values in live.items():
        for name, value in values.items():
            assert rows[step][name] == pytest.approx(value), (name, step)
        assert rows[step][JOB_GOODPUT] == pytest.approx(values["goodtrace/goodput/attempt"])
    numbers, attempts = expected_summary(tmp_path / "run", capture.lines[-1])
    for name, value in numbers.items():
        assert summary[name] == pytest.approx(value), name
    for name, text in attempts.items():
        assert summary[name] == text


@pytest.mark.processes
def test_a_run_the_program_already_opened_gets_the_numbers_and_stays_open(tmp_path: Path) -> None:
    from goodtrace.sinks.wandb import WandbSink

    own = wandb.init(project="users-own", mode="offline", dir=tmp_path)
    try:
        own.log({"user/loss": 1.0})
        train(tmp_path / "run", [WandbSink()])
        own.log({"user/loss": 0.5})  # still open: goodtrace did not finish the user's run
    finally:
        own.finish()
    history, summary = read_offline_run(tmp_path)
    assert [row["user/loss"] for row in history if "user/loss" in row] == [1.0, 0.5]
    assert sorted(int(row["goodtrace/step"]) for row in history if "goodtrace/step" in row) == [10, 20, STEPS]
    assert "goodtrace/summary/goodput" in summary
