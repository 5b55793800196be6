"""``ppo --env``: multi-turn episodes (marlhf_cli/episodes/) as the stage's rollouts.

With ``--env py:FILE.py:NAME`` a step plays one episode per sampled record (K per record for
the group estimators) instead of sampling one response per prompt: the environment's first
message is the prompt, its answers are read between the policy's turns, its turn rewards are
the rewards (placed at the end of their turns, experience.make_experience). Every estimator
that reads only the rollout works on them as it is: ``gae`` (token PPO at ``--n 1``, MA-PPO
with any rule cutting inside turns, ``--termination turn`` for a turn per macro action),
``rloo`` and ``grpo`` (an episode's return against its group's). ``mc`` and ``tree`` would
need an environment copied at a boundary mid-episode and are refused for now.

Seeds: the training episodes' environments are seeded with (seed, step, the episode's
sample number), so a resumed run replays them; the held-out episodes' with (seed, the
prompt's index), the same at every evaluation, so the evaluation before training and the last
one play the same games.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ...episodes.rollout import EpisodeBatch
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
    """A step's sampling (make_experience's ``draw``): the episodes of its records."""
    seeds = [derived_seed(ctx.config.seed, step, number, "env") for number in sample_numbers]
    return lambda model, prompts: _play(ctx, model, records, seeds)


def held_out(ctx, model, records: Sequence[dict], indices: Sequence[int]) -> EpisodeBatch:
    """The held-out episodes of the records at ``indices`` of the held-out list."""
    return _play(ctx, model, records, [derived_seed(ctx.config.seed, index, "eval-env") for index in indices])
