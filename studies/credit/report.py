"""What the study prints: calibration, tuning, per-arm tables, comparisons, deviations, the sentence."""

from __future__ import annotations

from collections import Counter

from .analysis import ArmResult, ComparisonResult, SameRate
from .protocol import AXES, Protocol, needed_reach
from .survival import restricted_mean
from .study import TaskPlan


def _cost(value: float, axis: str) -> str:
    return f"{value:,.0f}" if axis == "tokens" else f"{value:.1f}"


def print_critic(protocol: Protocol, plan: TaskPlan) -> None:
    """Third edition: the critic's rate and how well each candidate fits its targets."""
    if plan.critic is None:
        return
    c = protocol.critic
    fits = ", ".join(f"{lr:g}: {sum(v) / len(v):.3f}" for lr, v in sorted(plan.critic.fit.items()))
    print(f"# {plan.task}: critic rate {plan.critic.lr:g} (mean explained variance over each run's second half, "
          f"{', '.join(c.arms)} at actor rate {c.actor_lr:g}, {c.budget} tokens, {len(protocol.tuning.seeds)} tuning seeds: {fits})")  # fmt: skip


def print_calibration(protocol: Protocol, plan: TaskPlan) -> None:
    need = needed_reach(protocol)
    if protocol.edition >= 3:
        print_critic(protocol, plan)
        for rung in plan.rungs:
            counts = {f: _reach(protocol, rung, c.winner) for f, c in rung.families.items()}
            reach = ", ".join(f"{f} {c.winner} (lr {rung.rates[c.winner].winner:g}) {counts[f][0]}/{counts[f][1]}"
                              for f, c in rung.families.items())  # fmt: skip
            print(f"# {plan.task}: calibration at {rung.steps} tokens: family bests reached the threshold on {reach} "
                  f"tuning runs (each needs {need}): {'passes' if rung.passed else 'fails'}")  # fmt: skip
        return
    for rung in plan.rungs:
        lr = rung.rates[rung.best].winner
        verdict = "passes" if rung.passed else "fails"
        print(f"# {plan.task}: calibration at {rung.steps} steps: best arm {rung.best} (lr {lr:g}) reached the threshold "
              f"on {rung.reach[0]} of {rung.reach[1]} tuning runs (needs {need}): {verdict}")  # fmt: skip


def print_tuning(protocol: Protocol, plan: TaskPlan) -> None:
    rung = plan.rung
    print(f"\n## {plan.task}: tuning at {rung.steps} {protocol.unit} on seeds {list(protocol.tuning.seeds)}")
    grids = {arm: ",".join(f"{lr:g}" for lr in rung.grids[arm]) for arm in rung.rates}
    width = max(len(g) for g in grids.values()) + 2
    print(f"{'arm':<14}{'family':<12}{'grid':<{width}}{'lr':>7}{'score':>7}{'next':>8}{'margin':>8}{'reach':>7}  tie")
    for arm, choice in rung.rates.items():
        k, n = _reach(protocol, rung, arm)
        tie = "exact (lower rate)" if choice.exact_tie else ("near" if choice.near_tie else "")
        runner_up = "-" if choice.runner_up is None else f"{choice.runner_up:g}"
        print(f"{arm:<14}{protocol.arms[arm].family:<12}{grids[arm]:<{width}}{choice.winner:>7g}{choice.score:>7.3f}"
              f"{runner_up:>8}{choice.margin:>8.3f}{f'{k}/{n}':>7}  {tie}")  # fmt: skip
    if protocol.tuning.pick == "reach":
        print("(score: share of tuning runs that reached the threshold, what picks the rate (ties: the lower); next: the "
              "runner-up rate; reach: those runs at the chosen rate; tie near: the runner-up within one standard error)")
    else:
        print("(score: mean training score over the run and the tuning seeds; next: the runner-up rate; reach: tuning runs "
              "at the chosen rate that reached the threshold; tie near: the runner-up within one standard error)")
    for family, choice in rung.families.items():
        tie = " (exact tie, broken by the protocol's arm order)" if choice.exact_tie else (" (near tie: within one standard error)" if choice.near_tie else "")
        runner = f", next {choice.runner_up} by {choice.margin:.3f}" if choice.runner_up else ""
        tie = tie.replace("the protocol's arm order", "the lower rate, then the arm order") if protocol.edition >= 3 else tie
        print(f"# {plan.task}: best of {family}: {choice.winner} (tuning score {choice.score:.3f}{runner}){tie}")


def _reach(protocol: Protocol, rung, arm: str) -> tuple[int, int]:
    from .tuning import reach_count

    return reach_count(rung.records, arm, rung.rates[arm].winner, protocol.threshold, protocol.window)


def print_arms(protocol: Protocol, plan: TaskPlan, arms: dict[str, ArmResult], horizon: dict[str, float]) -> None:
    steps = plan.rung.steps
    budget = (f"a budget of {steps:,} generated tokens" if protocol.edition >= 3 else
              f"{steps} steps x {protocol.responses_per_step} responses")  # fmt: skip
    print(f"\n## {plan.task}: {protocol.tokens[plan.task]} tokens, {budget}, "
          f"threshold {protocol.threshold:g} of the best score (trailing {protocol.window}-step mean)")  # fmt: skip
    print("restricted mean cost to threshold (horizon: " + ", ".join(f"{a} {_cost(h, a)}" for a, h in horizon.items())
          + f"), {protocol.confidence:.0%} bootstrap intervals; reach rate with exact (Clopper-Pearson) interval")
    print(f"{'arm':<14}{'lr':>7}  {'reached [95% CI]':<21}{'steps [95% CI]':>22}{'tokens [95% CI]':>28}{'final':>7}{'seg':>6}{'tok/step':>9}")
    decided = plan.decided_arms
    for name, a in arms.items():
        reach = f"{a.reached}/{a.runs} [{a.reach_ci[0]:.2f},{a.reach_ci[1]:.2f}]"
        st, tk = a.restricted["steps"], a.restricted["tokens"]
        mark = "*" if name in decided else " "
        per_step = sum(sum(r["generated_tokens"]) for r in a.records) / sum(len(r["score"]) for r in a.records)
        segment = sum(r["segment_length"] for r in a.records) / a.runs
        print(f"{mark}{name:<13}{a.lr:>7g}  {reach:<21}{f'{st[0]:.1f} [{st[1]:.1f}, {st[2]:.1f}]':>22}"
              f"{f'{tk[0]:,.0f} [{tk[1]:,.0f}, {tk[2]:,.0f}]':>28}{a.final:>7.3f}{segment:>6.1f}{per_step:>9.0f}")  # fmt: skip
    if protocol.edition >= 3:
        fits = {name: _mean_fit(a.records) for name, a in arms.items()}
        print("explained variance of the critic (mean over each reported run's second half): "
              + ", ".join(f"{name} {v:.3f}" for name, v in fits.items() if v is not None))
        print(f"(* an arm a decided comparison uses; steps and tokens: restricted means; final: mean score of the last "
              f"{protocol.window} steps; seg: mean segment length; responses = steps x {protocol.responses_per_step})")  # fmt: skip
        return
    print(f"(* a family's best arm: the decided comparisons use it; steps and tokens: restricted means; final: mean "
          f"score of the last {protocol.window} steps; seg: mean segment length; responses = steps x "
          f"{protocol.responses_per_step} for every arm)")  # fmt: skip


def _mean_fit(records: list[dict]) -> float | None:
    from .study import second_half_fit

    fits = [second_half_fit(r) for r in records if any(v is not None for v in r.get("explained_variance", []))]
    return sum(fits) / len(fits) if fits else None


def print_comparisons(protocol: Protocol, comparisons: list[ComparisonResult]) -> None:
    scope = f"Holm over all {protocol.tests()} decided tests" if protocol.correction == "holm-all" else "Holm over the tasks of a comparison"
    print(f"\n## decided comparisons (log-rank; the decision uses {protocol.axis}, {scope}; "
          f"ratio = restricted mean of B / of A, above 1: A needs less)")  # fmt: skip
    for c in comparisons:
        print(f"{c.task}: {c.name}: {c.a.arm} ({c.a.reached}/{c.a.runs}) vs {c.b.arm} ({c.b.reached}/{c.b.runs}): {c.verdict}, "
              f"adjusted p {c.adjusted:.3g}")  # fmt: skip
        for axis in AXES:
            z, p = c.logrank[axis]
            r = c.ratio[axis]
            print(f"    {axis:<10} log-rank z {z:+.2f}, p {p:.3g}; restricted-mean ratio {r[0]:.2f}x [{r[1]:.2f}, {r[2]:.2f}]")
        power = ", ".join(f"{k} {v:.2f}" for k, v in c.power.items())
        print(f"    power at alpha/{protocol.tests()} with {c.a.runs} vs {c.b.runs} runs: {power}")


def print_same_rate(rows: list[SameRate]) -> None:
    """The exploratory same-rate table (third edition), after the decided comparisons."""
    if not rows:
        return
    print("\n## the segment value's arms at equal rates (exploratory, decides nothing): the tuning runs cut to the task's "
          "budget, tuning seeds only; tokens to threshold, restricted means up to the shortest run, uncorrected log-rank p; "
          "ratio = restricted mean of B / of A, above 1: A needs fewer")  # fmt: skip
    for r in rows:
        a, b = (f"{o.reached}/{len(o)} reached, {restricted_mean(o, r.horizon):,.0f} tokens" for o in (r.a, r.b))
        z, p = r.logrank
        print(f"{r.task}: {r.name} at lr {r.lr:g}: A {a}; B {b}; ratio {r.ratio:.2f}x, log-rank z {z:+.2f}, p {p:.3g}")


def deviations(protocol: Protocol, plans: list[TaskPlan]) -> list[str]:
    """Every way the study as run differs from the protocol (printed; none is silent)."""
    out = []
    planned = set(protocol.tasks)
    for task in sorted(planned - {p.task for p in plans}):
        out.append(f"{task}: not run (left out with --tasks)")
    for plan in plans:
        if not plan.complete:
            out.append(f"{plan.task}: calibration/tuning unfinished ({sum(len(r.records) for r in plan.rungs)} tuning runs saved in finished rungs): no result")
            continue
        rung = plan.rung
        if not rung.passed:
            out.append(f"{plan.task}: no budget of the ladder {list(protocol.ladder)} passed calibration; run at the last, "
                       f"{rung.steps} {protocol.unit}")  # fmt: skip
        # the third edition's rungs share their tuning runs, so the same limit can come from each rung
        out += [f"{m} (the grid was not extended further)" for m in dict.fromkeys(m for r in plan.rungs for m in r.limits)]
        if not plan.reported_complete:
            expected = sum(len(protocol.reported_seeds(a in plan.decided_arms)) for a in protocol.arms)
            out.append(f"{plan.task}: {len(plan.reported)} of {expected} reported runs saved (partial result)")
        records = tuning_records(protocol, plan) + plan.reported + (plan.critic.records if plan.critic else [])
        if protocol.edition >= 3:
            out += _token_plan_deviations(protocol, plan.task, records)
        other = Counter(r["protocol"] for r in records if r.get("protocol") != protocol.digest())
        for digest, count in other.items():
            out.append(f"{plan.task}: {count} runs were made under protocol {digest}, not {protocol.digest()}")
    return out


def tuning_records(protocol: Protocol, plan: TaskPlan) -> list[dict]:
    """Every tuning run once (the third edition's rungs are the same runs, cut to each budget)."""
    if protocol.edition >= 3:
        return plan.rungs[-1].records if plan.rungs else []
    return [r for rung in plan.rungs for r in rung.records]


def machine(record: dict) -> str:
    """The CPU a run ran on: its model, with its vector flags where the record has them (from
    the third edition on): two CPUs of one model can differ in them, and so in rounding."""
    flags = record.get("provenance", {}).get("cpu", {}).get("flags")
    return f"{record.get('cpu', '?')} ({', '.join(flags)})" if flags else record.get("cpu", "?")


def machines(protocol: Protocol, plans: list[TaskPlan]) -> str:
    cpus = Counter(machine(r) for p in plans for r in tuning_records(protocol, p) + (p.critic.records if p.critic else []))
    cpus.update(machine(r) for p in plans for r in p.reported)
    return "; ".join(f"{cpu}: {n} runs" for cpu, n in cpus.most_common())


def _token_plan_deviations(protocol: Protocol, task: str, records: list[dict]) -> list[str]:
    """Third edition: runs whose steps generated other than the planned tokens (an EOS, or a
    plan that does not match the stage), which the budgets assumed."""
    from .runs import tokens_per_step

    off = [r for r in records if any(t != tokens_per_step(protocol, task, r["arm"]) for t in r["generated_tokens"])]
    if not off:
        return []
    arms = Counter(r["arm"] for r in off)
    return [f"{task}: {len(off)} runs generated other than the planned tokens per step ({', '.join(f'{a} {n}' for a, n in arms.items())})"]
