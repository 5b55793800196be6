"""How well the critic fits its targets over a window of steps, and what to say when it does not.

A pure reading of the metrics rows (no torch): the stage logs it each step, the final table
and ``--compare`` read it back from ``metrics/ppo-<name>.jsonl``.
"""

from __future__ import annotations

import math
from typing import Iterable

FIT_WINDOW = 10  # training steps pooled by explained_variance_pooled

# EV is reported only where the targets' variance is above this: below it the ratio is
# rounding over rounding (a step whose responses all scored the same)
VARIES = 1e-12


def pooled_variances(rows: Iterable[dict]) -> tuple[float, float]:
    """(Var(target), Var(residual)) over every real token of ``rows`` (training steps' metrics)
    taken together, from each step's token count (``response_tokens``), means (``return``,
    ``value``) and variances (``return_variance``, ``residual_variance``); NaN without rows
    that carry them."""
    rows = [row for row in rows if "return_variance" in row]
    tokens = sum(row["response_tokens"] for row in rows)
    if tokens <= 0:
        return math.nan, math.nan

    def pooled(mean_of, variance_of) -> float:
        mean = sum(row["response_tokens"] * mean_of(row) for row in rows) / tokens
        second = sum(row["response_tokens"] * (variance_of(row) + mean_of(row) ** 2) for row in rows) / tokens
        return max(second - mean**2, 0.0)

    return (pooled(lambda row: row["return"], lambda row: row["return_variance"]),
            pooled(lambda row: row["return"] - row["value"], lambda row: row["residual_variance"]))  # fmt: skip


def pooled_explained_variance(rows: Iterable[dict]) -> float:
    """The critic's explained variance over every real token of ``rows`` taken together:
    1 - Var(residual) / Var(target) (:func:`pooled_variances`).

    One step's EV is noisy and blows up where its targets barely vary; pooled, each step
    weighs by its tokens, and a step whose targets barely vary adds little to either variance.
    Pooled, a critic also gets credit for following its targets' mean from step to step (and
    blame for missing it), which one step's EV, its mean removed, cannot see. NaN without rows
    that carry the figures, or where the targets do not vary."""
    target, residual = pooled_variances(rows)
    return 1.0 - residual / target if target > VARIES else float("nan")


def within_step_explained_variance(rows: Iterable[dict]) -> float:
    """The critic's explained variance within steps, pooled over ``rows``: 1 - sum_s n_s
    Var_s(residual) / sum_s n_s Var_s(target), each step's variances about its own means.

    Unlike :func:`pooled_explained_variance` it gives no credit for following the targets'
    mean from step to step: a critic that only tracks that mean (a moving-average baseline)
    scores about 0 here and well above 0 pooled; one that ranks a step's responses scores
    above 0 on both. NaN without rows that carry the figures, or where the targets do not
    vary within any step."""
    rows = [row for row in rows if "return_variance" in row]
    target = sum(row["response_tokens"] * row["return_variance"] for row in rows)
    residual = sum(row["response_tokens"] * row["residual_variance"] for row in rows)
    tokens = sum(row["response_tokens"] for row in rows)
    return 1.0 - residual / target if tokens > 0 and target / tokens > VARIES else float("nan")


# the last steps' targets "barely vary" when their spread is under this share of the whole
# run's: the policy has settled (every response scoring alike), and any critic's EV there is
# its small errors over a smaller spread, which says little about its fit
SETTLED = 0.1


def settled(window: list[dict], rows: list[dict]) -> tuple[bool, float, float]:
    """(whether the window's targets barely vary, their sd over the window, over ``rows``)."""
    here, everywhere = pooled_variances(window)[0], pooled_variances(rows)[0]
    if math.isnan(here) or math.isnan(everywhere):
        return False, here, everywhere
    return math.sqrt(here) < SETTLED * math.sqrt(everywhere), math.sqrt(here), math.sqrt(everywhere)


def last_window(rows: Iterable[dict], step: int | None = None) -> list[dict]:
    """The last :data:`FIT_WINDOW` training rows (up to ``step``, if given)."""
    train = [row for row in rows if row.get("split", "train") == "train" and (step is None or row.get("step", 0) <= step)]
    return train[-FIT_WINDOW:]


def advice(pooled: float, steps: int) -> str | None:
    """The end-of-run line when the critic explained nothing over its last ``steps`` steps
    (pooled EV <= 0); None when it did, or when its targets did not vary."""
    if math.isnan(pooled) or pooled > 0:
        return None
    return (
        f"the critic explained none of its targets' variance over the last {steps} steps (pooled explained variance "
        f"{pooled:.3g}): its values were no better than a constant. Try --critic-warmup-steps K (critic-only steps "
        "first), a critic started from a trained reward model (marlhf rm; --value-head-init reward-model), a lower "
        "--critic-lr, or a critic-free --advantage (rloo, grpo, mc)"
    )


def settled_line(pooled: float, steps: int, window_sd: float, run_sd: float) -> str:
    """The end-of-run line in place of :func:`advice` when the last steps' targets barely vary."""
    return (
        f"the critic's targets barely varied over the last {steps} steps (sd {window_sd:.2g}, against {run_sd:.2g} over the "
        f"run: the policy had settled), so its explained variance there ({pooled:.3g}) says little about its fit"
    )
