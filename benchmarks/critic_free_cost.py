"""Step time and peak memory of the critic-free baselines (rloo, grpo) against gae, same model
and responses.

    python benchmarks/critic_free_cost.py [--model smollm2-135m] [--prompts 2] [--k 4]
                                          [--new-tokens 48] [--rounds 2] [--repeats 1]
                                          [--device cpu|cuda] [--dtype fp32|bf16] [--threads 1]

Each estimator runs in a fresh process (peak memory is a per-process figure), which builds
the PPO stage's models exactly as ``marlhf ppo --advantage <estimator>`` does (gae: actor,
critic, reference, reward model; rloo/grpo: no critic) and runs the stage's own ``ppo_step``:
one warm-up step, then ``--rounds`` timed steps. Every estimator samples K = ``--k``
responses to each of ``--prompts`` prompts with the learning rates at 0, so all of them
see the same responses (the step's seed is the round's; the printed token count proves it)
and the update still runs in full (forward, backward, AdamW step). ``--repeats`` runs the
three processes again in rotated order.

Reported per estimator: the median phase times of the stage's metrics, the step time over
gae's (median over repeats), and the process's peak resident memory (CPU; on CUDA the
peak allocated GPU memory too) over gae's.
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

ESTIMATORS = ("gae", "rloo", "grpo")
PHASES = ("generation_time", "scoring_time", "credit_time", "training_time", "step_time")


def worker(args) -> None:
    """One estimator in this process; prints one JSON line."""
    H.apply_device_args(args)
    import torch

    from marlhf_cli.train import common, ppo

    data = dict(dataset="hh", data_file=str(H.HH_HELPFUL)) if H.HH_HELPFUL.is_file() else dict(dataset="hh")
    config = H.ppo_config(
        tempfile.mkdtemp(prefix="marlhf-critic-free-"), policy=args.model, reward_model=args.model, **data,
        max_records=200, advantage=args.worker, samples_per_prompt=args.k, rollout_batch_size=args.prompts,
        mini_batch_size=args.prompts * args.k, max_new_tokens=args.new_tokens, max_prompt_length=args.prompt_tokens,
        actor_lr=0.0, critic_lr=0.0, dtype=args.dtype, eval_every=0, eval_prompts=0, save_every=0, seed=0,
        max_steps=args.rounds + 1,
    )  # fmt: skip
    common.start(config)
    plan = ppo.plan_run(config)
    prompts = common.load_split(config, "ppo", config.max_records, report=False)
    models = ppo.build_models(config, plan, config.policy, config.reward_model, None)
    ctx = ppo.make_context(config, plan, models, prompts.records)
    steps = [ppo.ppo_step(ctx, step) for step in range(args.rounds + 1)][1:]  # step 0 warms up
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    trainable = sum(p.numel() for engine in (models.actor, models.critic) if engine is not None for p in engine.module.parameters())
    out = {
        "estimator": args.worker, "steps": steps, "peak_rss": peak_rss, "trainable_params": trainable,
        "has_critic": models.critic is not None, "source": prompts.source,
        "gpu_peak": torch.cuda.max_memory_allocated() if args.device == "cuda" else None,
    }  # fmt: skip
    print("RESULT " + json.dumps(out), flush=True)


def run_one(args, estimator: str) -> dict:
    argv = [sys.executable, __file__, "--worker", estimator, "--model", args.model, "--prompts", str(args.prompts),
            "--k", str(args.k), "--new-tokens", str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens),
            "--rounds", str(args.rounds), "--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]  # fmt: skip
    done = subprocess.run(argv, env=H.child_env(args.threads), capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"{estimator} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="policy = reference = critic = reward model base")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--k", type=int, default=4, help="responses per prompt, for every estimator")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="timed steps per process (after one warm-up step)")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the three estimators, order rotated")
    parser.add_argument("--worker", choices=ESTIMATORS, help=argparse.SUPPRESS)
    H.add_device_args(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    H.apply_device_args(args)
    print(H.machine_line(args))
    print(f"# model {args.model}, {args.prompts} prompts x K={args.k} = {args.prompts * args.k} responses per step, "
          f"{args.new_tokens} new tokens, prompts <= {args.prompt_tokens} tokens; lr 0 (identical samples); "
          f"{args.rounds} timed steps + 1 warm-up per process, {args.repeats} repeat(s)")  # fmt: skip
    started = time.perf_counter()
    results: dict[str, list[dict]] = {e: [] for e in ESTIMATORS}
    for rep in range(args.repeats):
        order = ESTIMATORS[rep % 3 :] + ESTIMATORS[: rep % 3]
        for estimator in order:
            results[estimator].append(run_one(args, estimator))
            print(f"# {estimator} done ({time.perf_counter() - started:.0f} s)", flush=True)
    report(results, args)
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")


def report(results: dict[str, list[dict]], args) -> None:
    def phase(estimator, key):
        return H.median([s[key] for r in results[estimator] for s in r["steps"]])

    def peak(estimator, key="peak_rss"):
        return H.median([r[key] for r in results[estimator]])

    print(f"{'estimator':<10}{'critic':>7}{'trainable M':>12}{'gen s':>8}{'score s':>9}{'credit s':>10}{'train s':>9}"
          f"{'step s':>8}{'step x':>8}{'peak RSS GiB':>14}{'RSS x':>7}{'resp tokens':>12}")  # fmt: skip
    for estimator in ESTIMATORS:
        tokens = H.median([s["response_tokens"] for r in results[estimator] for s in r["steps"]])
        print(
            f"{estimator:<10}{'yes' if results[estimator][0]['has_critic'] else 'no':>7}"
            f"{results[estimator][0]['trainable_params'] / 1e6:>12.1f}"
            + "".join(f"{phase(estimator, k):>{w}.{d}f}" for k, w, d in
                      (("generation_time", 8, 2), ("scoring_time", 9, 2), ("credit_time", 10, 3), ("training_time", 9, 2), ("step_time", 8, 2)))
            + f"{phase(estimator, 'step_time') / phase('gae', 'step_time'):>8.2f}"
            f"{peak(estimator) / 2**30:>14.2f}{peak(estimator) / peak('gae'):>7.2f}{tokens:>12.0f}"
        )  # fmt: skip
        if args.device == "cuda":
            print(f"{'':<10}GPU peak allocated {peak(estimator, 'gpu_peak') / 2**30:.2f} GiB "
                  f"({peak(estimator, 'gpu_peak') / peak('gae', 'gpu_peak'):.2f}x gae)")  # fmt: skip
    for estimator in ("rloo", "grpo"):
        print(f"{estimator} / gae: step time {phase(estimator, 'step_time') / phase('gae', 'step_time'):.2f}x, "
              f"peak memory {peak(estimator) / peak('gae'):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
