"""TRL 1.12.0's PPOTrainer on the models and prompts vs_trl.py prepared; writes per-step times.

Run by ``benchmarks/vs_trl.py`` with the interpreter of ``benchmarks/.venv-trl`` (TRL removed
its PPO trainer in 1.13). Imports nothing of marlhf: the policy, reward model and prompt ids
come from files, so both tools start from the same weights and the same token ids.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", required=True)
    parser.add_argument("--reward", required=True)
    parser.add_argument("--prompts", required=True, help="JSON list of prompt id lists")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--out", required=True)
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    import trl
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    transformers.utils.logging.set_verbosity_error()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(args.policy, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy = AutoModelForCausalLM.from_pretrained(args.policy, dtype=dtype)
    reference = AutoModelForCausalLM.from_pretrained(args.policy, dtype=dtype)  # a separate object, as TRL wants
    value = AutoModelForSequenceClassification.from_pretrained(args.reward, num_labels=1, dtype=dtype)
    reward = AutoModelForSequenceClassification.from_pretrained(args.reward, num_labels=1, dtype=dtype)
    for model in (policy, reference, value, reward):
        model.config.pad_token_id = tokenizer.pad_token_id
    with open(args.prompts, encoding="utf-8") as handle:
        ids = json.load(handle)
    dataset = Dataset.from_dict({"input_ids": ids})

    config = PPOConfig(
        output_dir=os.path.join(args.work_dir, "trl-out"),
        per_device_train_batch_size=args.batch, gradient_accumulation_steps=1, num_mini_batches=1,
        local_rollout_forward_batch_size=args.batch, num_ppo_epochs=1, total_episodes=args.batch * args.steps,
        response_length=args.new_tokens, temperature=args.temperature, stop_token="eos",
        kl_coef=0.05, kl_estimator="k1", cliprange=0.2, cliprange_value=0.2, gamma=1.0, lam=0.95,
        learning_rate=1.5e-5, num_sample_generations=0, report_to=[], save_strategy="no",
        logging_steps=1, disable_tqdm=True, bf16=args.dtype == "bf16", fp16=False, seed=0,
        use_cpu=args.device == "cpu", dataloader_num_workers=0,
    )  # fmt: skip
    marks: list[float] = []
    eos: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "val/num_eos_tokens" in logs:
                eos.append(logs["val/num_eos_tokens"])

    trainer = PPOTrainer(
        args=config, processing_class=tokenizer, model=policy, ref_model=reference, reward_model=reward,
        train_dataset=dataset, value_model=value, callbacks=[Clock()],
    )  # fmt: skip
    sys.stdout.flush()
    trainer.train()
    steps = [b - a for a, b in zip(marks, marks[1:])]
    result = {
        "tool": f"trl {trl.__version__}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "step_times": steps,
        "tokens_per_step": args.batch * args.new_tokens,
        "eos_tokens": eos,
        "params": sum(p.numel() for p in policy.parameters()),
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
