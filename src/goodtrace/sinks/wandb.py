"""Weights & Biases: ``wandb`` runs (``pip install 'goodtrace[wandb]'``), online or offline.

Logs into the run the program already has open (``wandb.run``, e.g. the Hugging Face
Trainer's) when there is one, else starts its own (``mode="offline"`` needs no account and
no network) and finishes it at the end. goodtrace's names get their own x axis
(``goodtrace/step``), so they never disturb the program's own step counter; the summary goes
to the run's summary. ``goodtrace export`` gives its run an id derived from the recorded
run (so exporting again resumes that W&B run; offline, the earlier copy is replaced), rows
carry the step's wall time (``_timestamp``), events are text values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from goodtrace.record.live.sink_hub import SinkError, SinkRun
from goodtrace.sinks._base import PREFIX, ScalarSink, rank_suffix

STEP_KEY = f"{PREFIX}/step"


class WandbSink(ScalarSink):
    """Log goodtrace's numbers to a W&B run (the active one, or a new one of ``project``)."""

    name = "wandb"

    def __init__(
        self, project: str | None = None, *, mode: str | None = None, dir: str | os.PathLike[str] | None = None,
        name: str | None = None, all_ranks: bool = False, summary: bool = True, use_active_run: bool = True,
    ) -> None:
        super().__init__(all_ranks=all_ranks, summary=summary)
        if mode not in (None, "online", "offline", "disabled"):
            raise SinkError(f"wandb: mode must be 'online', 'offline' or 'disabled', got {mode!r}")
        self.project = project
        self.mode = mode
        self.dir = None if dir is None else os.fspath(dir)
        self.run_name = name
        self.use_active_run = use_active_run
        self._run: Any = None
        self._own = False

    @classmethod
    def from_spec(cls, argument: str | None) -> WandbSink:
        """``wandb`` or ``wandb:PROJECT`` (mode and directory from W&B's own WANDB_* variables)."""
        return cls(argument or None)

    def start(self, run: SinkRun) -> None:
        import wandb

        active = wandb.run if self.use_active_run else None
        if active is not None:
            self._run, self._own = active, False
        else:
            name = self.run_name or os.path.basename(os.path.normpath(run.run_dir))
            mode: Any = self.mode
            run_id = None
            if self.export_id is not None:  # goodtrace export: one W&B run per recorded run
                run_id = f"goodtrace-{self.export_id}"
                self._remove_offline_copies(run_id)
            self._run = wandb.init(
                project=self.project or "goodtrace", mode=mode, dir=self.dir, id=run_id,
                resume="allow" if run_id is not None else None, name=name + rank_suffix(run),
                config={"goodtrace/run_dir": run.run_dir, "goodtrace/rank": run.rank,
                        "goodtrace/world_size": run.world_size},
                reinit="create_new",
            )
            self._own = True
        self._run.define_metric(STEP_KEY, hidden=True)
        self._run.define_metric(f"{PREFIX}/*", step_metric=STEP_KEY)

    def scalars(self, step: int, values: Mapping[str, float], wall_time_s: float | None = None) -> None:
        stamp = {} if wall_time_s is None else {"_timestamp": wall_time_s}  # W&B's time of the row
        self._run.log({STEP_KEY: step, **values, **stamp})

    def event(self, step: int, name: str, text: str) -> None:
        self._run.log({STEP_KEY: step, name: text})

    def _remove_offline_copies(self, run_id: str) -> None:
        """An earlier offline export of the same run (W&B would sync both)."""
        import glob
        import shutil

        if (self.mode or os.environ.get("WANDB_MODE")) != "offline":
            return
        base = os.path.join(self.dir or os.environ.get("WANDB_DIR") or os.getcwd(), "wandb")
        for old in glob.glob(os.path.join(glob.escape(base), f"offline-run-*-{run_id}")):
            shutil.rmtree(old, ignore_errors=True)

    def summary(self, step: int, numbers: Mapping[str, float], texts: Mapping[str, str]) -> None:
        for key, value in {**numbers, **texts}.items():
            self._run.summary[key] = value

    def shutdown(self) -> None:
        if self._run is not None and self._own:
            self._run.finish()
        self._run = None
