"""The third edition end to end on a protocol cut down to seconds (python -m studies.credit
--edition 3): the critic's rate, tuning at the largest token budget, calibration by cuts,
the reported runs, the report; every record carries its provenance and its explained
variance, spends the tokens the budget planned, and runs again bit for bit on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_credit_second_study import ROOT
from test_credit_second_study import _run as run_study

THIRD = ROOT / "studies" / "credit" / "third"
ARMS = ("fixed5", "fixed5-first", "rloo", "mc-fixed5")  # a critic arm, its sigma twin, and the two without a critic


def _tiny_protocol(folder: Path) -> Path:
    document = yaml.safe_load((THIRD / "protocol.yaml").read_text())
    document["arms"] = {name: arm for name, arm in document["arms"].items() if name in ARMS}
    document["families"] = {f: name for f, name in document["families"].items() if f != "token-ppo"}
    document["comparisons"] = [{"a": "fixed5-first", "b": "fixed5"}, {"a": "ma-ppo", "b": "critic-free"}, {"a": "mc", "b": "critic-free"}]
    document["decision"]["default_rule"]["comparisons"] = ["fixed5-first vs fixed5"]
    document["decision"]["default_rule"]["tasks"] = 1
    document["modes"] = {"quick": {
        "folder": "tiny", "threshold": 0.5, "tasks": {"units": {"tokens": 10}}, "budgets": [160, 240],
        "calibration_reach": 0.8, "reported": {"decided_seeds": 2, "other_seeds": 1},
        "critic": {"arms": ["fixed5"], "actor_lr": 0.06, "lrs": [0.03, 0.1], "budget": 160},
        # one rate: the grid and extension rules are tests/test_credit_third.py's, on synthetic runs
        "tuning": {"seeds": [1000], "lrs": [0.06], "pick": "reach", "extend_factor": 2, "max_extensions": 0, "tie_tolerance": 1e-9},
        "power_simulations": 50, "bootstrap_resamples": 100,
    }}  # fmt: skip
    path = folder / "protocol.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _run(*args) -> str:
    return run_study("--edition", "3", *args)


def _same_numbers(a: dict, b: dict, steps: int | None = None) -> None:
    for key in ("score", "generated_tokens", "explained_variance", "responses"):
        assert a[key][:steps] == b[key][:steps], key  # bit for bit: JSON floats round-trip exactly


@pytest.mark.slow
def test_the_third_edition_runs_reports_and_its_records_rerun_bit_for_bit(tmp_path):
    from marlhf_cli import provenance
    from studies.credit.protocol import load
    from studies.credit.runs import rerun, tokens_per_step

    protocol_file = _tiny_protocol(tmp_path)
    protocol = load("quick", protocol_file)
    out = _run("--protocol", str(protocol_file), "--out", str(tmp_path), "--workers", "2")
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "tiny" / "units").glob("*.json"))]
    # critic rate: 2 runs; tuning: 4 arms x 1 rate at 240 tokens; reported: every arm is compared here, 2 seeds each
    assert len(records) == 2 + 4 + 4 * 2
    for r in records:
        assert r["generated_tokens"] == [tokens_per_step(protocol, "units", r["arm"])] * len(r["score"])  # the budget's plan
        assert sum(r["generated_tokens"]) <= r["budget"]
        assert r["provenance"]["commit"] and r["provenance"]["cpu"]["model"] and r["threads"] == 1
        assert {"torch", "transformers", "deepspeed"} <= set(r["provenance"]["versions"])
        assert (r["critic_lr"] is None) == (r["arm"] in ("rloo", "mc-fixed5"))
        if r["critic_lr"] is None:  # no critic, nothing to fit
            assert all(v is None for v in r["explained_variance"])
        else:  # None (NaN) only at a step whose targets did not vary (every response scored alike)
            assert any(isinstance(v, float) for v in r["explained_variance"])
    assert [r["steps"] for r in records if r["arm"] == "mc-fixed5"][0] == 240 // (80 + 8 * 2 * 5)
    # at a constant learning rate a smaller budget's run is the larger one's, cut: the critic-rate
    # run (160 tokens) and the tuning run (240) of fixed5 at the same rates and seed agree step for step
    long = next(r for r in records if r["arm"] == "fixed5" and r["seed"] == 1000 and r["budget"] == 240)
    short = next(r for r in records if r["arm"] == "fixed5" and r["budget"] == 160 and r["critic_lr"] == long["critic_lr"])
    assert len(short["score"]) == 2 and len(long["score"]) == 3
    _same_numbers(short, {key: value[:2] for key, value in long.items() if isinstance(value, list)})
    assert "# units: critic rate " in out and "# units: calibration at 160 tokens: family bests reached" in out
    assert "Holm over all 3 decided tests" in out and "power at alpha/3" in out  # 3 comparisons x 1 task
    assert "## the segment value's default (the protocol's rule)" in out and "--value-function" in out.split("default (the protocol's rule)")[1]
    again = _run("--protocol", str(protocol_file), "--out", str(tmp_path), "--report-only")
    assert "runs to do" not in again and again.split("## the README's statement")[1] == out.split("## the README's statement")[1]
    # two saved records, a critic arm and mc, run again in a fresh process: the same numbers
    picked = [next(r for r in records if r["arm"] == "fixed5"), next(r for r in records if r["arm"] == "mc-fixed5")]
    assert all(record["provenance"]["cpu"] == provenance.cpu() for record in picked)
    for again, record in zip(rerun(picked), picked):
        _same_numbers(again, record)


def _committed_records() -> list[dict]:
    paths = sorted(p for p in THIRD.glob("*/*.json"))
    return [json.loads(p.read_text()) for p in paths]


@pytest.mark.slow
def test_committed_third_edition_records_rerun_bit_for_bit_on_their_machine():
    """Two of the edition's own saved runs, a critic arm's and one without a critic, re-executed
    where the CPU is the one they ran on (its model and flags decide torch's kernels, hence the
    rounding): their first 6 steps (the second edition's records departed at step 4 on another
    CPU), which at the edition's constant learning rate are the record's own first steps."""
    from marlhf_cli import provenance
    from studies.credit.runs import rerun

    records = [r for r in _committed_records() if r.get("provenance", {}).get("cpu") == provenance.cpu()]
    picked = [next((r for r in records if (r["critic_lr"] is None) == free), None) for free in (False, True)]
    if None in picked:
        pytest.skip("no records of the third edition, with and without a critic, were made on a CPU like this one")
    for again, record in zip(rerun(picked, steps=6), picked):
        _same_numbers(again, record, steps=6)
