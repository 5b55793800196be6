"""Hints name commands that do what they say."""

from __future__ import annotations

import itertools
import shlex

import pytest
from typer.testing import CliRunner

from marlhf_cli import accepts, config
from marlhf_cli.cli import app
from marlhf_cli.errors import UserError
from marlhf_cli.train import ppo
from marlhf_cli.train.ppo import report as ppo_report


def _flags(text: str) -> dict[str, str]:
    words = shlex.split(text)
    return {flag[2:].replace("-", "_"): value for flag, value in zip(words[::2], words[1::2])}


@pytest.mark.parametrize(
    "termination, n, value_function, ratio",
    list(itertools.product(accepts.RULES, ("1", "5", "inf"), accepts.VALUE_FUNCTIONS, accepts.RATIO_MODES)),
)
def test_the_hint_for_a_derived_name_makes_a_run_of_that_name(termination, n, value_function, ratio):
    name = ppo.run_name(config.resolve("ppo", flags=dict(termination=termination, n=n, value_function=value_function, ratio=ratio)))
    flags = ppo_report.options_for(name)
    assert flags is not None and "--name" not in flags
    assert ppo.run_name(config.resolve("ppo", flags=_flags(flags))) == name


@pytest.mark.parametrize(
    "advantage, k, ratio, termination",
    list(itertools.product(("gae", "rloo", "grpo"), ("1", "2", "4"), accepts.RATIO_MODES, ("fixed", "ppl"))),
)
def test_the_hint_round_trips_advantage_and_samples_per_prompt(advantage, k, ratio, termination):
    if advantage != "gae" and k == "1":
        return  # a group needs two responses
    name = ppo.run_name(config.resolve("ppo", flags=dict(advantage=advantage, samples_per_prompt=k, ratio=ratio, termination=termination)))
    flags = ppo_report.options_for(name)
    assert flags is not None
    assert ppo.run_name(config.resolve("ppo", flags=_flags(flags))) == name


def test_compare_hint_for_vanilla_runs_vanilla_ppo(tmp_path):
    result = CliRunner().invoke(app, ["ppo", "--compare", "vanilla", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert f"run 'marlhf ppo --termination fixed --n 1 --run-dir {tmp_path}' first" in " ".join(result.output.split())
    custom = CliRunner().invoke(app, ["ppo", "--compare", "mine", "--run-dir", str(tmp_path)])
    assert custom.exit_code == 2 and "--name mine" in custom.output and "that run's options" in " ".join(custom.output.split())


def test_too_few_prompts_does_not_offer_a_cap_as_more_data():
    with pytest.raises(UserError) as err:
        ppo.context.PromptSchedule([{"prompt": "x"}] * 3, batch_size=8, seed=0)
    message = str(err.value)
    assert "add data (--max-records" not in message
    assert "raise --max-records if you set it" in message and "--rollout-batch-size 8" in message


@pytest.mark.parametrize("args, hint", [
    (["rm", "--policy", "tiny"], "No such option: --policy ('marlhf rm' takes the model to start from as --model; --policy is an option of marlhf bon, marlhf dpo, marlhf ppo)"),
    (["ppo", "--model", "tiny"], "No such option: --model ('marlhf ppo' takes the model to start from as --policy; --model is an option of"),
    (["sft", "--max-stpes", "3"], "No such option: --max-stpes (did you mean --max-steps?)"),
    (["segment", "x.txt", "--critic-lr", "1"], "No such option: --critic-lr (--critic-lr is an option of marlhf ppo)"),
])  # fmt: skip
def test_an_unknown_flag_is_answered_with_the_flag_meant(args, hint):
    """The hint knows each command's own flags, the flag it takes for the same thing, and the
    commands an unknown flag belongs to (click's own suggested --epochs for rm --policy)."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert hint in result.output.replace("\n", " "), result.output
