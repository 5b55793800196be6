"""One TRL DPOTrainer run for benchmarks/vs_trl_dpo.py, in TRL's own virtualenv.

Reads the policy folder and the pairs (prompt, chosen, rejected texts, already cut to the
benchmark's lengths), trains ``--steps`` steps of ``--batch`` pairs, and writes per-step wall
times (between TRL's step-end callbacks), the time from ``train()`` to the first step (where
``--precompute`` computes the reference's log-probs), and the process's peak resident memory.
Like marlhf's run: fp32 (TRL's bf16 fails on a CPU), one thread unless told, no dropout, no
gradient checkpointing (TRL 1.x turns it on by default), a constant rate, the sigmoid loss,
beta 0.1, and a ``max_length`` no pair reaches (the pairs are cut before, the same for both).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", required=True)
    parser.add_argument("--pairs", required=True, help="JSON Lines of {prompt, chosen, rejected}")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, default=8, help="pairs per step")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precompute", action="store_true", help="precompute_ref_log_probs: the reference once, up front")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16 on a GPU only (TRL's bf16 fails on a CPU)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    import trl
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    bf16 = args.dtype == "bf16" and args.device == "cuda"
    policy = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.float32)
    with open(args.pairs, encoding="utf-8") as handle:
        pairs = [json.loads(line) for line in handle if line.strip()]
    config = DPOConfig(
        output_dir=os.path.join(args.work_dir, f"trl-dpo-{time.time_ns()}"), use_cpu=args.device == "cpu", bf16=bf16,
        per_device_train_batch_size=args.batch, max_steps=args.steps, learning_rate=5e-7, lr_scheduler_type="constant",
        beta=0.1, loss_type=["sigmoid"], max_length=100_000, gradient_checkpointing=False, disable_dropout=True,
        precompute_ref_log_probs=args.precompute, logging_steps=1, report_to=[], save_strategy="no", seed=0,
        dataloader_num_workers=0,
    )  # fmt: skip
    stamps: list[float] = []

    class Times(TrainerCallback):
        def on_train_begin(self, *a, **k):
            stamps.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

    constructing = time.perf_counter()
    trainer = DPOTrainer(model=policy, args=config, train_dataset=Dataset.from_list(pairs), processing_class=tokenizer,
                         callbacks=[Times()])  # fmt: skip
    began = time.perf_counter()
    trainer.train()
    steps = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    result = {
        "tool": f"trl {trl.__version__} DPOTrainer" + (" (precompute_ref_log_probs)" if args.precompute else ""),
        "threads": torch.get_num_threads(),
        "step_times": [stamps[1] - stamps[0]] + steps,  # the first includes the first batch's preparation
        # tokenizing the pairs and building the reference (DPOTrainer()), then what train() does before its
        # first step (the reference's pass over every pair with --precompute)
        "construct_seconds": began - constructing,
        "before_first_step": stamps[0] - began,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if torch.cuda.is_available():
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
