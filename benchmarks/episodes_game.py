"""Credit over turns on the letter game: token PPO, MA-PPO with a turn per macro action, GRPO.

    python benchmarks/episodes_game.py [--seeds 5] [--workers 1] [--out DIR] [--quick]

Exploratory. The protocol, fixed before any run (docs/results/episodes.md reports it with
the results and every deviation):

- the task: the shipped game (templates/envs/guess_letter.py on templates/prompts/guess-letter.jsonl,
  the PPO three quarters of it), the random-init tiny policy, at most 4 turns of at most 4
  tokens (the guess is a turn's first letter: the other tokens are the reply's rest, where
  token-level and turn-level credit part), 96 tokens an episode, temperature 1, no KL, one PPO
  epoch, a constant rate, fp32, 16 episodes a step, 40 steps;
- arms: ``ppo-token`` (``--termination fixed --n 1``: token PPO, lambda 0.95), ``ma-turn``
  (``--termination turn``: MA-PPO, a turn per macro action, lambda 0.95), both with a critic
  started at zero and trained at the actor's rate; ``grpo`` (4 games x 4 episodes, no critic);
- actor rates 0.02 and 0.04 for every arm (the two the learning test was probed at);
- seeds 0 .. ``--seeds``-1;
- outcomes, per arm and rate: the mean return of the last 5 steps (t-interval over seeds);
  the generated tokens until the trailing 5-step mean return first reaches 0 (the game's
  wasted-turn penalty gone on average), the share of runs that reached it (Wilson) and the
  median over those that did (bootstrap); and the return against generated tokens, drawn
  (plots/episodes-game.png).

Two arms added after those 30 runs were reported, their protocol fixed before their own runs
(2026-12-05): ``tree-turn`` (``--advantage tree --termination turn``, K = 2, D = 2: 4 games x
4 leaves a step, each tree branching at the end of its episodes' first turn) and ``mc-turn``
(``--advantage mc --termination turn``, 4 games x 4 episodes, M = 2 continuations from each
turn's start), neither with a critic; the same stage, rates, seeds, steps and outcomes. They
are read against ``ma-turn`` and ``ppo-token`` descriptively (a ratio of median tokens with
its interval); mc's continuations count among its generated tokens.

Each run is ``marlhf ppo --env`` through its own ``ppo.run`` (studies/credit/runs.py's
workers); records are JSON files under ``--out`` (a rerun skips those it has). ``--quick``: 2
seeds, 6 steps: the same path as a smoke test.

``--cache``: the cost of playing episodes alone, each turn started from the keys and values
the earlier turns kept against each turn reading its whole context again, in interleaved
rounds in this process (SmolLM2-135M's shape, random init, fp32, one thread; 8 games of at
most 4 turns of at most 24 tokens): the median seconds and their ratio, and whether both
played the same episodes.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as H  # noqa: E402
from _outcomes import median_interval, reached, wilson, with_interval  # noqa: E402

REPO = BENCH.parent
GAME = f"py:{REPO / 'templates' / 'envs' / 'guess_letter.py'}:GuessLetter"
GAMES = REPO / "templates" / "prompts" / "guess-letter.jsonl"
STEPS, QUICK_STEPS, EPISODES = 40, 6, 16
RATES = (0.02, 0.04)
THRESHOLD = 0.0  # a trailing 5-step mean return of 0: the wasted turns' penalty gone on average
ARMS = {
    "ppo-token": {"termination": "fixed", "n": 1},
    "ma-turn": {"termination": "turn"},
    "grpo": {"advantage": "grpo", "samples_per_prompt": 4},
    # added after the first 30 runs (docstring): the two estimators that continue an episode from inside it
    "tree-turn": {"advantage": "tree", "termination": "turn", "tree_branches": 2, "tree_depth": 2},
    "mc-turn": {"advantage": "mc", "termination": "turn", "samples_per_prompt": 4, "mc_rollouts": 2},
}
GROUPS = {"tree-turn": 4}  # episodes per record where no --samples-per-prompt says it (a tree's K^D)
STAGE = dict(env=GAME, dataset=str(GAMES), split_shares="0/0/3/1", max_turns=4, max_new_tokens=4, max_episode_tokens=96,
             max_prompt_length=64, temperature=1.0, top_k=0, kl_coef=0.0, ppo_epochs=1, lr_scheduler="constant",
             dtype="fp32", report_to="none")  # fmt: skip


def jobs(seeds: int, steps: int) -> list[dict]:
    return [{"task": "letter-game", "arm": arm, "lr": lr, "seed": seed, "steps": steps, "flags": flags, "stage": STAGE}
            for arm, flags in ARMS.items() for lr in RATES for seed in range(seeds)]  # fmt: skip


def job_path(root: Path, job: dict) -> Path:
    return root / f"{job['arm']}-lr{job['lr']:g}-s{job['seed']}-{job['steps']}steps.json"


def run_job(job: dict) -> dict:
    """One run through the stage (in a worker process); its per-step record."""
    import torch

    from marlhf_cli import provenance
    from marlhf_cli.train import ppo

    flags = dict(job["flags"])
    group = GROUPS.get(job["arm"], flags.get("samples_per_prompt", 1))
    work = Path(tempfile.mkdtemp(prefix="marlhf-episodes-game-"))
    try:
        config = H.ppo_config(work, name="run", policy="tiny", reward_model="tiny", **job["stage"], **flags,
                              rollout_batch_size=EPISODES // group, mini_batch_size=EPISODES, actor_lr=job["lr"],
                              critic_lr=job["lr"], max_steps=job["steps"], eval_every=0, eval_prompts=0, save_every=0,
                              seed=job["seed"])  # fmt: skip
        started = time.perf_counter()
        ppo.run(config)
        seconds = time.perf_counter() - started
        rows = H.train_rows(work, "run")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {**job, "score": [r["score"] for r in rows], "generated_tokens": [r["generated_tokens"] for r in rows],
            "turns": [r["turns"] for r in rows], "truncated_rate": [r["truncated_rate"] for r in rows],
            "step_time": statistics.median(r["step_time"] for r in rows), "seconds": seconds,
            "provenance": {k: v for k, v in provenance.provenance().items() if k != "command"}, "threads": torch.get_num_threads(),
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}  # fmt: skip


def t_interval(values: list[float]) -> str:
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def print_table(records: list[dict]) -> None:
    print("| arm | actor rate | runs | return, last 5 steps [95% t] | reached a return of 0 [95% CI] | tokens to it, median [95% CI] | tokens / step | turns / episode |")
    print("|---|---:|---:|---|---|---|---:|---:|")
    for arm in ARMS:
        for lr in RATES:
            runs = [r for r in records if r["arm"] == arm and r["lr"] == lr]
            if not runs:
                continue
            hits = [h for h in (reached(r, THRESHOLD) for r in runs) if h is not None]
            share = wilson(len(hits), len(runs))
            tokens = [h[1] for h in hits]
            median = statistics.median(tokens) if tokens else None
            per_step = statistics.fmean(statistics.fmean(r["generated_tokens"]) for r in runs)
            turns = statistics.fmean(statistics.fmean(r["turns"]) for r in runs)
            print(f"| {arm} | {lr:g} | {len(runs)} | {t_interval([statistics.fmean(r['score'][-5:]) for r in runs])} | "
                  f"{len(hits)}/{len(runs)} [{share[0]:.2f}, {share[1]:.2f}] | {with_interval(median, median_interval(tokens), ',.0f')} | "
                  f"{per_step:.0f} | {turns:.2f} |")  # fmt: skip


def plot(records: list[dict], path: Path) -> None:
    """The mean return against the mean generated tokens, per arm and rate (seeds averaged step by step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(RATES), figsize=(5 * len(RATES), 3.6), sharey=True)
    for axis, lr in zip(axes, RATES):
        for arm in ARMS:
            runs = [r for r in records if r["arm"] == arm and r["lr"] == lr]
            if not runs:
                continue
            steps = min(len(r["score"]) for r in runs)
            tokens = [statistics.fmean(sum(r["generated_tokens"][: s + 1]) for r in runs) for s in range(steps)]
            axis.plot(tokens, [statistics.fmean(r["score"][s] for r in runs) for s in range(steps)], label=arm)
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axis.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
        axis.set_title(f"actor rate {lr:g}")
        axis.set_xlabel("generated tokens")
    axes[0].set_ylabel("mean episode return (seeds averaged)")
    axes[0].legend()
    figure.suptitle("letter game: optimum 1 (dashed), a blind player that wastes no turn 0.5 (dotted)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def cache_timing(rounds: int = 5, model_name: str = "random:smollm2-135m", games: int = 8, turns: int = 4, tokens: int = 24) -> None:
    """``--cache`` (module docstring)."""
    import json

    import torch

    from marlhf_cli import models
    from marlhf_cli.chat import ChatFormat
    from marlhf_cli.episodes.environment import Environments, load_factory
    from marlhf_cli.episodes.rollout import play, started
    from marlhf_cli.generation import SamplingParams

    torch.set_num_threads(1)
    chat = ChatFormat(models.load_tokenizer(model_name, padding_side="left"), "auto")
    model = models.load_causal_lm(model_name).eval()
    records = [json.loads(line) for line in GAMES.read_text().splitlines()[:games]]
    factory = load_factory(GAME)
    budget = turns * tokens + (turns - 1) * 64
    sampling = SamplingParams(1.0, 0, 1.0, tokens, cache_length=256 + budget)

    def once(keep: bool, seed: int):
        torch.manual_seed(seed)
        environments = Environments(GAME, factory, records, list(range(games)), timeout=30)
        episodes = started(chat, environments, 256)
        began = time.perf_counter()
        play(model, chat, environments, episodes, sampling, max_turns=turns, max_episode_tokens=budget, device="cpu", keep_cache=keep)
        return time.perf_counter() - began, episodes

    seen: dict[bool, list[float]] = {True: [], False: []}
    same = True
    for round_ in range(rounds):
        played = {}
        for keep in (False, True):
            seconds, played[keep] = once(keep, 100 + round_)
            seen[keep].append(seconds)
        same &= [e.tokens for e in played[True]] == [e.tokens for e in played[False]]
    last = played[True]
    context = max(len(e.prompt_row) + len(e.tokens) for e in last)
    print(f"# {model_name}, {games} games, at most {turns} turns of {tokens} tokens; last round: "
          f"{sum(len(e.replies) for e in last)} turns, {sum(e.drawn for e in last)} tokens drawn, the longest context "
          f"{context} tokens; the same episodes both ways in every round: {same}")  # fmt: skip
    H.print_against_baseline("turns", "s per batch", "reading again", [
        ("each reads its whole context again", seen[False]), ("each starts from the kept keys and values", seen[True])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "episodes")
    parser.add_argument("--plot", type=Path, default=BENCH / "episodes_game.png")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 6 steps: a smoke test")
    parser.add_argument("--cache", action="store_true", help="only the cost of playing episodes with and without the kept cache")
    args = parser.parse_args(argv)
    if args.cache:
        print(H.machine_line())
        cache_timing()
        return 0
    steps = QUICK_STEPS if args.quick else STEPS
    if args.quick:
        args.seeds = min(args.seeds, 2)
    from studies.credit.runs import run_jobs

    print(H.machine_line())
    print(H.device_report())
    print(f"# exploratory: the letter game, {len(ARMS)} arms x {len(RATES)} actor rates, seeds 0-{args.seeds - 1}, {steps} steps "
          f"of {EPISODES} episodes (at most 4 turns of 4 tokens)")  # fmt: skip
    records = run_jobs(jobs(args.seeds, steps), args.out, args.workers, threads=1, label="letter game", run=run_job, path=job_path)
    print_table(records)
    plot(records, args.plot)
    print(f"# plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
