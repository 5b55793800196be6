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


def pooled_explained_variance(rows: Iterable[dict]) -> float:
    """The critic's explained variance over every real token of ``rows`` (training steps'
    metrics) taken together: 1 - Var(residual) / Var(target), each variance over the union of
    the steps' tokens, from each step's token count (``response_tokens``), means (``return``,
    ``value``) and variances (``return_variance``, ``residual_variance``).

    One step's EV is noisy and blows up where its targets barely vary; pooled, each step
    weighs by its tokens, and a step whose targets barely vary adds little to either variance.
    NaN without rows that carry the figures, or where the targets do not vary."""
    rows = [row for row in rows if "return_variance" in row]
    tokens = sum(row["response_tokens"] for row in rows)
    if tokens <= 0:
        return float("nan")

    def pooled(mean_of, variance_of) -> float:
        mean = sum(row["response_tokens"] * mean_of(row) for row in rows) / tokens
        second = sum(row["response_tokens"] * (variance_of(row) + mean_of(row) ** 2) for row in rows) / tokens
        return max(second - mean**2, 0.0)

    target = pooled(lambda row: row["return"], lambda row: row["return_variance"])
    residual = pooled(lambda row: row["return"] - row["value"], lambda row: row["residual_variance"])
    return 1.0 - residual / target if target > VARIES else float("nan")


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
