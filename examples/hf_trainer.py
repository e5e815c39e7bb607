"""Train a tiny GPT-2 (built from a config: no download) with the Hugging Face Trainer, recorded
by goodtrace's callback and sent live to TensorBoard; then goodtrace's report.

    pip install 'goodtrace[transformers,tensorboard,report]'
    python examples/hf_trainer.py [--steps 40] [--run-dir runs/hf_trainer] [--tensorboard runs/hf_tb]

The callback records every optimizer step (with forward/backward, optimizer and the batch
fetch), the evaluations and checkpoint saves the Trainer runs every ``--eval-every`` steps,
and the Trainer's logs; the TensorBoard sink gets a live line every logging step and the
run's summary at the end (``tensorboard --logdir runs/hf_tb``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from goodtrace.integrations.transformers import GoodtraceCallback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--run-dir", default="runs/hf_trainer")
    parser.add_argument("--tensorboard", default="runs/hf_tb")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                       bos_token_id=0, eos_token_id=0))
    texts = torch.randint(0, 256, (512, 64))
    train = [{"input_ids": ids, "labels": ids} for ids in texts[:448]]
    evaluation = [{"input_ids": ids, "labels": ids} for ids in texts[448:]]
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=8, logging_steps=5,
            eval_strategy="steps", eval_steps=args.eval_every, save_steps=args.eval_every, report_to=[],
            use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
        )
        callback = GoodtraceCallback(args.run_dir, sinks=[f"tensorboard:{args.tensorboard}"])
        Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=evaluation,
                callbacks=[callback]).train()
    subprocess.run([sys.executable, "-m", "goodtrace", "report", args.run_dir], check=False)


if __name__ == "__main__":
    main()
