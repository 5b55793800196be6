"""MA-PPO against the strongest token-level PPO on the credit study's tasks: exploratory.

    python benchmarks/token_rivals.py [--seeds 10] [--workers 1] [--out DIR] [--quick]

The protocol, fixed before any run (docs/results/token-rivals.md reports it with the results
and every deviation):

- tasks: the third edition's ``target``, ``units`` and ``prefix`` (studies/credit/tasks.py)
  with its stage: the tiny random-init policy, 30-32 response tokens, temperature 1, no KL,
  one PPO epoch, a constant rate, fp32, 8 responses per step (8 prompts, one response each);
- the critic of every arm: today's default start for a model without a trained reward head
  (``--value-head-init zero``) at critic rate 0.001, the better of the two rates the critic-fit
  benchmark measured for that start (docs/results/critic-fit.md);
- arms, all ``--advantage gae``: ``ppo-lam0.95`` (token PPO, the paper's baseline: ``--n 1
  --lam 0.95``), ``ppo-decoupled`` (VAPO's decoupled GAE: ``--n 1 --lam 0.95 --critic-lambda
  1``), ``ppo-adaptive`` (VAPO's length-adaptive lambda: ``--n 1 --lam adaptive --lam-alpha
  0.05``, which at 30-32 tokens is lambda 0.33-0.375 for the actor and the critic alike) and
  ``fixed5`` (MA-PPO, ``--n 5 --lam 0.95``, the paper's ``equal`` segment values);
- actor rates: every arm at 0.03 and 0.06, two rates of the third edition's grid that its
  tuning picked for token PPO and MA-PPO (a difference that shows at one rate only is a
  difference of rate, the control a sceptic asks for first);
- budget: 17,920 generated tokens per run (the third edition's): 70 steps on the 32-token
  tasks, 74 on ``units``;
- seeds 0 .. ``--seeds``-1 for every arm and rate;
- outcome: the first step whose trailing 5-step mean score reaches 0.8 (the study's
  threshold) and the generated tokens up to it; per arm and rate the share that reached
  (Wilson 95% interval) and the median tokens to it over the runs that reached (bootstrap 95%
  interval of the median); each rival against token PPO at the same rate as the ratio of
  their medians, with a bootstrap interval (the two samples resampled apart).

Each run is the PPO stage's own ``ppo.run`` through the study's runner (studies/credit/runs.py),
so its figures are what ``marlhf ppo`` logs. Records are JSON files under ``--out`` (a rerun
skips the runs it has). ``--quick``: 2 seeds, 8-10 token tasks, budget 768: the same path as
a smoke test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as H  # noqa: E402  (offline environment first)
from _outcomes import print_table, ratio_interval, reached, summarise  # noqa: E402
from critic_fit import QUICK_TASKS, STAGE, TASKS  # noqa: E402  (the third edition's tasks and stage)

BUDGET, QUICK_BUDGET = 17920, 768
RESPONSES = 8
RATES = (0.03, 0.06)
CRITIC_LR, HEAD = 0.001, "zero"
BASELINE = "ppo-lam0.95"
ARMS = {
    BASELINE: {"termination": "fixed", "n": 1, "lam": 0.95},
    "ppo-decoupled": {"termination": "fixed", "n": 1, "lam": 0.95, "critic_lambda": 1.0},
    "ppo-adaptive": {"termination": "fixed", "n": 1, "lam": "adaptive", "lam_alpha": 0.05},
    "fixed5": {"termination": "fixed", "n": 5, "lam": 0.95, "value_function": "equal"},
}


def jobs(tasks: dict[str, int], seeds: int, budget: int) -> list[dict]:
    stage = {**STAGE, "value_head_init": HEAD}
    return [
        {"task": task, "arm": arm, "lr": lr, "seed": seed, "budget": budget, "critic_lr": CRITIC_LR,
         "steps": budget // (RESPONSES * tokens), "tokens": tokens, "flags": flags, "stage": stage, "responses_per_step": RESPONSES}
        for task, tokens in tasks.items() for arm, flags in ARMS.items() for lr in RATES for seed in range(seeds)
    ]  # fmt: skip


def print_ratios(records: list[dict]) -> None:
    """Each rival against token PPO at the same task and rate: the ratio of the median tokens to
    the threshold over the runs that reached it (below 1: the rival needed fewer)."""
    rivals = [arm for arm in ARMS if arm != BASELINE]
    print("| task | actor rate | " + " | ".join(f"{arm} / {BASELINE}, tokens [95% CI]" for arm in rivals) + " |")
    print("|---|---:|" + "---|" * len(rivals))

    def tokens(task, lr, arm):
        runs = [r for r in records if r["task"] == task and r["arm"] == arm and r["lr"] == lr]
        return [h[1] for h in map(reached, runs) if h is not None]

    for task in dict.fromkeys(r["task"] for r in records):
        for lr in RATES:
            cells = []
            for arm in rivals:
                found = ratio_interval(tokens(task, lr, arm), tokens(task, lr, BASELINE))
                cells.append("-" if found is None else f"{found[0]:.2f} [{found[1]:.2f}, {found[2]:.2f}]")
            print(f"| {task} | {lr:g} | " + " | ".join(cells) + " |")


def print_lambdas(records: list[dict]) -> None:
    """The actor's lambda each arm ran with (the stage's gae_lambda, mean over steps and runs)."""
    import statistics

    for arm in ARMS:
        values = [statistics.fmean(r["gae_lambda"]) for r in records if r["arm"] == arm and r.get("gae_lambda")]
        if values:
            print(f"# {arm}: the actor's lambda, mean over steps and runs {statistics.fmean(values):.3f} "
                  f"(runs from {min(values):.3f} to {max(values):.3f})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=BENCH.parent / "docs" / "results" / "token-rivals")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 8-10 token responses, budget 768: a smoke test")
    args = parser.parse_args(argv)
    tasks, budget = (QUICK_TASKS, QUICK_BUDGET) if args.quick else (TASKS, BUDGET)
    if args.quick:
        args.seeds = min(args.seeds, 2)
    from studies.credit.runs import run_jobs

    print(H.machine_line())
    print(H.device_report())
    print(f"# exploratory: {len(tasks)} tasks x {len(ARMS)} arms x {len(RATES)} actor rates, seeds 0-{args.seeds - 1}, "
          f"{budget:,} generated tokens per run, {RESPONSES} responses per step; critic {HEAD} head at rate {CRITIC_LR:g}")  # fmt: skip
    records = run_jobs(jobs(tasks, args.seeds, budget), args.out, args.workers, threads=1, label="token rivals")
    print_table(summarise(records, ARMS))
    print()
    print_ratios(records)
    print()
    print_lambdas(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
