"""The second credit study's statistics and rules (studies/credit/) against references:
Kaplan-Meier against a brute-force product-limit loop, the restricted mean against its
definition, Holm against the step-down formula, exact intervals against beta quantiles, the
power figures against known values, and the tuning, extension and calibration rules on
synthetic runs (no training here: tests/test_credit_second_study.py runs the study end to end)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from studies.credit import analysis as A
from studies.credit import power as P
from studies.credit import survival as S
from studies.credit import tuning as T
from studies.credit.protocol import load
from studies.credit.study import plan_task, tune_rung


def _reference_km(times, events):
    """Product-limit estimate by its definition: at each distinct event time t,
    S *= 1 - deaths(t) / at_risk(t) (at risk: time >= t)."""
    survival, curve = 1.0, {}
    for t in sorted(set(times)):
        deaths = sum(1 for x, e in zip(times, events) if x == t and e)
        at_risk = sum(1 for x in times if x >= t)
        if deaths:
            survival *= 1 - deaths / at_risk
        curve[t] = survival
    return curve


def _survival_at(times, survival, x):
    before = times <= x
    return 1.0 if not before.any() else float(survival[before][-1])


censored = st.lists(st.tuples(st.integers(1, 12), st.booleans()), min_size=1, max_size=25)


@settings(max_examples=80, deadline=None)
@given(censored)
def test_kaplan_meier_matches_the_product_limit_definition(data):
    times = np.array([t for t, _ in data], dtype=float)
    events = np.array([e for _, e in data])
    got_t, got_s = S.kaplan_meier(S.Outcomes(times, events))
    reference = _reference_km(times.tolist(), events.tolist())
    for x in np.arange(0, 14, 0.5):
        expected = 1.0 if x < min(reference) else reference[max(t for t in reference if t <= x)]
        assert _survival_at(got_t, got_s, x) == pytest.approx(expected)


@settings(max_examples=80, deadline=None)
@given(censored, st.integers(1, 14))
def test_restricted_mean_is_the_area_under_the_curve(data, horizon):
    times = np.array([t for t, _ in data], dtype=float)
    events = np.array([e for _, e in data])
    reference = _reference_km(times.tolist(), events.tolist())

    def level(x):  # survival on [x, x + 1) of the integer grid
        return 1.0 if x < min(reference) else reference[max(t for t in reference if t <= x)]

    area = sum(level(x) for x in range(horizon))  # every jump is at an integer
    assert S.restricted_mean(S.Outcomes(times, events), horizon) == pytest.approx(area)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=20), st.integers(1, 35))
def test_restricted_mean_without_censoring_is_the_mean_of_the_capped_times(times, horizon):
    o = S.Outcomes(np.array(times, dtype=float), np.ones(len(times), dtype=bool))
    assert S.restricted_mean(o, horizon) == pytest.approx(np.mean(np.minimum(times, horizon)))


def test_restricted_mean_of_runs_that_never_reach_is_the_horizon():
    o = S.Outcomes(np.array([40.0, 40.0]), np.array([False, False]))
    assert S.restricted_mean(o, 40) == 40.0 and S.restricted_mean(o, 25) == 25.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_holm_matches_the_step_down_formula(pvalues):
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    expected = [0.0] * m
    for rank, i in enumerate(order):
        expected[i] = max(min(1.0, (m - j) * pvalues[order[j]]) for j in range(rank + 1))
    assert S.holm(pvalues) == pytest.approx(expected)


def test_reach_interval_is_clopper_pearson():
    from scipy import stats

    low, high = S.reach_interval(3, 20, 0.95)
    assert low == pytest.approx(stats.beta.ppf(0.025, 3, 18)) and high == pytest.approx(stats.beta.ppf(0.975, 4, 17))
    assert S.reach_interval(0, 5, 0.95)[0] == 0.0 and S.reach_interval(5, 5, 0.95)[1] == 1.0


def test_logrank_sign_says_which_arm_is_sooner():
    fast = S.Outcomes(np.array([3.0, 4, 5, 6, 7, 8]), np.ones(6, dtype=bool))
    slow = S.Outcomes(np.array([20.0, 25, 30, 40, 40, 40]), np.array([1, 1, 1, 0, 0, 0], dtype=bool))
    z, p = S.logrank(fast, slow)
    assert z > 0 and p < 0.05
    assert S.logrank(slow, fast)[0] == pytest.approx(-z)
    never = S.Outcomes(np.array([40.0, 40.0]), np.zeros(2, dtype=bool))
    assert S.logrank(never, never) == (0.0, 1.0)


def _record(arm, lr, seed, score, tokens_per_step=256, task="t"):
    return {"task": task, "arm": arm, "lr": lr, "seed": seed, "score": list(score), "responses": [8.0] * len(score),
            "generated_tokens": [float(tokens_per_step)] * len(score), "protocol": "x", "cpu": "test"}  # fmt: skip


def test_outcomes_count_cost_on_every_axis():
    learned = _record("a", 0.1, 0, [0.0, 1, 1, 1, 1, 1, 1, 1], tokens_per_step=100)
    never = _record("a", 0.1, 1, [0.0] * 8, tokens_per_step=100)
    for axis, scale, end in (("steps", 1, 8), ("responses", 8, 64), ("tokens", 100, 800)):
        o = S.outcomes([learned, never], axis, threshold=0.8, window=5)
        assert o.times.tolist() == [5 * scale, end] and o.events.tolist() == [True, False]  # trailing mean 0.8 at step 5


def test_fisher_power_reproduces_the_first_editions_38_percent():
    # the issue: 5 seeds, reach rates 0.2 against 0.8, detected about 38% of the time
    assert P.fisher_power(0.2, 0.8, 5, 5, 0.05) == pytest.approx(0.376, abs=0.005)
    assert P.fisher_power(0.5, 0.5, 20, 20, 0.05) <= 0.05  # its size: Fisher's test is conservative
    assert P.fisher_power(0.2, 0.8, 20, 20, 0.05) > 0.9


def test_logrank_power_by_simulation_has_its_size_and_grows_with_runs():
    observed = np.arange(5.0, 30.0)
    size = P.logrank_power((0.8, 0.8), 1.0, (20, 20), observed, 40, 0.05, 400)
    assert size < 0.1
    small = P.logrank_power((0.9, 0.9), 2.0, (5, 5), observed, 40, 0.05, 300)
    large = P.logrank_power((0.9, 0.9), 2.0, (40, 40), observed, 40, 0.05, 300)
    assert small < large and large > 0.8


def test_rate_choice_breaks_exact_ties_toward_the_lower_rate_and_reports_near_ties():
    choice = T.choose_rate({0.12: [0.5, 0.5], 0.03: [0.5, 0.5], 0.06: [0.2, 0.2]}, 1e-9)
    assert choice.winner == 0.03 and choice.exact_tie and choice.runner_up == 0.12
    near = T.choose_rate({0.03: [0.2, 0.6], 0.06: [0.39, 0.39]}, 1e-9)  # 0.4 +- 0.2 against 0.39
    assert near.winner == 0.03 and near.near_tie and not near.exact_tie
    clear = T.choose_rate({0.03: [0.8, 0.82], 0.06: [0.2, 0.2]}, 1e-9)
    assert not clear.near_tie and clear.margin == pytest.approx(0.61)


def test_grid_extends_past_an_edge_until_the_limit():
    base = (0.03, 0.06, 0.12)
    assert T.extend([0.03, 0.06, 0.12], 0.06, base, 2, 3) == ([0.03, 0.06, 0.12], None)
    assert T.extend([0.03, 0.06, 0.12], 0.03, base, 2, 3) == ([0.015, 0.03, 0.06, 0.12], None)
    assert T.extend([0.03, 0.06, 0.12], 0.12, base, 2, 3) == ([0.03, 0.06, 0.12, 0.24], None)
    grid, stopped = T.extend([0.0075, 0.015, 0.03, 0.06, 0.12], 0.0075, base, 2, 2)
    assert grid == [0.0075, 0.015, 0.03, 0.06, 0.12] and "lowest after 2" in stopped


def _fake_runner(curve_of, log=None):
    """A runner that 'trains' by formula: curve_of(job) -> the score per step."""

    def run(jobs, label):
        if log is not None:
            log.append(label)
        return [_record(j["arm"], j["lr"], j["seed"], curve_of(j), task=j["task"]) | {"steps": j["steps"]} for j in jobs]

    return run


def _protocol():
    return load("full")


def test_tuning_extends_each_arm_until_its_choice_is_interior():
    protocol = _protocol()

    def curve(job):  # every arm peaks at 0.0075 (two extensions below the grid), except grpo at 0.06
        peak = 0.06 if job["arm"] == "grpo" else 0.0075
        level = max(0.0, 1 - abs(math.log2(job["lr"] / peak)) / 4)
        return [level] * job["steps"]

    rung = tune_rung(protocol, "target", 40, _fake_runner(curve))
    assert rung.rates["grpo"].winner == 0.06 and rung.grids["grpo"] == [0.03, 0.06, 0.12]
    assert rung.rates["ppo-lam0.95"].winner == 0.0075
    assert rung.grids["ppo-lam0.95"] == [0.00375, 0.0075, 0.015, 0.03, 0.06, 0.12]
    assert not rung.limits
    # every family's best is an arm of that family; exact ties go to the protocol's first arm
    assert rung.families["token-ppo"].winner == "ppo-lam0.95" and rung.families["token-ppo"].exact_tie
    assert rung.families["critic-free"].winner == "rloo"  # rloo at 0.0075 scores 1.0, grpo at 0.06 too: first listed


def test_calibration_climbs_the_ladder_until_the_best_arm_reaches_on_enough_tuning_runs():
    protocol = _protocol()
    labels = []

    def curve(job):  # grpo learns in 50 steps: reached on every seed only when the budget is 60 or more
        if job["arm"] == "grpo" and job["lr"] == 0.06:
            return [0.1] * 50 + [1.0] * (job["steps"] - 50) if job["steps"] > 50 else [0.5] * job["steps"]
        return [0.1] * job["steps"]

    plan = plan_task(protocol, "prefix", _fake_runner(curve, labels))
    assert [r.steps for r in plan.rungs] == [40, 60] and [r.passed for r in plan.rungs] == [False, True]
    assert plan.rung.best == "grpo" and plan.rung.reach == (len(protocol.tuning.seeds), len(protocol.tuning.seeds))
    # reported: 20 seeds for the four family bests, 5 for the rest, all at 60 steps
    by_arm = {}
    for r in plan.reported:
        by_arm.setdefault(r["arm"], set()).add(r["seed"])
    assert {a for a, seeds in by_arm.items() if len(seeds) == 20} == plan.decided_arms
    assert all(len(seeds) == 5 for a, seeds in by_arm.items() if a not in plan.decided_arms)
    assert all(r["steps"] == 60 for r in plan.reported) and plan.reported_complete


def test_decision_rule_uses_holm_over_tasks_and_the_direction_of_the_test():
    protocol = _protocol()

    def arm(name, family, times, events):
        o = S.Outcomes(np.array(times, dtype=float), np.array(events, dtype=bool))
        return A.ArmResult(name, family, 0.1, [{}] * len(times), {a: o for a in ("steps", "responses", "tokens")},
                           (0.0, 1.0), {}, 0.5)  # fmt: skip

    def result(task, p, z, ratio):
        c = A.ComparisonResult(task, "ma-ppo vs token-ppo", arm("fixed5", "ma-ppo", [1], [1]), arm("ppo", "token-ppo", [1], [1]),
                               {a: (z, p) for a in ("steps", "responses", "tokens")}, {a: (ratio, 0, 0) for a in ("steps", "responses", "tokens")})  # fmt: skip
        c.power = {"log-rank faster": 0.7}
        return c

    # Holm over 3 tasks: 0.01 * 3 = 0.03 < 0.05; 0.02 * 2 = 0.04 < 0.05; 0.2 stays out
    results = [result("target", 0.01, 2.5, 1.6), result("units", 0.02, -2.3, 0.7), result("prefix", 0.2, 1.0, 1.1)]
    A.decide(protocol, results)
    assert [r.verdict for r in results] == ["A sooner", "B sooner", "no difference detected"]
    assert [round(r.adjusted, 3) for r in results] == [0.03, 0.04, 0.2]
    # with one task's result missing, Holm still counts three tasks (the missing one as p = 1)
    partial = results[:2]
    A.decide(protocol, partial)
    assert [round(r.adjusted, 3) for r in partial] == [0.03, 0.04]
    (sentence,) = A.sentences(protocol, results, partial=False)
    assert sentence.startswith("MA-PPO (fixed5) against token PPO (ppo):")
    assert "fewer generated tokens to the threshold on `target`" in sentence and "more generated tokens to the threshold on `units`" in sentence
    assert "no difference was detected on `prefix`" in sentence and "0.70" in sentence


def test_protocol_reads_both_modes_and_its_digest_follows_its_content(tmp_path):
    full, quick = load("full"), load("quick")
    assert full.digest() != quick.digest() and full.digest() == load("full").digest()
    assert set(full.families) == {a.family for a in full.arms.values()}
    assert len(full.tuning.seeds) >= 3 and full.decided_seeds >= 20 and full.other_seeds >= 5
    text = (Path(__file__).resolve().parents[1] / "studies" / "credit" / "second" / "protocol.yaml").read_text()
    changed = tmp_path / "protocol.yaml"
    changed.write_text(text.replace("threshold: 0.8", "threshold: 0.7"))
    assert load("full", changed).digest() != full.digest()
    with pytest.raises(ValueError, match="no mode"):
        load("nonsense")


@pytest.mark.parametrize("edition", [2, 3])
def test_every_arm_resolves_to_a_stage_configuration(tmp_path, edition):
    """The protocol's flags are the stage's own options (a typo would fail only hours in)."""
    from studies.credit.protocol import PROTOCOL_FILES
    from studies.credit.runs import H

    protocol = load("full", PROTOCOL_FILES[edition])
    for name, arm in protocol.arms.items():
        stage = {k: v for k, v in protocol.stage.items() if k != "model"}
        config = H.ppo_config(tmp_path, policy="tiny", reward_model="tiny", dataset="unused.jsonl", **arm.flags, **stage)
        for key, value in arm.flags.items():
            assert getattr(config, key) == value, name


def test_the_cost_projection_counts_runs_as_the_protocol_does():
    from studies.credit.estimate import project, timing_jobs

    protocol = _protocol()
    jobs = timing_jobs(protocol)
    assert len(jobs) == len(protocol.tasks) * len(protocol.arms) and {j["steps"] for j in jobs} == {protocol.steps_ladder[0]}
    # one second per step for every arm: tuning = arms x 4 rates x 5 seeds x steps, reported = 4 x 20 + 10 x 5 runs
    records = [j | {"seconds": float(j["steps"])} for j in jobs]
    lines = project(protocol, records, workers=1)
    arms, seeds, first = len(protocol.arms), len(protocol.tuning.seeds), protocol.steps_ladder[0]
    reported = 4 * protocol.decided_seeds + (arms - 4) * protocol.other_seeds
    hours = len(protocol.tasks) * (arms * 4 * seeds * first + reported * first) / 3600
    assert f"{hours:.1f} h with 1 workers" in lines[1]


def test_runs_come_back_in_the_jobs_order_though_the_mc_runs_start_first(tmp_path):
    """The power simulation draws from the records in order: a study that trains its runs and
    one that only reads them must hand the analysis the same order, or their reports differ."""
    from marlhf_cli.artifacts import write_json
    from studies.credit.runs import job_path, make_job, run_jobs, saved

    protocol = _protocol()
    jobs = [make_job(protocol, "target", arm, 0.06, seed, 40) for arm in ("rloo", "mc-fixed5", "fixed5") for seed in (1000, 1001)]
    for job in jobs:  # every run saved already: nothing is trained
        path = job_path(tmp_path, job)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, job | {"score": [0.1] * 40})
    order = [(r["arm"], r["seed"]) for r in run_jobs(jobs, tmp_path, workers=1, threads=1, label="test")]
    assert order == [(j["arm"], j["seed"]) for j in jobs] == [(r["arm"], r["seed"]) for r in saved(tmp_path, jobs)]
