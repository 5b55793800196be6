"""Outcomes of the exploratory learning-speed benchmarks (tree_rollouts.py, token_rivals.py):
when a run first reaches the credit study's threshold, and the intervals their tables give.

A run's record is the credit study's (studies/credit/runs.py): its per-step ``score`` and
``generated_tokens``. It reaches the threshold at the first step whose trailing ``window``-step
mean score is at least ``threshold`` (studies.credit.survival.reached_step).
"""

from __future__ import annotations

import statistics

THRESHOLD, WINDOW = 0.8, 5  # the credit study's: a trailing 5-step mean score of 0.8


def reached(record: dict, threshold: float = THRESHOLD, window: int = WINDOW) -> tuple[int, float] | None:
    """(steps, generated tokens) to the threshold, or None."""
    from studies.credit.survival import reached_step

    step = reached_step(record["score"], threshold, window)
    return None if step is None else (step, float(sum(record["generated_tokens"][:step])))


def wilson(successes: int, n: int) -> tuple[float, float]:
    """The Wilson 95% interval of a share."""
    from scipy.stats import binomtest

    interval = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(interval.low), float(interval.high)


def median_interval(values: list[float]) -> tuple[float, float] | None:
    """A bootstrap 95% interval of the median (percentile, 2,000 resamples, seed 0); the value
    itself for one value or all equal, None for none."""
    if len(values) < 2 or len(set(values)) < 2:
        return None if not values else (values[0], values[0])
    import numpy as np
    from scipy.stats import bootstrap

    result = bootstrap((np.array(values),), np.median, confidence_level=0.95, method="percentile", n_resamples=2000,
                       random_state=np.random.default_rng(0))  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def ratio_interval(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """median(a) / median(b) and a bootstrap 95% interval (the two samples resampled apart)."""
    if len(a) < 2 or len(b) < 2:
        return None
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = np.array(a), np.array(b)
    draws = [np.median(rng.choice(x, len(x))) / np.median(rng.choice(y, len(y))) for _ in range(2000)]
    return float(np.median(x) / np.median(y)), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def with_interval(value, interval, spec: str) -> str:
    """'12 [9, 15]', the value alone without an interval, '-' without a value."""
    if value is None:
        return "-"
    if interval is None:
        return format(value, spec)
    return f"{format(value, spec)} [{format(interval[0], spec)}, {format(interval[1], spec)}]"


def summarise(records: list[dict], arms) -> list[dict]:
    """Per task, arm and actor rate: the runs, how many reached (Wilson interval), the median
    tokens and steps to the threshold over those that did (bootstrap intervals), the median
    tokens per step and step time, and the mean final score (the last window's mean)."""
    rows = []
    for task in dict.fromkeys(r["task"] for r in records):
        for arm in arms:
            for lr in sorted({r["lr"] for r in records if r["task"] == task and r["arm"] == arm}):
                runs = [r for r in records if r["task"] == task and r["arm"] == arm and r["lr"] == lr]
                hits = [h for h in map(reached, runs) if h is not None]
                steps, tokens = [h[0] for h in hits], [h[1] for h in hits]
                rows.append({
                    "task": task, "arm": arm, "lr": lr, "runs": len(runs), "reached": len(hits),
                    "reach_interval": wilson(len(hits), len(runs)),
                    "tokens": statistics.median(tokens) if tokens else None, "tokens_interval": median_interval(tokens),
                    "steps": statistics.median(steps) if steps else None, "steps_interval": median_interval(steps),
                    "tokens_per_step": statistics.median(statistics.mean(r["generated_tokens"]) for r in runs),
                    "step_time": statistics.median(r["step_time"] for r in runs),
                    "final_score": statistics.fmean(statistics.fmean(r["score"][-WINDOW:]) for r in runs),
                })  # fmt: skip
    return rows


def print_table(rows: list[dict]) -> None:
    print("| task | arm | actor rate | reached [95% CI] | tokens to 0.8, median [95% CI] | steps to 0.8, median [95% CI] "
          "| tokens / step | s / step | final score |")  # fmt: skip
    print("|---|---|---:|---|---|---|---:|---:|---:|")
    for r in rows:
        low, high = r["reach_interval"]
        print(f"| {r['task']} | {r['arm']} | {r['lr']:g} | {r['reached']}/{r['runs']} [{low:.2f}, {high:.2f}] "
              f"| {with_interval(r['tokens'], r['tokens_interval'], ',.0f')} | {with_interval(r['steps'], r['steps_interval'], 'g')} "
              f"| {r['tokens_per_step']:,.0f} | {r['step_time']:.2f} | {r['final_score']:.3f} |")  # fmt: skip
