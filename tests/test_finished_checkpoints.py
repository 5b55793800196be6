"""A finished stage keeps its model, not the means to resume it: small run directories."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from _toy_prefs import write_toy_preferences
from marlhf_cli import checkpoints
from marlhf_cli.cli import app


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_finished_stage_keeps_only_the_trainer_state_of_its_checkpoints(tmp_path):
    data = write_toy_preferences(tmp_path / "prefs.jsonl")
    run_dir = tmp_path / "run"
    args = ["sft", "--model", "tiny", "--dataset", str(data), "--run-dir", str(run_dir),
            "--max-steps", "3", "--save-every", "1", "--eval-records", "0", "--batch-size", "2",
            "--max-prompt-length", "16", "--max-response-length", "8"]  # fmt: skip
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    kept = checkpoints.list_checkpoints(run_dir / "sft" / "checkpoints")
    # the two last saved before the final step (a damaged newest one falls back to the other),
    # and the finished run's state at its end
    assert [p.name for p in kept] == ["step-000001", "step-000002", "step-000003"]
    for folder in kept:
        assert sorted(p.name for p in folder.iterdir()) == [checkpoints.STATE_FILE]
        assert checkpoints.read_state(folder)["finished"] is True
    assert _size(run_dir / "sft" / "checkpoints") < 16384 < _size(run_dir / "sft")  # the exported model stays

    again = CliRunner().invoke(app, [*args, "--resume"])
    assert again.exit_code == 2
    *before, message = again.output.strip().splitlines()  # the start-up line on the data, then the error
    assert message.startswith("error: --resume") and "without --resume" in message
    assert not any(line.startswith("error") for line in before)
    # the run finished its 3 steps; its last checkpoint (step 2) is no description of it
    assert "finished all its 3 steps" in message and "step 2" not in message
    changed = CliRunner().invoke(app, [*args, "--batch-size", "4", "--resume"])
    assert changed.exit_code == 2 and "--batch-size was 2, now 4" in " ".join(changed.output.split())  # options are still compared


def test_resume_with_no_checkpoint_is_an_error_not_a_fresh_run(tmp_path, monkeypatch):
    """A typo in --run-dir used to become a run from scratch: --resume with nothing to resume
    is one line and exit 2 (as Hugging Face's Trainer refuses resume_from_checkpoint=True),
    for ppo before any model is loaded."""
    from marlhf_cli.train import ppo

    data = write_toy_preferences(tmp_path / "prefs.jsonl")
    typo = tmp_path / "runs-typo"
    sft = CliRunner().invoke(app, ["sft", "--model", "tiny", "--dataset", str(data), "--run-dir", str(typo), "--max-steps", "2",
                                   "--batch-size", "2", "--resume"])  # fmt: skip
    assert sft.exit_code == 2
    message = sft.output.strip().splitlines()[-1]
    assert message.startswith(f"error: --resume: no checkpoint in {typo / 'sft' / 'checkpoints'}") and "nothing to resume" in message
    assert not (typo / "sft" / "config.json").exists()

    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded for a run with nothing to resume")

    monkeypatch.setattr(ppo, "build_models", no_models)
    refused = CliRunner().invoke(app, ["ppo", "--policy", "tiny", "--reward-model", "tiny", "--dataset", str(data),
                                       "--run-dir", str(typo), "--resume"])  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert f"error: --resume: no checkpoint in {typo / 'ppo' / 'fixed5' / 'checkpoints'}" in " ".join(refused.output.split())
