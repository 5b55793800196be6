"""Multi-turn episodes (``--env``): an environment the user writes, and the policy's turns with
its observations between them as one row of tokens. Below the stages that play episodes
(``ppo``'s rollouts and evaluation, ``bon``), above nothing of theirs.

- ``environment.py``: the user's environment loaded by path; its calls, side by side in
  threads with a time limit; their returns checked (one line for anything wrong).
- ``rollout.py``: playing a batch of episodes with a model (:class:`rollout.EpisodeBatch`).
- :class:`Episodes`: what a command's episodes are (the environment and the budgets), from its
  options.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

OBSERVATION_TOKENS = 64  # the default budget's room for each observation (its template's words included)


@dataclass(frozen=True)
class Episodes:
    """A command's episodes: its environment (``--env``) and budgets (``--max-turns``,
    ``--max-episode-tokens``, ``--env-timeout``)."""

    spec: str
    factory: Callable[..., Any]
    max_turns: int
    max_episode_tokens: int
    timeout: float

    def play(self, model, chat, records: Sequence[dict], seeds: Sequence[int], *, sampling, max_prompt_length: int, device):
        """One episode per record, each environment seeded with its seed: an EpisodeBatch."""
        from .environment import Environments
        from .rollout import sample_episodes

        environments = Environments(self.spec, self.factory, records, seeds, timeout=self.timeout)
        # the static cache holds a whole episode's context, not a prompt and one response
        sampling = dataclasses.replace(sampling, cache_length=max_prompt_length + self.max_episode_tokens)
        return sample_episodes(model, chat, environments, sampling, max_prompt_length=max_prompt_length, max_turns=self.max_turns,
                               max_episode_tokens=self.max_episode_tokens, device=device)  # fmt: skip


def from_config(config) -> Episodes | None:
    """The episodes of a command's options, or None without ``--env``."""
    if not getattr(config, "env", None):
        return None
    from .environment import load_factory

    return Episodes(config.env, load_factory(config.env), config.max_turns, episode_tokens(config), config.env_timeout)


def episode_tokens(config) -> int:
    """``--max-episode-tokens``, by default room for every turn at its longest and 64 tokens for
    each observation between them."""
    return config.max_episode_tokens or config.max_turns * config.max_new_tokens + (config.max_turns - 1) * OBSERVATION_TOKENS
