"""PPO's held-out evaluation: distinct prompts (TL;DR has several pairs per post), a word
when fewer exist than asked, and no 'eval start' in the final table when none ran."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from marlhf_cli.artifacts import read_jsonl
from marlhf_cli.cli import app
from marlhf_cli.data import load_records
from marlhf_cli.data.records import one_per_prompt
from marlhf_cli.train.ppo import report


def test_one_record_per_prompt_keeps_the_first_of_each_in_order():
    records = [{"prompt": p, "i": i} for i, p in enumerate("aabacbd")]
    assert one_per_prompt(records) == [records[0], records[2], records[4], records[6]]
    assert one_per_prompt([]) == []


def test_the_embedded_tldr_eval_split_repeats_prompts():
    """What made the issue's run evaluate two prompts three times: rows come per post."""
    rows = load_records("tldr", split="eval").records
    assert len(one_per_prompt(rows)) < len(rows)


def test_eval_start_is_empty_when_no_evaluation_ran_before_training():
    rows = [{"step": 1, "split": "train", "score": 0.1}, {"step": 2, "split": "eval", "score": 1.5}]
    summary = report.summary_row("x", rows)
    assert summary["eval_start"] is None and summary["eval_end"] == 1.5
    assert report.summary_row("x", [{"step": 0, "split": "eval", "score": 0.2}, *rows])["eval_start"] == 0.2


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_ppo_evaluates_distinct_prompts_and_says_when_fewer_exist(tmp_path):
    distinct = len(one_per_prompt(load_records("tldr", split="eval").records))
    args = ["ppo", "--preset", "cpu-tiny", "--run-dir", str(tmp_path), "--policy", "tiny", "--reward-model", "tiny",
            "--max-steps", "1", "--eval-every", "0", "--eval-prompts", "8", "--max-new-tokens", "4",
            "--save-every", "0"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"the eval split has {distinct} distinct prompts: evaluating {distinct}, not 8 (--eval-prompts)" in result.output
    assert f"{distinct} distinct held-out prompts for evaluation" in result.output
    assert "ppo: training on 15 of the 48 records of embedded:tldr" in result.output
    samples = read_jsonl(tmp_path / "samples" / "fixed5.jsonl")
    assert len(samples) == distinct == len({row["prompt"] for row in samples})
    evals = [row for row in read_jsonl(tmp_path / "metrics" / "ppo-fixed5.jsonl") if row["split"] == "eval"]
    assert [row["step"] for row in evals] == [1] and evals[0]["prompts"] == distinct
    # --eval-every 0: no evaluation before training, so the table's 'eval start' is empty
    # the table's row: run, steps, gen tokens, eval start, eval end, ... (figures hold no spaces)
    table = next(line for line in result.output.splitlines() if line.split()[:1] == ["fixed5"])
    cells = dict(zip(("run", "steps", "gen tokens", "eval start", "eval end"), table.split()))
    assert cells["eval start"] == "-" and cells["eval end"] != "-", table
    entry = json.loads((tmp_path / "run.json").read_text())["stages"]["ppo/fixed5"]
    assert entry["inputs"]["eval_prompts"] == distinct
