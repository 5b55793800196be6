"""The README's third command, ``marlhf ppo --preset cpu-real``, on its own path with the
tiny model in place of SmolLM2-135M: the project's posts, a third held out, the reward
template scoring every sample, two held-out prompts before and after and the paired gain
printed last."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from marlhf_cli.artifacts import read_jsonl
from marlhf_cli.cli import app
from marlhf_cli.config import TEMPLATES_DIR, resolve

POSTS = TEMPLATES_DIR / "prompts" / "tldr-posts.jsonl"


def concise_summary():
    spec = importlib.util.spec_from_file_location("concise_summary", TEMPLATES_DIR / "rewards" / "concise_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.concise_summary


def test_the_posts_are_tldr_prompts_the_reward_reads():
    prompts = [json.loads(line)["prompt"] for line in POSTS.read_text().splitlines()]
    assert len(prompts) == len(set(prompts)) == 72
    for prompt in prompts:
        assert prompt.startswith("SUBREDDIT: r/") and "\nTITLE: " in prompt and "\nPOST: " in prompt and prompt.endswith("\nTL;DR:")
    config = resolve("ppo", preset="cpu-real")
    assert config.policy == "smollm2-135m" and config.eval_prompts == 24 and config.split_shares == "0/0/2/1"


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_cpu_real_runs_its_path_on_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository's root: the preset names the installed package's files
    run = tmp_path / "run"
    args = ["ppo", "--preset", "cpu-real", "--policy", "tiny", "--max-steps", "2", "--eval-every", "2", "--eval-prompts", "6",
            "--rollout-batch-size", "4", "--mini-batch-size", "4", "--max-new-tokens", "8", "--run-dir", str(run)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "ppo: training on 48 of the 72 records of " in result.output and "/templates/prompts/tldr-posts.jsonl (ppo 66.7%, eval 33.3%" in result.output
    before, after = read_jsonl(run / "samples" / "fixed5-before.jsonl"), read_jsonl(run / "samples" / "fixed5.jsonl")
    held_out = {row["prompt"] for row in before}
    assert len(before) == 6 and held_out == {row["prompt"] for row in after}
    score = concise_summary()
    for row in before + after:  # the template's score of the response as sampled
        assert row["score"] == pytest.approx(score([row["prompt"]], [row["response"]])[0], abs=1e-6)
    lines = result.output.splitlines()
    assert sum(line.startswith("held-out prompt ") for line in lines) == 2
    assert lines[-1].startswith("held-out score on 6 prompts") and lines[-1].endswith("(paired)"), lines[-1]
