"""The second edition (python -m studies.credit --edition 2) end to end on a protocol cut down to seconds: it calibrates,
tunes, runs the reported seeds through the PPO stage, saves one JSON per run, reports (tables,
comparisons, deviations, the README's sentence, both figures), and a second call trains
nothing and says the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STUDY = [sys.executable, "-m", "studies.credit"]  # the runner, from the repository root
ARMS = ("ppo-lam0.99", "fixed5", "grpo", "mc-fixed5")


def _tiny_protocol(folder: Path) -> Path:
    document = yaml.safe_load((ROOT / "studies" / "credit" / "second" / "protocol.yaml").read_text())
    document["arms"] = {name: arm for name, arm in document["arms"].items() if name in ARMS}
    document["modes"] = {"quick": {
        "folder": "tiny", "threshold": 0.5, "tasks": {"units": {"tokens": 10}}, "steps_ladder": [2],
        "calibration_reach": 0.8, "reported": {"decided_seeds": 2, "other_seeds": 1},
        "tuning": {"seeds": [1000], "lrs": [0.06, 0.12], "extend_factor": 2, "max_extensions": 0, "tie_tolerance": 1e-9},
        "power_simulations": 50, "bootstrap_resamples": 100,
    }}  # fmt: skip
    path = folder / "protocol.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _run(*args) -> str:
    done = subprocess.run([*STUDY, "--quick", *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_study_runs_saves_reports_and_resumes(tmp_path):
    protocol = _tiny_protocol(tmp_path)
    out = _run("--edition", "2", "--protocol", str(protocol), "--out", str(tmp_path), "--workers", "2")
    runs = sorted((tmp_path / "tiny" / "units").glob("*.json"))
    # tuning: 4 arms x 2 rates x 1 seed; reported: every arm is its family's best here, 2 seeds each
    assert len(runs) == 4 * 2 + 4 * 2
    record = json.loads(runs[0].read_text())
    assert len(record["score"]) == 2 and len(record["generated_tokens"]) == 2 and record["cpu"] and record["protocol"]
    mc = [json.loads(p.read_text()) for p in runs if p.name.startswith("mc-fixed5")]
    assert all(sum(r["generated_tokens"]) > 2 * 8 * 10 for r in mc)  # continuations cost tokens beyond the responses
    assert "# units: calibration at 2 steps: best arm" in out
    assert "restricted mean cost to threshold" in out and "log-rank z" in out and "power at alpha/1" in out
    # a two-rate grid with no extension allowed: every choice is on an edge, and each is a printed deviation
    assert "## deviations from protocol" in out and out.count("the grid was not extended further") == 4
    sentence = out.split("## the README's statement (the protocol's decision rule)")[1]
    assert "MA-PPO (fixed5) against token PPO (ppo-lam0.99):" in sentence
    for figure in ("kaplan_meier.png", "restricted_means.png"):
        assert (tmp_path / "tiny" / figure).stat().st_size > 10_000
    again = _run("--edition", "2", "--protocol", str(protocol), "--out", str(tmp_path), "--report-only")
    assert "runs to do" not in again and again.split("## the README's statement")[1] == out.split("## the README's statement")[1]


def test_a_bad_task_or_protocol_is_one_line(tmp_path):
    done = subprocess.run([*STUDY, "--edition", "2", "--tasks", "nonsense", "--report-only", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip().splitlines() == ["unknown task(s) nonsense: the protocol has target, units, prefix"]
    done = subprocess.run([*STUDY, "--protocol", str(tmp_path / "missing.yaml")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "cannot read the protocol" in done.stderr
