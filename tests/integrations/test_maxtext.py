"""MaxText recorded by goodtrace, MaxText unedited: ``python -m goodtrace.integrations.maxtext``
runs MaxText's own pre-training trainer (a tiny model on CPU, synthetic data, checkpoints and
evaluations every 5 steps) through its goodput-recorder seam, and the run is read back.

MaxText needs Python >= 3.12 and about 230 packages, so it lives in an environment of its own:
``.venv-maxtext/`` beside the suite's, made by ``.ci/maxtext-env`` (the README's test command
runs it), or the interpreter ``GOODTRACE_MAXTEXT_PYTHON`` names; without either the
real-trainer test is skipped. goodtrace comes from this checkout (``src/`` on
its path; the recording path needs only the standard library)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from goodtrace import schema
from goodtrace.analysis import analyze
from goodtrace.analysis.attempts import COMPLETED
from goodtrace.read.load import load_run

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
MADE = ROOT / ".venv-maxtext" / "bin" / "python"  # what .ci/maxtext-env makes (the README's test command runs it)
PYTHON = os.environ.get("GOODTRACE_MAXTEXT_PYTHON", "") or (str(MADE) if MADE.exists() else "")
STEPS, EVERY = 12, 5
TINY = ["hardware=cpu", "dataset_type=synthetic", "skip_jax_distributed_system=True", f"steps={STEPS}",
        "base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2", "base_mlp_dim=128",
        "base_num_decoder_layers=2", "head_dim=32", "vocab_size=256", "max_target_length=64",
        "per_device_batch_size=1", "enable_checkpointing=True", "async_checkpointing=False",
        f"checkpoint_period={EVERY}", f"eval_interval={EVERY}", "eval_steps=1"]

needs_maxtext = pytest.mark.skipif(not PYTHON, reason="no Python with MaxText: run .ci/maxtext-env, or set "
                                   "GOODTRACE_MAXTEXT_PYTHON")


def _maxtext(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), JAX_PLATFORMS="cpu")
    return subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _base_config() -> str:
    done = _maxtext("-c", "import maxtext, os; print(os.path.join(os.path.dirname(maxtext.__file__), 'configs', "
                          "'base.yml'))", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@needs_maxtext
def test_maxtext_s_trainer_recorded_unedited(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = _maxtext("-m", "goodtrace.integrations.maxtext", str(run_dir), "--", _base_config(), "run_name=t",
                    f"base_output_directory={tmp_path / 'out'}", *TINY)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = done.stdout + done.stderr
    own = {int(k): float(s) for k, s in re.findall(r"completed step: (\d+), seconds: ([0-9.]+)", log)}
    assert sorted(own) == list(range(STEPS))  # MaxText's own step times, as it logs them

    analysis = analyze(load_run(run_dir))
    (attempt,) = analysis.attempts
    assert attempt.ended == COMPLETED
    rows = {row.step: row for row in analysis.steps}
    assert sorted(rows) == list(range(STEPS))
    assert not any(row.host_timed for row in analysis.steps)  # completed on the loss, on the device
    # MaxText saves and evaluates after steps 0, 5 and 10 (and saves the last step at the end):
    # each save and eval lies after that step's completion, so in the next step's interval
    after = {k + 1 for k in range(0, STEPS - 1, EVERY)}
    for k, row in rows.items():
        assert (row.overhead_s.get(schema.CHECKPOINT_SAVE, 0) > 0) == (k in after), (k, row.overhead_s)
        assert (row.overhead_s.get(schema.EVAL, 0) > 0) == (k in after), (k, row.overhead_s)
    # where MaxText is wrong: its step k's time holds the save and the eval goodtrace splits out
    for k in after:
        isolated = rows[k].overhead_s[schema.CHECKPOINT_SAVE] + rows[k].overhead_s[schema.EVAL]
        assert own[k] >= isolated, (k, own[k], rows[k].overhead_s)
    (model,) = [e for e in analysis.events if e.name == "model"]
    assert model.attrs is not None and model.attrs["tokens_per_step"] == 64  # max_target_length x batch
    assert model.attrs["flops_per_step"] > 0


@needs_maxtext
def test_a_moved_seam_is_named_with_the_maxtext_version(tmp_path: Path) -> None:
    code = ("import sys\nimport maxtext.common.checkpointing as c\ndel c.save_checkpoint\n"
            "from goodtrace.integrations.maxtext import main\n"
            f"sys.exit(main([{str(tmp_path / 'run')!r}, '--', 'base.yml']))\n")
    done = _maxtext("-c", code, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "maxtext.common.checkpointing.save_checkpoint" in done.stderr
    assert "tested with MaxText 0.2.5" in done.stderr
    assert not (tmp_path / "run").exists()  # stopped before training


def test_without_maxtext_the_command_says_what_to_install(tmp_path: Path) -> None:
    if importlib.util.find_spec("maxtext") is not None:
        pytest.skip("MaxText is installed here")
    done = subprocess.run([sys.executable, "-m", "goodtrace.integrations.maxtext", str(tmp_path / "run"), "--",
                           "base.yml"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "install it first (pip install maxtext)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
