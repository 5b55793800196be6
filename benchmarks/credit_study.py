"""The credit-assignment study: does MA-PPO beat well-tuned token PPO, and the critic-free baselines?

    python benchmarks/credit_study.py [--quick] [--workers 2] [--tasks target,pairs,prefix]
                                      [--configs ...] [--report-only]

Tasks (``_credit_tasks.py``): the tiny random-init policy, a reward in [0, 1] given once at
the last token, about 0.1 for a random policy and 1.0 at best: ``target`` (every token
counts, 64 tokens), ``pairs`` (2-token units score, 32 tokens), ``prefix`` (only the first 4
of 32 tokens count). The parsing rule is left out: a random-init policy writes no text that
a parser could mean anything on.

Configurations, each through the stage's own ``ppo.run`` with everything else equal (8
responses per step, one PPO epoch, temperature 1, no top-k, no KL penalty: there is no
reference to stay near): token PPO (fixed n=1) at GAE lambda 0.95 (the paper's), 0.99 and
1.0; MA-PPO at lambda 0.95 with fixed 5, fixed 10 and n=inf, each with the segment value
``equal`` (the paper's) and ``first``; ppl; RLOO and GRPO with K=4 responses to each of 2
prompts (the same 8 responses per step).

Fair tuning: every configuration runs every learning rate of the grid (actor = critic rate)
on tuning seeds that are never reported (full mode: two seeds x 15 steps), and keeps the
rate with the highest mean training score over the tuning runs; the best token-PPO and the
best MA-PPO configuration are picked the same way, on tuning data, so picking among more
candidates cannot flatter the reported seeds. Then each configuration runs the reported seeds at its rate (full mode: 5 seeds x
30 steps, 60 on ``prefix``). The last lines say whether the best token-PPO configuration had
settled by the end of its runs (how far a run's trailing mean still moved over its last 10
steps): a study whose baseline is still learning would flatter whatever beats it early.

Reported per task: steps (and responses generated) until the trailing 5-step mean training
score first reaches the threshold, a stated fraction of the best achievable score (0.8 of
1.0; runs that never reach it count as the run's length and are marked), the final score
(mean of the last 5 steps), each with a 95% bootstrap interval over seeds (percentile,
scipy), and a Figure-2-style plot with 95% t-interval bands. The last lines give, per task,
steps(best token PPO) / steps(best MA-PPO) with its bootstrap interval: above 1, MA-PPO
needs fewer steps.

Resumable: every finished run is a small JSON file under ``benchmarks/credit_study/<mode>/``
(committed with the figures), skipped on a rerun. ``--quick`` runs the same code with fewer
seeds, steps and tokens (its own folder); ``--report-only`` redraws tables and plot from the
saved runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402
from _credit_tasks import TASKS  # noqa: E402

FIRST_EDITION_TASKS = ("target", "pairs", "prefix")  # `units` is the second edition's (credit_study2.py)

RESPONSES_PER_STEP = 8
WINDOW = 5
CONFIGS = {
    "ppo-lam0.95": dict(termination="fixed", n=1, lam=0.95),
    "ppo-lam0.99": dict(termination="fixed", n=1, lam=0.99),
    "ppo-lam1.0": dict(termination="fixed", n=1, lam=1.0),
    "fixed5": dict(termination="fixed", n=5),
    "fixed5-first": dict(termination="fixed", n=5, value_function="first"),
    "fixed10": dict(termination="fixed", n=10),
    "fixed10-first": dict(termination="fixed", n=10, value_function="first"),
    "inf": dict(termination="fixed", n=math.inf),
    "inf-first": dict(termination="fixed", n=math.inf, value_function="first"),
    "ppl": dict(termination="ppl"),
    "rloo": dict(advantage="rloo", samples_per_prompt=4),
    "grpo": dict(advantage="grpo", samples_per_prompt=4),
}
PALETTE = [f"C{i}" for i in range(10)] + ["black", "gold"]  # one colour per configuration
TOKEN_PPO = ("ppo-lam0.95", "ppo-lam0.99", "ppo-lam1.0")
MA_PPO = ("fixed5", "fixed5-first", "fixed10", "fixed10-first", "inf", "inf-first", "ppl")
CRITIC_FREE = ("rloo", "grpo")


@dataclass
class Mode:
    name: str
    steps: int  # reported runs
    tune_steps: int
    seeds: tuple[int, ...]  # reported
    tune_seeds: tuple[int, ...]
    lrs: tuple[float, ...]
    tokens: dict[str, int] = field(default_factory=dict)
    threshold: float = 0.8  # fraction of the best achievable score (1.0 on every task)
    longer: dict[str, int] = field(default_factory=dict)  # reported steps of tasks that need more

    def report_steps(self, task: str) -> int:
        return self.longer.get(task, self.steps)


# two tuning seeds: a single tuning run is bimodal (it collapses to ~0 or learns to ~1 within
# 15 steps), so one seed picks rates on a coin flip
FULL = Mode("full", steps=30, tune_steps=15, seeds=(0, 1, 2, 3, 4), tune_seeds=(1000, 1001), lrs=(0.03, 0.06, 0.12),
            tokens={"target": 64, "pairs": 32, "prefix": 32},
            # at 30 steps the best token-PPO configuration on prefix was still moving (one run's
            # trailing mean rose 0.26 over its last 10 steps): its runs are twice as long
            longer={"prefix": 60})  # fmt: skip
# a smoke test of the same code path with a preview of the result: short runs rarely get far
QUICK = Mode("quick", steps=10, tune_steps=6, seeds=(0, 1), tune_seeds=(1000,), lrs=(0.03, 0.06, 0.12),
             tokens={"target": 8, "pairs": 8, "prefix": 8}, threshold=0.5)  # fmt: skip


# ---------------------------------------------------------------------------------------
# one run (in a worker process)


def _init_worker(threads: int, log: str) -> None:
    """One torch thread per run; the stage's own console output goes to the log, not the
    study's terminal (the study shows one progress bar)."""
    import os

    import torch

    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(threads)
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)


@functools.lru_cache(maxsize=None)
def _reward(task: str, model: str = "tiny"):
    from _credit_tasks import TaskReward

    return TaskReward(task, model)


@functools.lru_cache(maxsize=1)
def _prompts() -> str:
    return str(H.write_prompts(Path(tempfile.mkdtemp(prefix="marlhf-credit-prompts-")) / "prompts.jsonl"))


def run_job(job: dict) -> dict:
    """Train one (task, configuration, learning rate, seed) with the stage; its score curve."""
    from marlhf_cli.train import ppo

    setup = dict(CONFIGS[job["config"]])
    group = setup.get("samples_per_prompt", 1)
    model = job.get("model", "tiny")  # gpu/credit_scale.py: a larger random-init shape, in bf16
    if "dtype" in job:
        setup["dtype"] = job["dtype"]
    work = Path(tempfile.mkdtemp(prefix="marlhf-credit-run-"))
    try:
        config = H.ppo_config(
            work, name="run", policy=model, reward_model=model, dataset=_prompts(), **setup,
            rollout_batch_size=RESPONSES_PER_STEP // group, mini_batch_size=RESPONSES_PER_STEP,
            max_new_tokens=job["tokens"], max_prompt_length=16, temperature=1.0, top_k=0, kl_coef=0.0,
            actor_lr=job["lr"], critic_lr=job["lr"], max_steps=job["steps"], eval_every=0, eval_prompts=0,
            save_every=0, seed=job["seed"],
        )  # fmt: skip
        started = time.perf_counter()
        ppo.run(config, reward_fn=_reward(job["task"], model))
        rows = H.train_rows(work, "run")
    finally:
        shutil.rmtree(work, ignore_errors=True)  # models of a tiny run are ~13 MB each
    return {
        **job,
        "score": [row["score"] for row in rows],
        "responses": [row["responses"] for row in rows],
        # rloo and grpo log none (one advantage per response): a response is their one segment
        "segment_length": statistics.mean(row.get("segment_length", row["response_length"]) for row in rows),
        "step_time": statistics.median(row["step_time"] for row in rows),
        "seconds": time.perf_counter() - started,
    }


def job_path(root: Path, job: dict) -> Path:
    return root / job["task"] / f"{job['config']}-lr{job['lr']:g}-s{job['seed']}-{job['steps']}steps.json"


def run_jobs(jobs: list[dict], root: Path, workers: int, threads: int, run=run_job, path_of=job_path,
             label: str = "runs", start_first=None) -> list[dict]:  # fmt: skip
    """Run the jobs not already saved under ``root`` (``run(job)`` in ``workers`` processes,
    each result saved at ``path_of(root, result)``); return every job's result, in the jobs'
    order whatever order they ran in. ``start_first(job)`` true: the job is started before the
    others (the longest ones, so no worker waits long at the end). The second edition
    (credit2/runs.py) passes its own ``run``, ``path_of`` and ``start_first``."""
    todo = [job for job in jobs if not path_of(root, job).is_file()]
    if start_first is not None:
        todo.sort(key=lambda job: not start_first(job))  # stable: the rest keep their order
    if todo:
        from rich.progress import Progress

        from marlhf_cli.artifacts import write_json

        print(f"# {label}: {len(todo)} of {len(jobs)} runs to do ({len(jobs) - len(todo)} saved)", flush=True)
        spawn = multiprocessing.get_context("spawn")
        root.mkdir(parents=True, exist_ok=True)
        log = str(root / "runs.log")  # not committed: .gitignore
        with ProcessPoolExecutor(max_workers=workers, mp_context=spawn, initializer=_init_worker, initargs=(threads, log)) as pool:
            futures = {pool.submit(run, job): job for job in todo}
            with Progress(transient=False) as progress:
                bar = progress.add_task(label, total=len(todo))
                for future in as_completed(futures):
                    result = future.result()
                    path = path_of(root, result)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_json(path, result)
                    progress.advance(bar)
    return [json.loads(path_of(root, job).read_text()) for job in jobs]


# ---------------------------------------------------------------------------------------
# statistics


def trailing_mean(values: list[float], window: int = WINDOW) -> list[float]:
    return [statistics.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def steps_to(curve: list[float], threshold: float) -> int | None:
    """First step (1-based) whose trailing mean reaches ``threshold``; None if none does."""
    for index, value in enumerate(trailing_mean(curve)):
        if value >= threshold:
            return index + 1
    return None


def bootstrap_interval(statistic, *samples) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``statistic(*samples)`` over independent resamples."""
    import numpy as np
    from scipy import stats

    arrays = [np.asarray(s, dtype=float) for s in samples]
    if all(np.ptp(a) == 0 for a in arrays):  # no spread to resample
        value = float(statistic(*arrays))
        return value, value
    result = stats.bootstrap(arrays, statistic, vectorized=False, paired=False, n_resamples=2000,
                             confidence_level=0.95, method="percentile", random_state=0)  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def mean_of(values) -> float:
    return float(sum(values) / len(values))


# ---------------------------------------------------------------------------------------
# the study


def jobs_for(mode: Mode, tasks, configs, phase: str, lr_of=None) -> list[dict]:
    out = []
    for task in tasks:
        seeds, steps = (mode.tune_seeds, mode.tune_steps) if phase == "tune" else (mode.seeds, mode.report_steps(task))
        for config in configs:
            lrs = mode.lrs if phase == "tune" else (lr_of[task][config],)
            for lr in lrs:
                for seed in seeds:
                    out.append({"task": task, "config": config, "lr": lr, "seed": seed, "steps": steps,
                                "tokens": mode.tokens[task]})  # fmt: skip
    return out


def tuning_scores(results: list[dict]) -> dict:
    """(task, config, lr) -> mean training score over the tuning run(s)."""
    table: dict = {}
    for r in results:
        table.setdefault((r["task"], r["config"], r["lr"]), []).append(mean_of(r["score"]))
    return {key: mean_of(values) for key, values in table.items()}


def choose(tuned: dict, tasks, configs, lrs) -> tuple[dict, dict]:
    """Per task: each configuration's learning rate, and its tuning score at that rate."""
    lr_of, score_of = {}, {}
    for task in tasks:
        lr_of[task], score_of[task] = {}, {}
        for config in configs:
            best = max(lrs, key=lambda lr: tuned[(task, config, lr)])
            lr_of[task][config], score_of[task][config] = best, tuned[(task, config, best)]
    return lr_of, score_of


@dataclass
class Summary:
    config: str
    lr: float
    tuning_score: float
    seeds: int
    reached: int
    steps: list[float]  # per seed; unreached runs count as the run's length
    steps_ci: tuple[float, float]
    final: list[float]
    final_ci: tuple[float, float]
    segment_length: float
    step_time: float
    curves: list[list[float]]


def summarise(results: list[dict], mode: Mode, lr_of, score_of, task: str, configs) -> dict[str, Summary]:
    out = {}
    for config in configs:
        runs = [r for r in results if r["task"] == task and r["config"] == config]
        reached = [steps_to(r["score"], mode.threshold) for r in runs]
        steps = [float(s) if s is not None else float(mode.report_steps(task)) for s in reached]
        final = [mean_of(r["score"][-WINDOW:]) for r in runs]
        out[config] = Summary(
            config=config, lr=lr_of[task][config], tuning_score=score_of[task][config], seeds=len(runs),
            reached=sum(s is not None for s in reached), steps=steps, steps_ci=bootstrap_interval(mean_of, steps),
            final=final, final_ci=bootstrap_interval(mean_of, final),
            segment_length=statistics.mean(r["segment_length"] for r in runs),
            step_time=statistics.median(r["step_time"] for r in runs), curves=[r["score"] for r in runs],
        )  # fmt: skip
    return out


def print_table(task: str, mode: Mode, summaries: dict[str, Summary]) -> None:
    print(f"\n## task {task}: {mode.tokens[task]} tokens, {mode.report_steps(task)} steps x {RESPONSES_PER_STEP} responses, "
          f"threshold {mode.threshold:g} of the best score, {len(mode.seeds)} reported seeds")  # fmt: skip
    print(f"{'config':<15}{'lr':>6}{'tune':>7}{'seg':>6}{'s/step':>8}{'reached':>9}"
          f"{'steps to threshold [95% CI]':>30}{'responses':>10}{'final score [95% CI]':>26}")  # fmt: skip
    for s in summaries.values():
        censored = ">=" if s.reached < s.seeds else ""
        steps = f"{censored}{mean_of(s.steps):.1f} [{s.steps_ci[0]:.1f}, {s.steps_ci[1]:.1f}]"
        final = f"{mean_of(s.final):.3f} [{s.final_ci[0]:.3f}, {s.final_ci[1]:.3f}]"
        print(f"{s.config:<15}{s.lr:>6g}{s.tuning_score:>7.3f}{s.segment_length:>6.1f}{s.step_time:>8.2f}"
              f"{f'{s.reached}/{s.seeds}':>9}{steps:>30}{mean_of(s.steps) * RESPONSES_PER_STEP:>10.0f}{final:>26}")  # fmt: skip


def best_of(summaries: dict[str, Summary], group) -> Summary:
    """The configuration of ``group`` with the best tuning score (picked on tuning seeds)."""
    return max((summaries[c] for c in group if c in summaries), key=lambda s: s.tuning_score)


def settled_line(task: str, token: Summary, last: int = 10) -> str:
    """Whether the best token-PPO configuration has converged: how far each reported run's
    trailing mean still moved over its last ``last`` steps."""
    moved = [max(c) - min(c) for c in (trailing_mean(curve)[-last:] for curve in token.curves)]
    verdict = "settled" if max(moved) < 0.05 else "still moving"
    return (f"# {task}: best token PPO ({token.config}), largest change of a run's trailing mean over its last "
            f"{last} steps: {max(moved):.3f} ({verdict})")  # fmt: skip


def ratio_line(task: str, label: str, baseline: Summary, other: Summary) -> str:
    ratio = mean_of(baseline.steps) / mean_of(other.steps)
    low, high = bootstrap_interval(lambda a, b: mean_of(a) / mean_of(b), baseline.steps, other.steps)
    note = "" if baseline.reached == baseline.seeds and other.reached == other.seeds else " (unreached runs counted at the run's length)"
    return (f"{task}: steps to threshold, best token PPO ({baseline.config}) / {label} ({other.config}) = "
            f"{ratio:.2f}x [95% CI {low:.2f}, {high:.2f}]{note}")  # fmt: skip


def plot(all_summaries: dict[str, dict[str, Summary]], mode: Mode, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    tasks = list(all_summaries)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.2), dpi=110, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        summaries = all_summaries[task]
        shown = []
        # every lambda (the horizon control), the paper's fixed 5, the best MA-PPO, the critic-free
        for name in (*TOKEN_PPO, "fixed5", best_of(summaries, MA_PPO).config, *CRITIC_FREE):
            if name in summaries and name not in shown:
                shown.append(name)
        for name in shown:
            s = summaries[name]
            curves = [trailing_mean(c) for c in s.curves]
            xs = list(range(1, len(curves[0]) + 1))
            mean = [mean_of(col) for col in zip(*curves)]
            if len(curves) > 1:
                t = stats.t.ppf(0.975, len(curves) - 1)
                half = [t * statistics.stdev(col) / math.sqrt(len(col)) for col in zip(*curves)]
            else:
                half = [0.0] * len(mean)
            style = "--" if name in TOKEN_PPO else (":" if name in CRITIC_FREE else "-")
            colour = PALETTE[list(CONFIGS).index(name) % len(PALETTE)]  # a configuration's colour is the same in every panel
            (line,) = ax.plot(xs, mean, style, color=colour, label=f"{name} (lr {s.lr:g})", linewidth=1.6)
            ax.fill_between(xs, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                            color=line.get_color(), alpha=0.12)  # fmt: skip
        ax.axhline(mode.threshold, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(f"task {task}, {mode.tokens[task]} tokens", fontsize=10)
        ax.set_xlabel(f"PPO step ({RESPONSES_PER_STEP} responses each)")
        ax.set_ylabel("training score (trailing 5-step mean)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"credit-assignment study ({mode.name}): mean over {len(mode.seeds)} seeds, band 95% t-interval; "
                 f"dotted line: threshold", fontsize=9)  # fmt: skip
    fig.tight_layout()
    from marlhf_cli.artifacts import write_figure

    write_figure(path, fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer seeds, steps and tokens (~15 min on a quiet 2-core CPU)")
    parser.add_argument("--tasks", default=",".join(FIRST_EDITION_TASKS), help="comma-separated, from " + ", ".join(TASKS))
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from " + ", ".join(CONFIGS))
    parser.add_argument("--workers", type=int, default=2, help="runs side by side, one process each")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--out", type=Path, default=H.BENCH_DIR / "credit_study", help="saved runs and figures")
    parser.add_argument("--report-only", action="store_true", help="tables and plot from the saved runs; train nothing")
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    tasks = [t.strip() for t in args.tasks.split(",")]
    configs = [c.strip() for c in args.configs.split(",")]
    unknown = (set(tasks) - set(TASKS)) | (set(configs) - set(CONFIGS))
    if unknown:
        sys.exit(f"unknown task or configuration: {', '.join(sorted(unknown))}")
    if not (set(configs) & set(TOKEN_PPO) and set(configs) & set(MA_PPO)):
        sys.exit("--configs needs at least one token-PPO and one MA-PPO configuration")
    root = args.out / mode.name
    print(H.machine_line())
    print(f"# mode {mode.name}: {json.dumps(asdict(mode))}; {args.workers} worker(s) x {args.threads} thread(s)")
    started = time.perf_counter()
    if args.report_only:
        def run(jobs):  # what is saved; a task with runs missing is left out below
            return [json.loads(job_path(root, j).read_text()) for j in jobs if job_path(root, j).is_file()]
    else:
        def run(jobs):
            return run_jobs(jobs, root, args.workers, args.threads)

    # task by task, so that a study stopped part-way has whole tasks to show (a rerun resumes)
    lr_of, score_of, results = {}, {}, []
    done_tasks = []
    for task in tasks:
        tuning = run(jobs_for(mode, [task], configs, "tune"))
        if len(tuning) < len(jobs_for(mode, [task], configs, "tune")):
            print(f"# {task}: tuning runs missing, left out (run without --report-only to finish it)")
            continue
        tuned = tuning_scores(tuning)
        chosen = choose(tuned, [task], configs, mode.lrs)
        lr_of.update(chosen[0])
        score_of.update(chosen[1])
        print(f"# {task}: learning rate chosen on tuning seed(s) {list(mode.tune_seeds)} ({mode.tune_steps} steps): "
              + ", ".join(f"{c} {lr_of[task][c]:g}" for c in configs), flush=True)  # fmt: skip
        reported = run(jobs_for(mode, [task], configs, "report", lr_of))
        if len(reported) < len(jobs_for(mode, [task], configs, "report", lr_of)):
            print(f"# {task}: reported runs missing, left out (run without --report-only to finish it)")
            continue
        results += reported
        done_tasks.append(task)
    if not done_tasks:
        sys.exit("no task has all its runs yet")
    tasks = done_tasks

    all_summaries = {task: summarise(results, mode, lr_of, score_of, task, configs) for task in tasks}
    for task in tasks:
        print_table(task, mode, all_summaries[task])
    figure = root / "credit_study.png"
    plot(all_summaries, mode, figure)
    print(f"\n# plot: {figure}")
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")
    for task in tasks:
        summaries = all_summaries[task]
        token = best_of(summaries, TOKEN_PPO)
        print(settled_line(task, token))
        if set(configs) & set(CRITIC_FREE):
            print(ratio_line(task, "best critic-free", token, best_of(summaries, CRITIC_FREE)))
    for task in tasks:
        summaries = all_summaries[task]
        print(ratio_line(task, "best MA-PPO", best_of(summaries, TOKEN_PPO), best_of(summaries, MA_PPO)))


if __name__ == "__main__":
    main()
