"""Peak memory and step time of a PPO step with LoRA adapters (``--lora-rank``) against full
fine-tuning, for gae and grpo, same model and responses.

    python benchmarks/lora_cost.py [--model smollm2-135m | smollm2-360m-shape] [--rank 16]
                                   [--estimators gae,grpo] [--only gae:lora,...] [--gradient-checkpointing]
                                   [--prompts 2] [--k 4] [--new-tokens 48]
                                   [--rounds 1] [--repeats 1] [--device cpu|cuda] [--dtype fp32|bf16]

Each configuration (estimator x full or LoRA) runs in a fresh process (peak memory is a
per-process figure), which builds the PPO stage's models exactly as ``marlhf ppo --advantage
<estimator> [--lora-rank R]`` does and runs the stage's own ``ppo_step``: one warm-up step,
then ``--rounds`` timed steps. Full: actor, reference, critic (gae) and reward model, AdamW
over every actor and critic weight. LoRA: the actor and the critic with adapters, the
reference and the reward model being the same weights with the adapter off. Every process
samples K = ``--k`` responses to each of ``--prompts`` prompts with the learning rates at 0,
so all configurations see the same responses (the printed token count shows it) and the
update still runs in full (forward, backward, AdamW step). ``--repeats`` runs the processes
again in rotated order.

``smollm2-360m-shape`` is a random-init model of SmolLM2-360M's shape (hidden 960, 32
layers, 15 heads, 5 key-value heads, intermediate 2560, tied embeddings, SmolLM2's
tokenizer), written once to ``$MARLHF_CACHE/bench-smollm2-360m-shape`` (1.4 GB).
``--only`` runs some configurations (``gae:full`` needs the most memory: ~18 GiB at 360M);
``--gradient-checkpointing`` turns it on in every configuration.

Reported per configuration: the memory the process holds between steps (resident memory
after the timed steps, freed memory handed back with glibc's ``malloc_trim``: weights,
gradients, optimizer states), the peak resident memory of the process (on CUDA the peak allocated GPU memory too), the median
phase times of the stage's metrics, and LoRA over full for each estimator.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

PHASES = ("generation_time", "scoring_time", "credit_time", "training_time", "step_time")
SHAPE_360M = "smollm2-360m-shape"
# SmolLM2-360M's config.json (HuggingFaceTB/SmolLM2-360M): the sizes that decide memory and time
ARCH_360M = dict(
    hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
    max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip


def shape_folder() -> Path:
    from marlhf_cli.models import cache_dir

    return cache_dir() / f"bench-{SHAPE_360M}"


def make_shape() -> None:
    """Write the random-init 360M-shaped model (in its own process: it costs 3 GB once)."""
    import torch
    from transformers import LlamaForCausalLM

    from marlhf_cli.models import _fill_cache_folder, load_tokenizer, tiny_config

    tokenizer = load_tokenizer("tiny")
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(tokenizer, **ARCH_360M))

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    _fill_cache_folder(shape_folder(), save)


def held_rss() -> int:
    """Resident memory once glibc has handed freed memory back (what outlives a step)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def worker(args) -> None:
    """One configuration in this process; prints one JSON line."""
    H.apply_device_args(args)
    import torch

    from marlhf_cli.train import common, ppo

    estimator, mode = args.worker.split(":")
    model = str(shape_folder()) if args.model == SHAPE_360M else args.model
    data = dict(dataset="hh", data_file=str(H.HH_HELPFUL)) if H.HH_HELPFUL.is_file() else dict(dataset="hh")
    config = H.ppo_config(
        tempfile.mkdtemp(prefix="marlhf-lora-cost-"), policy=model, reward_model=model, **data,
        max_records=200, advantage=estimator, samples_per_prompt=args.k, rollout_batch_size=args.prompts,
        mini_batch_size=args.prompts * args.k, max_new_tokens=args.new_tokens, max_prompt_length=args.prompt_tokens,
        actor_lr=0.0, critic_lr=0.0, dtype=args.dtype, eval_every=0, eval_prompts=0, save_every=0, seed=0,
        max_steps=args.rounds + 1, lora_rank=args.rank if mode == "lora" else 0,
        gradient_checkpointing=args.gradient_checkpointing,
    )  # fmt: skip
    common.start(config)
    plan = ppo.plan_run(config)
    prompts = common.load_split(config, "ppo", config.max_records, report=False)
    models = ppo.build_models(config, plan, config.policy, config.reward_model, None)
    ctx = ppo.make_context(config, plan, models, prompts.records)
    steps = [ppo.ppo_step(ctx, step) for step in range(args.rounds + 1)][1:]  # step 0 warms up
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    held = held_rss()
    engines = [engine for engine in (models.actor, models.critic) if engine is not None]
    trainable = sum(p.numel() for engine in engines for p in engine.module.parameters() if p.requires_grad)
    out = {
        "config": args.worker, "steps": steps, "peak_rss": peak_rss, "held_rss": held, "trainable_params": trainable,
        "source": prompts.source, "gpu_peak": torch.cuda.max_memory_allocated() if args.device == "cuda" else None,
    }  # fmt: skip
    print("RESULT " + json.dumps(out), flush=True)


def run_one(args, configuration: str) -> dict:
    argv = [sys.executable, __file__, "--worker", configuration, "--model", args.model, "--rank", str(args.rank),
            "--prompts", str(args.prompts), "--k", str(args.k), "--new-tokens", str(args.new_tokens),
            "--prompt-tokens", str(args.prompt_tokens), "--rounds", str(args.rounds), "--device", args.device,
            "--dtype", args.dtype, "--threads", str(args.threads)]  # fmt: skip
    if args.gradient_checkpointing:
        argv.append("--gradient-checkpointing")
    done = subprocess.run(argv, env=H.child_env(args.threads), capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"{configuration} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help=f"policy = reference = critic = reward model base, or {SHAPE_360M}")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank of the LoRA configurations (alpha 2 x rank)")
    parser.add_argument("--estimators", default="gae,grpo")
    parser.add_argument("--only", help="comma-separated configurations to run (e.g. gae:lora,grpo:full); default: all")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="in every configuration")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--k", type=int, default=4, help="responses per prompt, for every configuration")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="timed steps per process (after one warm-up step)")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the configurations, order rotated")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--make-shape", action="store_true", help=argparse.SUPPRESS)
    H.add_device_args(parser)
    args = parser.parse_args()
    if args.make_shape:
        make_shape()
        return
    if args.worker:
        worker(args)
        return
    H.apply_device_args(args)
    print(H.machine_line(args))
    if args.model == SHAPE_360M and not (shape_folder() / "config.json").is_file():
        subprocess.run([sys.executable, __file__, "--make-shape"], env=H.child_env(args.threads), check=True)
    configurations = [f"{e}:{mode}" for e in args.estimators.split(",") for mode in ("full", "lora")]
    if args.only:
        configurations = [c for c in configurations if c in args.only.split(",")]
    print(f"# model {args.model}, LoRA r={args.rank} (alpha {2 * args.rank}, all linear layers of the blocks), "
          f"{args.prompts} prompts x K={args.k} = {args.prompts * args.k} responses per step, {args.new_tokens} new tokens, "
          f"prompts <= {args.prompt_tokens} tokens; lr 0 (identical samples); {args.rounds} timed steps + 1 warm-up "
          f"per process, {args.repeats} repeat(s)" + (", gradient checkpointing" if args.gradient_checkpointing else ""))  # fmt: skip
    started = time.perf_counter()
    results: dict[str, list[dict]] = {c: [] for c in configurations}
    for rep in range(args.repeats):
        order = configurations[rep % len(configurations) :] + configurations[: rep % len(configurations)]
        for configuration in order:
            results[configuration].append(run_one(args, configuration))
            print(f"# {configuration} done ({time.perf_counter() - started:.0f} s)", flush=True)
    report(results, args)
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")


def report(results: dict[str, list[dict]], args) -> None:
    def phase(configuration, key):
        return H.median([s[key] for r in results[configuration] for s in r["steps"]])

    def memory(configuration, key="peak_rss"):
        return H.median([r[key] for r in results[configuration]])

    print(f"{'config':<11}{'trainable M':>12}{'gen s':>8}{'score s':>9}{'train s':>9}{'step s':>8}"
          f"{'held GiB':>10}{'peak RSS GiB':>14}{'resp tokens':>12}")  # fmt: skip
    for configuration in results:
        tokens = H.median([s["response_tokens"] for r in results[configuration] for s in r["steps"]])
        print(
            f"{configuration:<11}{results[configuration][0]['trainable_params'] / 1e6:>12.2f}"
            + "".join(f"{phase(configuration, k):>{w}.2f}" for k, w in
                      (("generation_time", 8), ("scoring_time", 9), ("training_time", 9), ("step_time", 8)))
            + f"{memory(configuration, 'held_rss') / 2**30:>10.2f}{memory(configuration) / 2**30:>14.2f}{tokens:>12.0f}"
        )  # fmt: skip
        if args.device == "cuda":
            print(f"{'':<11}GPU peak allocated {memory(configuration, 'gpu_peak') / 2**30:.2f} GiB")
    for estimator in args.estimators.split(","):
        full, adapted = f"{estimator}:full", f"{estimator}:lora"
        if not (results.get(full) and results.get(adapted)):
            continue
        line = (f"{estimator}: LoRA r={args.rank} / full: peak memory {memory(adapted) / memory(full):.2f}x, "
                f"step time {phase(adapted, 'step_time') / phase(full, 'step_time'):.2f}x "
                f"(update {phase(adapted, 'training_time') / phase(full, 'training_time'):.2f}x)")  # fmt: skip
        if args.device == "cuda":
            line += f", GPU peak {memory(adapted, 'gpu_peak') / memory(full, 'gpu_peak'):.2f}x"
        print(line)


if __name__ == "__main__":
    main()
