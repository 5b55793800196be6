"""Sample efficiency of MA-PPO against PPO when the reward arrives only at the end (Figure 2).

    python benchmarks/sample_efficiency.py [--steps 30] [--seeds 3] [--workers 1]
                                           [--device cpu|cuda] [--dtype fp32|bf16] [--threads 1]

Task: the ``tiny`` policy (random-init Llama, SmolLM2 tokenizer) answers short prompts with
``--new-tokens`` (32) sampled tokens; the score, given once at the last token like a reward
model's, is ``--reward-scale`` x the fraction of response tokens in a fixed target set (the
10% of the vocabulary whose embedding points most along a random direction, as in
tests/test_ppo_learning.py). A random policy scores ~0.1 of the scale, the best one 1.0.
Every token contributes, so the credit for a terminal reward must travel back over the
whole response: the setting where the paper says macro actions help.

Configurations: vanilla PPO (fixed n=1) and MA-PPO with fixed 5, fixed 10, fixed inf
(one segment per response), ppl and parsing, the paper's defaults otherwise (value
function ``equal``, token ratio, gamma 1, lambda 0.95, no whitening), KL coefficient 0 (the
task has no reference to stay close to), temperature 1, no top-k. Each runs ``--seeds``
seeds through the stage's ``ppo.run``; runs go to ``--workers`` worker processes (one torch
thread each), so the imports are paid once per worker.

Curves are the stage's per-step training score (on-policy samples of that step), as the
fraction of target tokens. Parity: the target is vanilla PPO's final reward, the mean over
its seeds of the last 5 steps; a curve reaches it at the first step whose trailing 5-step
mean is at or above it. The last line is the headline: steps(PPO) / steps(MA-PPO fixed 5)
on the seed-mean curves. The plot goes to ``--plot`` and the raw curves beside it (.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

CONFIGS = {  # name: (termination, n, value function)
    "vanilla": ("fixed", 1, "equal"),
    "fixed5": ("fixed", 5, "equal"),
    "fixed10": ("fixed", 10, "equal"),
    "fixed-inf": ("fixed", math.inf, "equal"),
    "ppl": ("ppl", 5, "equal"),
    "parsing": ("parsing", 5, "equal"),
    "fixed5-first": ("fixed", 5, "first"),  # not in the default set: --configs vanilla,fixed5,fixed5-first
}
DEFAULT_CONFIGS = ("vanilla", "fixed5", "fixed10", "fixed-inf", "ppl", "parsing")
LABELS = {"vanilla": "PPO (n=1)", "fixed5": "MA-PPO fixed 5", "fixed10": "MA-PPO fixed 10",
          "fixed-inf": "MA-PPO n=inf", "ppl": "MA-PPO ppl", "parsing": "MA-PPO parsing",
          "fixed5-first": "MA-PPO fixed 5, first"}  # fmt: skip
WINDOW = 5


def target_reward(scale: float):
    """``scale`` x the fraction of real response tokens in the target set (EOS not counted)."""
    import torch

    from marlhf_cli.models import load_causal_lm, load_tokenizer
    from marlhf_cli.train.rewards import TokenFractionReward

    embedding = load_causal_lm("tiny").get_input_embeddings().weight.detach()
    direction = torch.randn(embedding.shape[1], generator=torch.Generator().manual_seed(0))
    targets = torch.topk(embedding @ direction, k=len(embedding) // 10).indices
    fraction = TokenFractionReward(targets, eos_token_id=load_tokenizer("tiny").eos_token_id)

    class Scaled:
        name = f"{scale:g} x target-token fraction"

        def __call__(self, batch):
            return scale * fraction(batch)

    return Scaled()


def worker(args) -> None:
    """Run the jobs of --jobs (a JSON list) one after the other; one result file per job."""
    H.apply_device_args(args)
    from marlhf_cli.train import ppo

    jobs = json.loads(Path(args.jobs).read_text())
    reward = target_reward(args.reward_scale)
    for job in jobs:
        run_dir = Path(job["dir"])
        termination, n, value_function = CONFIGS[job["config"]]
        config = H.ppo_config(
            run_dir, name=job["config"], policy="tiny", reward_model="tiny", dataset=str(Path(args.work) / "prompts.jsonl"),
            termination=termination, n=n, value_function=value_function, rollout_batch_size=args.batch, mini_batch_size=args.batch,
            max_new_tokens=args.new_tokens, max_prompt_length=16, temperature=1.0, top_k=0, kl_coef=0.0,
            actor_lr=args.lr, critic_lr=args.lr, max_steps=args.steps, dtype=args.dtype,
            eval_every=0, eval_prompts=0, save_every=0, seed=job["seed"],
        )  # fmt: skip
        started = time.perf_counter()
        ppo.run(config, reward_fn=reward)
        rows = H.train_rows(run_dir, job["config"])
        result = {
            **job,
            "fraction": [row["score"] / args.reward_scale for row in rows],
            "segment_length": statistics.mean(row["segment_length"] for row in rows),
            "step_time": statistics.median(row["step_time"] for row in rows),
            "seconds": time.perf_counter() - started,
        }
        Path(job["out"]).write_text(json.dumps(result))
        print(f"done {job['config']} seed {job['seed']} in {result['seconds']:.0f} s", flush=True)


def trailing_mean(values: list[float], window: int = WINDOW) -> list[float]:
    return [statistics.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def steps_to(curve: list[float], target: float) -> int | None:
    """First step (1-based) whose trailing mean reaches ``target``; None if it never does."""
    for index, value in enumerate(trailing_mean(curve)):
        if value >= target:
            return index + 1
    return None


def analyse(results: list[dict], configs: list[str], steps: int) -> dict:
    by_config = {c: [r for r in results if r["config"] == c] for c in configs}
    finals = [statistics.mean(r["fraction"][-WINDOW:]) for r in by_config["vanilla"]]
    target = statistics.mean(finals)
    out = {"target": target, "configs": {}}
    for config, runs in by_config.items():
        curves = [r["fraction"] for r in runs]
        mean_curve = [statistics.mean(col) for col in zip(*curves)]
        per_seed = [steps_to(c, target) for c in curves]
        out["configs"][config] = {
            "mean_curve": mean_curve,
            "std_curve": [statistics.pstdev(col) for col in zip(*curves)],
            "steps_mean_curve": steps_to(mean_curve, target),
            "per_seed": per_seed,
            "final": [statistics.mean(c[-WINDOW:]) for c in curves],
            "segment_length": statistics.mean(r["segment_length"] for r in runs),
            "step_time": statistics.median(r["step_time"] for r in runs),
        }
    return out


def fmt_steps(values: list[int | None], steps: int) -> str:
    reached = [v for v in values if v is not None]
    text = H.spread([float(v) for v in reached]) if reached else "-"
    missed = len(values) - len(reached)
    return text + (f" ({missed} >{steps})" if missed else "")


def plot(analysis: dict, configs: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for config in configs:
        data = analysis["configs"][config]
        mean = trailing_mean(data["mean_curve"])
        std = data["std_curve"]
        xs = list(range(1, len(mean) + 1))
        style = "-" if config != "vanilla" else "--"
        (line,) = ax.plot(xs, mean, style, label=LABELS[config], linewidth=2 if config in ("vanilla", "fixed5") else 1.3)
        ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=line.get_color(), alpha=0.12)
        if data["steps_mean_curve"]:
            ax.plot([data["steps_mean_curve"]], [mean[data["steps_mean_curve"] - 1]], "o", color=line.get_color())
    ax.axhline(analysis["target"], color="grey", linewidth=0.8, linestyle=":", label="PPO's final reward")
    ax.set_xlabel("PPO step")
    ax.set_ylabel("reward (fraction of target tokens)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    from marlhf_cli.artifacts import write_figure

    write_figure(path, fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="comma-separated, from " + ", ".join(CONFIGS))
    parser.add_argument("--workers", type=int, default=1, help="worker processes running jobs side by side (2 was not faster on a loaded 2-core CPU)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=6e-2, help="actor and critic learning rate")
    parser.add_argument("--reward-scale", type=float, default=5.0)
    parser.add_argument("--plot", type=Path, default=H.BENCH_DIR / "sample_efficiency.png")
    parser.add_argument("--replot", type=Path, help="redraw the plot and table from a saved .json instead of training")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    H.add_device_args(parser)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    configs = [c.strip() for c in args.configs.split(",")]
    unknown = set(configs) - set(CONFIGS)
    if unknown or "vanilla" not in configs:
        sys.exit(f"--configs: unknown {sorted(unknown)}" if unknown else "--configs must include vanilla (the baseline)")
    if args.replot:
        saved = json.loads(args.replot.read_text())
        return finish(saved["results"], saved["args"], configs, args.plot, saved.get("header", []))

    H.apply_device_args(args)
    header = [H.machine_line(args)]
    header.append(f"# tiny policy, batch {args.batch}, {args.new_tokens} new tokens, {args.steps} steps, lr {args.lr:g}, "
                  f"reward {args.reward_scale:g} x target fraction at the last token, {args.seeds} seeds, "
                  f"{args.workers} worker process(es) x {args.threads} thread(s)")  # fmt: skip
    for line in header:
        print(line, flush=True)
    work = Path(tempfile.mkdtemp(prefix="marlhf-sample-efficiency-"))
    H.write_prompts(work / "prompts.jsonl")
    jobs = [
        {"config": c, "seed": s, "dir": str(work / f"{c}-{s}"), "out": str(work / f"{c}-{s}.json")}
        for s in range(args.seeds) for c in configs
    ]  # fmt: skip
    started = time.perf_counter()
    workers = []
    for w in range(max(1, args.workers)):
        mine = jobs[w :: max(1, args.workers)]
        if not mine:
            continue
        path = work / f"jobs-{w}.json"
        path.write_text(json.dumps(mine))
        command = [sys.executable, __file__, "--worker", "--jobs", str(path), "--work", str(work),
                   "--steps", str(args.steps), "--batch", str(args.batch), "--new-tokens", str(args.new_tokens),
                   "--lr", str(args.lr), "--reward-scale", str(args.reward_scale),
                   "--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]  # fmt: skip
        log = open(work / f"worker-{w}.log", "w", encoding="utf-8")
        workers.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=H.child_env(args.threads)), log, w))
    failed = []
    for process, log, w in workers:
        if process.wait() != 0:
            failed.append(w)
        log.close()
    results = [json.loads(Path(j["out"]).read_text()) for j in jobs if Path(j["out"]).is_file()]
    if failed or len(results) != len(jobs):
        tails = "".join((work / f"worker-{w}.log").read_text(errors="replace")[-1500:] for w in failed)
        sys.exit(f"{len(jobs) - len(results)} of {len(jobs)} runs failed (logs in {work}):\n{tails}")
    wall = time.perf_counter() - started
    header.append(f"# wall time {wall:.0f} s for {len(jobs)} runs; load average at the end {H.load_average()}")
    saved = {"args": vars(args) | {"plot": str(args.plot), "replot": None}, "header": header, "results": results}
    args.plot.with_suffix(".json").write_text(json.dumps(saved))
    finish(results, saved["args"], configs, args.plot, header[-1:])


def finish(results: list[dict], saved_args: dict, configs: list[str], plot_path: Path, notes: list[str]) -> None:
    steps = saved_args["steps"]
    analysis = analyse(results, configs, steps)
    for line in notes:
        print(line)
    print(f"# parity target = PPO's final reward (mean of its last {WINDOW} steps over seeds) = {analysis['target']:.3f}")
    print(f"{'config':<18}{'seg len':>8}{'s/step':>8}{'final reward':>18}{'steps to parity, per seed':>30}{'mean curve':>12}")
    for config in configs:
        data = analysis["configs"][config]
        steps_curve = data["steps_mean_curve"]
        print(f"{LABELS[config]:<18}{data['segment_length']:>8.2f}{data['step_time']:>8.2f}{H.spread(data['final']):>18}"
              f"{fmt_steps(data['per_seed'], steps):>30}{(str(steps_curve) if steps_curve else '>' + str(steps)):>12}")  # fmt: skip
    title = (f"tiny policy, {saved_args['new_tokens']}-token responses, reward at the end; {saved_args['seeds']} seeds\n"
             f"mean over seeds, trailing {WINDOW}-step mean; band: ±1 std over seeds; dots: parity")  # fmt: skip
    plot(analysis, configs, plot_path, title)
    print(f"# plot: {plot_path}")
    ppo_steps = analysis["configs"]["vanilla"]["steps_mean_curve"] or steps
    if "fixed5" in configs:
        ma = analysis["configs"]["fixed5"]["steps_mean_curve"]
        paired = [
            (v or steps) / m for v, m in zip(analysis["configs"]["vanilla"]["per_seed"], analysis["configs"]["fixed5"]["per_seed"]) if m
        ]
        per_seed = f"; per seed {H.spread(paired)}" if paired else ""
        if ma:
            print(f"steps to PPO's final reward: PPO {ppo_steps} / MA-PPO fixed 5 {ma} = {ppo_steps / ma:.2f}x{per_seed}")
        else:
            print(f"steps to PPO's final reward: PPO {ppo_steps}, MA-PPO fixed 5 never reached it in {steps} steps")


if __name__ == "__main__":
    main()
