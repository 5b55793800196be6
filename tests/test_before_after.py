"""What a PPO run did to its held-out prompts (train/ppo/before_after.py): the paired gain
and its interval against a hand-written t-interval on random scores, and end to end on the
tiny model: the evaluation before training kept in samples/<name>-before.jsonl, the
samples --show-samples prints, and the gain line computed from the two files."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import t as student_t

from marlhf_cli.artifacts import read_jsonl
from marlhf_cli.train.ppo.before_after import paired_gain, sample_lines, shorten


def t_interval(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = student_t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def rows(scores: list[float], tag: str = "") -> list[dict]:
    return [{"prompt": f"prompt {i}", "response": f"{tag}{i}", "score": s} for i, s in enumerate(scores)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5)), min_size=2, max_size=40))
def test_paired_gain_is_the_mean_difference_with_its_t_interval(pairs):
    before, after = [p[0] for p in pairs], [p[1] for p in pairs]
    gain = paired_gain(rows(before), list(reversed(rows(after))))  # matched by prompt, not by position
    differences = [b - a for a, b in pairs]
    assert gain["prompts"] == len(pairs)
    assert gain["gain"] == pytest.approx(sum(differences) / len(pairs), abs=1e-9)
    if len(set(differences)) > 1:
        assert gain["gain_ci"] == pytest.approx(t_interval(differences), rel=1e-6, abs=1e-9)
    else:
        assert gain["gain_ci"] is None
    if len(set(after)) > 1:
        assert gain["after_ci"] == pytest.approx(t_interval(after), rel=1e-6, abs=1e-9)


def test_only_the_prompts_both_scored_count():
    gain = paired_gain(rows([0.0, 1.0, 2.0]), rows([1.0, 1.0])[:1] + [{"prompt": "other", "response": "", "score": 9.0}])
    assert gain["prompts"] == 1 and gain["gain"] == 1.0 and gain["gain_ci"] is None and gain["before_ci"] is None
    assert paired_gain(rows([1.0]), [{"prompt": "other", "response": "", "score": 1.0}]) is None


def test_sample_lines_show_each_prompt_before_and_after():
    lines = sample_lines(rows([0.25, 0.5], "old "), rows([0.75, 1.0], "new "), 1)
    assert lines == ["held-out prompt 1: prompt 0", "  before (0.250): old 0", "  after  (0.750): new 0"]
    assert shorten("a " * 200, 21) == "a a a a ... a a a a"


REWARD = '''
def length_share(completions, **kwargs):
    """The response's length in characters over 40, at most 1."""
    return [min(1.0, len(c) / 40) for c in completions]
'''


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_run_prints_its_held_out_prompts_before_and_after_and_the_paired_gain(tmp_path):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Item {i}: describe the colour {i}."}) + "\n" for i in range(30)))
    (tmp_path / "reward.py").write_text(REWARD)
    run = tmp_path / "run"
    args = ["ppo", "--policy", "tiny", "--reward", f"py:{tmp_path / 'reward.py'}:length_share", "--dataset", str(prompts),
            "--split-shares", "0/0/2/1", "--max-steps", "2", "--rollout-batch-size", "4", "--mini-batch-size", "4",
            "--max-new-tokens", "12", "--eval-every", "2", "--eval-prompts", "8", "--save-every", "0",
            "--run-dir", str(run), "--name", "demo"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--show-samples", "2"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    before, after = read_jsonl(run / "samples" / "demo-before.jsonl"), read_jsonl(run / "samples" / "demo.jsonl")
    assert len(before) == len(after) == 8  # a third of 30 prompts held out: 10, the first 8 evaluated
    assert [r["prompt"] for r in before] == [r["prompt"] for r in after]
    lines = result.output.splitlines()
    for index in (0, 1):  # the first two held-out prompts, each response as the files hold it
        at = lines.index(f"held-out prompt {index + 1}: {shorten(after[index]['prompt'])}")
        assert lines[at + 1] == f"  before ({before[index]['score']:.3f}): {shorten(before[index]['response'], 400)}"
        assert lines[at + 2] == f"  after  ({after[index]['score']:.3f}): {shorten(after[index]['response'], 400)}"
    assert "held-out prompt 3:" not in result.output
    differences = [b["score"] - a["score"] for a, b in zip(before, after)]
    gain = sum(differences) / 8
    shown = re.search(r"gain ([+-]\d\.\d{3})(?: \[(-?\d\.\d{3}), (-?\d\.\d{3})\])? \(paired\)", lines[-1])
    assert lines[-1].startswith("held-out score on 8 prompts") and shown, lines[-1]
    assert float(shown[1]) == pytest.approx(gain, abs=6e-4)
    if len(set(differences)) > 1:
        low, high = t_interval(differences)
        assert (float(shown[2]), float(shown[3])) == pytest.approx((low, high), abs=6e-4)
    metrics = json.loads((run / "run.json").read_text())["stages"]["ppo/demo"]["metrics"]
    assert metrics["eval_gain"]["gain"] == pytest.approx(gain) and metrics["eval_gain"]["prompts"] == 8

    # the same name again with no evaluation before training: the other run's samples are not its own
    again = CliRunner().invoke(app, [*args, "--eval-every", "0", "--show-samples", "2"], env={"COLUMNS": "400"})
    assert again.exit_code == 0, again.output
    assert not (run / "samples" / "demo-before.jsonl").exists()
    assert "held-out prompt 1" not in again.output and "(paired)" not in again.output
