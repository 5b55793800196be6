"""Tree rollouts against mc and RLOO on the credit study's tasks: exploratory, not an edition.

    python benchmarks/tree_rollouts.py [--seeds 10] [--workers 2] [--out DIR] [--quick]

The protocol, fixed before any run (docs/results/tree-rollouts.md reports it with the
results and every deviation):

- tasks: the third edition's ``target``, ``units`` and ``prefix`` (studies/credit/tasks.py)
  with its stage: the tiny random-init policy, 30-32 response tokens, temperature 1, no KL,
  one PPO epoch, a constant rate, fp32, 8 responses per step (2 prompts x 4);
- arms, all without a critic and at 4 responses per prompt: ``rloo``; ``mc-fixed5`` (M = 2);
  ``tree-fixed5`` (K = 2 branches, depth D = 2: 4 leaves per prompt, branching at the prompt
  and after the first 5 tokens);
- actor rates: every arm at both rates the third edition's tuning picked on each task, rloo's
  (0.03, 0.015, 0.03 on target, units, prefix) and mc's (0.12, 0.24, 0.24). The tree has no
  tuning of its own, and the third edition's ties went to the lower rate, so a tree that
  beat rloo only at mc's higher rate would show the rate, not the tree: every arm runs at
  both (the control a sceptic asks for first);
- budget: 17,920 generated tokens per run, the third edition's (steps = budget // the tokens
  a step generates when no response ends early: rloo 70, mc 10, tree 75 on 32-token tasks);
- seeds 0 .. ``--seeds``-1 for every arm;
- outcome: the first step whose trailing 5-step mean score reaches 0.8 (the study's threshold)
  and the generated tokens up to it; per arm the share of runs that reached (Wilson 95%
  interval), and the median tokens and steps to the threshold over the runs that reached
  (bootstrap 95% interval of the median, scipy.stats.bootstrap, percentile, seed 0). Step time
  and tokens per step come from the same run of this script on one machine (ratios only).

``--timing``: the cost at equal responses per step, on a quiet machine, one process and one
thread: each arm 8 steps on ``target`` at rate 0.03, in 5 interleaved rounds (seeds 100-104);
median step time and its ratio to rloo's, and tokens generated per step.

Each run is the PPO stage's own ``ppo.run`` through the study's runner (studies/credit/runs.py),
so its figures are what ``marlhf ppo`` logs. Records are JSON files under ``--out`` (a rerun
skips the runs it has). ``--quick``: 2 seeds, 8-10 token tasks, budget 768: the same path as
a smoke test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as H  # noqa: E402  (offline environment first)
from _outcomes import print_table, ratio_interval, reached, summarise  # noqa: E402
from critic_fit import QUICK_TASKS, STAGE, TASKS  # noqa: E402  (the third edition's tasks and stage)

BUDGET, QUICK_BUDGET = 17920, 768
RESPONSES, N, M, K, D = 8, 5, 2, 2, 2
# the third edition's picks (studies/credit/third, its report): rloo's and mc's actor rate per task
PICKS = {"target": {"rloo": 0.03, "mc": 0.12}, "units": {"rloo": 0.015, "mc": 0.24}, "prefix": {"rloo": 0.03, "mc": 0.24}}
ARMS = {
    "rloo": {"advantage": "rloo", "samples_per_prompt": 4},
    "mc-fixed5": {"advantage": "mc", "termination": "fixed", "n": N, "samples_per_prompt": 4, "mc_rollouts": M},
    # samples_per_prompt: the study's runner sizes the batch by it; the tree's K^D = 4 is what runs
    "tree-fixed5": {"advantage": "tree", "termination": "fixed", "n": N, "tree_branches": K, "tree_depth": D, "samples_per_prompt": 4},
}


def tokens_per_step(arm: str, length: int) -> int:
    """Tokens a step generates when no response ends early."""
    prompts = RESPONSES // 4
    if arm == "rloo":
        return RESPONSES * length
    if arm == "mc-fixed5":
        boundaries = range(N, length, N)
        return RESPONSES * length + RESPONSES * M * sum(length - b for b in boundaries)
    # a tree: K completions of the prompt, then K - 1 from each of the K level-1 nodes' ends
    return prompts * (K * length + K * (K - 1) * (length - N))


def jobs(tasks: dict[str, int], seeds: int, budget: int) -> list[dict]:
    out = []
    for task, tokens in tasks.items():
        rates = PICKS[task]
        for arm, flags in ARMS.items():
            for lr in (rates["rloo"], rates["mc"]):
                for seed in range(seeds):
                    out.append({"task": task, "arm": arm, "lr": lr, "seed": seed, "budget": budget, "critic_lr": None,
                                "steps": budget // tokens_per_step(arm, tokens), "tokens": tokens, "flags": flags,
                                "stage": STAGE, "responses_per_step": RESPONSES})  # fmt: skip
    return out


def print_ratios(records: list[dict]) -> None:
    """tree against rloo and mc at each rate: the ratio of the median tokens (and steps) to the
    threshold over the runs that reached it (below 1: the tree needed fewer)."""
    print("| task | actor rate | tree / rloo, tokens [95% CI] | tree / mc, tokens [95% CI] | tree / rloo, steps [95% CI] | tree / mc, steps [95% CI] |")
    print("|---|---:|---|---|---|---|")

    def cell(task, lr, other, index):
        def values(arm):
            runs = [r for r in records if r["task"] == task and r["arm"] == arm and r["lr"] == lr]
            return [h[index] for h in map(reached, runs) if h is not None]

        found = ratio_interval(values("tree-fixed5"), values(other))
        return "-" if found is None else f"{found[0]:.2f} [{found[1]:.2f}, {found[2]:.2f}]"

    for task in dict.fromkeys(r["task"] for r in records):
        for lr in sorted({r["lr"] for r in records if r["task"] == task}):
            print(f"| {task} | {lr:g} | {cell(task, lr, 'rloo', 1)} | {cell(task, lr, 'mc-fixed5', 1)} "
                  f"| {cell(task, lr, 'rloo', 0)} | {cell(task, lr, 'mc-fixed5', 0)} |")  # fmt: skip


def timing(rounds: int = 5, steps: int = 8) -> None:
    """Step time and generated tokens per step of each arm, interleaved rounds in this process."""
    import torch

    from studies.credit.runs import run_job

    torch.set_num_threads(1)
    seen: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    for round_ in range(rounds):
        for arm, flags in ARMS.items():
            record = run_job({"task": "target", "arm": arm, "lr": 0.03, "seed": 100 + round_, "steps": steps, "tokens": 32,
                              "flags": flags, "stage": STAGE, "responses_per_step": RESPONSES, "critic_lr": None})  # fmt: skip
            seen[arm].append((record["step_time"], statistics.mean(record["generated_tokens"])))
    base = statistics.median(t for t, _ in seen["rloo"])
    print(f"| arm ({RESPONSES} responses per step, 32 tokens) | s / step, median of {rounds} runs' medians | / rloo "
          f"| per round | tokens / step |")  # fmt: skip
    print("|---|---:|---:|---|---:|")
    for arm, runs in seen.items():
        median = statistics.median(t for t, _ in runs)
        per_round = ", ".join(f"{t / r:.2f}" for (t, _), (r, _) in zip(runs, seen["rloo"]))
        print(f"| {arm} | {median:.3f} | {median / base:.2f} | {per_round} | {statistics.median(n for _, n in runs):,.0f} |")


def cache_timing(rounds: int = 5, model_name: str = "random:smollm2-135m") -> None:
    """The tree sampler alone, its children started from their parent's cache rows against
    reading every node's prompt and path again, in interleaved rounds in this process: 2 trees
    of K=2, D=3 branching every 8 tokens, 24-token responses, the embedded TL;DR sample's first
    two posts as prompts (SmolLM2-135M's shape, random init, fp32, one thread)."""
    import time
    from unittest import mock

    import torch

    from marlhf_cli import models
    from marlhf_cli.data import tldr
    from marlhf_cli.macro import TerminationRule
    from marlhf_cli.train.ppo import tree
    from marlhf_cli.train.ppo.experience import RolloutSettings

    torch.set_num_threads(1)
    tokenizer = models.load_tokenizer(model_name, padding_side="left")
    model = models.load_causal_lm(model_name).eval()
    branches, depth, leaves = 2, 3, 8
    sample = (Path(tldr.__file__).parent / "samples" / "tldr.jsonl").read_text().splitlines()[:2]
    posts = [json.loads(line)["info"] for line in sample]
    prompts = [tldr.format_prompt(p["subreddit"], p["title"], p["post"]) for p in posts for _ in range(leaves)]
    settings = RolloutSettings(max_new_tokens=24, max_prompt_length=512, top_k=0, temperature=0.9)
    rule = TerminationRule("fixed", n=8)
    segmenter = tree.rule_segmenter(rule, tokenizer, reference=model, settings=settings, tree_seeds=[0, 1], device="cpu")

    def once(reuse: bool, seed: int):
        with mock.patch.object(tree, "_start_cache", tree._start_cache if reuse else (lambda *args: None)):
            started = time.perf_counter()
            drawn = tree.sample_tree(model, tokenizer, prompts, settings, branches=branches, depth=depth, segmenter=segmenter,
                                     seeds=lambda t, level, node, child: tree.tree_seed(seed, 0, t, level, node, child))  # fmt: skip
            return time.perf_counter() - started, drawn

    seen: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(rounds):
        for reuse in (False, True):
            seconds, drawn = once(reuse, 100 + round_)
            seen[reuse].append(seconds)
            if reuse:
                tokens, cached = drawn.sampled_tokens, drawn.cached_prefix_tokens
    prompt_tokens = [int(m.sum()) for m in drawn.prompt_mask[::leaves]]
    print(f"# {model_name}, prompts of {prompt_tokens} tokens, K={branches} D={depth} fixed 8, 24-token responses; "
          f"last round: {tokens} tokens drawn, {cached} prefix tokens not read again")  # fmt: skip
    H.print_against_baseline("sampler", "s per batch of 2 trees", "reading again", [
        ("every level reads its prefixes again", seen[False]), ("children start from the parent's rows", seen[True])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=BENCH.parent / "docs" / "results" / "tree-rollouts")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 8-10 token responses, budget 768: a smoke test")
    parser.add_argument("--timing", action="store_true", help="only the step time and tokens per step of each arm")
    parser.add_argument("--cache", action="store_true", help="only the tree sampler with and without its parents' cache rows")
    args = parser.parse_args(argv)
    if args.timing or args.cache:
        print(H.machine_line())
        timing() if args.timing else cache_timing()
        return 0
    tasks, budget = (QUICK_TASKS, QUICK_BUDGET) if args.quick else (TASKS, BUDGET)
    if args.quick:
        args.seeds = min(args.seeds, 2)
    from studies.credit.runs import run_jobs

    print(H.machine_line())
    print(H.device_report())
    print(f"# exploratory: {len(tasks)} tasks x {len(ARMS)} arms, seeds 0-{args.seeds - 1}, {budget:,} generated tokens per run, "
          f"{RESPONSES} responses per step; tree K={K} D={D} fixed {N}, mc M={M} fixed {N}")  # fmt: skip
    records = run_jobs(jobs(tasks, args.seeds, budget), args.out, args.workers, threads=1, label="tree rollouts")
    print_table(summarise(records, ARMS))
    print()
    print_ratios(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
