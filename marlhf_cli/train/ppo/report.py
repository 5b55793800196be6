"""What ``marlhf ppo`` shows at the end, and ``marlhf ppo --compare``: tables and eval curves.

Everything here reads the metrics stream ``metrics/ppo-<name>.jsonl`` (rows with
``split`` = ``train`` or ``eval``), so runs can be compared long after they finished, and a
resumed run's table covers its whole history.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

from ... import artifacts
from ...artifacts import RunDir
from ...errors import UserError
from .critic_fit import FIT_WINDOW, advice, last_window, pooled_explained_variance, settled, settled_line


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _train_mean(rows: list[dict], key: str, last: int = 5) -> float | None:
    """Mean of the last few training steps' ``key`` (single steps are noisy)."""
    values = [row[key] for row in rows if row.get("split") == "train" and isinstance(row.get(key), (int, float))]
    tail = values[-last:]
    return sum(tail) / len(tail) if tail else None


def summary_row(name: str, rows: list[dict]) -> dict:
    evals = [row for row in rows if row.get("split") == "eval"]
    steps = max((row.get("step", 0) for row in rows), default=0)
    # the evaluation before training (step 0); with --eval-every 0 there is none
    start = next((row["score"] for row in evals if row.get("step") == 0), None)
    return {
        "run": name,
        "steps": steps,
        "eval_start": start,
        "eval_end": evals[-1]["score"] if evals else None,
        "eval_length": evals[-1].get("response_length") if evals else None,
        "train_score": _train_mean(rows, "score"),
        # k3 (never negative); runs logged before it existed show their k1 estimate
        "kl": _train_mean(rows, "kl_k3") if _train_mean(rows, "kl_k3") is not None else _train_mean(rows, "kl"),
        "segment_length": _train_mean(rows, "segment_length"),
        "seconds_per_step": _train_mean(rows, "step_time", last=10**9),
        "generated_tokens": _generated_so_far(rows, steps),
        "critic_fit": _critic_fit(rows),
    }


def _critic_fit(rows: list[dict]) -> float | None:
    """The critic's explained variance over the last steps, pooled; None without a critic
    (or for metrics written before the pooled figure existed)."""
    window = last_window(rows)
    pooled = pooled_explained_variance(window)
    return None if math.isnan(pooled) else pooled


def critic_lines(rows: list[dict]) -> list[str]:
    """What the end of a run with a critic says about its fit: its warm-up, if it had one,
    and what to try when the critic explained nothing over its last steps."""
    train = [row for row in rows if row.get("split") == "train"]
    if not any("return_variance" in row for row in train):
        return []
    lines = []
    warmup = [row for row in train if row.get("critic_warmup")]
    if warmup:
        at_end = pooled_explained_variance(last_window(train, warmup[-1]["step"]))
        lines.append(f"critic warm-up: steps 1-{warmup[-1]['step']} trained the critic alone; its explained variance "
                     f"(last {FIT_WINDOW} steps pooled) was {at_end:.3f} when the actor started")  # fmt: skip
    window = last_window(train)
    pooled = pooled_explained_variance(window)
    line = advice(pooled, len(window))
    still, window_sd, run_sd = settled(window, train)
    if line and still:  # no fault of the critic's: nothing left to explain
        line = settled_line(pooled, len(window), window_sd, run_sd)
    return lines + ([line] if line else [])


def _generated_so_far(rows: list[dict], step: int) -> float | None:
    """Tokens sampled by the training steps up to ``step`` (responses and mc's continuations;
    evaluation not counted); None for metrics written before the count existed."""
    train = [row for row in rows if row.get("split") == "train" and row.get("step", 0) <= step]
    if any("generated_tokens" not in row for row in train):
        return None
    return float(sum(row["generated_tokens"] for row in train))


def _table(title: str, summaries: Sequence[dict]):
    from rich import box
    from rich.table import Table

    # no vertical rules and two-line headers: nine columns fit 80 terminal columns whole (a long
    # run name folds onto a second line; figures never do); the critic's column only where a
    # run has a critic, whose step generates no mc continuations (its token count stays short)
    # the legend left-aligned within the table's width (centred, its wrapped lines were ragged)
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, caption_justify="left")
    critic = any(s["critic_fit"] is not None for s in summaries)
    # eval: mean held-out score before training and at the end; KL and segment length: mean
    # of the last 5 training steps
    table.add_column("run", overflow="fold", min_width=8)
    labels = ("steps", "gen\ntokens", "eval\nstart", "eval\nend", "eval\nlength", "KL", "seg\nlen", *(("critic\nEV",) if critic else ()), "s/step")
    for label in labels:
        table.add_column(label, justify="right", no_wrap=True)
    for s in summaries:
        generated = None if s["generated_tokens"] is None else f"{s['generated_tokens']:,.0f}"
        table.add_row(
            s["run"], str(s["steps"]), _fmt(generated), _fmt(s["eval_start"]), _fmt(s["eval_end"]), _fmt(s["eval_length"], 1),
            _fmt(s["kl"]), _fmt(s["segment_length"], 2), *((_fmt(s["critic_fit"], 2),) if critic else ()), _fmt(s["seconds_per_step"], 2),
        )  # fmt: skip
    table.caption = (
        "gen tokens: sampled in training (responses + mc's continuations; a tree's shared prefixes once); eval: mean held-out score; "
        "eval length: eval response tokens; KL: KL(policy || reference) per response, the k3 estimate "
        "(unbiased, never negative; metrics' kl is k1); KL, seg len: last 5 steps"
        + (f"; critic EV: the critic's explained variance over the last {FIT_WINDOW} steps pooled (1 a perfect fit, "
           "<= 0 no better than a constant)" if critic else "")
    )  # fmt: skip
    return table


def print_final_table(name: str, history: list[dict], metrics: dict) -> None:
    """The final eval table of one run (stdout)."""
    from rich.console import Console

    Console(highlight=False).print(_table(f"ppo '{name}': final evaluation", [summary_row(name, history)]))


_DERIVED_NAME = re.compile(
    r"(?:(?P<mc>mc-)|(?P<tree>tree-))?(?P<rule>vanilla|fixed(?P<n>\d+|-inf)|randomized|ppl|parsing|code|turn|rloo|grpo)"
    r"(?:-(?P<value>unit|position|first))?(?:-m(?P<m>\d+))?(?:-b(?P<b>\d+))?(?:-d(?P<d>\d+))?(?P<macro>-macro-ratio)?"
    r"(?:-k(?P<k>\d+))?"
)


def options_for(name: str) -> str | None:
    """The flags whose run 'marlhf ppo' names ``name`` by itself (the inverse of
    ppo.run_name: 'vanilla' -> '--termination fixed --n 1'), or None for a custom name."""
    match = _DERIVED_NAME.fullmatch(name)
    if match is None:
        return None
    rule, sampled = match["rule"], match["mc"] or match["tree"]
    if sampled and (rule in ("vanilla", "rloo", "grpo") or match["value"]):
        return None  # not a name run_name makes
    misplaced = (match["m"] and not match["mc"]) or (match["b"] and not sampled) or (match["d"] and not match["tree"])
    if misplaced or (match["tree"] and match["k"]):
        return None  # -m is mc's, -b mc's or tree's, -d tree's; a tree's group size is K^D
    flags = ["--advantage mc"] if match["mc"] else ["--advantage tree"] if match["tree"] else []
    if rule in ("rloo", "grpo"):
        flags.append(f"--advantage {rule}")
    elif rule == "vanilla":
        flags.append("--termination fixed --n 1")
    elif match["n"]:
        flags.append(f"--termination fixed --n {'inf' if match['n'] == '-inf' else match['n']}")
    else:
        flags.append(f"--termination {rule}")
    if match["m"]:
        flags.append(f"--mc-rollouts {match['m']}")
    if match["b"]:
        flags.append(f"--tree-branches {match['b']}" if match["tree"] else f"--mc-max-boundaries {match['b']}")
    if match["d"]:
        flags.append(f"--tree-depth {match['d']}")
    if match["value"]:
        flags.append(f"--value-function {match['value']}")
    if match["macro"]:
        flags.append("--ratio macro")
    if match["k"]:
        flags.append(f"--samples-per-prompt {match['k']}")
    return " ".join(flags)


def read_run(run_dir: RunDir, name: str) -> list[dict]:
    path = run_dir.metrics_path(f"ppo-{name}")
    if not path.is_file():
        flags = options_for(name)
        command = (
            f"'marlhf ppo {flags} --run-dir {run_dir.root}'" if flags
            else f"'marlhf ppo --name {name} --run-dir {run_dir.root}' with that run's options"
        )  # fmt: skip
        raise UserError(f"{path} is missing: run {command} first")
    return artifacts.read_jsonl(path)


def _x(rows: list[dict], row: dict, x_axis: str) -> float:
    return row["step"] if x_axis == "step" else _generated_so_far(rows, row["step"])


def plot_eval_curves(runs: dict[str, list[dict]], path: Path, metric: str = "score", x_axis: str = "step") -> Path:
    """Eval ``metric`` against the step or the generated tokens so far (``x_axis``: step or
    tokens), one line per run, on one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, rows in runs.items():
        points = [(_x(rows, r, x_axis), r[metric]) for r in rows if r.get("split") == "eval" and isinstance(r.get(metric), (int, float))]
        if not points:  # a run without evaluation: its training curve, dashed
            points = [(_x(rows, r, x_axis), r[metric]) for r in rows if r.get("split") == "train" and isinstance(r.get(metric), (int, float))]
            style = "--"
        else:
            style = "o-"
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, style, label=name, markersize=4)
    ax.set_xlabel("PPO step" if x_axis == "step" else "generated tokens (responses + continuations)")
    ax.set_ylabel(f"held-out {metric}")
    ax.set_title(f"eval {metric}: " + ", ".join(runs))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    return artifacts.write_figure(path, fig)


def compare(run_dir: str | Path, names: Sequence[str], metric: str = "score", x_axis: str = "step") -> Path:
    """``marlhf ppo --compare A B ...``: one figure of eval curves and one table."""
    from rich.console import Console

    if not names:
        raise UserError("--compare needs at least one run name")
    run = RunDir(run_dir)
    runs = {name: read_run(run, name) for name in names}
    if x_axis == "tokens":
        uncounted = [name for name, rows in runs.items() if summary_row(name, rows)["generated_tokens"] is None]
        if uncounted:
            raise UserError(
                f"--x-axis tokens: the metrics of {', '.join(uncounted)} have no generated-token counts "
                "(written before they were logged); use --x-axis step"
            )
    suffix = "" if x_axis == "step" else "-tokens"
    path = plot_eval_curves(runs, run.plot_path("ppo-compare-" + "-".join(names) + suffix), metric, x_axis)
    Console(highlight=False).print(_table("ppo runs", [summary_row(n, rows) for n, rows in runs.items()]))
    Console(stderr=True, highlight=False).print(f"wrote {path}")
    return path


def compare_command(run_dir: str | Path, names: Sequence[str], flag: bool, x_axis: str | None = None) -> Path:
    """Checks of the command line's shape, then :func:`compare`."""
    if not flag:
        raise UserError(f"unexpected argument{'s' if len(names) > 1 else ''} {' '.join(names)}: run names go with --compare")
    return compare(run_dir, names, x_axis=x_axis or "step")
