"""``--reward py:FILE.py:FUNCTION`` (docs/rewards.md): loading and
option-time validation, TRL's calling convention, what a function may return, and how its
errors are reported (its own traceback, the response it failed on, exit code 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marlhf_cli import config as config_module
from marlhf_cli.errors import UserCodeError, UserError
from marlhf_cli.rewards.function import FunctionReward, load_function, record_fields

ROOT = Path(__file__).resolve().parents[1]

REWARDS = '''
import asyncio
import math

calls = []


def everything(**kwargs):
    calls.append(kwargs)
    return [float(len(c)) for c in kwargs["completions"]]


def named(completions, answer):
    calls.append({"completions": completions, "answer": answer})
    return [1.0 if a and a in c else 0.0 for c, a in zip(completions, answer)]


def needs_label(completions, label, **kwargs):
    return [0.0 for _ in completions]


def as_numpy(completions, **kwargs):
    import numpy
    return numpy.arange(len(completions), dtype=numpy.float32)


def as_tensor(completions, **kwargs):
    import torch
    return torch.ones(len(completions)) * 0.5


def as_bools(completions, **kwargs):
    return tuple(c.startswith("a") for c in completions)


def with_nones(completions, **kwargs):
    return [None if c == "skip" else 2.0 for c in completions]


def too_few(completions, **kwargs):
    return [1.0]


def a_string(completions, **kwargs):
    return [1.0, "good", 0.0][: len(completions)]


def a_nan(completions, **kwargs):
    return [math.nan if c == "bad" else 0.0 for c in completions]


def an_inf(completions, **kwargs):
    return [-math.inf for c in completions]


def not_a_list(completions, **kwargs):
    return 3.0


def divides(completions, **kwargs):
    return [1.0 / (len(c) - 3) for c in completions]


def batch_only(completions, **kwargs):
    if len(completions) > 1:
        raise RuntimeError("cannot score several at once")
    return [0.0]


async def later(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def positional(completions, /):
    return [0.0]


NOT_CALLABLE = 3
'''


@pytest.fixture
def rewards(tmp_path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS, encoding="utf-8")
    return path


def reward(path: Path, name: str) -> FunctionReward:
    return FunctionReward(f"py:{path}:{name}")


PROMPTS = ["What is 2+2?", "Name a colour.", "Spell cat."]
COMPLETIONS = [" 4", " red", "skip"]
IDS = [[11, 2], [33, 4, 5], [6]]
RECORDS = [
    {"prompt": PROMPTS[0], "columns": {"answer": "4", "id": 1}},
    {"prompt": PROMPTS[1], "columns": {"answer": "blue"}},
    {"prompt": PROMPTS[2], "chosen": " c-a-t", "columns": {"id": 3}},
]


# ---------------------------------------------------------------------------------------
# loading and option-time validation


def test_bad_specs_are_one_line_errors(rewards, tmp_path):
    cases = {
        f"py:{rewards}": "expected py:FILE.py:FUNCTION",
        f"py:{rewards}:not a name": "expected py:FILE.py:FUNCTION",
        f"py:{tmp_path}/absent.py:f": "absent.py: file not found",
        f"py:{tmp_path}:f": "is not a file",
        f"py:{rewards}:missing": "defines no 'missing' (its functions: a_nan, a_string, an_inf, as_bools",
        f"py:{rewards}:NOT_CALLABLE": "'NOT_CALLABLE' in",
    }
    for spec, expected in cases.items():
        with pytest.raises(UserError, match=None) as caught:
            load_function(spec)
        assert expected in str(caught.value) and "\n" not in str(caught.value), (spec, str(caught.value))
    with pytest.raises(UserError, match="can only be passed by position"):
        reward(rewards, "positional")


def test_an_import_error_shows_the_files_own_traceback(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import os\n\nvalue = 1 / 0\n", encoding="utf-8")
    with pytest.raises(UserCodeError) as caught:
        load_function(f"py:{broken}:f")
    assert str(caught.value) == f"--reward py:{broken}:f: importing {broken} raised ZeroDivisionError: division by zero"
    details = caught.value.details
    assert f'File "{broken}", line 3, in <module>' in details and details.endswith("ZeroDivisionError: division by zero")
    assert "marlhf_cli" not in details and "importlib" not in details


def test_options_check_the_function_before_anything_loads(rewards, tmp_path):
    config = config_module.resolve("ppo", flags={"reward": f"py:{rewards}:named", "run_dir": str(tmp_path)})
    assert config.reward == f"py:{rewards}:named"
    for stage in ("ppo", "bon", "passk"):
        with pytest.raises(UserError, match="defines no 'nope'"):
            config_module.resolve(stage, flags={"reward": f"py:{rewards}:nope"})
    with pytest.raises(UserError, match="--reward must be one of model, or py:FILE.py:FUNCTION, got 'apps'"):
        config_module.resolve("bon", flags={"reward": "apps"})
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))\n"
        "from marlhf_cli.cli import main\n"
        f"sys.argv = ['marlhf', 'ppo', '--reward', 'py:{rewards}:nope', '--run-dir', '{tmp_path}']\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[-1] == "torch loaded: False" and len(lines) == 2
    assert lines[0].startswith(f"error: --reward py:{rewards}:nope: {rewards} defines no 'nope'")


def test_a_changed_file_is_imported_again(tmp_path):
    path = tmp_path / "changing.py"
    path.write_text("def f(completions, **kw):\n    return [1.0 for _ in completions]\n", encoding="utf-8")
    assert FunctionReward(f"py:{path}:f").score(["p"], ["c"], [[1]], [{}]) == [1.0]
    path.write_text("def f(completions, **kw):\n    return [2.0 for _ in completions]\n", encoding="utf-8")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert FunctionReward(f"py:{path}:f").score(["p"], ["c"], [[1]], [{}]) == [2.0]


# ---------------------------------------------------------------------------------------
# TRL's calling convention


def test_kwargs_are_trls_lists_plus_every_record_field(rewards):
    fn = reward(rewards, "everything")
    assert fn.score(PROMPTS, COMPLETIONS, IDS, RECORDS) == [2.0, 4.0, 4.0]
    called = sys.modules[fn.function.__module__].calls[-1]
    assert called == {
        "prompts": PROMPTS, "completions": COMPLETIONS, "completions_ids": IDS, "trainer_state": None,
        "answer": ["4", "blue", None], "id": [1, None, 3], "chosen": [None, None, " c-a-t"],
    }  # fmt: skip


def test_a_function_without_kwargs_gets_only_what_it_names(rewards):
    fn = reward(rewards, "named")
    assert fn.score(PROMPTS, COMPLETIONS, IDS, RECORDS) == [1.0, 0.0, 0.0]
    assert sys.modules[fn.function.__module__].calls[-1] == {"completions": COMPLETIONS, "answer": ["4", "blue", None]}
    fn.check_records(RECORDS)
    with pytest.raises(UserError, match=r"the function needs 'label', which the records do not have \(their fields: answer, chosen, id;"):
        reward(rewards, "needs_label").check_records(RECORDS)


def test_record_fields_are_all_but_the_prompt_and_the_columns_flattened():
    assert record_fields({"prompt": "p", "chosen": "c", "rejected": "r"}) == {"chosen": "c", "rejected": "r"}
    assert record_fields({"prompt": "p", "columns": {"answer": 4}}) == {"answer": 4}
    turns = {"prompt": [{"role": "user", "content": "p"}]}  # the chat template's copy of the prompt
    assert record_fields({"prompt": "p", "conversation": turns, "columns": {"answer": 4}}) == {"answer": 4}


def test_the_scoring_batch_gives_ids_up_to_the_eos(rewards):
    from types import SimpleNamespace

    fn = reward(rewards, "everything")
    batch = SimpleNamespace(
        prompts=PROMPTS[:2], responses=COMPLETIONS[:2], records=RECORDS[:2],
        response_ids=torch.tensor([[11, 2, 0, 0], [33, 4, 5, 0]]), response_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]),
    )  # fmt: skip
    scores = fn(batch)
    assert scores.dtype == torch.float32 and scores.tolist() == [2.0, 4.0]
    assert sys.modules[fn.function.__module__].calls[-1]["completions_ids"] == IDS[:2]


def test_async_functions_are_awaited(rewards):
    assert reward(rewards, "later").score(PROMPTS, COMPLETIONS, IDS, RECORDS) == [2.0, 4.0, 4.0]


# ---------------------------------------------------------------------------------------
# what it returns


def test_arrays_tensors_tuples_and_bools_become_floats(rewards):
    assert reward(rewards, "as_numpy").score(PROMPTS, COMPLETIONS, IDS, RECORDS) == [0.0, 1.0, 2.0]
    assert reward(rewards, "as_tensor").score(PROMPTS, COMPLETIONS, IDS, RECORDS) == [0.5, 0.5, 0.5]
    assert reward(rewards, "as_bools").score(["p", "q"], ["abc", "xyz"], [[1], [2]], [{}, {}]) == [1.0, 0.0]


def test_none_counts_as_zero_and_is_said_once(rewards, capsys):
    fn = reward(rewards, "with_nones")
    assert fn.score(PROMPTS, COMPLETIONS, IDS, RECORDS) == [2.0, 2.0, 0.0]
    assert fn.score(PROMPTS, COMPLETIONS, IDS, RECORDS) == [2.0, 2.0, 0.0]
    assert fn.nones == 2
    err = capsys.readouterr().err
    assert err.count("returned None for 1 of 3 responses: each counts as 0.0") == 1


@pytest.mark.parametrize("name, expected", [
    ("too_few", "returned 1 scores for 3 responses"),
    ("not_a_list", "returned float, not a list of 3 numbers"),
    ("a_string", "returned str 'good', not a number for response 2 of 3 (prompt 'Name a colour.', response ' red')"),
])  # fmt: skip
def test_wrong_returns_are_one_line_errors_naming_the_response(rewards, name, expected):
    with pytest.raises(UserError) as caught:
        reward(rewards, name).score(PROMPTS, COMPLETIONS, IDS, RECORDS)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_nan_and_inf_name_the_response(rewards):
    with pytest.raises(UserError, match=r"returned nan for response 2 of 2 \(prompt 'q', response 'bad'\)"):
        reward(rewards, "a_nan").score(["p", "q"], ["fine", "bad"], [[1], [2]], [{}, {}])
    with pytest.raises(UserError, match=r"returned -inf for response 1 of 1"):
        reward(rewards, "an_inf").score(["p"], ["x"], [[1]], [{}])


# ---------------------------------------------------------------------------------------
# its exceptions: its own traceback and the response it failed on


def test_an_exception_names_the_first_response_that_fails_alone(rewards):
    completions = [" abcd", " ab", " abc"]  # lengths 5, 3, 4: the second divides by zero
    with pytest.raises(UserCodeError) as caught:
        reward(rewards, "divides").score(PROMPTS, completions, IDS, RECORDS)
    message = str(caught.value)
    assert message == (
        f"reward function py:{rewards}:divides raised ZeroDivisionError: float division by zero "
        "for response 2 of 3 (prompt 'Name a colour.', response ' ab')"
    )
    details = caught.value.details
    assert details.startswith("Traceback (most recent call last):")
    assert f'File "{rewards}", line' in details and "in divides" in details
    assert "marlhf_cli" not in details and "During handling" not in details
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


def test_an_exception_no_single_response_causes_blames_the_batch(rewards):
    with pytest.raises(UserCodeError) as caught:
        reward(rewards, "batch_only").score(PROMPTS, COMPLETIONS, IDS, RECORDS)
    assert "raised RuntimeError: cannot score several at once on a batch of 3 responses (each scored alone without error)" in str(caught.value)
    assert "in batch_only" in caught.value.details


def test_the_cli_prints_the_traceback_then_one_line(rewards, tmp_path, monkeypatch):
    """options.user_errors: a UserCodeError's details above the one line, exit code 2."""
    from typer.testing import CliRunner

    from marlhf_cli.cli import app
    from marlhf_cli.train import ppo

    def fail(config, **_):
        reward(rewards, "divides").score(["p"], ["abc"], [[1]], [{}])

    monkeypatch.setattr(ppo, "run", fail)
    result = CliRunner().invoke(app, ["ppo", "--reward", f"py:{rewards}:divides", "--run-dir", str(tmp_path)],
                                env={"COLUMNS": "400"})  # fmt: skip
    assert result.exit_code == 2
    lines = result.output.rstrip("\n").splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-2] == "ZeroDivisionError: float division by zero"
    assert lines[-1].startswith(f"error: reward function py:{rewards}:divides raised ZeroDivisionError")


# ---------------------------------------------------------------------------------------
# several rewards, weighted (ppo's --reward A --reward B --reward-weights 1,0.5)


def test_several_rewards_are_checked_as_options(rewards, tmp_path):
    spec = f"py:{rewards}:named"
    config = config_module.resolve("ppo", flags={"reward": f"model,{spec}", "reward_weights": "1, -0.5", "run_dir": str(tmp_path)})
    from marlhf_cli.train import sources as settings

    assert settings.reward_specs(config) == ["model", spec] and settings.reward_weights(config) == [1.0, -0.5]
    assert settings.uses_reward_model(config)
    as_yaml = config_module.resolve("ppo", flags={"reward": [spec, "apps"], "reward_weights": [2, 1], "run_dir": str(tmp_path)})
    assert settings.reward_specs(as_yaml) == [spec, "apps"] and settings.reward_weights(as_yaml) == [2.0, 1.0]
    assert not settings.uses_reward_model(as_yaml)
    errors = {
        (f"model,{spec}", "1"): "--reward-weights gives 1 weight for 2 rewards (model, " + spec + ")",
        (f"model,{spec}", "1,x"): "--reward-weights must be comma-separated numbers, one per --reward",
        (f"model,{spec}", "1,nan"): "--reward-weights must be comma-separated numbers",
        (f"{spec},{spec}", None): "--reward names a reward twice",
        (f"model,py:{rewards}:nope", None): "defines no 'nope'",
    }
    for (reward_flag, weights), expected in errors.items():
        with pytest.raises(UserError) as caught:
            config_module.resolve("ppo", flags={"reward": reward_flag, "reward_weights": weights, "run_dir": str(tmp_path)})
        assert expected in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    with pytest.raises(UserError, match="--reward takes one reward here, got 2"):
        config_module.resolve("bon", flags={"reward": f"model,{spec}"})


def test_weighted_rewards_sum_the_parts_and_keep_each_ones_scores(rewards):
    from types import SimpleNamespace

    from marlhf_cli.scoring.rewards import TokenFractionReward, WeightedRewards

    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        rows, width = 1 + trial % 4, 5
        ids = torch.randint(0, 6, (rows, width), generator=generator)
        mask = (torch.arange(width) < torch.randint(1, width + 1, (rows, 1), generator=generator)).long()
        completions = ["".join("abc "[int(i) % 4] for i in row[: int(m.sum())]) for row, m in zip(ids, mask)]
        batch = SimpleNamespace(prompts=["p"] * rows, responses=completions, records=[{"prompt": "p"}] * rows,
                                response_ids=ids, response_mask=mask)  # fmt: skip
        parts = [("everything", reward(rewards, "everything")), ("fraction", TokenFractionReward([1, 2]))]
        weights = torch.randn(2, generator=generator).tolist()
        combined = WeightedRewards(parts, weights)
        # the reference: each part's scores, summed with the weights by hand
        each = {name: [float(x) for x in part(batch)] for name, part in parts}
        expected = [weights[0] * a + weights[1] * b for a, b in zip(each["everything"], each["fraction"])]
        assert combined(batch).tolist() == pytest.approx(expected, rel=1e-6, abs=1e-6)
        assert combined.last.keys() == each.keys()
        for name, scores in combined.last.items():
            assert scores.tolist() == pytest.approx(each[name])
    assert combined.name == f"{weights[0]:g} x py:{rewards}:everything + {weights[1]:g} x token-fraction"
    with pytest.raises(ValueError, match="2 rewards, 1 weights"):
        WeightedRewards(parts, [1.0])
