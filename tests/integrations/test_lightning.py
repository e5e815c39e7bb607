"""Lightning with GoodtraceCallback: a tiny LightningModule fitted on CPU with validation (the
sanity check included) and checkpointing, then the run analysed."""

from __future__ import annotations

import collections
import csv
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace import schema
from goodtrace.analysis import analyze
from goodtrace.analysis.attempts import COMPLETED
from goodtrace.read.load import load_run
from goodtrace.read.sessions import read_run

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

STEPS = 6


class Regression(L.LightningModule):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, index: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, index: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Path, accumulate: int = 1, logger: Any = False, **callback_options: Any) -> Any:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from goodtrace.integrations.lightning import GoodtraceCallback

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    callback = GoodtraceCallback(tmp_path / "run", **callback_options)
    trainer = L.Trainer(
        default_root_dir=tmp_path, max_steps=STEPS, val_check_interval=3 * accumulate, limit_val_batches=2,
        accumulate_grad_batches=accumulate, log_every_n_steps=2, num_sanity_val_steps=1, accelerator="cpu",
        logger=logger, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback, ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)],
    )
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=4),
                torch.utils.data.DataLoader(data, batch_size=8))
    return callback


def test_the_fit_s_steps_validations_and_checkpoints_are_in_the_report(tmp_path: Path) -> None:
    _fit(tmp_path)
    assert not gt.is_enabled()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    spans = [r for _, r in read_run(tmp_path / "run").records(schema.SPAN)]
    count = collections.Counter((r[schema.F_NAME], r[schema.F_CATEGORY]) for r in spans)
    assert count[("checkpoint", schema.CHECKPOINT_SAVE)] == 2
    assert count[("eval", schema.EVAL)] == 3  # the sanity check, after step 3, after step 6
    assert count[("forward_backward", schema.COMPUTE)] == STEPS and count[("optimizer", schema.COMPUTE)] == STEPS
    assert count[("data", schema.DATA)] == STEPS

    analysis = analyze(load_run(tmp_path / "run"))
    assert [row.step for row in analysis.steps] == list(range(STEPS))  # Lightning's logger steps
    (attempt,) = analysis.attempts
    assert attempt.ended == COMPLETED
    buckets = analysis.partition.buckets_ns
    assert buckets["eval"] > 0 and buckets["checkpoint_save"] > 0
    by_step = {row.step: row for row in analysis.steps}
    assert by_step[3].overhead_s["checkpoint_save"] > 0 and by_step[3].overhead_s["eval"] > 0
    # logged every 2nd step (logger steps 1, 3, 5); validated after the 3rd and 6th step
    assert {s for s, row in by_step.items() if "train_loss" in row.metrics} == {1, 3, 5}
    assert {s for s, row in by_step.items() if "val_loss" in row.metrics} == {2, 5}


def test_each_logged_value_is_recorded_once_at_the_step_lightning_logs_it(tmp_path: Path) -> None:
    """Read back against Lightning's own CSV logger: the same (step, name, value) triples,
    no validation value counted again at later logging steps, no step shifted by one."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="", version="")
    _fit(tmp_path, logger=logger)
    with open(Path(logger.log_dir) / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    logged = {(int(row["step"]), name): float(value) for row in rows
              for name, value in row.items() if value and name not in ("step", "epoch")}
    assert {name for _, name in logged} == {"train_loss", "val_loss"}
    records = read_run(tmp_path / "run").records(schema.METRIC)
    recorded = collections.Counter((r[schema.F_STEP], r[schema.F_NAME]) for _, r in records
                                   if not r[schema.F_NAME].startswith("memory/"))  # instrument()'s own
    assert set(recorded) == set(logged) and set(recorded.values()) == {1}
    by_step = {row.step: row for row in analyze(load_run(tmp_path / "run")).steps}
    for (step, name), value in logged.items():
        assert by_step[step].metrics[name] == pytest.approx(value, rel=1e-6), (step, name)


def test_accumulated_micro_batches_make_one_step(tmp_path: Path) -> None:
    _fit(tmp_path, accumulate=2)
    analysis = analyze(load_run(tmp_path / "run"))
    assert [row.step for row in analysis.steps] == list(range(STEPS))
    spans = [r for _, r in read_run(tmp_path / "run").records(schema.SPAN)]
    assert sum(1 for r in spans if r[schema.F_NAME] == "optimizer") == STEPS


def test_a_fit_that_raises_records_the_exception_and_leaves_the_ending_to_the_program(tmp_path: Path) -> None:
    class Exploding(Regression):
        def training_step(self, batch: Any, index: int) -> Any:
            if self.global_step == 2:
                raise RuntimeError("diverged")
            return super().training_step(batch, index)

    from goodtrace.integrations.lightning import GoodtraceCallback

    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=STEPS, accelerator="cpu", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[GoodtraceCallback(tmp_path / "run")])
    with pytest.raises(RuntimeError, match="diverged"):
        trainer.fit(Exploding(), torch.utils.data.DataLoader(data, batch_size=4))
    assert gt.is_enabled()  # still recording: a program that dies here leaves no finish record
    assert "save_checkpoint" not in vars(trainer)  # the wrapper is gone
    gt.finish(completed=False)
    records = read_run(tmp_path / "run")
    (event,) = [r for _, r in records.records(schema.EVENT) if r[schema.F_NAME] == "exception"]
    assert event["attrs"] == {"type": "RuntimeError", "message": "diverged"}
    steps = [r["step"] for _, r in records.records(schema.STEP)]
    assert steps == [0, 1, 2]  # step 2 raised inside its forward; it was closed
