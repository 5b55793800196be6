"""The fifth edition's pilot report (studies/credit/fifth_report.py) from its committed records,
and the pilot's stop at a gate 1 that no reward model of its grid passes (issue 55)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from studies.credit import fifth, fourth
from studies.credit.fifth_report import pilot_lines

RECORDS = Path(__file__).resolve().parent.parent / "studies" / "credit" / "fifth-pilot"


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
