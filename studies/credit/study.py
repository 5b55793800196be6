"""The study's course, task by task, as PROTOCOL.md states it.

For each task: calibration and tuning on the tuning seeds (each rung of the steps ladder runs
every arm over its learning-rate grid, extending the grid where a choice is on its edge;
the first rung whose best arm reaches the threshold on enough tuning runs is the task's
budget), then the reported seeds at each arm's chosen rate (more seeds for each family's
best arm), then the analysis. A runner either trains what is missing or only reads what is
saved; with the second a task whose runs are not all there stops where they end.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from . import tuning as T
from .protocol import Protocol, needed_reach
from .runs import make_job


@dataclass
class Rung:
    """Tuning at one budget of the steps ladder."""

    steps: int
    records: list[dict]
    grids: dict[str, list[float]]
    rates: dict[str, T.Choice]  # arm -> chosen rate
    families: dict[str, T.Choice]  # family -> best arm
    best: str  # the best arm of all
    reach: tuple[int, int]  # its tuning runs that reached the threshold
    passed: bool
    limits: list[str] = field(default_factory=list)  # extensions the limit stopped


@dataclass
class TaskPlan:
    task: str
    rungs: list[Rung]
    complete: bool  # calibration and tuning finished (False: runs missing)
    reported: list[dict] = field(default_factory=list)
    reported_complete: bool = False
    critic: CriticChoice | None = None  # third edition: the critic's rate
    compared: set[str] = field(default_factory=set)  # third edition: the arms the comparisons use

    @property
    def rung(self) -> Rung | None:
        """The rung the task is run at: the first that passed, else the ladder's last."""
        if not self.complete or not self.rungs:
            return None
        return next((r for r in self.rungs if r.passed), self.rungs[-1])

    @property
    def decided_arms(self) -> set[str]:
        if self.compared:
            return self.compared
        return {choice.winner for choice in self.rung.families.values()} if self.rung else set()

    def side_arm(self, protocol: Protocol, side: str) -> str:
        """The arm a comparison's side stands for: the one it names, or its family's best."""
        return side if side in protocol.arms else self.rung.families[side].winner


@dataclass
class CriticChoice:
    """The third edition's critic rate for a task: per rate, the mean explained variance of
    the critic over the second half of each run, averaged over the tuning seeds."""

    lr: float
    fit: dict[float, list[float]]  # rate -> per-seed mean explained variance
    records: list[dict]


def second_half_fit(record: dict) -> float:
    values = [v for v in record["explained_variance"][len(record["explained_variance"]) // 2 :] if v is not None and math.isfinite(v)]
    return statistics.fmean(values) if values else float("nan")


def choose_critic_rate(protocol: Protocol, task: str, runner) -> CriticChoice | None:
    """Runs of the protocol's critic arms at its actor rate over its critic rates (tuning
    seeds); the rate with the highest mean explained variance (ties: the lower rate)."""
    c = protocol.critic
    jobs = [make_job(protocol, task, arm, c.actor_lr, seed, c.budget, critic_lr=lr)
            for arm in c.arms for lr in c.lrs for seed in protocol.tuning.seeds]  # fmt: skip
    records = runner(jobs, f"{task} critic rate, {c.budget} tokens")
    if len(records) < len(jobs):
        return None
    fit: dict[float, list[float]] = {}
    for record in records:
        fit.setdefault(record["critic_lr"], []).append(second_half_fit(record))
    choice = T.pick(sorted(fit), fit, protocol.tuning.tie_tolerance)
    return CriticChoice(choice.winner, fit, records)


def extend_grids(protocol: Protocol, where: str, jobs_for, per_rate_of, leads, runner, label: str):
    """Every arm over its rate grid (``jobs_for(arm, lr)``: the runs of one rate), the grids
    extended past an edge whose choice ``leads`` until none changes or the limit stops it.
    Returns (records, grids, limits), or None while runs are missing."""
    t = protocol.tuning
    grids = {arm: sorted(t.lrs) for arm in protocol.arms}
    limits: dict[str, str] = {}
    while True:
        jobs = [job for arm in protocol.arms for lr in grids[arm] for job in jobs_for(arm, lr)]
        records = runner(jobs, label)
        if len(records) < len(jobs):
            return None
        per_rate = per_rate_of(records)
        changed = False
        for arm in protocol.arms:
            chosen = T.choose_rate(per_rate[arm], t.tie_tolerance).winner
            if not leads(grids[arm], chosen, per_rate[arm]):
                continue
            grid, stopped = T.extend(grids[arm], chosen, t.lrs, t.extend_factor, t.max_extensions)
            changed |= grid != grids[arm]
            grids[arm] = grid
            if stopped:
                limits[arm] = f"{where}, {arm}: {stopped}"
        if not changed:
            return records, grids, list(limits.values())


def tune_rung(protocol: Protocol, task: str, steps: int, runner) -> Rung | None:
    """Every arm over its grid on the tuning seeds at ``steps``, grids extended until interior."""
    t = protocol.tuning
    tuned = extend_grids(protocol, f"{task}, {steps} steps",
                         lambda arm, lr: [make_job(protocol, task, arm, lr, seed, steps) for seed in t.seeds],
                         T.scores_by_rate, lambda grid, chosen, per_rate: True, runner, f"{task} tuning, {steps} steps")  # fmt: skip
    if tuned is None:
        return None
    records, grids, limits = tuned
    per_rate = T.scores_by_rate(records)
    rates = {arm: T.choose_rate(per_rate[arm], t.tie_tolerance) for arm in protocol.arms}
    families = {f: T.family_best(protocol.family_arms(f), rates, per_rate, t.tie_tolerance) for f in protocol.families}
    best = T.pick(list(protocol.arms), {a: per_rate[a][rates[a].winner] for a in protocol.arms}, t.tie_tolerance).winner
    reach = T.reach_count(records, best, rates[best].winner, protocol.threshold, protocol.window)
    return Rung(steps, records, grids, rates, families, best, reach, reach[0] >= needed_reach(protocol), limits)


def tune_budgets(protocol: Protocol, task: str, critic_lr: float, runner) -> list[Rung] | None:
    """Third edition: every arm over its actor-rate grid on the tuning seeds at the largest
    token budget (grids extended past an edge whose choice reached), then each budget of the
    ladder as those runs cut to it: its rates, family bests and calibration check. A grid is
    extended only where its edge rate reached strictly more often than its neighbour: a tie
    already goes to the lower rate, and an arm that never reached has no edge to follow. Stops at
    the first budget that passes (every family's best reaches on enough tuning runs)."""
    t, top = protocol.tuning, protocol.budgets[-1]
    tuned = extend_grids(protocol, f"{task}, {top} tokens",
                         lambda arm, lr: [make_job(protocol, task, arm, lr, seed, top, critic_lr=critic_lr) for seed in t.seeds],
                         lambda records: T.reach_by_rate(records, protocol.threshold, protocol.window),
                         lambda grid, chosen, per_rate: T.edge_leads(grid, chosen, per_rate, t.tie_tolerance),
                         runner, f"{task} tuning, {top} tokens")  # fmt: skip
    if tuned is None:
        return None
    records, grids, limits = tuned
    rungs = []
    for budget in protocol.budgets:
        cut = [T.cut(r, budget) for r in records]
        per_rate = T.reach_by_rate(cut, protocol.threshold, protocol.window)
        rates = {arm: T.choose_rate(per_rate[arm], t.tie_tolerance) for arm in protocol.arms}
        families = {f: T.best_by_reach(protocol.family_arms(f), rates, per_rate, t.tie_tolerance) for f in protocol.families}
        reach = {f: T.reach_count(cut, c.winner, rates[c.winner].winner, protocol.threshold, protocol.window) for f, c in families.items()}
        weakest = min(families, key=lambda f: reach[f][0])
        passed = all(k >= needed_reach(protocol) for k, _ in reach.values())
        rungs.append(Rung(budget, cut, grids, rates, families, families[weakest].winner, reach[weakest], passed, limits))
        if passed:
            break
    return rungs


def plan_task(protocol: Protocol, task: str, runner) -> TaskPlan:
    """Calibration (the steps ladder) and tuning, then the reported runs."""
    if protocol.edition >= 3:
        return plan_task3(protocol, task, runner)
    plan = TaskPlan(task, [], complete=False)
    for steps in protocol.steps_ladder:
        rung = tune_rung(protocol, task, steps, runner)
        if rung is None:
            return plan
        plan.rungs.append(rung)
        if rung.passed:
            break
    plan.complete = True
    rung = plan.rung
    jobs = [make_job(protocol, task, arm, rung.rates[arm].winner, seed, rung.steps)
            for arm in protocol.arms for seed in protocol.reported_seeds(arm in plan.decided_arms)]  # fmt: skip
    plan.reported = runner(jobs, f"{task} reported, {rung.steps} steps")
    plan.reported_complete = len(plan.reported) == len(jobs)
    return plan


def plan_task3(protocol: Protocol, task: str, runner) -> TaskPlan:
    """Third edition: the critic's rate, the tuning and token-budget calibration, then the
    reported seeds of every arm (more for those a comparison uses) at the calibrated budget."""
    plan = TaskPlan(task, [], complete=False)
    plan.critic = choose_critic_rate(protocol, task, runner)
    if plan.critic is None:
        return plan
    rungs = tune_budgets(protocol, task, plan.critic.lr, runner)
    if rungs is None:
        return plan
    plan.rungs, plan.complete = rungs, True
    rung = plan.rung
    plan.compared = {plan.side_arm(protocol, side) for c in protocol.comparisons for side in (c.a, c.b)}
    jobs = [make_job(protocol, task, arm, rung.rates[arm].winner, seed, rung.steps, critic_lr=plan.critic.lr)
            for arm in protocol.arms for seed in protocol.reported_seeds(arm in plan.compared)]  # fmt: skip
    plan.reported = runner(jobs, f"{task} reported, {rung.steps} tokens")
    plan.reported_complete = len(plan.reported) == len(jobs)
    return plan
