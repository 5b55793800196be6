"""TRL 1.12.0's PPOTrainer on the models and prompts vs_trl.py prepared; writes per-step times.

Run by ``benchmarks/vs_trl.py`` with the interpreter of ``benchmarks/.venv-trl`` (TRL removed
its PPO trainer in 1.13). Imports nothing of marlhf: the policy, reward model and prompt ids
come from files, so both tools start from the same weights and the same token ids.

``--gc noop`` makes ``gc.collect`` a no-op in this process before TRL is imported (TRL's
``PPOTrainer.train`` calls it twice per step, a cost that is not PPO work and that a user can
remove the same way); Python's automatic collection still runs. ``--gc shipped`` leaves it.

Phases, timed without changing TRL's code: ``generation`` is ``batch_generation`` (its
``model.generate`` with the sampling logits kept); ``scoring`` runs from there to the first
training forward (old log-probs from those logits, reference, value and reward forwards,
rewards, GAE); ``update`` from the first training forward to the end of the step's logging
(the PPO epochs: one forward of policy and value, one backward, one optimizer step per
micro-batch, then the step's metrics). Time inside ``gc.collect`` is taken out of the phase
it fell in and reported as ``gc``; ``other`` is the rest of the step (data loader, callbacks).
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
    parser.add_argument("--gc", choices=("shipped", "noop"), default="shipped")
    args = parser.parse_args()
    gc_spans = time_gc(noop=args.gc == "noop")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    import trl
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    events: list[tuple[str, float]] = []  # (what, when), in order
    generate = trl_ppo.batch_generation
    forward = trl_ppo.forward

    def timed_generation(*a, **k):
        events.append(("generation", time.perf_counter()))
        out = generate(*a, **k)
        events.append(("scoring", time.perf_counter()))
        return out

    def marked_forward(model, *a, **k):
        if type(model).__name__ == "PolicyAndValueWrapper" and events and events[-1][0] != "update":
            events.append(("update", time.perf_counter()))  # the first training forward of the step
        return forward(model, *a, **k)

    truncate = trl_ppo.truncate_response
    real_tokens: list[int] = []  # per rollout chunk: tokens up to and including the first stop token

    def counted_truncate(stop_token_id, pad_token_id, responses):
        stops = responses == stop_token_id
        first = torch.where(stops.any(1), stops.int().argmax(1) + 1, torch.full_like(stops[:, 0], responses.shape[1], dtype=torch.long))
        real_tokens.append(int(first.sum()))
        return truncate(stop_token_id, pad_token_id, responses)

    trl_ppo.batch_generation = timed_generation
    trl_ppo.truncate_response = counted_truncate
    trl_ppo.forward = marked_forward

    transformers.utils.logging.set_verbosity_error()
    # bf16: weights, gradients and AdamW states in bf16 (what loading a model in bf16 and
    # bf16=True gives); bf16-mixed: fp32 weights and optimizer, bf16 autocast (accelerate's
    # mixed precision), the like of marlhf's bf16 with its fp32 master weights
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
        logging_steps=1, disable_tqdm=True, bf16=args.dtype in ("bf16", "bf16-mixed"), fp16=False, seed=0,
        use_cpu=args.device == "cpu", dataloader_num_workers=0,
    )  # fmt: skip
    marks: list[float] = []
    eos: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())
            events.append(("end", marks[-1]))

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
        "tokens_per_step": real_tokens,  # one rollout chunk per step (local_rollout_forward_batch_size = batch)
        "eos_tokens": eos,
        "gc": args.gc,
        "phases": phase_times(events, gc_spans, marks),
        "params": sum(p.numel() for p in policy.parameters()),
    }
    if torch.cuda.is_available():
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


def time_gc(*, noop: bool) -> list[tuple[float, float]]:
    """Record every ``gc.collect`` call as (start, seconds); with ``noop`` make it do nothing."""
    import gc

    spans: list[tuple[float, float]] = []
    collect = gc.collect

    def recorded(*a, **k):
        started = time.perf_counter()
        result = 0 if noop else collect(*a, **k)
        spans.append((started, time.perf_counter() - started))
        return result

    gc.collect = recorded
    return spans


def phase_times(events, gc_spans, marks) -> dict[str, list[float]]:
    """Per step: seconds of generation, scoring, update (gc time taken out), gc, other."""
    phases: dict[str, list[float]] = {k: [] for k in ("generation_time", "scoring_time", "training_time", "gc_time", "other_time")}
    starts = [i for i, (what, _) in enumerate(events) if what == "generation"]
    for step, first in enumerate(starts):
        window = dict(events[first : first + 4])  # generation, scoring, update, end
        if set(window) != {"generation", "scoring", "update", "end"}:
            break
        bounds = {"generation_time": (window["generation"], window["scoring"]),
                  "scoring_time": (window["scoring"], window["update"]),
                  "training_time": (window["update"], window["end"])}  # fmt: skip
        begin, end = marks[step], marks[step + 1]
        gc_total = sum(d for t, d in gc_spans if begin <= t < end)
        for key, (a, b) in bounds.items():
            phases[key].append(b - a - sum(d for t, d in gc_spans if a <= t < b))
        phases["gc_time"].append(gc_total)
        phases["other_time"].append(end - begin - sum(phases[k][-1] for k in bounds) - gc_total)
    return phases


if __name__ == "__main__":
    main()
