"""``ppo --env``: multi-turn episodes (marlhf_cli/episodes/) as the stage's rollouts.

With ``--env py:FILE.py:NAME`` a step plays one episode per sampled record (K per record for
the group estimators) instead of sampling one response per prompt: the environment's first
message is the prompt, its answers are read between the policy's turns, its turn rewards are
the rewards (placed at the end of their turns, experience.make_experience). Every estimator
that reads only the rollout works on them as it is: ``gae`` (token PPO at ``--n 1``, MA-PPO
with any rule cutting inside turns, ``--termination turn`` for a turn per macro action),
``rloo`` and ``grpo`` (an episode's return against its group's). The two that sample from
inside an episode continue it against a replayed environment (marlhf_cli/episodes/branching.py):
``tree`` branches at turn ends (:func:`draw`), ``mc`` continues each macro action's start to
the episode's end and scores the continuation by the whole episode's return, the turns
before the start included (:func:`continuation_scores`): those rewards are the same for every
continuation of a start, so V(s_{k+1}) - V(s_k) keeps only what came after it.

Seeds: the training episodes' environments are seeded with (seed, step, the sample number
of their group's first episode), so a resumed run replays them, and the K episodes of one
record (a group for rloo, grpo and mc; a tree's K^D) play one game, as K responses answer
one prompt (a branch or a continuation: its episode's seed); the held-out
episodes' with (seed, the prompt's index), the same at every evaluation, so the evaluation
before training and the last one play the same games. A branch's and a continuation's
tokens come from the global generator the stage seeds per step.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from ...episodes.branching import cut
from ...episodes.rollout import EpisodeBatch, as_batch
from ...seeding import derived_seed


class EnvironmentReward:
    """The reward entry of a run whose rewards are its environment's: named in the start-up
    line and the table, never called (the episodes carry their rewards)."""

    model = None

    def __init__(self, spec: str):
        self.name = f"env {spec}"

    def __call__(self, batch) -> Any:
        raise RuntimeError("an environment's episodes are scored by their turn rewards, not by a reward function")


def _play(ctx, model, records: Sequence[dict], seeds: Sequence[int]) -> EpisodeBatch:
    return ctx.episodes.play(model, ctx.chat, records, seeds, sampling=ctx.rollout.sampling,
                             max_prompt_length=ctx.config.max_prompt_length, device=ctx.models.device)  # fmt: skip


def draw(ctx, step: int, records: Sequence[dict], sample_numbers: Sequence[int]) -> Callable:
    """A step's sampling (make_experience's ``draw``): the episodes of its records (``tree``:
    a tree of K^D episodes per K^D records, which are one record repeated)."""
    group = ctx.plan.group_size  # consecutive episodes of one record
    seeds = [derived_seed(ctx.config.seed, step, sample_numbers[k - k % group], "env") for k in range(len(sample_numbers))]
    if ctx.estimator.name != "tree":
        return lambda model, prompts: _play(ctx, model, records, seeds)
    config = ctx.config
    return lambda model, prompts: ctx.episodes.play_trees(
        model, ctx.chat, records[::group], seeds[::group], branches=config.tree_branches, depth=config.tree_depth,
        sampling=ctx.rollout.sampling, max_prompt_length=config.max_prompt_length, device=ctx.models.device,
    )  # fmt: skip


def continuation_scores(ctx, model, experience, rows: Sequence[int], columns: Sequence[int], rollouts: int
                        ) -> tuple[torch.Tensor, int, float]:  # fmt: skip
    """``mc`` on episodes: ``rollouts`` continuations of episode ``rows[n]`` from its column
    ``columns[n]`` (a macro action's first token), each played to the episode's end; their
    scores [N, rollouts] (the whole episode's turn rewards, each clipped as the rollout's are,
    summed), the tokens they drew and the seconds it took. Sampled ``experience.batch_size x
    rollouts`` episodes at a time."""
    started = time.perf_counter()
    episodes = experience.episode.episodes
    starts = [(row, column) for row, column in zip(rows, columns) for _ in range(rollouts)]
    sums, tokens, chunk = [], 0, max(1, experience.batch_size * rollouts)
    for first in range(0, len(starts), chunk):
        part = starts[first : first + chunk]
        finished = ctx.episodes.continued(
            model, ctx.chat, [experience.records[row] for row, _ in part], [cut(episodes[row], column) for row, column in part],
            sampling=ctx.rollout.sampling, max_prompt_length=ctx.config.max_prompt_length, device=ctx.models.device,
        )  # fmt: skip
        played = as_batch(finished, ctx.models.tokenizer.pad_token_id, "cpu")
        tokens += played.sampled_tokens
        sums.append(played.clipped_turn_rewards(ctx.rollout.reward_clip).sum(dim=1))
    scores = torch.cat(sums) if sums else torch.zeros(0)  # no boundary: no continuation
    return scores.reshape(len(rows), rollouts), tokens, time.perf_counter() - started


def held_out(ctx, model, records: Sequence[dict], indices: Sequence[int]) -> EpisodeBatch:
    """The held-out episodes of the records at ``indices`` of the held-out list."""
    return _play(ctx, model, records, [derived_seed(ctx.config.seed, index, "eval-env") for index in indices])
