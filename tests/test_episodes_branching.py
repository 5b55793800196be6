"""``--advantage tree`` and ``mc`` on ``--env`` episodes: an episode continued from inside it
against a replayed environment (marlhf_cli/episodes/branching.py).

- ``cut`` against a loop over the turns, on random action masks;
- a replay gives every answer the original got, and an environment whose answers do not
  follow from its record, seed and replies is one line;
- ``grow_trees`` against a tree built node by node in the test (random episode shapes);
- through the stage with the tiny model: a tree's leaves share their nodes' tokens and play one
  game, their advantages are V(node) - V(parent) of a brute force over the leaves' returns;
  mc's continuations count the rewards of the turns before their start (a game that rewards
  only the first turn gives every later macro action an advantage of exactly 0);
- a tree and an mc run stopped by a failing environment resume to the uninterrupted run
  (a tree without ``--termination turn`` is one line: test_episodes_stage.py).
"""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

from marlhf_cli.episodes.branching import cut, grow_trees, replayed, turn_start
from marlhf_cli.episodes.environment import Environments, Observation
from marlhf_cli.episodes.rollout import Episode
from marlhf_cli.errors import UserError
from test_episodes import _runs
from test_episodes_stage import GAME, ROOT, _build, _config, _episode_experience, _rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _random_episode(rng: random.Random) -> Episode:
    """An episode of 1-4 turns with observations between them (tokens are column numbers)."""
    actions: list[int] = []
    turns = rng.randint(1, 4)
    for turn in range(turns):
        actions += [1] * rng.randint(1, 5)
        if turn < turns - 1:
            actions += [0] * rng.randint(1, 3)
    said = [Observation(f"said {t}", "user", float(t), t == turns - 1) for t in range(turns)]
    return Episode("first", "prompt", [7, 8], 11, tokens=list(range(len(actions))), actions=actions,
                   replies=[f"reply {t}" for t in range(turns)], observations=said, done=True)  # fmt: skip


def test_cut_keeps_the_finished_turns_and_the_tokens_of_an_unfinished_one():
    rng = random.Random(0)
    checked = 0
    for _ in range(200):
        episode = _random_episode(rng)
        runs = _runs(episode.actions)
        for column in range(1, len(episode.tokens)):
            if not episode.actions[column]:
                with pytest.raises(ValueError):
                    cut(episode, column)
                continue
            part = cut(episode, column)
            finished = sum(1 for _, end in runs if end <= column)
            inside = [first for first, end in runs if first < column < end]
            assert part.tokens == episode.tokens[:column] and part.actions == episode.actions[:column]
            assert part.replies == episode.replies[:finished] and part.observations == episode.observations[:finished]
            assert part.partial == (column - inside[0] if inside else 0)
            assert (part.seed, part.first, part.prompt_row, part.done, part.drawn) == (11, "first", [7, 8], False, 0)
            checked += 1
        for turn, (first, _) in enumerate(runs):
            assert turn_start(episode, turn) == first
        assert turn_start(episode, len(runs)) == len(episode.tokens)
    assert checked > 500


SEEDED = '''
import random


class Seeded:
    """Answers from its seed and the replies so far (a replay is the original)."""

    def __init__(self, record, seed):
        self.rng, self.turns = random.Random(seed), 0

    def reset(self):
        return "Start."

    def step(self, reply):
        self.turns += 1
        return f"{reply} {self.rng.randint(0, 10**6)}", self.rng.random(), self.turns == 3


class Forgetful(Seeded):
    """Draws from a generator of its own that no seed sets: a replay answers otherwise."""

    made = 0

    def __init__(self, record, seed):
        Forgetful.made += 1
        super().__init__(record, seed + Forgetful.made)
'''


def _played(environments: Environments, replies: list[str]) -> Episode:
    """The episode environment 0 gives to ``replies`` (tokens: a turn of two, an observation of one)."""
    (first,) = environments.reset()[:1]
    episode = Episode(first, "prompt", [1], environments.seeds[0])
    for turn, reply in enumerate(replies):
        seen = environments.step({0: reply}, {0: turn})[0]
        episode.replies.append(reply)
        episode.observations.append(seen)
        episode.tokens += [5, 6, 9]
        episode.actions += [1, 1, 0]
    return episode


def test_a_replay_is_the_original_and_an_environment_that_answers_otherwise_is_one_line(tmp_path):
    from marlhf_cli.episodes.environment import load_factory

    path = tmp_path / "seeded.py"
    path.write_text(SEEDED, encoding="utf-8")
    for name, replays in (("Seeded", True), ("Forgetful", False)):
        spec = f"py:{path}:{name}"
        factory = load_factory(spec)
        episode = _played(Environments(spec, factory, [{}], [42], timeout=5), ["a", "b"])
        start = cut(episode, 3)  # the second turn's first token: one finished turn to replay
        assert start.replies == ["a"] and start.partial == 0
        if replays:
            environments = replayed(spec, factory, [{}], [start], timeout=5)
            assert environments.step({0: "b"}, {0: 1})[0] == episode.observations[1]  # it stands where the episode stood
            continue
        with pytest.raises(UserError) as caught:
            replayed(spec, factory, [{}], [start], timeout=5)
        message = str(caught.value)
        assert message.startswith(f"--env {spec}: replaying episode 1 with the same record, seed and replies changed its "
                                  "answer to turn 1: tree and mc branch an episode by replaying it") and "\n" not in message  # fmt: skip


def _reference_tree(root_of, continue_one, branches: int, depth: int):
    """One tree built node by node: [(leaf, [node starts])] in base-K digit order."""

    def grow(path: Episode, level: int, starts: list[int]):
        if level == depth:
            return [(path, starts)]
        end = turn_start(path, level)
        if end < len(path.tokens):
            children = [path] + [continue_one(path, end) for _ in range(branches - 1)]
        else:
            children = [path] * branches
        return [leaf for child in children for leaf in grow(child, level + 1, starts + [end])]

    return [leaf for k in range(branches) for leaf in grow(root_of(k), 1, [])]


@pytest.mark.parametrize("branches, depth", [(2, 1), (2, 2), (3, 2), (2, 3)])
def test_trees_of_episodes_against_a_tree_grown_node_by_node(branches, depth):
    """Random episode shapes (an episode ends after 1-4 turns); every continuation is named by
    its parent's tokens and a per-parent counter, so the two builds can be compared leaf by
    leaf whatever order they call in."""
    rng = random.Random(branches * 10 + depth)
    trees = 3
    roots = [_random_episode(rng) for _ in range(trees * branches)]
    for number, root in enumerate(roots):
        root.tokens = [1000 * number + t for t in root.tokens]
    for root in roots:
        root.drawn = sum(root.actions)
    shapes = {}  # what the n-th continuation of a prefix appends: drawn once, the same for both builds

    def extended(start: Episode, counter: dict) -> Episode:
        key = tuple(start.tokens)
        counter[key] = counter.get(key, 0) + 1
        if (key, counter[key]) not in shapes:
            extra = _random_episode(rng)
            shapes[key, counter[key]] = ([10**6 + len(shapes) * 100 + t for t in extra.tokens], extra.actions)
        tokens, actions = shapes[key, counter[key]]
        start.tokens += tokens
        start.actions += actions
        start.drawn = sum(actions)
        return start

    batched_counter: dict = {}
    calls = []

    def continued(records, starts):
        calls.append(len(starts))
        assert len(records) == len(starts)
        return [extended(start, batched_counter) for start in starts]

    records = [{"tree": t} for t in range(trees)]
    leaves, starts = grow_trees(roots, records, branches=branches, depth=depth, continued=continued)
    assert len(leaves) == trees * branches**depth and all(len(s) == depth - 1 for s in starts)
    assert len(calls) <= depth - 1  # one call per level that branches
    reference_counter: dict = {}
    for tree in range(trees):
        expected = _reference_tree(lambda k: roots[tree * branches + k],
                                   lambda path, end: extended(cut(path, end), reference_counter), branches, depth)  # fmt: skip
        got = list(zip(leaves, starts))[tree * branches**depth : (tree + 1) * branches**depth]
        assert [(leaf.tokens, leaf.actions, s) for leaf, s in got] == [(leaf.tokens, leaf.actions, s) for leaf, s in expected]
    # leaf 0 of every tree is its first root itself; a leaf copied below an ended node drew nothing of its own
    assert all(leaves[t * branches**depth] is roots[t * branches] for t in range(trees))
    drawn_once = sum(sum(r.actions) for r in roots) + sum(sum(actions) for _, actions in shapes.values())
    assert sum(leaf.drawn for leaf in leaves) == drawn_once


# ---------------------------------------------------------------------------------------
# through the stage

FIRST_COUNTS = '''
class FirstCounts:
    """Three turns; only the first is rewarded, by its share of letters a to m."""

    def __init__(self, record, seed):
        self.turns = 0

    def reset(self):
        return "Say something."

    def step(self, reply):
        self.turns += 1
        letters = [c for c in reply.lower() if c.isalpha()]
        reward = sum(c <= "m" for c in letters) / max(len(letters), 1) if self.turns == 1 else 0.0
        return "Go on.", reward, self.turns == 3
'''


@pytest.fixture
def first_counts(tmp_path):
    path = tmp_path / "first_counts.py"
    path.write_text(FIRST_COUNTS, encoding="utf-8")
    return f"py:{path}:FirstCounts"


def _turn_of(mask: torch.Tensor) -> torch.Tensor:
    from marlhf_cli.macro.turns import turn_index

    return turn_index(mask)


def test_a_tree_of_episodes_plays_one_game_shares_its_nodes_and_has_the_brute_force_advantages(tmp_path):
    """K = 2, D = 2 on the letter game (its secret drawn from the seed): the four leaves of a
    tree play one game (one seed, one secret), leaves of one level-1 node share its turn and the
    observation after it, and each token's advantage is V(node) - V(parent) over the leaves'
    returns (kl 0: the return is the sum of the turn rewards)."""
    records = tmp_path / "games.jsonl"
    records.write_text("".join(json.dumps({"prompt": f"Game {i}: guess my letter from a to h."}) + "\n" for i in range(8)))
    config = _config(tmp_path, dataset=str(records), advantage="tree", tree_branches=2, tree_depth=2, kl_coef=0.0,
                     rollout_batch_size=2, mini_batch_size=2, max_turns=3)  # fmt: skip
    ctx = _build(config)
    experience = _episode_experience(ctx)
    episode = experience.episode
    leaves = episode.episodes
    assert len(leaves) == 8 and episode.branch_positions.shape == (8, 1)
    for tree in range(2):
        games = leaves[tree * 4 : tree * 4 + 4]
        assert len({g.seed for g in games}) == 1
    branched = 0
    for node in range(4):  # level-1 nodes: leaves 2 node, 2 node + 1
        a, b = leaves[2 * node], leaves[2 * node + 1]
        at = int(episode.branch_positions[2 * node, 0])
        assert at == int(episode.branch_positions[2 * node + 1, 0]) and a.tokens[:at] == b.tokens[:at]
        if at < len(a.tokens):  # it branched: the second turn begins there in both
            branched += 1
            assert a.actions[at] == b.actions[at] == 1 and a.observations[0] == b.observations[0]
    assert branched >= 1, "no episode reached a second turn"
    returns = episode.returns().double()
    mask = experience.mask.bool()
    level = torch.where(mask, (torch.arange(mask.shape[1])[None, :] >= episode.branch_positions).long(), 0)
    for row in range(8):
        tree, node = row // 4, row // 2
        v_root, v_node, v_leaf = returns[tree * 4 : tree * 4 + 4].mean(), returns[node * 2 : node * 2 + 2].mean(), returns[row]
        expected = torch.where(level[row] == 0, v_node - v_root, v_leaf - v_node).float()
        torch.testing.assert_close(experience.advantages[row][mask[row]], expected[mask[row]], rtol=0, atol=1e-6)
        assert (experience.advantages[row][~mask[row]] == 0).all()


@pytest.mark.parametrize("advantage", [{"advantage": "grpo"}, {"advantage": "mc", "mc_rollouts": 1}])
def test_the_episodes_of_one_record_play_one_game(tmp_path, advantage):
    """A group's K episodes (one record) get one seed, so a game that draws its secret from
    the seed is one game for the group's baseline; the step's groups get different seeds."""
    records = tmp_path / "games.jsonl"
    records.write_text("".join(json.dumps({"prompt": f"Game {i}: guess my letter from a to h."}) + "\n" for i in range(8)))
    config = _config(tmp_path, dataset=str(records), rollout_batch_size=2, mini_batch_size=2, samples_per_prompt=4, **advantage)
    episodes = _episode_experience(_build(config)).episode.episodes
    seeds = [episode.seed for episode in episodes]
    assert seeds[:4] == [seeds[0]] * 4 and seeds[4:] == [seeds[4]] * 4 and seeds[0] != seeds[4]


@pytest.mark.parametrize("termination", [{"termination": "turn"}, {"termination": "fixed", "n": 2}])
def test_mc_continuations_count_the_turns_before_their_start(tmp_path, first_counts, termination):
    """A game that rewards only the first turn: a continuation from any macro action after it
    returns exactly the episode's own score (the first turn's reward, replayed), so every later
    macro action's advantage is 0 and the first turn's advantages add up to its score minus
    the group's others' mean; ``fixed --n 2`` also continues from inside turns."""
    from marlhf_cli.macro.baselines import leave_one_out_means

    config = _config(tmp_path, env=first_counts, advantage="mc", kl_coef=0.0, max_new_tokens=4, rollout_batch_size=2,
                     mini_batch_size=2, mc_rollouts=2, **termination)  # fmt: skip
    ctx = _build(config)
    experience = _episode_experience(ctx)
    mask, turn = experience.mask.bool(), _turn_of(experience.mask)
    assert experience.continuations > 0 and experience.continuation_tokens > 0
    later = mask & (turn >= 1)
    assert later.any() and (experience.advantages[later] == 0).all()
    baseline = leave_one_out_means(experience.scores, ctx.plan.group_size)
    for row in range(experience.batch_size):
        first = mask[row] & (turn[row] == 0)
        ids = experience.segment_ids[row][first]
        values = experience.advantages[row][first]
        per_segment = [float(values[ids == s][0]) for s in ids.unique()]  # one advantage per macro action
        assert sum(per_segment) == pytest.approx(float(experience.scores[row] - baseline[row]), abs=1e-5)
    if termination["termination"] == "fixed":  # a macro action began inside a turn, and was continued from there
        ids = experience.segment_ids
        assert (mask[:, 1:] & mask[:, :-1] & (ids[:, 1:] != ids[:, :-1])).any()


FLAKY_SEEDS = '''
import json
import pathlib

from guess_letter import GuessLetter

BAD = set(json.loads(pathlib.Path(__file__).with_suffix(".json").read_text()))


class Flaky(GuessLetter):
    """The game, but step() raises for the environments of one step (their seeds are listed)."""

    def __init__(self, record, seed):
        super().__init__(record, seed)
        self.broken = seed in BAD

    def step(self, reply):
        if self.broken:
            raise KeyError("the board")
        return super().step(reply)
'''


@pytest.mark.slow
@pytest.mark.parametrize("advantage", [{"advantage": "tree"}, {"advantage": "mc", "mc_rollouts": 1}])
def test_a_tree_or_mc_run_stopped_by_its_environment_resumes_to_the_uninterrupted_run(tmp_path, advantage):
    """Step 3's environments (and every replay of them) raise; the run stops with step 2's
    checkpoint, and the fixed environment's --resume gives the uninterrupted run's metrics."""
    import shutil

    from marlhf_cli.seeding import derived_seed
    from marlhf_cli.train import ppo

    shutil.copy(ROOT / "templates" / "envs" / "guess_letter.py", tmp_path / "guess_letter.py")
    flaky = tmp_path / "flaky.py"
    flaky.write_text(FLAKY_SEEDS, encoding="utf-8")
    seeds = [derived_seed(5, 2, number, "env") for number in range(64)]  # step 3's, whatever their sample numbers
    (tmp_path / "flaky.json").write_text(json.dumps(seeds))
    flags = dict(env=f"py:{flaky}:Flaky", rollout_batch_size=2, mini_batch_size=2, **advantage)
    name = "tree-turn" if advantage["advantage"] == "tree" else "mc-turn-m1"
    ppo.run(_config(tmp_path / "straight", **(flags | {"env": GAME})))
    broken = tmp_path / "broken"
    with pytest.raises(UserError, match="stopped after step 2, whose checkpoint is saved"):
        ppo.run(_config(broken, **flags))
    (tmp_path / "flaky.json").write_text("[]")  # the fix
    os.utime(flaky, ns=(flaky.stat().st_atime_ns, flaky.stat().st_mtime_ns + 10**9))
    ppo.run(_config(broken, **flags, resume=True))
    got, expected = _rows(broken, name), _rows(tmp_path / "straight", name)
    assert len(got) == len(expected) and all(a == b for a, b in zip(got, expected)), [
        {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)} for a, b in zip(got, expected)]



def test_spread_segments_numbers_macro_actions_over_the_observations_as_a_loop_does():
    """Random episodes with random segment labels (-1 off the actions, any labels on them): each
    macro action numbered in time order, each observation carrying the number before it."""
    from marlhf_cli.macro.turns import spread_segments

    rng = random.Random(3)
    for _ in range(100):
        rows = [_random_episode(rng) for _ in range(3)]
        width = max(len(e.actions) for e in rows) + 2
        actions = torch.zeros((3, width), dtype=torch.long)
        labels = torch.full((3, width), -1, dtype=torch.long)
        attention = torch.zeros_like(actions)
        expected = torch.zeros_like(actions)
        for b, episode in enumerate(rows):
            number, previous = -1, None
            for column, action in enumerate(episode.actions):
                attention[b, column] = 1
                if action:
                    label = rng.choice([previous, rng.randint(0, 50)]) if previous is not None else rng.randint(0, 50)
                    actions[b, column], labels[b, column] = 1, label
                    if previous is None or label != previous:
                        number += 1
                    previous = label
                expected[b, column] = max(number, 0)
        torch.testing.assert_close(spread_segments(labels, actions, attention), expected, rtol=0, atol=0)


@pytest.mark.slow
def test_a_tree_of_episodes_on_two_processes_with_its_completions_table(tmp_path):
    """``--nproc 2`` with ``--env``: each process plays and branches its own trees (a tree never
    spans processes), the step counts both; the TensorBoard completions table shows whole
    episodes, the macro actions marked and the game's answers in brackets."""
    import subprocess
    import sys

    from marlhf_cli.artifacts import read_jsonl
    from test_ppo_resume import environment
    from test_tracking import tensorboard_texts

    argv = [sys.executable, "-m", "marlhf_cli.cli", "ppo", "--run-dir", str(tmp_path), "--policy", "tiny", "--reward-model", "tiny",
            "--dataset", str(ROOT / "templates" / "prompts" / "guess-letter.jsonl"), "--env", GAME, "--split-shares", "0/0/3/1",
            "--advantage", "tree", "--termination", "turn", "--max-turns", "3", "--max-new-tokens", "4",
            "--max-episode-tokens", "64", "--max-prompt-length", "64", "--rollout-batch-size", "2", "--mini-batch-size", "4",
            "--max-steps", "2", "--save-every", "0", "--eval-every", "2", "--eval-prompts", "2", "--report-to", "tensorboard",
            "--nproc", "2", "--zero-stage", "2", "--seed", "4"]  # fmt: skip
    done = subprocess.run(argv, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 processes" in done.stderr
    train = [r for r in read_jsonl(tmp_path / "metrics" / "ppo-tree-turn.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(r["responses"] == 8.0 and r["turns"] >= 1 for r in train)
    (table,) = tensorboard_texts(tmp_path / "tb" / "ppo-tree-turn", "completions").values()
    assert "| prompt | response | score | segment_advantages |" in table and "@@" in table
    assert "[" in table and any(answer in table for answer in ("comes earlier", "comes later", "not a letter", "Right, it was"))


def test_the_start_up_line_bounds_the_continuations_of_episodes(tmp_path):
    """mc on episodes: at most --max-turns turns, each cut as the rule cuts a turn."""
    from marlhf_cli.train.ppo import credit
    from marlhf_cli.train.ppo.estimators import mc_cost

    turn = _config(tmp_path, advantage="mc", max_turns=3)
    assert mc_cost(turn, credit.make_rule(turn), 8) == (
        "mc: up to 32 continuations per step (8 episodes x at most 2 boundaries x 2 rollouts), each played to its end, "
        "beside the 8 episodes")  # fmt: skip
    fixed = _config(tmp_path, advantage="mc", max_turns=3, termination="fixed", n=2, max_new_tokens=4)
    assert "(8 episodes x at most 5 boundaries x 2 rollouts)" in mc_cost(fixed, credit.make_rule(fixed), 8)
