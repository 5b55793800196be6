"""From a task's reported runs to per-arm figures and the decided comparisons.

Per arm and cost axis: the reach rate with its exact interval, the Kaplan-Meier curve, the
restricted mean cost to threshold with a bootstrap interval. Per decided comparison (family
best A against family best B): the log-rank test on every axis, the ratio of restricted means
with a bootstrap interval (above 1: A needs less), and the comparison's power. Then the
decision rule across tasks (Holm over the tasks of one comparison) and its sentence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import power as P
from . import survival as S
from .protocol import AXES, Protocol
from .study import TaskPlan


@dataclass
class ArmResult:
    arm: str
    family: str
    lr: float
    records: list[dict]
    outcomes: dict[str, S.Outcomes]  # axis -> outcomes
    reach_ci: tuple[float, float]
    restricted: dict[str, tuple[float, float, float]]  # axis -> (mean, low, high)
    final: float  # mean over runs of the last window's mean score

    @property
    def runs(self) -> int:
        return len(self.records)

    @property
    def reached(self) -> int:
        return self.outcomes["steps"].reached


@dataclass
class ComparisonResult:
    task: str
    name: str
    a: ArmResult
    b: ArmResult
    logrank: dict[str, tuple[float, float]]  # axis -> (z, p)
    ratio: dict[str, tuple[float, float, float]]  # axis -> RMST(b) / RMST(a) with interval
    power: dict[str, float] = field(default_factory=dict)
    adjusted: float = float("nan")  # Holm-adjusted p on the decision axis
    verdict: str = ""


def horizons(protocol: Protocol, records: list[dict], steps: int) -> dict[str, float]:
    """Per axis, the horizon of the restricted means: the budget on steps and responses; on
    tokens the smallest total of any run of the task, so every run is followed that far. In
    the third edition (runs of equal tokens, unequal steps) the smallest total on every axis."""
    if protocol.edition >= 3:
        return {axis: min(float(S.cumulative_cost(r, axis)[-1]) for r in records) for axis in AXES}
    tokens = min(float(sum(r["generated_tokens"])) for r in records)
    return {"steps": float(steps), "responses": float(steps * protocol.responses_per_step), "tokens": tokens}


def arm_result(protocol: Protocol, arm: str, lr: float, records: list[dict], horizon: dict[str, float]) -> ArmResult:
    outs = {axis: S.outcomes(records, axis, protocol.threshold, protocol.window) for axis in AXES}
    restricted = {}
    for axis in AXES:
        h = horizon[axis]
        mean = S.restricted_mean(outs[axis], h)
        low, high = S.bootstrap(lambda o, h=h: S.restricted_mean(o, h), [outs[axis]], protocol.bootstrap_resamples, protocol.confidence)
        restricted[axis] = (mean, low, high)
    final = float(np.mean([np.mean(r["score"][-protocol.window :]) for r in records]))
    reach = S.reach_interval(outs["steps"].reached, len(records), protocol.confidence)
    return ArmResult(arm, protocol.arms[arm].family, lr, records, outs, reach, restricted, final)


def task_results(protocol: Protocol, plan: TaskPlan) -> tuple[dict[str, ArmResult], dict[str, float]]:
    rung = plan.rung
    horizon = horizons(protocol, plan.reported, rung.steps)
    out = {}
    for arm in protocol.arms:
        records = [r for r in plan.reported if r["arm"] == arm]
        if records:
            out[arm] = arm_result(protocol, arm, rung.rates[arm].winner, records, horizon)
    return out, horizon


def tuning_reach_costs(protocol: Protocol, plan: TaskPlan) -> np.ndarray:
    """Costs to threshold of the tuning runs (at chosen rates) that reached it: the cost
    distribution the power simulation draws from; in steps (second edition) or generated
    tokens (third, whose budgets are in tokens)."""
    rung = plan.rung
    costs = []
    for r in rung.records:
        if r["lr"] != rung.rates[r["arm"]].winner:
            continue
        step = S.reached_step(r["score"], protocol.threshold, protocol.window)
        if step is not None:
            costs.append(step if protocol.edition < 3 else S.cumulative_cost(r, "tokens")[step - 1])
    return np.asarray(costs, dtype=float)


def compare(protocol: Protocol, plan: TaskPlan, arms: dict[str, ArmResult], horizon: dict[str, float]) -> list[ComparisonResult]:
    results = []
    tests = protocol.tests()  # Holm's first step tests at alpha / tests
    observed = tuning_reach_costs(protocol, plan)
    for c in protocol.comparisons:
        a, b = (arms.get(plan.side_arm(protocol, side)) for side in (c.a, c.b))
        if a is None or b is None:
            continue
        ranks = {axis: S.logrank(a.outcomes[axis], b.outcomes[axis]) for axis in AXES}
        ratio = {}
        for axis in AXES:
            h = horizon[axis]

            def rmst_ratio(x, y, h=h):
                return S.restricted_mean(y, h) / S.restricted_mean(x, h)

            value = rmst_ratio(a.outcomes[axis], b.outcomes[axis])
            low, high = S.bootstrap(rmst_ratio, [a.outcomes[axis], b.outcomes[axis]], protocol.bootstrap_resamples, protocol.confidence)
            ratio[axis] = (value, low, high)
        result = ComparisonResult(plan.task, c.name, a, b, ranks, ratio)
        alpha = protocol.alpha / tests
        for label, s in protocol.power_scenarios.items():
            reach = (float(s["reach"][0]), float(s["reach"][1]))
            result.power[f"log-rank {label}"] = P.logrank_power(reach, float(s["speedup"]), (a.runs, b.runs), observed,
                                                                plan.rung.steps, alpha, protocol.power_simulations)  # fmt: skip
            if float(s["speedup"]) == 1.0:
                result.power[f"Fisher {label}"] = P.fisher_power(*reach, a.runs, b.runs, alpha)
        results.append(result)
    return results


@dataclass
class SameRate:
    """Exploratory (third edition): one compared pair of arms at one learning rate both ran in
    tuning, on the tuning seeds at the task's budget; decides nothing."""

    task: str
    name: str
    lr: float
    a: S.Outcomes  # tokens to threshold
    b: S.Outcomes
    horizon: float
    logrank: tuple[float, float]  # (z, p), uncorrected

    @property
    def ratio(self) -> float:
        """Restricted mean tokens of B / of A: above 1, A needs fewer."""
        return S.restricted_mean(self.b, self.horizon) / S.restricted_mean(self.a, self.horizon)


def same_rate(protocol: Protocol, plan: TaskPlan) -> list[SameRate]:
    """For each comparison of two named arms (the segment value's: the arms differ in sigma
    alone), the two arms at every rate of the tuning grid they share, from the tuning runs cut
    to the task's budget: whether a verdict follows the arm or the rate its pick landed on
    (ties go to the lower rate, so two arms that reach equally often may be compared at
    different rates). Not part of the protocol's decision."""
    rung, out = plan.rung, []
    horizon = min(float(S.cumulative_cost(r, "tokens")[-1]) for r in rung.records)
    for c in protocol.comparisons:
        if not (c.a in protocol.arms and c.b in protocol.arms):
            continue
        for lr in sorted(set(rung.grids[c.a]) & set(rung.grids[c.b])):
            a, b = ([r for r in rung.records if r["arm"] == arm and r["lr"] == lr] for arm in (c.a, c.b))
            oa, ob = (S.outcomes(runs, "tokens", protocol.threshold, protocol.window) for runs in (a, b))
            out.append(SameRate(plan.task, c.name, lr, oa, ob, horizon, S.logrank(oa, ob)))
    return out


def decide(protocol: Protocol, comparisons: list[ComparisonResult]) -> None:
    """Holm over the tasks of each comparison (or, ``holm-all``, over every decided test) on
    the decision axis; each result's verdict."""
    by_name: dict[str, list[ComparisonResult]] = {}
    for c in comparisons:
        by_name.setdefault("all" if protocol.correction == "holm-all" else c.name, []).append(c)
    for group in by_name.values():
        # a test without a result yet enters as p = 1: Holm's m stays the protocol's number of tests
        missing = [1.0] * (protocol.tests() - len(group))
        adjusted = S.holm([c.logrank[protocol.axis][1] for c in group] + missing)
        for c, p in zip(group, adjusted):
            c.adjusted = p
            z = c.logrank[protocol.axis][0]
            ratio = c.ratio[protocol.axis][0]
            if p >= protocol.alpha:
                c.verdict = "no difference detected"
            elif (z > 0) == (ratio > 1):
                c.verdict = "A sooner" if z > 0 else "B sooner"
            else:
                c.verdict = "curves cross"  # the test sees a difference, the restricted means point the other way


def sentences(protocol: Protocol, comparisons: list[ComparisonResult], partial: bool) -> list[str]:
    """The README's statement: one sentence per comparison, from the verdicts alone."""
    axis_words = {"steps": "steps", "responses": "responses", "tokens": "generated tokens"}[protocol.axis]
    out = []
    for c in protocol.comparisons:
        group = [r for r in comparisons if r.name == c.name]
        if not group:
            continue
        a, b = protocol.side_name(c.a), protocol.side_name(c.b)
        arms_a, arms_b = (", ".join(sorted({getattr(r, side).arm for r in group})) for side in ("a", "b"))
        parts = []
        for verdict, words in (("A sooner", f"fewer {axis_words} to the threshold"), ("B sooner", f"more {axis_words} to the threshold"),
                               ("curves cross", "a different course (the Kaplan-Meier curves cross)")):  # fmt: skip
            tasks = [f"`{r.task}` (adjusted p = {r.adjusted:.2g})" for r in group if r.verdict == verdict]
            if tasks:
                parts.append(f"needed {words} on {', '.join(tasks)}")
        none = [r for r in group if r.verdict == "no difference detected"]
        if none:
            powers = [r.power.get("log-rank faster", float("nan")) for r in none]
            span = f"{min(powers):.2f}" if min(powers) == max(powers) else f"{min(powers):.2f}-{max(powers):.2f}"
            parts.append(f"no difference was detected on {', '.join(f'`{r.task}`' for r in none)} "
                         f"(power to detect half the cost at equal reach rates: {span})")  # fmt: skip
        out.append(f"{a} ({arms_a}) against {b} ({arms_b}): " + "; ".join(parts) + ".")
    if partial:
        out.append("(Partial: not every task of the protocol has all its runs; the sentences cover the tasks that do.)")
    return out


def default_value_function(protocol: Protocol, comparisons: list[ComparisonResult], partial: bool) -> list[str]:
    """The third edition's rule for ``--value-function``'s default, in words: `first` when it
    needed fewer tokens than `equal` (verdict "A sooner") on at least the rule's number of tasks
    in every one of the rule's comparisons; otherwise the paper's `equal` stays."""
    rule = protocol.default_rule
    if not rule:
        return []
    sooner = {name: sorted(r.task for r in comparisons if r.name == name and r.verdict == "A sooner") for name in rule["comparisons"]}
    wins = all(len(tasks) >= int(rule["tasks"]) for tasks in sooner.values())
    counts = "; ".join(f"{name}: sooner on {len(tasks)} task(s){' (' + ', '.join(tasks) + ')' if tasks else ''}" for name, tasks in sooner.items())
    verdict = ("the default of --value-function becomes `first`" if wins else
               "the default of --value-function stays the paper's `equal`: `first` was not detected to need fewer tokens "
               f"on {rule['tasks']} tasks for every rule")  # fmt: skip
    return [f"{verdict} ({counts}; the rule asks for {rule['tasks']} of {len(protocol.tasks)} tasks in each)"
            + (" - PARTIAL: not every test has its runs" if partial else "")]
