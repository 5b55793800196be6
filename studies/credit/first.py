"""The credit-assignment study, first edition: does MA-PPO beat well-tuned token PPO, and the critic-free baselines?

    python -m studies.credit --edition 1 [--quick] [--workers 2] [--tasks target,pairs,prefix]
                                         [--configs ...] [--report-only]

Its design is ``first/protocol.yaml`` (the constants the runs were made with; this edition
was not pre-registered). Tasks (``tasks.py``): the tiny random-init policy, a reward in [0, 1] given once at
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

Resumable: every finished run is a small JSON file under ``first/`` (``first-quick/`` for
``--quick``; committed with the figure), skipped on a rerun. ``--quick`` runs the same code with fewer
seeds, steps and tokens (its own folder); ``--report-only`` redraws tables and plot from the
saved runs.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .protocol import PROTOCOL_FILES
from .runs import H, first_edition_job, run_jobs, saved
from .survival import reached_step, trailing_mean

PALETTE = [f"C{i}" for i in range(10)] + ["black", "gold"]  # one colour per configuration


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


@dataclass(frozen=True)
class Design:
    """The first edition's protocol file: one mode of it, the configurations and their groups."""

    mode: Mode
    folder: str
    configs: dict[str, dict]  # configuration -> its flags
    groups: dict[str, tuple[str, ...]]  # token-ppo, ma-ppo, critic-free -> their configurations
    stage: dict
    responses_per_step: int
    window: int

    @property
    def token_ppo(self) -> tuple[str, ...]:
        return self.groups["token-ppo"]

    @property
    def ma_ppo(self) -> tuple[str, ...]:
        return self.groups["ma-ppo"]

    @property
    def critic_free(self) -> tuple[str, ...]:
        return self.groups["critic-free"]


def load(mode: str = "full", path: Path = PROTOCOL_FILES[1]) -> Design:
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    settings = document["modes"][mode]
    groups: dict[str, tuple[str, ...]] = {}
    for name, spec in document["configs"].items():
        groups[spec["group"]] = (*groups.get(spec["group"], ()), name)
    return Design(
        mode=Mode(mode, steps=int(settings["steps"]), tune_steps=int(settings["tune_steps"]),
                  seeds=tuple(int(s) for s in settings["seeds"]), tune_seeds=tuple(int(s) for s in settings["tune_seeds"]),
                  lrs=tuple(float(x) for x in settings["lrs"]), tokens={t: int(n) for t, n in settings["tasks"].items()},
                  threshold=float(settings["threshold"]), longer={t: int(n) for t, n in settings.get("longer", {}).items()}),
        folder=settings["folder"], configs={name: dict(spec["flags"]) for name, spec in document["configs"].items()},
        groups=groups, stage=dict(document["stage"]), responses_per_step=int(document["responses_per_step"]),
        window=int(document["window"]),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# statistics


def steps_to(curve: list[float], threshold: float, window: int = 5) -> int | None:
    """First step (1-based) whose trailing mean reaches ``threshold``; None if none does."""
    return reached_step(curve, threshold, window)


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
# the course: tuning runs, each configuration's rate, reported runs


def jobs_for(design: Design, tasks, configs, phase: str, lr_of=None) -> list[dict]:
    mode = design.mode
    out = []
    for task in tasks:
        seeds, steps = (mode.tune_seeds, mode.tune_steps) if phase == "tune" else (mode.seeds, mode.report_steps(task))
        for config in configs:
            lrs = mode.lrs if phase == "tune" else (lr_of[task][config],)
            for lr in lrs:
                for seed in seeds:
                    out.append(first_edition_job(task, config, design.configs[config], design.stage, lr, seed, steps,
                                                 mode.tokens[task], design.responses_per_step))  # fmt: skip
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


def summarise(results: list[dict], mode: Mode, lr_of, score_of, task: str, configs, window: int = 5) -> dict[str, Summary]:
    out = {}
    for config in configs:
        runs = [r for r in results if r["task"] == task and r["config"] == config]
        reached = [steps_to(r["score"], mode.threshold, window) for r in runs]
        steps = [float(s) if s is not None else float(mode.report_steps(task)) for s in reached]
        final = [mean_of(r["score"][-window:]) for r in runs]
        out[config] = Summary(
            config=config, lr=lr_of[task][config], tuning_score=score_of[task][config], seeds=len(runs),
            reached=sum(s is not None for s in reached), steps=steps, steps_ci=bootstrap_interval(mean_of, steps),
            final=final, final_ci=bootstrap_interval(mean_of, final),
            segment_length=statistics.mean(r["segment_length"] for r in runs),
            step_time=statistics.median(r["step_time"] for r in runs), curves=[r["score"] for r in runs],
        )  # fmt: skip
    return out


def print_table(task: str, design: Design, summaries: dict[str, Summary]) -> None:
    mode, per_step = design.mode, design.responses_per_step
    print(f"\n## task {task}: {mode.tokens[task]} tokens, {mode.report_steps(task)} steps x {per_step} responses, "
          f"threshold {mode.threshold:g} of the best score, {len(mode.seeds)} reported seeds")  # fmt: skip
    print(f"{'config':<15}{'lr':>6}{'tune':>7}{'seg':>6}{'s/step':>8}{'reached':>9}"
          f"{'steps to threshold [95% CI]':>30}{'responses':>10}{'final score [95% CI]':>26}")  # fmt: skip
    for s in summaries.values():
        censored = ">=" if s.reached < s.seeds else ""
        steps = f"{censored}{mean_of(s.steps):.1f} [{s.steps_ci[0]:.1f}, {s.steps_ci[1]:.1f}]"
        final = f"{mean_of(s.final):.3f} [{s.final_ci[0]:.3f}, {s.final_ci[1]:.3f}]"
        print(f"{s.config:<15}{s.lr:>6g}{s.tuning_score:>7.3f}{s.segment_length:>6.1f}{s.step_time:>8.2f}"
              f"{f'{s.reached}/{s.seeds}':>9}{steps:>30}{mean_of(s.steps) * per_step:>10.0f}{final:>26}")  # fmt: skip


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


def plot(all_summaries: dict[str, dict[str, Summary]], design: Design, path: Path, mode: Mode | None = None) -> None:
    """Mean training-score curves with 95% t-bands per task (``mode``: the one the summaries
    were made with, when not the design's own: ``gpu_scale.py``'s pilot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    mode = mode or design.mode
    tasks = list(all_summaries)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.2), dpi=110, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        summaries = all_summaries[task]
        shown = []
        # every lambda (the horizon control), the paper's fixed 5, the best MA-PPO, the critic-free
        for name in (*design.token_ppo, "fixed5", best_of(summaries, design.ma_ppo).config, *design.critic_free):
            if name in summaries and name not in shown:
                shown.append(name)
        for name in shown:
            s = summaries[name]
            curves = [trailing_mean(c, design.window) for c in s.curves]
            xs = list(range(1, len(curves[0]) + 1))
            mean = [mean_of(col) for col in zip(*curves)]
            if len(curves) > 1:
                t = stats.t.ppf(0.975, len(curves) - 1)
                half = [t * statistics.stdev(col) / math.sqrt(len(col)) for col in zip(*curves)]
            else:
                half = [0.0] * len(mean)
            style = "--" if name in design.token_ppo else (":" if name in design.critic_free else "-")
            colour = PALETTE[list(design.configs).index(name) % len(PALETTE)]  # a configuration's colour is the same in every panel
            (line,) = ax.plot(xs, mean, style, color=colour, label=f"{name} (lr {s.lr:g})", linewidth=1.6)
            ax.fill_between(xs, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                            color=line.get_color(), alpha=0.12)  # fmt: skip
        ax.axhline(mode.threshold, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(f"task {task}, {mode.tokens[task]} tokens", fontsize=10)
        ax.set_xlabel(f"PPO step ({design.responses_per_step} responses each)")
        ax.set_ylabel("training score (trailing 5-step mean)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"credit-assignment study ({mode.name}): mean over {len(mode.seeds)} seeds, band 95% t-interval; "
                 f"dotted line: threshold", fontsize=9)  # fmt: skip
    fig.tight_layout()
    from marlhf_cli.artifacts import write_figure

    write_figure(path, fig)


def main(args) -> None:
    """The first edition's course and report: ``python -m studies.credit --edition 1``."""
    design = load("quick" if args.quick else "full")
    mode = design.mode
    tasks = list(mode.tokens) if args.tasks is None else [t.strip() for t in args.tasks.split(",")]
    configs = list(design.configs) if args.configs is None else [c.strip() for c in args.configs.split(",")]
    unknown = (set(tasks) - set(mode.tokens)) | (set(configs) - set(design.configs))
    if unknown:
        sys.exit(f"unknown task or configuration: {', '.join(sorted(unknown))}")
    if not (set(configs) & set(design.token_ppo) and set(configs) & set(design.ma_ppo)):
        sys.exit("--configs needs at least one token-PPO and one MA-PPO configuration")
    root = args.out / design.folder
    print(H.machine_line())
    print(f"# mode {mode.name}: {json.dumps(asdict(mode))}; {args.workers} worker(s) x {args.threads} thread(s)")
    started = time.perf_counter()
    if args.report_only:
        def run(jobs):  # what is saved; a task with runs missing is left out below
            return saved(root, jobs)
    else:
        def run(jobs):
            return run_jobs(jobs, root, args.workers, args.threads)

    # task by task, so that a study stopped part-way has whole tasks to show (a rerun resumes)
    lr_of, score_of, results = {}, {}, []
    done_tasks = []
    for task in tasks:
        tuning_jobs = jobs_for(design, [task], configs, "tune")
        tuning = run(tuning_jobs)
        if len(tuning) < len(tuning_jobs):
            print(f"# {task}: tuning runs missing, left out (run without --report-only to finish it)")
            continue
        tuned = tuning_scores(tuning)
        chosen = choose(tuned, [task], configs, mode.lrs)
        lr_of.update(chosen[0])
        score_of.update(chosen[1])
        print(f"# {task}: learning rate chosen on tuning seed(s) {list(mode.tune_seeds)} ({mode.tune_steps} steps): "
              + ", ".join(f"{c} {lr_of[task][c]:g}" for c in configs), flush=True)  # fmt: skip
        reported_jobs = jobs_for(design, [task], configs, "report", lr_of)
        reported = run(reported_jobs)
        if len(reported) < len(reported_jobs):
            print(f"# {task}: reported runs missing, left out (run without --report-only to finish it)")
            continue
        results += reported
        done_tasks.append(task)
    if not done_tasks:
        sys.exit("no task has all its runs yet")
    tasks = done_tasks

    all_summaries = {task: summarise(results, mode, lr_of, score_of, task, configs, design.window) for task in tasks}
    for task in tasks:
        print_table(task, design, all_summaries[task])
    figure = root / "credit_study.png"
    plot(all_summaries, design, figure)
    print(f"\n# plot: {figure}")
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")
    for task in tasks:
        summaries = all_summaries[task]
        token = best_of(summaries, design.token_ppo)
        print(settled_line(task, token))
        if set(configs) & set(design.critic_free):
            print(ratio_line(task, "best critic-free", token, best_of(summaries, design.critic_free)))
    for task in tasks:
        summaries = all_summaries[task]
        print(ratio_line(task, "best MA-PPO", best_of(summaries, design.token_ppo), best_of(summaries, design.ma_ppo)))
