"""The study's course, task by task, as PROTOCOL.md states it.

For each task: calibration and tuning on the tuning seeds (each rung of the steps ladder runs
every arm over its learning-rate grid, extending the grid where a choice is on its edge;
the first rung whose best arm reaches the threshold on enough tuning runs is the task's
budget), then the reported seeds at each arm's chosen rate (more seeds for each family's
best arm), then the analysis. A runner either trains what is missing or only reads what is
saved; with the second a task whose runs are not all there stops where they end.
"""

from __future__ import annotations

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

    @property
    def rung(self) -> Rung | None:
        """The rung the task is run at: the first that passed, else the ladder's last."""
        if not self.complete or not self.rungs:
            return None
        return next((r for r in self.rungs if r.passed), self.rungs[-1])

    @property
    def decided_arms(self) -> set[str]:
        return {choice.winner for choice in self.rung.families.values()} if self.rung else set()


def tune_rung(protocol: Protocol, task: str, steps: int, runner) -> Rung | None:
    """Every arm over its grid on the tuning seeds at ``steps``, grids extended until interior."""
    t = protocol.tuning
    grids = {arm: sorted(t.lrs) for arm in protocol.arms}
    limits: dict[str, str] = {}
    while True:
        jobs = [make_job(protocol, task, arm, lr, seed, steps) for arm in protocol.arms for lr in grids[arm] for seed in t.seeds]
        records = runner(jobs, f"{task} tuning, {steps} steps")
        if len(records) < len(jobs):
            return None
        per_rate = T.scores_by_rate(records)
        rates = {arm: T.choose_rate(per_rate[arm], t.tie_tolerance) for arm in protocol.arms}
        changed = False
        for arm in protocol.arms:
            grid, stopped = T.extend(grids[arm], rates[arm].winner, t.lrs, t.extend_factor, t.max_extensions)
            changed |= grid != grids[arm]
            grids[arm] = grid
            if stopped:
                limits[arm] = f"{task}, {steps} steps, {arm}: {stopped}"
        if not changed:
            break
    families = {f: T.family_best(protocol.family_arms(f), rates, per_rate, t.tie_tolerance) for f in protocol.families}
    best = T.pick(list(protocol.arms), {a: per_rate[a][rates[a].winner] for a in protocol.arms}, t.tie_tolerance).winner
    reach = T.reach_count(records, best, rates[best].winner, protocol.threshold, protocol.window)
    return Rung(steps, records, grids, rates, families, best, reach, reach[0] >= needed_reach(protocol), list(limits.values()))


def plan_task(protocol: Protocol, task: str, runner) -> TaskPlan:
    """Calibration (the steps ladder) and tuning, then the reported runs."""
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
