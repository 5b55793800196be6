"""What the full study will cost, from timed runs: ``python -m studies.credit --edition 2 --estimate``.

Runs one tuning run per arm and task at the first budget of the steps ladder (the first
tuning seed, the grid's middle rate: runs the study itself needs, saved as any other), then
projects the study's CPU time from their seconds. The projection counts every arm's rates
as the grid plus one extension (4 rates: most arms needed one in the first edition) on every
tuning seed, and the reported seeds with each family's best arm taken as its costliest arm;
a budget of more steps scales a run's seconds in proportion. It gives three cases: every
task passes calibration at the first budget, each needs the second, each needs the last.
"""

from __future__ import annotations

import statistics

from .protocol import Protocol
from .runs import make_job


def timing_jobs(protocol: Protocol) -> list[dict]:
    lr = sorted(protocol.tuning.lrs)[len(protocol.tuning.lrs) // 2]
    steps = protocol.steps_ladder[0]
    return [make_job(protocol, task, arm, lr, protocol.tuning.seeds[0], steps) for task in protocol.tasks for arm in protocol.arms]


def project(protocol: Protocol, records: list[dict], workers: int) -> list[str]:
    """Lines of the projection (wall-clock hours with ``workers`` runs side by side)."""
    first = protocol.steps_ladder[0]
    per_step = {(r["task"], r["arm"]): r["seconds"] / r["steps"] for r in records}  # seconds of one step, side by side
    lines = [f"# timed: {len(records)} runs of {first} steps, {workers} side by side; seconds per step, median over tasks: "
             + ", ".join(f"{arm} {statistics.median(v for (t, a), v in per_step.items() if a == arm):.2f}" for arm in protocol.arms)]  # fmt: skip
    rates = len(protocol.tuning.lrs) + 1
    cases = {"every task passes at the first budget": 1, "each needs the second": 2, "each needs the last": len(protocol.steps_ladder)}
    for label, rungs in cases.items():
        if rungs > len(protocol.steps_ladder):
            continue
        ladder = protocol.steps_ladder[:rungs]
        total = 0.0
        for task in protocol.tasks:
            step = {arm: per_step[(task, arm)] for arm in protocol.arms}
            tuning = sum(step[a] * s * rates * len(protocol.tuning.seeds) for a in protocol.arms for s in ladder)
            costliest = {f: max(protocol.family_arms(f), key=step.get) for f in protocol.families}
            reported = sum(step[a] * ladder[-1] * len(protocol.reported_seeds(a in costliest.values())) for a in protocol.arms)
            total += tuning + reported
        lines.append(f"# projection, {label} ({', '.join(map(str, ladder))} steps): {total / 3600 / workers:.1f} h with {workers} workers")
    return lines
