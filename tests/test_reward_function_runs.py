"""A reward function the test writes, end to end on the tiny model: ``marlhf ppo --preset
cpu-tiny --reward py:...`` with gae and grpo (no rm/ needed), ``bon`` and ``passk`` picking
and tabulating by its scores, and a function that fails mid-run: every process stops, the
last completed step is checkpointed, and ``--resume`` after the fix reproduces the
uninterrupted run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from marlhf_cli import config as config_module
from marlhf_cli.artifacts import read_jsonl
from marlhf_cli.errors import UserError

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

# per process or per machine: timings, and the static-cache buckets a process made (a resumed
# process makes its own: marlhf_cli/generation/compiled.py)
VOLATILE = ("time", "step_time", "generation_time", "scoring_time", "credit_time", "training_time", "tokens_per_second",
            "generation_captures", "generation_replays")

REWARD = '''
def overlap(prompts, completions, answer, **kwargs):
    """The share of the answer's characters that the response uses."""
    return [len(set(c) & set(a)) / len(set(a)) for c, a in zip(completions, answer)]


def brevity(completions, **kwargs):
    return [-len(c) / 10 for c in completions]
'''
# the same function, raising from its FAIL_FROM-th call on (a bug that shows up mid-run)
FLAKY = REWARD + '''
calls = [0]
_good = overlap


def overlap(prompts, completions, answer, **kwargs):
    calls[0] += 1
    if calls[0] >= FAIL_FROM:
        raise KeyError("no such answer")
    return _good(prompts, completions, answer, **kwargs)
'''


def overlap(response: str, answer: str) -> float:
    return len(set(response) & set(answer)) / len(set(answer))


@pytest.fixture
def task(tmp_path) -> dict:
    rows = [{"prompt": f"Question {i}: spell the word number {i}.", "answer": f"word{i}xyz"} for i in range(40)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    reward = tmp_path / "task_reward.py"
    reward.write_text(REWARD, encoding="utf-8")
    return {"prompts": prompts, "reward": reward, "answers": {r["prompt"]: r["answer"] for r in rows}}


def invoke(*args: str):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def assert_scores_are_the_functions(rows: list[dict], answers: dict, key: str = "score") -> None:
    assert rows
    for row in rows:
        assert row[key] == pytest.approx(overlap(row["response"], answers[row["prompt"]]), rel=1e-6, abs=1e-7)


# ---------------------------------------------------------------------------------------
# ppo, every estimator


@pytest.mark.parametrize("advantage, extra, name", [
    ("gae", [], "fixed5"),
    ("grpo", ["--rollout-batch-size", "2", "--loss-aggregation", "token-sum"], "grpo-token-sum"),
])  # fmt: skip
def test_ppo_scores_with_the_function_and_needs_no_reward_model(tmp_path, task, advantage, extra, name):
    run = tmp_path / "run"
    result = invoke(
        "ppo", "--preset", "cpu-tiny", "--run-dir", run, "--dataset", task["prompts"], "--policy", "tiny",
        "--reward", f"py:{task['reward']}:overlap", "--advantage", advantage, "--max-steps", "2",
        "--rollout-batch-size", "4", "--mini-batch-size", "4", "--eval-prompts", "4", "--eval-every", "1",
        "--save-every", "0", *extra,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"reward py:{task['reward']}:overlap" in result.output
    samples = read_jsonl(run / "samples" / f"{name}.jsonl")
    assert len(samples) == 4
    assert_scores_are_the_functions(samples, task["answers"])
    assert not (run / "rm").exists()
    assert (run / "ppo" / name / "critic").exists() == (advantage == "gae")  # gae's critic: from the policy
    stage = json.loads((run / "run.json").read_text())["stages"][f"ppo/{name}"]
    assert stage["status"] == "finished" and stage["inputs"]["reward"] == f"py:{task['reward']}:overlap"
    evals = [r for r in read_jsonl(run / "metrics" / f"ppo-{name}.jsonl") if r["split"] == "eval"]
    assert evals[-1]["score"] == pytest.approx(sum(r["score"] for r in samples) / 4, rel=1e-6)


def test_several_rewards_score_with_their_weighted_sum_and_log_each(tmp_path, task):
    run, spec = tmp_path / "run", f"py:{task['reward']}"
    result = invoke(
        "ppo", "--preset", "cpu-tiny", "--run-dir", run, "--dataset", task["prompts"], "--policy", "tiny",
        "--reward-model", "tiny", "--reward", "model", "--reward", f"{spec}:overlap,{spec}:brevity",
        "--reward-weights", "1,2,-0.5", "--advantage", "grpo", "--max-steps", "2", "--rollout-batch-size", "2",
        "--mini-batch-size", "4", "--eval-prompts", "4", "--eval-every", "2", "--save-every", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"2 x {spec}:overlap + -0.5 x {spec}:brevity" in result.output
    samples = read_jsonl(run / "samples" / "grpo.jsonl")
    assert len(samples) == 4
    assert_scores_are_the_functions(samples, task["answers"], key="score_overlap")
    for row in samples:
        assert row["score_brevity"] == pytest.approx(-len(row["response"]) / 10)
        assert row["score"] == pytest.approx(row["score_model"] + 2 * row["score_overlap"] - 0.5 * row["score_brevity"], abs=1e-5)
    assert len({row["score_model"] for row in samples}) > 1  # the tiny reward model's scores, not a constant
    rows = read_jsonl(run / "metrics" / "ppo-grpo.jsonl")
    for row in rows:  # each step's and evaluation's mean: the same weighted sum of the parts' means
        assert row["score"] == pytest.approx(row["score_model"] + 2 * row["score_overlap"] - 0.5 * row["score_brevity"], abs=1e-5)
    assert [row["split"] for row in rows].count("train") == 2
    summary = json.loads((run / "run.json").read_text())["stages"]["ppo/grpo"]["metrics"]
    assert {"score_model", "score_overlap", "score_brevity"} <= summary.keys()


# ---------------------------------------------------------------------------------------
# a function that fails mid-run: nothing is lost


def _config(run_dir: Path, prompts: Path, reward: Path, **flags):
    base = dict(policy="tiny", dataset=str(prompts), reward=f"py:{reward}:overlap", rollout_batch_size=4,
                mini_batch_size=2, max_new_tokens=8, max_prompt_length=48, max_steps=4, eval_every=0,
                eval_prompts=4, save_every=0, actor_lr=1e-3, critic_lr=1e-3, run_dir=str(run_dir))  # fmt: skip
    return config_module.resolve("ppo", flags={**base, **flags})


def _history(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in read_jsonl(run_dir / "metrics" / "ppo-fixed5.jsonl")]


@pytest.mark.parametrize("fail_from, where", [
    (3, "the rollout of step 3"),  # calls 1, 2: steps 1 and 2; call 3: step 3's rollout
    (5, "the final evaluation"),  # calls 1-4: the steps; call 5: the evaluation after step 4
])  # fmt: skip
def test_a_failing_function_stops_with_a_checkpoint_and_resume_reproduces_the_run(tmp_path, task, fail_from, where):
    from marlhf_cli.train import ppo

    straight = tmp_path / "straight"
    ppo.run(_config(straight, task["prompts"], task["reward"]))

    flaky = tmp_path / "flaky_reward.py"
    flaky.write_text(FLAKY.replace("FAIL_FROM", str(fail_from)), encoding="utf-8")
    broken = tmp_path / "broken"
    with pytest.raises(UserError) as caught:
        ppo.run(_config(broken, task["prompts"], flaky))
    message = str(caught.value)
    completed = fail_from - 1
    assert message.startswith(f"reward function py:{flaky}:overlap raised KeyError: 'no such answer' for response 1 of 4")
    assert message.endswith(f"stopped after step {completed}, whose checkpoint is saved: fix it, then rerun with --resume"), where
    stage = json.loads((broken / "run.json").read_text())["stages"]["ppo/fixed5"]
    assert stage["status"] == "failed"
    checkpoints = broken / "ppo" / "fixed5" / "checkpoints"
    assert (checkpoints / "actor" / "latest").read_text().strip() == f"step-{completed:06d}"
    assert (checkpoints / "critic" / "latest").read_text().strip() == f"step-{completed:06d}"

    flaky.write_text(REWARD, encoding="utf-8")  # the fix
    os.utime(flaky, ns=(flaky.stat().st_atime_ns, flaky.stat().st_mtime_ns + 10**9))
    ppo.run(_config(broken, task["prompts"], flaky, resume=True))
    assert _history(broken) == _history(straight)
    assert read_jsonl(broken / "samples" / "fixed5.jsonl") == read_jsonl(straight / "samples" / "fixed5.jsonl")
    assert json.loads((broken / "run.json").read_text())["stages"]["ppo/fixed5"]["status"] == "finished"


# ---------------------------------------------------------------------------------------
# bon and passk


def test_bon_picks_the_best_by_the_function(tmp_path, task):
    run = tmp_path / "run"
    result = invoke("bon", "--preset", "cpu-tiny", "--run-dir", run, "--dataset", task["prompts"], "--policy", "tiny",
                    "--reward", f"py:{task['reward']}:overlap", "--temperature", "1.0")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"reward function py:{task['reward']}:overlap" in result.output
    cached = json.loads((run / "bon" / "tiny" / "t1.json").read_text())["rows"]
    samples = [{"prompt": row["prompt"], **s} for row in cached for s in row["samples"]]
    assert_scores_are_the_functions(samples, task["answers"])
    best = read_jsonl(run / "bon" / "tiny-best.jsonl")
    assert_scores_are_the_functions(best, task["answers"])
    for row in cached:  # the chosen response is the function's favourite among the prompt's samples
        top = max(s["score"] for s in row["samples"])
        assert next(b for b in best if b["prompt"] == row["prompt"])["score"] == top
    assert not (run / "rm").exists()


def test_passk_tabulates_the_functions_scores(tmp_path, task):
    run = tmp_path / "run"
    result = invoke("passk", "--run-dir", run, "--dataset", task["prompts"], "--model", "tiny", "--split", "all",
                    "--limit", "5", "--n", "2", "--k", "1,2", "--max-new-tokens", "8",
                    "--reward", f"py:{task['reward']}:overlap")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((run / "passk" / "tiny.json").read_text())
    rows = read_jsonl(run / "passk" / "tiny-samples.jsonl")
    assert len(rows) == 10 and report["sandbox"] is None and report["reward"] == f"py:{task['reward']}:overlap"
    prompts = {r["prompt"]: r["answer"] for r in (json.loads(line) for line in task["prompts"].read_text().splitlines())}
    by_id = list(prompts)[:5]
    for row in rows:
        index = int(row["problem_id"].split("-")[1])
        assert row["reward"] == pytest.approx(overlap(row["response"], prompts[by_id[index]]))
        assert row["status"] == ("passed" if row["reward"] >= 1.0 else "failed")
    overall = next(r for r in report["table"] if r["difficulty"] == "all")
    assert overall["mean_score"] == pytest.approx(sum(r["reward"] for r in rows) / 10)
    passed = [sum(r["status"] == "passed" for r in rows if r["problem_id"] == f"problem-{i}") for i in range(5)]
    assert overall["pass@2"] == pytest.approx(sum(p > 0 for p in passed) / 5)
    assert "mean score" in result.output


def test_a_function_failing_on_one_process_stops_both(tmp_path, task):
    """Process 1's error must not leave process 0 waiting in the update's all-reduce."""
    import subprocess
    import sys

    from test_ppo_resume import environment

    one_sided = tmp_path / "one_sided.py"
    one_sided.write_text(REWARD + '''
import os
calls = [0]
_good = overlap


def overlap(prompts, completions, answer, **kwargs):
    calls[0] += 1
    if calls[0] >= 2 and os.environ.get("RANK") == "1":
        raise ValueError("only on the second process")
    return _good(prompts, completions, answer, **kwargs)
''', encoding="utf-8")  # fmt: skip
    run = tmp_path / "run"
    result = subprocess.run([
        sys.executable, "-m", "marlhf_cli.cli", "ppo", "--run-dir", str(run), "--policy", "tiny", "--dataset",
        str(task["prompts"]), "--reward", f"py:{one_sided}:overlap", "--nproc", "2", "--rollout-batch-size", "4",
        "--mini-batch-size", "4", "--max-new-tokens", "8", "--max-prompt-length", "48", "--max-steps", "3",
        "--eval-every", "0", "--eval-prompts", "4", "--save-every", "0",
    ], env=environment(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode != 0
    assert "raised ValueError: only on the second process" in result.stderr
    assert "the reward failed on another process" in result.stderr
    assert "stopped after step 1, whose checkpoint is saved" in result.stderr
    checkpoints = run / "ppo" / "fixed5" / "checkpoints"
    assert (checkpoints / "actor" / "latest").read_text().strip() == "step-000001"
    assert json.loads((run / "run.json").read_text())["stages"]["ppo/fixed5"]["status"] == "failed"
