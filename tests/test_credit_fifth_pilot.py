"""The fifth edition's pilot report (studies/credit/fifth_report.py) from its committed records,
and the pilot's stop at a gate 1 that no reward model of its grid passes (issue 55)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from studies.credit import fifth, fourth
from studies.credit.fifth_report import pilot_lines

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "studies" / "credit" / "fifth-pilot"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "fifth-pilot"
    shutil.copytree(RECORDS, root, ignore=shutil.ignore_patterns("work", "pilot-report.md"))
    return root


def test_the_committed_pilot_stops_at_gate_one_with_its_figures(tmp_path):
    root = _copy(tmp_path)
    gate = json.loads((root / "rm-gate.json").read_text())
    assert not fifth.gate1_passable(gate)
    text = "\n".join(pilot_lines(fourth.load("full", fifth.PILOT), root))
    assert "Gate 1 cannot be passed at this scale: the pilot stops here" in text
    assert "goes on with the reward model" not in text
    for lr, result in gate["by_lr"].items():  # each rate's row carries its own accuracy and verdict
        assert f"| {lr} | {result['pairs']} | {result['accuracy']:.3f} " in text
    models = json.loads((root / "models.json").read_text())
    hours = sum(run["steps"] * run["seconds_per_step"] for run in [models["sft"], *models["rm"].values()]) / 3600
    assert f"Their training steps took {hours:.2f} h" in text


def test_a_pilot_whose_reward_model_passes_goes_on(tmp_path):
    root = _copy(tmp_path)
    gate = json.loads((root / "rm-gate.json").read_text())
    first = next(iter(gate["by_lr"]))
    gate["by_lr"][first]["passed"] = True
    (root / "rm-gate.json").write_text(json.dumps(gate))
    assert fifth.gate1_passable(gate)
    text = "\n".join(pilot_lines(fourth.load("full", fifth.PILOT), root))
    assert "the pilot stops here" not in text and "goes on with the reward model" in text


def _pilot(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "studies.credit", "--edition", "5", "--pilot", "--quick", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
def test_the_quick_pilot_runs_every_phase_and_its_report_comes_again_from_the_records(tmp_path):
    """The pilot's whole course on its quick mode (the embedded HH sample, the tiny model), with
    a gate 1 its reward model passes so that the critic's and the curve's phases run too; then
    --report-only writes the same report from the records alone."""
    document = yaml.safe_load(fifth.PILOT.read_text())
    document["modes"]["quick"]["gate1"] = {"accuracy": 0.0, "alpha": 1.01}  # a bar every reward model passes (p <= 1)
    protocol = tmp_path / "pilot.yaml"
    protocol.write_text(yaml.safe_dump(document))
    done = _pilot("--out", str(tmp_path), "--protocol", str(protocol))
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    root = tmp_path / "fifth-pilot-quick"
    quick = fourth.load("quick", protocol)
    for name in ("data.json", "models.json", "rm-gate.json", "pilot-report.md"):
        assert (root / name).is_file(), name
    gate = json.loads((root / "rm-gate.json").read_text())
    assert fifth.gate1_passable(gate) and gate["protocol"] == quick["digest"] and gate["provenance"]["cpu"]["model"]
    critic, curve = fifth.records_of(root, "critic"), fifth.records_of(root, "curve")
    assert len(critic) == len(quick["critic"]["lrs"]) and len(curve) == 1
    assert [row["step"] for row in curve[0]["train"]] == list(range(1, quick["curve"]["steps"] + 1))
    assert curve[0]["eval"][0]["step"] == 0 and curve[0]["threads"] == quick["threads"]
    report = (root / "pilot-report.md").read_text()
    assert "goes on with the reward model" in report and "the pilot stops here" not in report
    again = _pilot("--out", str(tmp_path), "--protocol", str(protocol), "--report-only")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (root / "pilot-report.md").read_text() == report
