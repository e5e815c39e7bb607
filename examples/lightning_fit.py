"""Fit a small LightningModule with goodtrace's callback, exporting live to MLflow (sqlite) and
serving Prometheus metrics; then goodtrace's report.

    pip install 'goodtrace[lightning,mlflow,prometheus,report]'
    python examples/lightning_fit.py [--steps 60] [--run-dir runs/lightning_fit]

The callback records every optimizer step (forward/backward in the optimizer's closure, the
optimizer, the batch fetch), validation every ``--val-every`` steps and the checkpoints
Lightning saves, and the values the module logs. While it runs, http://127.0.0.1:9464/metrics
serves the live numbers; MLflow gets the live lines and the summary (``mlflow ui
--backend-store-uri sqlite:///runs/mlflow.db``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from goodtrace.integrations.lightning import GoodtraceCallback


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: Any, index: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, index: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--val-every", type=int, default=20)
    parser.add_argument("--run-dir", default="runs/lightning_fit")
    parser.add_argument("--mlflow", default="sqlite:///runs/mlflow.db")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(2048, 32)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    callback = GoodtraceCallback(args.run_dir, sinks=[f"mlflow:{args.mlflow}", "prometheus:9464"])
    trainer = L.Trainer(
        max_steps=args.steps, val_check_interval=args.val_every, limit_val_batches=4, log_every_n_steps=5,
        logger=False, enable_progress_bar=False, default_root_dir=args.run_dir + "-lightning",
        callbacks=[callback, ModelCheckpoint(every_n_train_steps=args.val_every, save_top_k=-1)],
    )
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=32, shuffle=True),
                torch.utils.data.DataLoader(data, batch_size=256))
    subprocess.run([sys.executable, "-m", "goodtrace", "report", args.run_dir], check=False)


if __name__ == "__main__":
    main()
