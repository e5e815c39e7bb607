"""torchtitan's real trainer (``torchtitan.train``, llama3 ``debugmodel``) on CPU, 2 ranks on gloo.

:func:`train` writes what the trainer reads (a tiny JSONL text data set, read through
torchtitan's own ``c4_test`` loader with ``--dataloader.dataset_path``, and a byte-level BPE
tokenizer trained here with ``tokenizers``: nothing is fetched) and launches
``python -m torch.distributed.run ... -m helpers.torchtitan_trainer`` with goodtrace's handler
in ``TITAN_STRUCT_LOGGER_HANDLERS``. Run as that module, this file patches what torchtitan 0.3.0
needs on a CPU-only torch 2.13 (:func:`_patch_for_cpu`, each patch with its reason), then runs
``torchtitan.train`` as ``__main__``, unedited, with torchtitan's own arguments.

:class:`TitanLog` reads one rank's structured log (the JSONL handler's), :func:`tensorboard`
one rank's TensorBoard scalars (torchtitan's metric logger).
"""

from __future__ import annotations

import glob
import json
import os
import runpy
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

STEPS = 8
SAVE_EVERY = 4  # the save after step 4's update; torchtitan also saves after the last step, always
RANKS = 2
HANDLERS = ("torchtitan.observability.structured_logger.jsonl_handler.register_jsonl_handler,"
            "goodtrace.integrations.torchtitan.register_handler")
TESTS = Path(__file__).resolve().parents[1]  # on PYTHONPATH: `-m helpers.torchtitan_trainer`
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TEXT = ("the model reads a batch of tokens and the optimizer updates its weights after each step "
        "while the checkpoint keeps the state and the eval measures the loss on held out text")


def write_assets(root: Path, documents: int = 64) -> tuple[Path, Path]:
    """A JSONL data set (a ``text`` per line, as c4's) and a byte-level BPE tokenizer trained on it
    (``tokenizer.json`` and ``tokenizer_config.json``, what torchtitan's HuggingFaceTokenizer reads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = TEXT.split()
    data = root / "data"
    data.mkdir(parents=True)
    texts = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40 + i % 9)) for i in range(documents)]
    with open(data / "train.jsonl", "w", encoding="utf-8") as file:
        for text in texts:
            file.write(json.dumps({"text": text}) + "\n")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(  # under the debug model's 2048 tokens
        vocab_size=400, special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assets = root / "tokenizer"
    assets.mkdir()
    tokenizer.save(str(assets / "tokenizer.json"))
    with open(assets / "tokenizer_config.json", "w", encoding="utf-8") as file:
        json.dump({"bos_token": BOS, "eos_token": EOS}, file)
    return data, assets


def train(root: Path, timeout: float = 240) -> Path:
    """torchtitan's trainer for :data:`STEPS` steps on :data:`RANKS` ranks, recorded by goodtrace
    into ``OUTPUT/goodtrace`` (the handler's default); returns OUTPUT (torchtitan's dump folder)."""
    data, tokenizer = write_assets(root / "assets")
    out = root / "out"
    args = [
        "--module", "llama3", "--config", "llama3_debugmodel", "--dump_folder", str(out),
        "--hf_assets_path", str(tokenizer), "--dataloader.dataset_path", str(data),
        "--training.steps", str(STEPS), "--training.local_batch_size", "2", "--training.seq_len", "64",
        "--training.mixed_precision_param", "float32",
        # torch 2.13's fully_shard takes no spmd_types annotations (the default backend): "all
        # parameters must be DTensors" whatever the device; this backend shards plain parameters
        "--parallelism.spmd_backend", "partial_dtensor",
        "--checkpoint.enable", "--checkpoint.interval", str(SAVE_EVERY),
        # torchtitan validates at step 1 and every `freq` steps: once, at step 1
        "--validator.enable", "--validator.freq", str(10 * STEPS), "--validator.steps", "2",
        "--validator.dataloader.dataset", "c4_test", "--validator.dataloader.dataset_path", str(data),
        "--metrics.log_freq", "1", "--metrics.enable_tensorboard", "--metrics.save_for_all_ranks",
    ]
    hf = root / "hf"
    env = dict(os.environ, TITAN_STRUCT_LOGGER_HANDLERS=HANDLERS, GOODTRACE_RUN_DIR=str(out / "goodtrace"),
               PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
               HF_HOME=str(hf), HF_DATASETS_CACHE=str(hf / "datasets"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               # torch.compile'd flex attention and block masks run eagerly: inductor would build C++ on CPU
               TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
               "-m", "helpers.torchtitan_trainer", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"torchtitan's trainer failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    return out


class TitanLog:
    """One rank's structured log: its records in the order they were logged."""

    def __init__(self, out: Path, rank: int) -> None:
        (path,) = glob.glob(str(out / "structured_logs" / f"training.global_rank_{rank}.*.jsonl"))
        with open(path, encoding="utf-8") as file:
            self.records = [json.loads(line) for line in file]
        self._where: dict[tuple[str, int | None], list[int]] = {}
        self._nth: dict[str, list[int]] = {}
        for i, record in enumerate(self.records):
            self._where.setdefault((record["log_type_name"], record.get("step")), []).append(i)
            self._nth.setdefault(record["log_type_name"], []).append(i)

    def steps(self) -> list[int]:
        return [r["step"] for r in self.records if r["log_type_name"] == "step_start"]

    def index(self, name: str, step: int | None = None, nth: int = 0) -> int:
        """The ``nth`` record named ``name`` (of ``step``, when given)."""
        return (self._where[(name, step)] if step is not None else self._nth[name])[nth]

    def count(self, name: str) -> int:
        return len(self._nth.get(name, ()))

    def time_ns(self, index: int) -> int:
        return int(self.records[index]["time_us"]) * 1000

    def emission(self, index: int) -> tuple[int, int]:
        """When record ``index`` was being logged, in ns of torchtitan's clock: from its time (taken as
        it is created, before the handlers run) to that of the next record of its thread (created
        once the handlers returned); 1 us either side for the microseconds it is rounded to."""
        tid = self.records[index]["tid"]
        following = next(r for r in self.records[index + 1:] if r["tid"] == tid)
        return self.time_ns(index) - 1000, int(following["time_us"]) * 1000 + 2000

    def tags(self, index: int) -> list[str]:
        return list(self.records[index].get("step_tags") or ())


def tensorboard(out: Path, rank: int) -> dict[str, dict[int, float]]:
    """torchtitan's TensorBoard scalars of ``rank`` (``--metrics.save_for_all_ranks``): tag -> step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = glob.glob(str(out / "tb" / "*" / f"rank_{rank}"))
    events = EventAccumulator(folder).Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


# ---------------------------------------------------------------------------------------------
# What torchtitan 0.3.0 needs on a CPU-only torch 2.13 (applied in the trainer's processes only).


class _CpuDevice:
    """``torch.cpu`` with the calls torchtitan makes on its device module (``torch.cuda``'s names)."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0  # an index, as torch.cuda's (torch.cpu's "cpu" is no barrier device id for gloo)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device: Any = None) -> Any:
        return types.SimpleNamespace(name="cpu", total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        return {}  # no allocator statistics on CPU: torchtitan then logs -1 (its "unknown")

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass


def _no_triton(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name}: a triton kernel of torchtitan's expert parallelism, absent on CPU")

    return kernel


def _dense_flex_attention(query: Any, key: Any, value: Any, *, score_mod: Any = None, block_mask: Any = None,
                          scale: float | None = None, enable_gqa: bool = False, return_aux: Any = None,
                          kernel_options: Any = None) -> Any:
    """flex_attention's result for llama3 (a block mask, no score_mod, no lse) as dense masked SDPA."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    assert score_mod is None and not (return_aux is not None and return_aux.lse), "llama3 asks for neither"
    batch, q_len, kv_len = query.shape[0], query.shape[-2], key.shape[-2]
    mask = None if block_mask is None else create_mask(block_mask.mask_mod, batch, 1, q_len, kv_len, query.device)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    return out, AuxOutput()


def _patch_for_cpu() -> None:
    import torch
    import torch.distributed
    import torch.distributed.distributed_c10d as c10d

    try:
        import triton  # noqa: F401
    except ImportError:
        # every model (llama3 too) imports the expert-parallel triton kernels, which only MoE expert
        # parallelism runs; CPU torch has no triton: the module's names are kernels that raise
        kernels = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")
        kernels.__getattr__ = _no_triton  # type: ignore[method-assign]
        sys.modules[kernels.__name__] = kernels

    from torchtitan.tools import utils

    # torchtitan takes "cuda" (and torch.cuda) when no accelerator is found; the modules that
    # import device_type / device_module by name are imported after this, and read these
    utils.device_type, utils.device_module = "cpu", _CpuDevice()  # type: ignore[assignment]

    from torchtitan.distributed import fsdp
    from torchtitan.models.common.attention import FlexAttention

    # flex_attention has no backward on CPU (NotImplementedError): the same masked attention, dense
    FlexAttention._compiled_flex_attn = staticmethod(_dense_flex_attention)  # type: ignore[assignment]

    disable_division = fsdp.disable_fsdp_gradient_division

    def sum_without_division(model: Any) -> None:
        disable_division(model)
        for module in model.modules():
            if isinstance(module, fsdp.FSDPModule):
                # gloo has no PREMUL_SUM, FSDP's reduction for a divide factor of 1: a plain SUM is the same
                module.set_force_sum_reduction_for_comms(True)

    fsdp.disable_fsdp_gradient_division = sum_without_division
    if not hasattr(torch.distributed, "set_timeout"):
        # torchtitan calls torch.distributed.set_timeout after step 1; torch 2.13 has it as _set_pg_timeout
        torch.distributed.set_timeout = c10d._set_pg_timeout  # type: ignore[attr-defined]


def main() -> None:
    _patch_for_cpu()
    sys.argv = ["torchtitan.train", *sys.argv[1:]]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
