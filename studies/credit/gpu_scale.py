"""The credit-assignment study at a scale a CPU cannot reach: SmolLM2-135M's shape, 256-token responses.

    python -m studies.credit.gpu_scale --out DIR [--model random:smollm2-135m] [--tokens 256]
        [--tasks target,prefix] [--configs ppo-lam0.95,ppo-lam1.0,fixed5,grpo] [--steps 30]
        [--seeds 10] [--lr 0.005] [--budget 420] [--workers 4] [--device cuda] [--dtype bf16]

The first edition's runs (``first.py``: its tasks, configurations and per-run code:
8 responses per step, one PPO epoch, temperature 1, no KL penalty; the reward in [0, 1] at
the last token, token classes from the policy's own initial embedding), with a random-init
model of SmolLM2-135M's shape (``random:smollm2-135m``) in bf16 on a GPU and responses 4 to 8
times longer than the CPU study's. A pilot, not the study: there is no time for its fair
tuning, so every configuration runs at one learning rate (default 0.005: the CPU study's
tuned rates, 0.03-0.12 at width 64, scaled by 64/576 for SmolLM2-135M's width) and says so.

Jobs go seed by seed (every task x configuration of seed 0, then of seed 1, ...), ``--workers``
at a time (processes sharing the GPU: a 135M model at batch 8 leaves most of an H100 idle).
No job starts that would not end within ``--budget`` seconds, judged by the slowest job so
far; a seed counts only when all its jobs finished, so every configuration has the same seeds.
Writes DIR/credit_scale.json (settings, per task and configuration: runs that reached
``--threshold`` of the best score, steps to it and final score with 95% bootstrap intervals,
seconds per step, every curve) and DIR/credit_scale.png (mean curves with 95% t-bands).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path

from . import first as study
from .runs import H, first_edition_job, run_job
from .tasks import TASKS

DESIGN = study.load("full")  # the first edition's configurations, stage and responses per step


def _init_worker(device: str, threads: int, log: str) -> None:
    """A worker's output goes to the log (the suite keeps it); on 'cpu' it sees no GPU."""
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(threads)
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)


def plan(args) -> list[list[dict]]:
    """The jobs of each seed, seeds in order."""
    stage = DESIGN.stage | {"model": args.model, "dtype": args.dtype}
    return [[first_edition_job(task, config, DESIGN.configs[config], stage, args.lr, seed, args.steps, args.tokens,
                               DESIGN.responses_per_step) for task in args.tasks for config in args.configs]
            for seed in range(args.seeds)]  # fmt: skip


def run_within_budget(seeds: list[list[dict]], args, log: Path) -> list[dict]:
    """Run jobs seed by seed until the budget would be exceeded; the results of whole seeds."""
    queue = [job for jobs in seeds for job in jobs]
    started, slowest = time.perf_counter(), 0.0
    results: list[dict] = []
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=spawn, initializer=_init_worker,
                             initargs=(args.device, args.threads, str(log))) as pool:  # fmt: skip
        running: dict = {}
        while queue or running:
            elapsed = time.perf_counter() - started
            while queue and len(running) < args.workers and elapsed + slowest <= args.budget:
                job = queue.pop(0)
                running[pool.submit(run_job, job)] = (job, time.perf_counter())
            if not running:
                break  # the budget stops the rest
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job, began = running.pop(future)
                results.append(future.result())
                slowest = max(slowest, time.perf_counter() - began)
                print(f"# {job['task']} {job['config']} seed {job['seed']}: {results[-1]['seconds']:.0f} s, final score "
                      f"{statistics.mean(results[-1]['score'][-DESIGN.window:]):.3f} ({time.perf_counter() - started:.0f} s)",
                      flush=True)  # fmt: skip
            if queue and time.perf_counter() - started + slowest > args.budget:
                queue = []  # nothing more fits; the running jobs finish
    whole = [seed for seed, jobs in enumerate(seeds) if all(any(r["seed"] == seed and r["task"] == j["task"]
             and r["config"] == j["config"] for r in results) for j in jobs)]  # fmt: skip
    return [r for r in results if r["seed"] in whole]


def summary(results: list[dict], args) -> tuple[dict, dict]:
    seeds = tuple(sorted({r["seed"] for r in results}))
    mode = study.Mode("gpu", steps=args.steps, tune_steps=0, seeds=seeds, tune_seeds=(), lrs=(args.lr,),
                      tokens={t: args.tokens for t in args.tasks}, threshold=args.threshold)  # fmt: skip
    lr_of = {t: {c: args.lr for c in args.configs} for t in args.tasks}
    untuned = {t: {c: 0.0 for c in args.configs} for t in args.tasks}  # no tuning runs: a pilot
    return mode, {task: study.summarise(results, mode, lr_of, untuned, task, args.configs, DESIGN.window) for task in args.tasks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for credit_scale.json, .png and runs.log")
    parser.add_argument("--model", default="random:smollm2-135m", help="random-init policy (= critic base): tiny or random:<shape>")
    parser.add_argument("--tokens", type=int, default=256, help="response tokens")
    parser.add_argument("--tasks", default="target,prefix", help="comma-separated, from " + ", ".join(TASKS))
    parser.add_argument("--configs", default="ppo-lam0.95,ppo-lam1.0,fixed5,grpo", help="from " + ", ".join(DESIGN.configs))
    parser.add_argument("--steps", type=int, default=30, help="PPO steps per run (8 responses each)")
    parser.add_argument("--seeds", type=int, default=10, help="most seeds; fewer when the budget ends first")
    parser.add_argument("--lr", type=float, default=0.005, help="actor = critic learning rate, every configuration")
    parser.add_argument("--threshold", type=float, default=0.5, help="fraction of the best score (1.0) counted as learned")
    parser.add_argument("--budget", type=float, default=420, help="seconds: no job starts that would end later")
    parser.add_argument("--workers", type=int, default=None, help="runs side by side (default: 4 on cuda, 1 on cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    args = parser.parse_args()
    args.tasks = [t.strip() for t in args.tasks.split(",")]
    args.configs = [c.strip() for c in args.configs.split(",")]
    unknown = (set(args.tasks) - set(TASKS)) | (set(args.configs) - set(DESIGN.configs))
    if unknown:
        sys.exit(f"unknown task or configuration: {', '.join(sorted(unknown))}")
    if not set(args.configs) & set(DESIGN.ma_ppo):
        sys.exit("--configs needs an MA-PPO configuration (e.g. fixed5)")
    args.workers = args.workers or (4 if args.device == "cuda" else 1)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU on this machine")
    args.out.mkdir(parents=True, exist_ok=True)
    print(H.device_report())
    print(f"# {args.model}, {args.tokens} response tokens, tasks {args.tasks}, configurations {args.configs}, "
          f"{args.steps} steps x {DESIGN.responses_per_step} responses, lr {args.lr:g} (untuned), up to {args.seeds} seeds "
          f"in {args.budget:.0f} s, {args.workers} worker(s), {args.dtype} on {args.device}")  # fmt: skip
    started = time.perf_counter()
    results = run_within_budget(plan(args), args, args.out / "runs.log")
    if not results:
        sys.exit("no seed finished within the budget (see runs.log)")
    mode, summaries = summary(results, args)
    print(f"# {len(mode.seeds)} whole seed(s) in {time.perf_counter() - started:.0f} s")
    for task, table in summaries.items():
        print(f"## task {task}: threshold {args.threshold:g} of the best score")
        print(f"{'config':<14}{'s/step':>8}{'reached':>9}{'steps to threshold [95% CI]':>30}{'final score [95% CI]':>26}")
        for s in table.values():
            censored = ">=" if s.reached < s.seeds else ""
            steps = f"{censored}{study.mean_of(s.steps):.1f} [{s.steps_ci[0]:.1f}, {s.steps_ci[1]:.1f}]"
            final = f"{study.mean_of(s.final):.3f} [{s.final_ci[0]:.3f}, {s.final_ci[1]:.3f}]"
            print(f"{s.config:<14}{s.step_time:>8.2f}{f'{s.reached}/{s.seeds}':>9}{steps:>30}{final:>26}")
    from marlhf_cli.artifacts import write_json

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    write_json(args.out / "credit_scale.json", {
        "device": H.device_report(), "settings": settings, "seeds": list(mode.seeds),
        "wall_seconds": time.perf_counter() - started,
        "tasks": {task: {c: {k: v for k, v in asdict(s).items() if k != "tuning_score"} for c, s in table.items()}
                  for task, table in summaries.items()},
    })  # fmt: skip
    study.plot(summaries, DESIGN, args.out / "credit_scale.png", mode)
    print(f"# wrote {args.out / 'credit_scale.json'} and {args.out / 'credit_scale.png'}")


if __name__ == "__main__":
    main()
