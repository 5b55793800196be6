"""``ppo --env``: multi-turn episodes as the rollout (marlhf_cli/episodes/), in the stage.

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

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...episodes.environment import Environments, load_factory
from ...episodes.rollout import EpisodeBatch, sample_episodes
from ...seeding import derived_seed


class EnvironmentReward:
    """The reward entry of a run whose rewards are its environment's: named in the start-up
    line and the table, never called (the episodes carry their rewards)."""

    model = None

    def __init__(self, spec: str):
        self.name = f"env {spec}"

    def __call__(self, batch) -> Any:
        raise RuntimeError("an environment's episodes are scored by their turn rewards, not by a reward function")


@dataclass(frozen=True)
class Episodes:
    """What a run's episodes are: its environment and budgets (from ``--env``, ``--max-turns``,
    ``--max-episode-tokens``, ``--env-timeout``)."""

    spec: str
    factory: Callable[..., Any]
    max_turns: int
    max_episode_tokens: int
    timeout: float

    def play(self, ctx, model, records: Sequence[dict], seeds: Sequence[int]) -> EpisodeBatch:
        """One episode per record, each environment seeded with its seed."""
        environments = Environments(self.spec, self.factory, records, seeds, timeout=self.timeout)
        config = ctx.config
        # the static cache holds a whole episode's context, not a prompt and one response
        sampling = dataclasses.replace(ctx.rollout.sampling, cache_length=config.max_prompt_length + self.max_episode_tokens)
        return sample_episodes(
            model, ctx.chat, environments, sampling, max_prompt_length=config.max_prompt_length, max_turns=self.max_turns,
            max_episode_tokens=self.max_episode_tokens, device=ctx.models.device,
        )  # fmt: skip

    def draw(self, ctx, step: int, records: Sequence[dict], sample_numbers: Sequence[int]) -> Callable:
        """A step's sampling (make_experience's ``draw``): the episodes of its records."""
        seeds = [derived_seed(ctx.config.seed, step, number, "env") for number in sample_numbers]
        return lambda model, prompts: self.play(ctx, model, records, seeds)

    def held_out(self, ctx, model, records: Sequence[dict], indices: Sequence[int]) -> EpisodeBatch:
        """The held-out episodes of the records at ``indices`` of the held-out list."""
        return self.play(ctx, model, records, [derived_seed(ctx.config.seed, index, "eval-env") for index in indices])


def from_config(config) -> Episodes | None:
    """The run's episodes, or None without ``--env``."""
    if not getattr(config, "env", None):
        return None
    return Episodes(config.env, load_factory(config.env), config.max_turns, episode_tokens(config), config.env_timeout)


OBSERVATION_TOKENS = 64  # the default budget's room for each observation (its template's words included)


def episode_tokens(config) -> int:
    """``--max-episode-tokens``, by default room for every turn at its longest and 64 tokens for
    each observation between them."""
    return config.max_episode_tokens or config.max_turns * config.max_new_tokens + (config.max_turns - 1) * OBSERVATION_TOKENS
