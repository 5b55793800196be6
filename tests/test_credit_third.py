"""The third credit study's rules (studies/credit/ with third/protocol.yaml)
on synthetic runs: token budgets (a smaller budget is the longer run cut), the critic's rate by
explained variance, rates and arms picked by reach with ties to the lower rate, calibration
over token budgets until every family's best reaches, Holm over every decided test, and the
rule for --value-function's default. The end-to-end run through the PPO stage, and the
bit-for-bit rerun of saved records, are in tests/test_credit_third_study.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from studies.credit import analysis as A
from studies.credit import survival as S
from studies.credit import tuning as T
from studies.credit.protocol import PROTOCOL_FILES, load
from studies.credit.runs import make_job, tokens_per_step
from studies.credit.study import plan_task

AXES = ("steps", "responses", "tokens")


def _protocol(mode="full"):
    return load(mode, PROTOCOL_FILES[3])


def _fake_runner(curve_of, fit_of=lambda job: 0.5, log=None):
    """'Trains' by formula: curve_of(job) -> score per step; fit_of(job) -> explained variance."""

    def run(jobs, label):
        if log is not None:
            log.append(label)
        protocol = _protocol()
        out = []
        for j in jobs:
            per_step = tokens_per_step(protocol, j["task"], j["arm"])
            fit = fit_of(j) if j["critic_lr"] is not None else None
            out.append(j | {"score": list(curve_of(j)), "responses": [8.0] * j["steps"], "generated_tokens": [float(per_step)] * j["steps"],
                            "explained_variance": [fit] * j["steps"], "cpu": "test"})  # fmt: skip
        return out

    return run


def test_the_third_protocol_reads_and_keeps_the_second_editions_hash():
    third, quick = _protocol(), _protocol("quick")
    assert third.edition == 3 and third.budgets and not third.steps_ladder and third.unit == "tokens"
    assert third.tests() == 4 * 3 and third.correction == "holm-all"
    assert len(third.tuning.seeds) >= 8 and third.tuning.pick == "reach" and third.decided_seeds >= 20
    assert third.stage["lr_scheduler"] == "constant"  # what makes a smaller budget a cut of a longer run
    assert third.side_arms("ma-ppo") == ("fixed5", "fixed5-first", "ppl", "ppl-first") and third.side_arms("rloo") == ("rloo",)
    assert quick.digest() != third.digest()
    assert load("full").digest() == "8cde3443cd10"  # the second edition's runs still match their protocol


def test_a_token_budget_buys_each_arm_the_steps_its_tokens_allow():
    protocol = _protocol()
    # 8 responses x 32 tokens; mc: + 8 x M=2 continuations from boundaries 5, 10, ..., 30 to token 32
    assert tokens_per_step(protocol, "target", "fixed5") == 256
    assert tokens_per_step(protocol, "target", "mc-fixed5") == 256 + 16 * (27 + 22 + 17 + 12 + 7 + 2) == 1648
    assert tokens_per_step(protocol, "units", "mc-fixed5") == 240 + 16 * (25 + 20 + 15 + 10 + 5)
    job = make_job(protocol, "target", "mc-fixed5", 0.06, 0, 17920, critic_lr=0.03)
    assert job["steps"] == 17920 // 1648 and job["budget"] == 17920 and job["critic_lr"] is None  # no critic: no rate
    job = make_job(protocol, "target", "fixed5", 0.06, 0, 17920, critic_lr=0.03)
    assert job["steps"] == 70 and job["critic_lr"] == 0.03


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(50, 300), min_size=1, max_size=30), st.integers(0, 4000))
def test_a_cut_keeps_exactly_the_steps_that_fit_in_the_budget(tokens, budget):
    record = {"score": list(range(len(tokens))), "responses": [8.0] * len(tokens), "generated_tokens": [float(t) for t in tokens],
              "explained_variance": [0.5] * len(tokens), "arm": "a"}  # fmt: skip
    cut = T.cut(record, budget)
    k = len(cut["score"])
    assert sum(tokens[:k]) <= budget and (k == len(tokens) or sum(tokens[: k + 1]) > budget)
    assert cut["score"] == record["score"][:k] and len(cut["generated_tokens"]) == len(cut["explained_variance"]) == k


def test_rates_and_arms_are_picked_by_reach_with_ties_to_the_lower_rate():
    protocol = _protocol()
    seeds = protocol.tuning.seeds

    def curve(job):  # reach on every seed at 0.06 and 0.12 for fixed5-first; fixed5 only at 0.12, on odd seeds
        lr, arm, seed = job["lr"], job["arm"], job["seed"]
        if arm == "fixed5-first" and lr >= 0.06:
            return [1.0] * job["steps"]
        if arm == "fixed5" and lr == 0.12 and seed % 2:
            return [1.0] * job["steps"]
        if arm == "fixed5" and lr == 0.03:
            return [0.75] * job["steps"]  # the highest mean score, but it never reaches 0.8: not picked
        return [0.1] * job["steps"]

    plan = plan_task(protocol, "target", _fake_runner(curve))
    rung = plan.rungs[-1]
    assert rung.rates["fixed5-first"].winner == 0.06 and rung.rates["fixed5-first"].exact_tie  # 0.06 and 0.12 tie: the lower
    assert rung.rates["fixed5"].winner == 0.12 and rung.rates["fixed5"].score == pytest.approx(0.5)
    assert rung.families["ma-ppo"].winner == "fixed5-first"
    # an edge choice that reached extends the grid (0.12 -> 0.24 for fixed5); an arm that never reached does not
    assert rung.grids["fixed5"] == [0.03, 0.06, 0.12, 0.24] and rung.grids["rloo"] == [0.03, 0.06, 0.12]
    assert len({r["seed"] for r in rung.records}) == len(seeds)


def test_the_critic_rate_is_the_best_fit_and_every_critic_run_uses_it():
    protocol = _protocol()
    log = []
    fit = {0.01: 0.2, 0.03: 0.6, 0.1: 0.4}
    plan = plan_task(protocol, "units", _fake_runner(lambda j: [0.1] * j["steps"], lambda j: fit.get(j["critic_lr"], 0.5), log))
    assert plan.critic.lr == 0.03 and log[0].startswith("units critic rate")
    assert {r["critic_lr"] for r in plan.reported if r["arm"] in ("fixed5", "ppl-first", "ppo-lam1.0")} == {0.03}
    assert {r["critic_lr"] for r in plan.reported if r["arm"] in ("rloo", "mc-fixed5")} == {None}


def test_calibration_climbs_the_token_budgets_until_every_family_best_reaches():
    protocol = _protocol()
    log = []

    def curve(job):  # everything learns at step 3, except token PPO: at step 50 (beyond 40 steps, within 55)
        start = 50 if job["arm"].startswith("ppo") else 3
        return [0.1] * start + [1.0] * (job["steps"] - start)

    plan = plan_task(protocol, "prefix", _fake_runner(curve, log=log))
    assert [r.steps for r in plan.rungs] == [10240, 14080] and [r.passed for r in plan.rungs] == [False, True]
    assert sum("tuning" in label for label in log) == 1  # tuned once, at the largest budget; the smaller ones are cuts
    assert {r["budget"] for r in plan.reported} == {14080}
    seeds = {}
    for r in plan.reported:
        seeds.setdefault(r["arm"], set()).add(r["seed"])
    # every arm a comparison uses has 20 seeds: the four MA-PPO arms, token PPO's best, RLOO, mc
    assert {a for a, s in seeds.items() if len(s) == 20} == plan.decided_arms == set(protocol.arms) - {"ppo-lam1.0"}
    assert len(seeds["ppo-lam1.0"]) == 5 and plan.reported_complete


def _result(name, task, p, z, ratio):
    def arm(label):
        o = S.Outcomes(np.array([1.0]), np.array([True]))
        return A.ArmResult(label, "f", 0.1, [{}], {a: o for a in AXES}, (0.0, 1.0), {}, 0.5)

    c = A.ComparisonResult(task, name, arm("a"), arm("b"), {a: (z, p) for a in AXES}, {a: (ratio, 0, 0) for a in AXES})
    c.power = {"log-rank faster": 0.5}
    return c


def test_holm_runs_over_every_decided_test_and_the_default_follows_the_rule():
    protocol = _protocol()
    names = [f"{c.a} vs {c.b}" for c in protocol.comparisons]
    # first sooner on two tasks for both rules, at p = 0.001 each (x12, x11, ... stays below 0.05)
    results = [_result(n, t, 0.001, 3.0, 1.5) for n in names[:2] for t in ("target", "units")]
    results += [_result(names[2], "target", 0.004, 2.0, 1.2)]  # 0.004 x 8 = 0.032: decided
    A.decide(protocol, results)
    assert all(r.verdict == "A sooner" for r in results)
    assert sorted(round(r.adjusted, 4) for r in results) == [0.012, 0.012, 0.012, 0.012, 0.032]  # Holm's m: all 12 tests
    (line,) = A.default_value_function(protocol, results, partial=False)
    assert line.startswith("the default of --value-function becomes `first`")
    # one rule sooner on a single task: the paper's equal stays
    A.decide(protocol, results[1:])
    (line,) = A.default_value_function(protocol, results[1:], partial=False)
    assert "stays the paper's `equal`" in line and "fixed5-first vs fixed5: sooner on 1 task(s) (units)" in line
    sentence = A.sentences(protocol, results, partial=False)[2]
    assert sentence.startswith("MA-PPO (a) against token PPO (b): needed fewer generated tokens")


def test_the_report_tells_machines_apart_by_their_flags():
    """Two CPUs of one model can differ in vector units, hence in rounding: the third edition's
    machines line counts runs per model and flags (the second edition's records have no flags)."""
    from studies.credit.report import machine

    assert machine({"cpu": "AMD EPYC"}) == "AMD EPYC"
    assert machine({"cpu": "AMD EPYC", "provenance": {"cpu": {"model": "AMD EPYC", "flags": ["avx2", "fma"]}}}) == "AMD EPYC (avx2, fma)"


def test_the_segment_values_arms_are_also_compared_at_each_rate_they_share():
    """The exploratory same-rate table: for the comparisons of two named arms (sigma alone
    differs), every rate both grids hold, from the tuning runs cut to the task's budget; a
    family comparison (MA-PPO against token PPO) has no such rows."""
    protocol = _protocol()

    def curve(job):  # `first` learns at step 3 at every rate, `equal` at step 13 at 0.06 and never elsewhere
        if job["arm"].endswith("-first"):
            start = 3
        elif job["arm"] in ("fixed5", "ppl") and job["lr"] == 0.06:
            start = 13
        else:
            start = job["steps"]
        return [0.1] * start + [1.0] * (job["steps"] - start)

    plan = plan_task(protocol, "target", _fake_runner(curve))
    rows = A.same_rate(protocol, plan)
    assert {r.name for r in rows} == {"fixed5-first vs fixed5", "ppl-first vs ppl"}
    fixed = {r.lr: r for r in rows if r.name == "fixed5-first vs fixed5"}
    assert set(fixed) == set(plan.rung.grids["fixed5-first"]) & set(plan.rung.grids["fixed5"])
    at = fixed[0.06]
    assert (at.a.reached, at.b.reached, len(at.a)) == (8, 8, 8)
    # every run reaches at its 7th or 17th step (5-step trailing mean): 7 x 256 against 17 x 256 tokens
    assert at.ratio == pytest.approx(17 / 7) and at.logrank[0] > 0
    assert fixed[0.03].b.reached == 0 and fixed[0.03].ratio > 1
