"""Every bad option value of every command: one line, exit code 2, before anything loads.

The options are read from the commands themselves, so a new numeric or choice option
without a check in marlhf_cli/accepts.py (ACCEPTS) fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from marlhf_cli import accepts, config
from marlhf_cli.cli import app

COMMAND = typer.main.get_command(app)
ROOT = Path(__file__).resolve().parent.parent

# Options whose value is free-form (a name, a path, a model id): any string may be right.
FREE_FORM = {
    "--model", "--data-file", "--run-dir", "--config", "--preset", "--name", "--policy",
    "--reward-model", "--tokenizer", "--base-url", "--api-key-env", "--template", "--dataset-config", "--dataset-split",
}  # fmt: skip
# Options taking a string that must be one of a few values, or a number written as text.
BAD_TEXT = {
    "--rule": "sentences",
    "--backend": "nonsense",
    "--parser-backend": "nonsense",
    "--format": "xml",
    "--termination": "nonsense",
    "--value-function": "nonsense",
    "--value-head-init": "nonsense",
    "--report-to": "tensorboard,comet",
    "--push-to-hub": "no slash",
    "--ratio": "nonsense",
    "--loss-aggregation": "mean",
    "--kl-estimator": "k2",
    "--reward": "nonsense",
    "--reward-weights": "1,heavy",
    "--advantage": "ppo",
    "--x-axis": "time",
    "--dtype": "fp16",
    "--generation": "fast",
    "--lr-scheduler": "step",
    "--task": "nonsense",
    "--split": "nonsense",
    "--split-shares": "20/40",
    "--dataset": "nonsense",
    "--n": "0",  # segment and ppo: a segment length; bon: a list of N
    "--k": "0,1",
    "--temperature": "0",  # bon: a list of temperatures
    "--chat-template": "no-such-template.jinja",  # auto, none or a file
    "--lora-targets": ",",
    "--lam": "sometimes",  # a number in [0, 1], or adaptive
    "--env": "guess_letter.py",  # py:FILE.py:NAME
}
# Values inside a number's type but outside its range, beyond the -1 every number gets.
OUT_OF_RANGE = [
    ("segment", "--n", "-3"), ("segment", "--n", "2.5"), ("segment", "--cutoff", "-1"),
    ("ppo", "--top-p", "1.5"), ("ppo", "--gamma", "2"), ("ppo", "--lam", "1.01"), ("ppo", "--lam", "-1"), ("ppo", "--critic-lambda", "1.5"), ("ppo", "--lam-alpha", "0"),
    ("ppo", "--n", "-3"), ("ppo", "--critic-warmup-steps", "-1"), ("sft", "--warmup-ratio", "1"), ("sft", "--zero-stage", "4"),
    ("bon", "--n", "4,-8"), ("bon", "--temperature", "0.5,0"), ("bon", "--top-p", "0"),
    ("passk", "--n", "0"), ("judge", "--timeout", "0"),
]  # fmt: skip
# Values click rejects before the config sees them: one line too.
NOT_A_NUMBER = [("segment", "--seed", "abc"), ("sft", "--batch-size", "1.5"), ("judge", "--sample", "x")]
POSITIONAL = {"segment": ["in.txt"], "judge": ["a.jsonl", "b.jsonl"]}
STAGES = {
    "segment": "marlhf_cli.segment",
    "sft": "marlhf_cli.train.sft",
    "rm": "marlhf_cli.train.rm",
    "ppo": "marlhf_cli.train.ppo",
    "bon": "marlhf_cli.evaluate.bon",
    "judge": "marlhf_cli.evaluate.judge",
    "passk": "marlhf_cli.rewards.passk",
}


def _value_options(command: str) -> list[tuple[str, str]]:
    """(flag, bad value) for each option of ``command`` that takes a number or a choice."""
    cases = []
    for param in COMMAND.commands[command].params:
        if param.param_type_name != "option" or param.is_flag or param.opts[0] in FREE_FORM:
            continue
        flag = param.opts[0]
        if param.type_descriptor.annotation in (int, float):
            cases.append((flag, "-1"))
        else:
            assert flag in BAD_TEXT, f"{command} {flag}: add a bad value here and a check in accepts.ACCEPTS"
            cases.append((flag, BAD_TEXT[flag]))
    return cases


CASES = [(command, flag, value) for command in sorted(STAGES) for flag, value in _value_options(command)]


@pytest.fixture
def stages_unreachable(monkeypatch):
    """A command that reaches its stage has let a bad value through to model loading."""
    import importlib

    for command, module in STAGES.items():
        def reached(*args, _command=command, **kwargs):
            raise AssertionError(f"{_command}: the stage ran with a bad option value")

        monkeypatch.setattr(importlib.import_module(module), "run", reached)


def _assert_one_line_exit_2(result, flag: str) -> None:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "Traceback" not in result.output and flag in lines[0]


@pytest.mark.parametrize("command, flag, value", CASES + OUT_OF_RANGE + NOT_A_NUMBER)
def test_bad_value_is_one_line_exit_2_before_the_stage(stages_unreachable, tmp_path, command, flag, value):
    args = [command, *POSITIONAL.get(command, []), flag, value, "--run-dir", str(tmp_path)]
    if command == "segment":
        args.remove("--run-dir"), args.remove(str(tmp_path))
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    _assert_one_line_exit_2(result, flag)


def test_every_command_has_value_options_checked():
    counts = {command: len(_value_options(command)) for command in STAGES}
    assert all(counts.values()), counts
    # the examples, which printed a traceback after 9 s of loading
    assert {("segment", "--n"), ("segment", "--cutoff"), ("segment", "--backend")} <= {(c, f) for c, f, _ in CASES}


@pytest.mark.parametrize("command, flag, value, expected", [
    ("ppo", "--n", "abc", "--n (config key 'n') must be a whole number >= 1, or inf, got 'abc'"),
    ("segment", "--n", "many", "--n (config key 'n') must be a whole number >= 1, or inf, got 'many'"),
])  # fmt: skip
def test_a_value_of_the_wrong_type_says_what_the_option_accepts(stages_unreachable, tmp_path, command, flag, value, expected):
    """'--n abc' said 'expected float': the words of accepts.ACCEPTS say what --n takes."""
    args = [command, *POSITIONAL.get(command, []), flag, value]
    result = CliRunner().invoke(app, args + ([] if command == "segment" else ["--run-dir", str(tmp_path)]), env={"COLUMNS": "80"})
    _assert_one_line_exit_2(result, flag)
    assert expected in result.output and "expected float" not in result.output, result.output


def test_a_config_file_value_of_the_wrong_type_names_its_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  max_steps: many\n")
    with pytest.raises(config.UserError, match=r"--max-steps \(config key 'max_steps'\) must be a whole number, 1 or more, got 'many'"):
        config.resolve("ppo", config_file=path)


def test_bad_value_imports_no_torch():
    """The real command, in a fresh process: the error comes before torch is even imported."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))\n"
        "from marlhf_cli.cli import main\n"
        "sys.argv = ['marlhf', 'segment', '-', '--n', '-3']\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, input="", timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: --n must be a whole number >= 1, or inf, got -3", "torch loaded: False"]


def test_choices_match_the_modules_that_use_them():
    """accepts.py cannot import these modules (torch); the lists must not drift apart."""
    from marlhf_cli.evaluate.prompts import TASKS
    from marlhf_cli.macro import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, RATIO_MODES, RULE_NAMES, VALUE_FUNCTIONS
    from marlhf_cli.macro.parsing import BACKENDS as PARSING_BACKENDS
    from marlhf_cli.macro.segmentation import BACKENDS
    from marlhf_cli.generation.compiled import MODES
    from marlhf_cli.train.ppo.settings import REWARDS

    assert accepts.RULES == RULE_NAMES
    assert accepts.VALUE_FUNCTIONS == VALUE_FUNCTIONS and accepts.RATIO_MODES == RATIO_MODES
    assert accepts.PARSER_BACKENDS == BACKENDS == PARSING_BACKENDS
    assert accepts.JUDGE_TASKS == ("auto", *TASKS)
    assert accepts.REWARDS == REWARDS
    assert accepts.ADVANTAGES == ADVANTAGE_ESTIMATORS
    assert accepts.LOSS_AGGREGATIONS == LOSS_AGGREGATIONS
    assert accepts.GENERATIONS == MODES


def test_configs_in_code_are_checked_too():
    with pytest.raises(config.UserError, match="--top-k must be 0 or more, got -2"):
        config.resolve("ppo", flags={"top_k": -2})
    with pytest.raises(config.UserError, match="--n must be comma-separated ints, each 1 or more"):
        config.resolve("bon", flags={"n": "4,0"})
    assert config.resolve("ppo", flags={"n": "inf"}).n == float("inf")
    assert config.resolve("bon", flags={"n": "4,8", "temperature": "0.5"}).n == "4,8"


@pytest.mark.parametrize("command, flag", [
    ("sft", "--model"), ("rm", "--model"), ("ppo", "--policy"), ("ppo", "--reward-model"), ("bon", "--policy"),
    ("judge", "--reward-model"), ("passk", "--model"), ("segment", "--tokenizer"), ("segment", "--model"),
])  # fmt: skip
def test_a_model_folder_that_does_not_exist_is_one_line_before_the_stage(stages_unreachable, tmp_path, command, flag):
    """A path (it starts with /, ., ~ or has two slashes: no hub id does) that names nothing
    is answered by the option checks; before, a stage imported torch and probed the hub first."""
    args = [command, *POSITIONAL.get(command, []), flag, str(tmp_path / "no" / "such-model")]
    result = CliRunner().invoke(app, args + ([] if command == "segment" else ["--run-dir", str(tmp_path)]), env={"COLUMNS": "80"})
    _assert_one_line_exit_2(result, flag)
    assert "an existing folder, an alias" in result.output


def test_model_names_that_may_be_right_pass_the_check(tmp_path):
    (tmp_path / "here").mkdir()
    for name in ("tiny", "smollm2-135m", "random:2x64", "google/gemma-2b", "sft", "ppo/fixed5", str(tmp_path / "here"), "~"):
        assert accepts.MODEL_SOURCE.test(name), name
    for name in (str(tmp_path / "gone"), "./gone", "../gone/too", "runs/a/sft"):
        assert not accepts.MODEL_SOURCE.test(name), name


def test_a_missing_data_file_is_one_line_before_the_stage(stages_unreachable, tmp_path):
    for command in ("sft", "rm", "ppo", "bon"):
        result = CliRunner().invoke(app, [command, "--data-file", str(tmp_path / "gone.jsonl"), "--run-dir", str(tmp_path)])
        assert result.exit_code == 2 and result.output.strip() == f"error: {tmp_path / 'gone.jsonl'}: file not found", result.output
