"""Does the critic fit its targets? Before and after the zero value head (issue 42).

    python benchmarks/critic_fit.py [--seeds 5] [--steps 40] [--workers 2] [--out DIR] [--quick]

The credit study's three tasks (``target``, ``units``, ``prefix``; studies/credit/tasks.py)
with the third edition's settings (tiny random-init policy, 8 responses per step, 30-32
response tokens, temperature 1, no KL, constant learning rate), MA-PPO fixed 5 with the
paper's ``equal`` segment value at actor rate 0.03, ``--steps`` steps per run, seeds
0 .. ``--seeds``-1. Each run is the PPO stage's own ``ppo.run`` (through the study's runner,
studies/credit/runs.py), so its figures are what ``marlhf ppo`` logs.

The arms cross the critic's start with its learning rate, so neither can pass for the other:

- ``random`` (what every critic got before issue 42, and what the third edition ran: its
  critic rate was 0.01 on ``target`` and ``units``) against ``zero`` (the new default where
  the critic has no trained reward-model head), each at critic rate 0.01 and 0.001;
- ``zero`` at 0.001 with 10 critic warm-up steps (``--critic-warmup-steps 10``: the actor
  trains for the last 30).

Per run: the critic's explained variance pooled over each 10 steps (the stage's
``explained_variance_pooled`` at steps 10, 20, 30 and 40: 1 - Var(residual) / Var(target)
over those steps' tokens), and the steps until the trailing 5-step mean score reaches 0.8 (the
study's threshold), or none. Per task and arm the table gives each window's median over seeds
with its range, how many seeds exceed 0.2 over the last window, and how many reached the
threshold with their median steps. A figure (``critic_fit.png`` in ``--out``) draws the
pooled EV against the step, median over seeds.
Records are JSON files under ``--out`` (a rerun skips the runs it has); ``--quick`` is a
smoke test of the same path (2 seeds, 12 steps, 8-token responses).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as H  # noqa: E402  (offline environment first)

TASKS = {"target": 32, "units": 30, "prefix": 32}  # response tokens, the third edition's
QUICK_TASKS = {"target": 8, "units": 10, "prefix": 8}
# the third edition's stage (studies/credit/third/protocol.yaml), every arm
STAGE = {"temperature": 1.0, "top_k": 0, "kl_coef": 0.0, "ppo_epochs": 1, "max_prompt_length": 16, "model": "tiny",
         "dtype": "fp32", "lr_scheduler": "constant"}  # fmt: skip
ACTOR_LR = 0.03
THRESHOLD, WINDOW = 0.8, 5  # the study's: a trailing 5-step mean score of 0.8
FITS = 0.2  # the bar for a critic that fits

# arm -> (value head, critic rate, extra flags)
ARMS = {
    "random-c0.01": ("random", 0.01, {}),
    "random-c0.001": ("random", 0.001, {}),
    "zero-c0.01": ("zero", 0.01, {}),
    "zero-c0.001": ("zero", 0.001, {}),
    "zero-c0.001-warmup10": ("zero", 0.001, {"critic_warmup_steps": 10}),
}
WINDOWS = (10, 20, 30, 40)  # steps at which the pooled EV (over the 10 steps before) is read
BEFORE, AFTER = "random-c0.01", "zero-c0.001"


def jobs(tasks: dict[str, int], seeds: int, steps: int, warmup: int) -> list[dict]:
    out = []
    for task, tokens in tasks.items():
        for arm, (head, critic_lr, extra) in ARMS.items():
            flags = {"termination": "fixed", "n": 5, "value_function": "equal", **extra}
            if "critic_warmup_steps" in flags:
                flags["critic_warmup_steps"] = warmup
            for seed in range(seeds):
                out.append({"task": task, "arm": arm, "lr": ACTOR_LR, "critic_lr": critic_lr, "seed": seed, "steps": steps,
                            "tokens": tokens, "flags": flags, "stage": {**STAGE, "value_head_init": head},
                            "responses_per_step": 8})  # fmt: skip
    return out


def reached_step(score: list[float]) -> int | None:
    from studies.credit.survival import reached_step as first_reach

    return first_reach(score, THRESHOLD, WINDOW)


def summarise(records: list[dict], steps: int) -> list[dict]:
    rows = []
    windows = [w for w in WINDOWS if w <= steps] or [steps]
    for task in dict.fromkeys(r["task"] for r in records):
        for arm in ARMS:
            runs = [r for r in records if r["task"] == task and r["arm"] == arm]
            if not runs:
                continue
            pooled = {w: [r["explained_variance_pooled"][w - 1] for r in runs] for w in windows}
            reach = [reached_step(r["score"]) for r in runs]
            steps_reached = [s for s in reach if s is not None]
            rows.append({
                "task": task, "arm": arm, "runs": len(runs), "pooled": pooled,
                "fits": sum(p > FITS for p in pooled[windows[-1]] if math.isfinite(p)), "reached": len(steps_reached),
                "median_steps": statistics.median(steps_reached) if steps_reached else None,
                "final_score": statistics.fmean(statistics.fmean(r["score"][-WINDOW:]) for r in runs),
            })  # fmt: skip
    return rows


def _cell(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "n/a"
    return f"{statistics.median(finite):+.2f} [{min(finite):+.1f}, {max(finite):+.1f}]"


def print_table(rows: list[dict]) -> None:
    windows = list(rows[0]["pooled"])
    heads = "".join(f"{f'EV {w - 9}-{w}: median [range]':<26}" for w in windows)
    print(f"{'task':<7} {'arm':<21} {heads}{'EV>0.2':>6} {'reached':>8} {'median steps':>12} {'final score':>11}")
    for r in rows:
        cells = "".join(f"{_cell(r['pooled'][w]):<26}" for w in windows)
        steps = "-" if r["median_steps"] is None else f"{r['median_steps']:g}"
        print(f"{r['task']:<7} {r['arm']:<21} {cells}{r['fits']:>3}/{r['runs']:<2} {r['reached']:>5}/{r['runs']:<2} {steps:>12} "
              f"{r['final_score']:>11.3f}")  # fmt: skip
    print(f"# per seed, pooled EV over the last window (steps {windows[-1] - 9}-{windows[-1]}):")
    for r in rows:
        print(f"#   {r['task']:<7} {r['arm']:<21} " + " ".join(f"{v:+.3f}" for v in r["pooled"][windows[-1]]))


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from marlhf_cli.artifacts import write_figure

    tasks = list(dict.fromkeys(r["task"] for r in records))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), dpi=100, sharey=True)
    for ax, task in zip(np.atleast_1d(axes), tasks):
        for arm in ARMS:
            curves = [r["explained_variance_pooled"] for r in records if r["task"] == task and r["arm"] == arm]
            if not curves:
                continue
            with warnings.catch_warnings():  # a step where every seed's targets were constant
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmedian(np.array(curves, dtype=float), axis=0)
            style = "--" if arm.startswith("random") else "-"
            ax.plot(np.arange(1, len(mean) + 1), mean, style, label=arm, linewidth=1.4)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.axhline(FITS, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(task)
        ax.set_xlabel("PPO step")
        ax.set_ylim(-1.0, 1.0)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("critic EV, last 10 steps pooled")
    np.atleast_1d(axes)[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("The critic's fit, median over seeds (dashed: random head; y clipped to [-1, 1])", fontsize=9)
    write_figure(path, fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=BENCH.parent / "docs" / "results" / "critic-fit")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 12 steps, 8-10 token responses: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = min(args.seeds, 2), min(args.steps, 12)
    from studies.credit.runs import run_jobs

    print(H.machine_line())
    print(H.device_report())
    tasks = QUICK_TASKS if args.quick else TASKS
    warmup = max(1, args.steps // 4)
    print(f"# {len(tasks)} tasks x {len(ARMS)} arms x {args.seeds} seeds, {args.steps} steps of 8 responses, MA-PPO fixed 5 "
          f"(equal), actor rate {ACTOR_LR:g}; warm-up arm: {warmup} critic-only steps; before = {BEFORE}, after = {AFTER}")  # fmt: skip
    records = run_jobs(jobs(tasks, args.seeds, args.steps, warmup), args.out, args.workers, threads=1, label="critic fit")
    print_table(summarise(records, args.steps))
    plot(records, args.out / "critic_fit.png")
    print(f"# figure: {args.out / 'critic_fit.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
