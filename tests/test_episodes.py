"""Multi-turn episodes (``ppo --env``): the turns of an action mask against plain loops, GAE over
turns with intermediate rewards against a brute-force reference, the environment's calls and
their one-line errors, and the shipped game's optimum."""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.errors import UserError
from marlhf_cli.macro import macro_advantages
from marlhf_cli.macro.turns import place_turn_rewards, split_turns, turn_counts, turn_ends, turn_index

ROOT = Path(__file__).resolve().parents[1]
GAME = ROOT / "templates" / "envs" / "guess_letter.py"


def _episode_masks(seed: int, rows: int, width: int) -> torch.Tensor:
    """Random action masks shaped like episodes: runs of turns, observations between, padding after."""
    rng = random.Random(seed)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for b in range(rows):
        at = 0
        while at < width:
            turn = rng.randint(1, 5)
            mask[b, at : at + turn] = 1
            at += turn + rng.randint(1, 4)  # an observation of 1-4 tokens
            if rng.random() < 0.25:
                break
    return mask


def _runs(row: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s, end exclusive: a plain loop."""
    runs, start = [], None
    for t, v in enumerate(row + [0]):
        if v and start is None:
            start = t
        if not v and start is not None:
            runs.append((start, t))
            start = None
    return runs


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 30))
def test_turns_are_the_runs_of_the_action_mask(seed, rows, width):
    mask = _episode_masks(seed, rows, width)
    index, ends, counts = turn_index(mask), turn_ends(mask), turn_counts(mask)
    split = split_turns(mask)
    listed = []
    for b in range(rows):
        runs = _runs(mask[b].tolist())
        assert int(counts[b]) == len(runs)
        expected = [-1] * width
        for k, (start, end) in enumerate(runs):
            expected[start:end] = [k] * (end - start)
            assert bool(ends[b, end - 1]) and not ends[b, start : end - 1].any()
            listed.append((b, start, end - start, k))
        assert index[b].tolist() == expected
    assert list(zip(split.row.tolist(), split.start.tolist(), split.length.tolist(), split.turn.tolist())) == listed
    values = torch.arange(rows * width).reshape(rows, width)
    gathered = split.gather(values, fill=-7)
    for i, (b, start, length, _) in enumerate(listed):
        assert gathered[i, :length].tolist() == values[b, start : start + length].tolist()
        assert (gathered[i, length:] == -7).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 24), st.integers(1, 3))
def test_a_rule_cut_inside_turns_comes_back_to_the_episode_and_never_crosses_a_turn(seed, rows, width, n):
    mask = _episode_masks(seed, rows, width)
    split = split_turns(mask)
    turn_mask = split.mask()
    inside = (torch.arange(turn_mask.shape[1])[None, :] // n).expand_as(turn_mask)  # fixed n within each turn
    ids = split.join_segments(torch.where(turn_mask.bool(), inside, torch.zeros_like(inside)))
    assert ((ids >= 0) == mask.bool()).all()
    for b in range(rows):
        for start, end in _runs(mask[b].tolist()):
            expected = [(t - start) // n for t in range(start, end)]
            got = ids[b, start:end].tolist()
            # the same cuts as fixed n within the turn: equal ids exactly where the reference's are
            assert [got[i] == got[j] for i in range(len(got)) for j in range(len(got))] == \
                [expected[i] == expected[j] for i in range(len(got)) for j in range(len(got))]
        seen = {}
        for start, end in _runs(mask[b].tolist()):  # no id is shared by two turns
            for value in set(ids[b, start:end].tolist()):
                assert seen.setdefault(value, start) == start


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 30))
def test_turn_rewards_land_on_the_last_token_of_their_turn(seed, rows, width):
    mask = _episode_masks(seed, rows, width)
    gen = torch.Generator().manual_seed(seed)
    counts = turn_counts(mask)
    most = max(int(counts.max()), 1)
    turn_rewards = torch.randn(rows, most, generator=gen) * (torch.arange(most)[None, :] < counts[:, None])
    base = torch.randn(rows, width, generator=gen)
    placed = place_turn_rewards(base, turn_rewards, mask)
    expected = base.clone()
    for b in range(rows):
        for k, (_, end) in enumerate(_runs(mask[b].tolist())):
            expected[b, end - 1] += turn_rewards[b, k]
    assert torch.allclose(placed, expected)


def test_a_turn_reward_with_no_turn_to_land_on_is_an_error():
    mask = torch.tensor([[1, 1, 0, 1]])
    with pytest.raises(ValueError, match="no token to land on"):
        place_turn_rewards(torch.zeros(1, 4), torch.tensor([[1.0, 0.5, 0.25]]), mask)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 30), st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_gae_over_turns_with_turn_rewards_is_the_brute_force_over_turns(seed, rows, width, gamma, lam):
    """MA-PPO with a turn per macro action (``--termination turn``): each turn's value the mean
    of its tokens' values (``equal``), its reward the sum of its tokens' rewards (the KL terms
    and the environment's reward at its end), GAE over the turns; observations and padding,
    whatever they hold, take no part. The reference is a loop over each episode's turns."""
    mask = _episode_masks(seed, rows, width)
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, width, generator=gen)
    kl = torch.randn(rows, width, generator=gen) * 0.1
    counts = turn_counts(mask)
    most = max(int(counts.max()), 1)
    turn_rewards = torch.randn(rows, most, generator=gen) * (torch.arange(most)[None, :] < counts[:, None])
    rewards = place_turn_rewards(torch.where(mask.bool(), -kl, torch.zeros(())), turn_rewards, mask)
    noisy = torch.where(mask.bool(), rewards, torch.full_like(rewards, 1e6))  # observations hold garbage
    advantages, returns = macro_advantages(noisy, torch.where(mask.bool(), values, torch.full_like(values, -1e6)), mask,
                                           turn_index(mask), gamma=gamma, lam=lam, value_function="equal")  # fmt: skip
    for b in range(rows):
        runs = _runs(mask[b].tolist())
        v = [float(values[b, s:e].mean()) for s, e in runs]
        r = [float(rewards[b, s:e].sum()) for s, e in runs]
        a, following = [0.0] * len(runs), 0.0
        for k in reversed(range(len(runs))):
            delta = r[k] + gamma * (v[k + 1] if k + 1 < len(runs) else 0.0) - v[k]
            following = delta + gamma * lam * following
            a[k] = following
        for k, (s, e) in enumerate(runs):
            assert torch.allclose(advantages[b, s:e], torch.full((e - s,), a[k]), atol=1e-4)
            assert torch.allclose(returns[b, s:e], torch.full((e - s,), a[k] + v[k]), atol=1e-4)
        assert (advantages[b][~mask[b].bool()] == 0).all() and (returns[b][~mask[b].bool()] == 0).all()


# ---------------------------------------------------------------------------------------
# the environment's calls


def _game():
    spec = importlib.util.spec_from_file_location("guess_letter_for_tests", GAME)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_games_optimum_finds_every_letter_within_four_guesses_and_a_blind_player_half():
    game = _game()
    for secret in game.LETTERS:
        env = game.GuessLetter({"prompt": "p", "columns": {"secret": secret}}, seed=0)
        low, high, total = game.LETTERS[0], game.LETTERS[-1], 0.0
        for turn in range(4):
            guess = game.optimal_guess(low, high)
            said, reward, done = env.step(f"{guess.upper()}, I think.")
            total += reward
            if done:
                break
            low, high = (chr(ord(guess) + 1), high) if "later" in said else (low, chr(ord(guess) - 1))
        assert done and total == 1.0, secret
    blind = [sum(env.step(g)[1] for g in "abcd") for env in (game.GuessLetter({"secret": s}, 0) for s in game.LETTERS)]
    assert sum(blind) / len(blind) == 0.5  # never wasting a turn, never reading the answers
    env = game.GuessLetter({}, seed=3)
    assert env.step("42 !")[1:] == (game.WASTED, False) and env.step("zebra")[1:] == (game.WASTED, False)
    assert game.GuessLetter({}, seed=3).secret == env.secret  # drawn from the seed


class _Scripted:
    """An environment that does what it is told to (for the error cases)."""

    behaviour = "ok"

    def __init__(self, record, seed):
        self.seed = seed

    def reset(self):
        return None if self.behaviour == "reset-none" else "hello"

    def step(self, reply):
        import time

        kind = self.behaviour
        if kind == "raises":
            raise KeyError("the board")
        if kind == "hangs":
            time.sleep(30)
        return {
            "none": None, "number": (42, 0.0, False), "nan": ("more", math.nan, False), "done-string": ("x", 1.0, "yes"),
            "role": ({"role": "system", "content": "x"}, 0.0, False), "ok": ("more", 0.5, False),
        }[kind]  # fmt: skip


@pytest.mark.parametrize("behaviour, words", [
    ("raises", "step() raised KeyError: 'the board' (episode 1, turn 1)"),
    ("hangs", "step() did not return within 0.5 s (episode 1, turn 1; --env-timeout)"),
    ("none", "step() returned None (episode 1, turn 1), not (observation, reward, done)"),
    ("number", "step() returned the observation int 42 (episode 1, turn 1) with the episode not over"),
    ("nan", "step() returned the reward float nan (episode 1, turn 1), not a finite number"),
    ("done-string", "returned done = str 'yes' (episode 1, turn 1), not True or False"),
    ("role", "an observation in the role 'system'"),
    ("reset-none", "reset() returned None (episode 1), not the first user message"),
])  # fmt: skip
def test_an_environment_that_misbehaves_is_one_line_naming_it(monkeypatch, behaviour, words):
    from marlhf_cli.episodes.environment import Environments

    monkeypatch.setattr(_Scripted, "behaviour", behaviour)
    with pytest.raises(UserError) as caught:
        environments = Environments("py:e.py:Scripted", _Scripted, [{}, {}], [1, 2], timeout=0.5)
        environments.reset()
        environments.step({0: "a", 1: "b"}, {0: 0, 1: 0})
    message = str(caught.value)
    assert message.startswith("--env py:e.py:Scripted: ") and words in message and "\n" not in message, message


def test_an_environment_without_reset_or_step_is_named():
    from marlhf_cli.episodes.environment import Environments

    with pytest.raises(UserError, match=r"it made a dict \(episode 1\), which has no reset\(\) method"):
        Environments("py:e.py:make", lambda record, seed: {}, [{}], [0], timeout=1)


# ---------------------------------------------------------------------------------------
# marlhf segment --rule turn


def test_segment_turn_marks_each_assistant_turn_and_shows_the_rest_as_read(tmp_path):
    import json

    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    transcript = tmp_path / "chat.txt"
    transcript.write_text("Human: Guess my letter.\n\nAssistant: C\n\nHuman: No, later than c.\n\nAssistant: f, I think\n\nHuman: Right.")
    shown = CliRunner().invoke(app, ["segment", str(transcript), "--rule", "turn"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines() == ["[user] Guess my letter.", "C@@", "[user] No, later than c.", "f, I think@@", "[user] Right."]
    samples = tmp_path / "samples.jsonl"  # what ppo --env writes: the prompt turns and the whole episode
    samples.write_text(json.dumps({"prompt": "p", "conversation": {"prompt": [{"role": "user", "content": "p"}]},
                                   "episode": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "a"},
                                               {"role": "tool", "content": "out"}, {"role": "assistant", "content": "b"}]}) + "\n")  # fmt: skip
    as_json = CliRunner().invoke(app, ["segment", str(samples), "--rule", "turn", "--format", "json"])
    turns = json.loads(as_json.output)["turns"]
    assert [(t["role"], t["macro_action"]) for t in turns] == [("user", False), ("assistant", True), ("tool", False), ("assistant", True)]
    stats = CliRunner().invoke(app, ["segment", str(samples), "--rule", "turn", "--stats"])
    assert "1 conversations, 2 assistant turns (macro actions)" in stats.output
    for args, words in (([str(transcript), "--rule", "turn,fixed"], "--rule turn cuts conversations into their assistant turns: give it alone"),
                        ([str(tmp_path / "none.txt"), "--rule", "turn"], "file not found"),
                        ([str(samples.with_name("plain.txt")), "--rule", "turn"], "not a conversation")):  # fmt: skip
        if "plain" in args[0]:
            Path(args[0]).write_text("just some text")
        result = CliRunner().invoke(app, ["segment", *args])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output
