"""Tuning on unreported seeds: each arm's learning rate, each family's best arm, the calibration check.

Pure functions over run records, so that the rules the protocol states are the rules tested:

* an arm's tuning score at a rate is its mean training score over the whole run, averaged
  over the tuning seeds (the area under its learning curve: it rewards reaching the
  threshold and reaching it early);
* its rate is the one with the highest tuning score; exact ties (within the protocol's
  tolerance) go to the lower rate; a choice on an edge of the grid extends the grid by the
  next rate beyond it, until every choice is interior or the extension limit is reached;
* a family's best arm is its arm with the highest tuning score at the chosen rate (exact
  ties: the arm listed first in the protocol); the same rule for every family;
* a budget passes calibration when the best arm of all reaches the threshold on at least
  the protocol's share of its tuning runs at its chosen rate.

Near ties are reported, not broken differently: the runner-up lies within one standard error
(over tuning seeds) of the winner.

The third edition picks by reach instead of score (mean score rewarded standing still in the
second): an arm's rate is the one at which most tuning runs reach the threshold, ties to the
lower rate; a family's best arm the one whose chosen rate reaches most often, ties to the
lower rate, then the earlier arm. Its runs are budgeted in generated tokens and run at a
constant learning rate, so a run of a smaller budget is the longer run cut (:func:`cut`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .survival import reached_step


def run_score(record: dict) -> float:
    return statistics.fmean(record["score"])


def scores_by_rate(records: list[dict]) -> dict[str, dict[float, list[float]]]:
    """arm -> rate -> per-seed run scores."""
    table: dict = {}
    for r in records:
        table.setdefault(r["arm"], {}).setdefault(r["lr"], []).append(run_score(r))
    return table


def standard_error(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.inf


@dataclass
class Choice:
    """The winner of one pick (a rate for an arm, or an arm for a family) and how close it was."""

    winner: object
    score: float
    runner_up: object | None = None
    margin: float = math.inf  # winner's score - runner-up's
    exact_tie: bool = False  # broken by the stated order
    near_tie: bool = False  # margin within one standard error of the winner's score
    scores: dict = field(default_factory=dict)


def pick(candidates: list, per_seed: dict, tolerance: float) -> Choice:
    """The candidate with the highest mean of ``per_seed[candidate]``; exact ties go to the
    earliest candidate in ``candidates`` (the caller orders them: lower rate, earlier arm)."""
    means = {c: statistics.fmean(per_seed[c]) for c in candidates}
    top = max(means.values())
    winner = next(c for c in candidates if means[c] >= top - tolerance)
    others = [c for c in candidates if c != winner]
    choice = Choice(winner, means[winner], scores=means)
    if others:
        runner_up = max(others, key=lambda c: means[c])
        choice.runner_up, choice.margin = runner_up, means[winner] - means[runner_up]
        choice.exact_tie = abs(choice.margin) <= tolerance
        choice.near_tie = choice.margin <= standard_error(per_seed[winner])
    return choice


def extend(grid: list[float], chosen: float, base: tuple[float, ...], factor: float, limit: int) -> tuple[list[float], str | None]:
    """The grid after one extension step for a choice of ``chosen`` (unchanged when interior),
    and what stopped an extension the rule asked for (None if nothing did)."""
    grid = sorted(grid)
    below = sum(lr < min(base) for lr in grid)
    above = sum(lr > max(base) for lr in grid)
    if chosen == grid[0]:
        if below >= limit:
            return grid, f"rate {chosen:g} is the lowest after {limit} extension(s) below the grid"
        return [round(grid[0] / factor, 10), *grid], None
    if chosen == grid[-1]:
        if above >= limit:
            return grid, f"rate {chosen:g} is the highest after {limit} extension(s) above the grid"
        return [*grid, round(grid[-1] * factor, 10)], None
    return grid, None


def choose_rate(per_rate: dict[float, list[float]], tolerance: float) -> Choice:
    return pick(sorted(per_rate), per_rate, tolerance)  # ascending: an exact tie goes to the lower rate


def family_best(arms_in_order: tuple[str, ...], rate_choice: dict[str, Choice], per_rate: dict, tolerance: float) -> Choice:
    """The family's arm with the highest tuning score at its chosen rate."""
    per_seed = {arm: per_rate[arm][rate_choice[arm].winner] for arm in arms_in_order}
    return pick(list(arms_in_order), per_seed, tolerance)


def cut(record: dict, budget: float) -> dict:
    """The run of a smaller token budget: the steps whose cumulative generated tokens fit in
    ``budget``. Exact at a constant learning rate (a run's steps do not depend on its length:
    prompts and draws are seeded per step), the third edition's setting."""
    total, steps = 0.0, 0
    for tokens in record["generated_tokens"]:
        if total + tokens > budget:
            break
        total, steps = total + tokens, steps + 1
    per_step = ("score", "responses", "generated_tokens", "explained_variance")
    return record | {key: record[key][:steps] for key in per_step if key in record} | {"budget": int(budget)}


def reached(record: dict, threshold: float, window: int) -> float:
    """1.0 when the run's trailing mean reached the threshold, else 0.0 (a per-seed 'score' for :func:`pick`)."""
    return float(reached_step(record["score"], threshold, window) is not None)


def reach_by_rate(records: list[dict], threshold: float, window: int) -> dict[str, dict[float, list[float]]]:
    """arm -> rate -> per-seed reach (1.0 or 0.0)."""
    table: dict = {}
    for r in records:
        table.setdefault(r["arm"], {}).setdefault(r["lr"], []).append(reached(r, threshold, window))
    return table


def edge_leads(grid: list[float], chosen: float, per_rate: dict[float, list[float]], tolerance: float) -> bool:
    """Whether ``chosen`` is on an edge of ``grid`` and beats its neighbour there by more than
    ``tolerance`` (third edition: only then does the grid extend past it)."""
    grid = sorted(grid)
    if len(grid) < 2 or chosen not in (grid[0], grid[-1]):
        return False
    neighbour = grid[1] if chosen == grid[0] else grid[-2]
    return statistics.fmean(per_rate[chosen]) > statistics.fmean(per_rate[neighbour]) + tolerance


def best_by_reach(arms_in_order: tuple[str, ...], rate_choice: dict[str, Choice], per_rate: dict, tolerance: float) -> Choice:
    """The arm whose chosen rate reaches most often; ties to the lower rate, then the earlier arm."""
    order = sorted(arms_in_order, key=lambda arm: (rate_choice[arm].winner, arms_in_order.index(arm)))
    return pick(order, {arm: per_rate[arm][rate_choice[arm].winner] for arm in arms_in_order}, tolerance)


def reach_count(records: list[dict], arm: str, lr: float, threshold: float, window: int) -> tuple[int, int]:
    """(runs of ``arm`` at ``lr`` that reached the threshold, runs)."""
    runs = [r for r in records if r["arm"] == arm and r["lr"] == lr]
    return sum(reached_step(r["score"], threshold, window) is not None for r in runs), len(runs)
