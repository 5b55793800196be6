"""A fresh (non-resume) run replaces what an earlier run of the same stage left: interrupted
after it started, it must not leave the earlier run's finished model, samples and plots
beside its own "running" entry in run.json (a finished-looking mix of two runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _toy_prefs import write_toy_preferences
from marlhf_cli import config as config_module
from marlhf_cli.artifacts import RunDir
from marlhf_cli.errors import UserError

# draw_plots: an earlier run's plots must be gone, the new run's there
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread", "draw_plots")]


class Interrupted(Exception):
    """Stands for a crash or Ctrl-C in the middle of the second run."""


def _status(run: Path, stage: str) -> str:
    return json.loads((run / "run.json").read_text())["stages"][stage]["status"]


def test_interrupted_fresh_sft_leaves_no_earlier_model(tmp_path, monkeypatch):
    from marlhf_cli.train import loop, sft

    data = write_toy_preferences(tmp_path / "prefs.jsonl", n=40)
    flags = dict(model="tiny", dataset=str(data), batch_size=4, max_steps=2, eval_records=4, save_every=0,
                 max_prompt_length=16, max_response_length=8, run_dir=str(tmp_path / "run"))  # fmt: skip
    sft.run(config_module.resolve("sft", flags=flags))
    run = tmp_path / "run"
    assert (run / "sft" / "config.json").is_file() and (run / "plots" / "sft-loss.png").is_file()
    old_events = set((run / "tb" / "sft").iterdir())
    assert old_events

    # an option error stops before anything is touched: a typo must not cost the results
    with pytest.raises(UserError):
        sft.run(config_module.resolve("sft", flags={**flags, "dataset": str(tmp_path / "missing.jsonl")}))
    assert (run / "sft" / "model.safetensors").is_file() and _status(run, "sft") == "finished"

    def crash(*args, **kwargs):
        raise Interrupted

    monkeypatch.setattr(loop, "train_step", crash)
    with pytest.raises(Interrupted):
        sft.run(config_module.resolve("sft", flags={**flags, "lr": 1e-3}))
    assert _status(run, "sft") == "running"
    with pytest.raises(UserError, match="run 'marlhf sft"):
        RunDir(run).require("sft")  # later stages see no finished SFT model
    assert sorted(p.name for p in (run / "sft").iterdir()) in ([], ["checkpoints"])
    assert not (run / "plots" / "sft-loss.png").exists()
    assert not old_events & set((run / "tb" / "sft").iterdir())  # TensorBoard shows this run only


def test_interrupted_fresh_ppo_leaves_no_earlier_model_or_samples(tmp_path):
    from marlhf_cli.train import ppo
    from marlhf_cli.scoring.rewards import TokenFractionReward

    flags = dict(policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=2, mini_batch_size=2,
                 max_new_tokens=4, max_prompt_length=32, max_steps=1, eval_every=1, eval_prompts=2, save_every=0,
                 name="mine", run_dir=str(tmp_path))  # fmt: skip
    ppo.run(config_module.resolve("ppo", flags=flags), reward_fn=TokenFractionReward(range(100)))
    other = dict(flags, name="mine-b")  # a run whose name extends this one's: kept
    ppo.run(config_module.resolve("ppo", flags=other), reward_fn=TokenFractionReward(range(100)))
    assert (tmp_path / "samples" / "mine.jsonl").is_file() and (tmp_path / "ppo" / "mine" / "config.json").is_file()

    class Failing:
        name = "failing"

        def __call__(self, batch):
            raise Interrupted

    with pytest.raises(Interrupted):
        ppo.run(config_module.resolve("ppo", flags={**flags, "eval_every": 0}), reward_fn=Failing())
    assert _status(tmp_path, "ppo/mine") == "running"
    with pytest.raises(UserError):
        RunDir(tmp_path).require("ppo", "mine")
    assert not (tmp_path / "samples" / "mine.jsonl").exists()
    assert not (tmp_path / "ppo" / "mine" / "critic").exists()
    assert not [m for m in ("score", "kl", "reward") if (tmp_path / "plots" / f"ppo-mine-{m}.png").exists()]
    # the other run is untouched
    assert (tmp_path / "samples" / "mine-b.jsonl").is_file() and (tmp_path / "ppo" / "mine-b" / "config.json").is_file()
    assert (tmp_path / "plots" / "ppo-mine-b-score.png").is_file()
