"""How a source is shared among sft, rm and ppo: --split-shares, demonstration-only files,
and the line every training stage prints about the records it uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from marlhf_cli.cli import app
from marlhf_cli.data import load_records
from marlhf_cli.data.splits import PAPER_FRACTIONS, assign_splits, parse_split_shares, with_eval
from marlhf_cli.errors import UserError


def write_messages(path: Path, n: int) -> Path:
    """``n`` chat demonstrations in TRL's ``messages`` format (nothing for a reward model)."""
    rows = [
        {"messages": [{"role": "user", "content": f"Question {i}: name a colour."}, {"role": "assistant", "content": f"Colour number {i}."}]}
        for i in range(n)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_demonstration_file_trains_sft_on_all_but_the_held_out_rows(tmp_path):
    """The issue's file: 16 rows gave sft 3 (the paper's 20% of 90%); rm can never use them,
    so the file is not shared out: sft trains on all of it, ppo samples from all of it."""
    data = write_messages(tmp_path / "chat.jsonl", 16)
    sft, held_out = load_records(str(data), split="sft"), load_records(str(data), split="eval")
    assert sft.kind == "demonstration"
    assert len(sft.records) + len(held_out.records) == 16 and len(held_out.records) == 2  # 10% held out, by group
    assert sft.available == len(sft.records) and sft.total == 16
    assert sft.fractions == pytest.approx({"sft": 0.9, "eval": 0.1})
    ppo = load_records(str(data), split="ppo")
    assert ppo.records == sft.records and ppo.fractions == pytest.approx({"ppo": 0.9, "eval": 0.1})
    with pytest.raises(UserError, match="cannot train a reward model"):
        load_records(str(data), split="rm")


def test_shares_divide_a_demonstration_file_between_sft_and_ppo(tmp_path):
    data = write_messages(tmp_path / "chat.jsonl", 40)
    shares = parse_split_shares("50/0/50")
    parts = {s: load_records(str(data), split=s, shares=shares).records for s in ("sft", "ppo", "eval")}
    prompts = {s: {r["prompt"] for r in rows} for s, rows in parts.items()}
    assert len(parts["sft"]) == len(parts["ppo"]) == 18 and len(parts["eval"]) == 4
    assert not prompts["sft"] & prompts["ppo"] and not (prompts["sft"] | prompts["ppo"]) & prompts["eval"]
    # the held-out rows do not depend on the shares
    assert parts["eval"] == load_records(str(data), split="eval").records


def test_paper_shares_are_the_default_for_preference_data():
    default = {s: load_records("hh", split=s).records for s in ("sft", "rm", "ppo", "eval")}
    given_shares = parse_split_shares("20/40/40")
    assert {s: load_records("hh", split=s, shares=given_shares).records for s in default} == default
    everything = load_records("hh", split="ppo", shares=parse_split_shares("0/0/1"))
    assert len(everything.records) == len(load_records("hh").records) - len(default["eval"])
    assert everything.total == 48 and everything.fractions == pytest.approx({"ppo": 0.9, "eval": 0.1})
    with pytest.raises(UserError, match="gives rm no records"):
        load_records("hh", split="rm", shares=parse_split_shares("50/0/50"))


def test_a_preference_file_of_ones_own_goes_whole_to_each_stage(tmp_path):
    """A 24-row file gave sft 4 rows (18%), then failed on the default batch: a file in TRL's
    format goes whole to each stage, as TRL's trainers take their dataset; the paper's 20/40/40
    is for the paper's datasets, or any source with --split-shares."""
    from _toy_prefs import write_toy_preferences

    data = write_toy_preferences(tmp_path / "prefs.jsonl")
    whole = {s: load_records(str(data), split=s) for s in ("sft", "rm", "ppo", "eval")}
    total = whole["sft"].total
    assert whole["sft"].records == whole["rm"].records == whole["ppo"].records
    assert len(whole["sft"].records) + len(whole["eval"].records) == total
    assert whole["rm"].fractions == pytest.approx({"rm": 0.9, "eval": 0.1})
    shared = {s: load_records(str(data), split=s, shares=parse_split_shares("20/40/40")).records for s in ("sft", "rm", "ppo", "eval")}
    assert shared["eval"] == whole["eval"].records  # the same held-out rows whatever the shares
    assert sum(len(shared[s]) for s in ("sft", "rm", "ppo")) == len(whole["sft"].records)
    assert not {r["prompt"] for r in shared["sft"]} & {r["prompt"] for r in shared["rm"]}  # shared out: apart


def test_apps_has_no_reward_model_share():
    with pytest.raises(UserError, match="no 'rm' split"):
        load_records("apps", split="rm")
    with pytest.raises(UserError, match="apps trains no reward model"):
        load_records("apps", split="sft", shares=parse_split_shares("20/40/40"))
    assert len(load_records("apps", split="ppo", shares=parse_split_shares("0/0/100")).records) == 9


@pytest.mark.parametrize("text, shares", [
    ("20/40/40", {"sft": 0.2, "rm": 0.4, "ppo": 0.4}), ("1/1/2", {"sft": 0.25, "rm": 0.25, "ppo": 0.5}),
    (" 50 / 0 / 50 ", {"sft": 0.5, "rm": 0.0, "ppo": 0.5}), ("0.2,0.4,0.4", {"sft": 0.2, "rm": 0.4, "ppo": 0.4}),
    ("0/0/2/1", {"sft": 0.0, "rm": 0.0, "ppo": 1.0, "eval": 1 / 3}), ("20/40/40/0", {"sft": 0.2, "rm": 0.4, "ppo": 0.4, "eval": 0.0}),
])  # fmt: skip
def test_shares_are_read_and_normalised(text, shares):
    assert parse_split_shares(text) == pytest.approx(shares)


@pytest.mark.parametrize("value", ["20/40", "20/40/40/10/5", "a/b/c", "0/0/0", "0/0/0/5", "-10/50/60", "1/1/1/-1", "inf/1/1", "nan/1/1", ""])
def test_bad_shares_are_one_line_exit_2(tmp_path, value):
    result = CliRunner().invoke(app, ["sft", "--split-shares", value, "--run-dir", str(tmp_path)], env={"COLUMNS": "80"})
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: --split-shares must be three shares SFT/RM/PPO"), lines[0]


def test_a_fourth_share_holds_out_that_share_of_a_file(tmp_path):
    """0/0/2/1: a third of the prompts held out, the other two thirds ppo's, no prompt in both;
    the default 10% would hold out 4 of these 40."""
    data = write_messages(tmp_path / "chat.jsonl", 40)
    shares = parse_split_shares("0/0/2/1")
    ppo, held_out = (load_records(str(data), split=s, shares=shares) for s in ("ppo", "eval"))
    assert len(held_out.records) in (13, 14) and len(ppo.records) + len(held_out.records) == 40
    assert not {r["prompt"] for r in ppo.records} & {r["prompt"] for r in held_out.records}
    assert ppo.fractions == pytest.approx({"ppo": 2 / 3, "eval": 1 / 3})
    # three shares hold out the default 10%, and so does a fourth share of 10 in 100
    assert len(load_records(str(data), split="eval", shares=parse_split_shares("0/0/90/10")).records) == 4


def test_a_fourth_share_is_refused_where_the_hub_holds_the_eval_split(tmp_path):
    """TL;DR is evaluated on the hub's validation split: a held-out share cannot apply, and
    the refusal is the same offline (where the embedded sample stands in)."""
    result = CliRunner().invoke(app, ["sft", "--dataset", "tldr", "--model", "tiny", "--split-shares", "50/0/50/10",
                                      "--run-dir", str(tmp_path)], env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "tldr is evaluated on the hub's own validation split, so a fourth (held-out) share does not apply" in result.output


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=60),
    shares=st.tuples(*[st.integers(0, 5)] * 3).filter(any),
    seed=st.integers(0, 10**6),
)
def test_held_out_groups_and_proportions_hold_for_any_shares(sizes, shares, seed):
    """Against the definition: every group in one split; the held-out split the same
    whatever the shares; each training split within one group of its share of the rows."""
    groups = [g for g, size in enumerate(sizes) for _ in range(size)]
    fractions = {name: s / sum(shares) for name, s in zip(("sft", "rm", "ppo"), shares) if s}
    names = assign_splits(groups, with_eval(fractions), seed)
    paper = assign_splits(groups, with_eval(PAPER_FRACTIONS), seed)
    assert [n == "eval" for n in names] == [n == "eval" for n in paper]
    for g in set(groups):
        assert len({n for n, owner in zip(names, groups) if owner == g}) == 1
    train = sum(n != "eval" for n in names)
    eval_rows = len(groups) - train
    largest = max(sizes)
    assert abs(eval_rows - 0.1 * len(groups)) <= largest
    for name, share in fractions.items():
        assert abs(names.count(name) - share * 0.9 * len(groups)) <= largest + 1e-9


@pytest.mark.slow
def test_sft_on_a_chat_file_uses_and_says_all_its_rows(tmp_path):
    data = write_messages(tmp_path / "chat.jsonl", 16)
    args = ["sft", "--model", "tiny", "--dataset", str(data), "--batch-size", "2", "--max-steps", "1",
            "--eval-every", "0", "--save-every", "0", "--max-prompt-length", "24", "--max-response-length", "8",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (f"sft: training on 14 of the 16 records of {data} (sft 90%, eval 10%: every stage takes all of it "
            "(--split-shares shares it out)), 2 held out for evaluation") in result.output  # fmt: skip
    assert ", 1 step, train loss" in result.output  # not '1 steps'
    inputs = json.loads((tmp_path / "run" / "run.json").read_text())["stages"]["sft"]["inputs"]
    assert inputs["train_records"] == 14 and inputs["source_records"] == 16
    assert inputs["split_shares"] == pytest.approx({"sft": 0.9, "eval": 0.1})
