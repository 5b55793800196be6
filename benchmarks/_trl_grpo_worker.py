"""TRL's current ``GRPOTrainer`` on the models and prompts vs_trl.py prepared (``--algorithm
grpo``); writes per-step times, generation times and tokens.

Run by ``benchmarks/vs_trl.py`` with an interpreter that has TRL's newest release (default
``benchmarks/.venv-trl-new``; TRL 1.16.0 when this was written). Imports nothing of marlhf.
Without vLLM (which this project does not install) TRL generates with ``model.generate``, or
with transformers' continuous batching where ``--paged`` asks for it (``use_transformers_paged``;
on a GPU, the fast path TRL offers a single-GPU user without vLLM).

Times, without changing TRL's code: a step is the wall time between consecutive
``on_step_end`` callbacks (the first from the train loop's start); ``generation`` is the time
inside ``GRPOTrainer._generate_single_turn``; tokens per step are the completions' mean length
that TRL logs times the completions per step.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", required=True)
    parser.add_argument("--reward", required=True)
    parser.add_argument("--prompts", required=True, help="a JSON Lines file of {'prompt': text}")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, default=8, help="completions per step")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--paged", action="store_true", help="transformers' continuous batching (use_transformers_paged)")
    parser.add_argument("--beta", type=float, default=0.05, help="the KL loss's coefficient (0: TRL loads no reference)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    import trl
    from trl import GRPOConfig, GRPOTrainer

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(args.policy, padding_side="left")
    policy = AutoModelForCausalLM.from_pretrained(args.policy, dtype=dtype)
    reward = AutoModelForSequenceClassification.from_pretrained(args.reward, num_labels=1, dtype=dtype)
    with open(args.prompts, encoding="utf-8") as handle:
        prompts = [json.loads(line)["prompt"] for line in handle if line.strip()]
    config = GRPOConfig(
        output_dir=os.path.join(args.work_dir, f"trl-grpo-{time.time_ns()}"), use_cpu=args.device == "cpu",
        bf16=args.dtype == "bf16" and args.device != "cpu", per_device_train_batch_size=args.batch,
        num_generations=args.group, max_completion_length=args.new_tokens, temperature=args.temperature, top_k=0, top_p=1.0,
        learning_rate=1.5e-5, beta=args.beta, loss_type="dapo", scale_rewards="group", num_iterations=1, epsilon=0.2,
        max_steps=args.steps, logging_steps=1, report_to=[], save_strategy="no", disable_dropout=True, seed=0,
        use_transformers_paged=args.paged, dataloader_num_workers=0, lr_scheduler_type="constant",
    )  # fmt: skip

    steps: list[float] = []
    lengths: list[float] = []
    generation: list[float] = []

    class Times(TrainerCallback):
        def on_train_begin(self, *a, **k):
            steps.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            steps.append(time.perf_counter())

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    original = GRPOTrainer._generate_single_turn

    def timed(self, *a, **k):
        began = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            generation.append(time.perf_counter() - began)

    GRPOTrainer._generate_single_turn = timed
    trainer = GRPOTrainer(
        model=policy, reward_funcs=reward, args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer, reward_processing_classes=tokenizer, callbacks=[Times()],
    )  # fmt: skip
    trainer.train()
    step_times = [b - a for a, b in zip(steps, steps[1:])]
    result = {
        "tool": f"trl {trl.__version__} GRPOTrainer" + (" (paged)" if args.paged else ""),
        "threads": torch.get_num_threads(),
        "step_times": step_times,
        "tokens_per_step": [length * args.batch for length in lengths],
        "response_length": lengths,
        "phases": {"generation_time": generation[: len(step_times)],
                   "other_time": [t - g for t, g in zip(step_times, generation)]},  # fmt: skip
    }
    if torch.cuda.is_available():
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
