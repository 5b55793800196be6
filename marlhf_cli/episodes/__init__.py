"""Multi-turn episodes (``--env``): an environment the user writes, and the policy's turns with
its observations between them as one row of tokens. Below the stages that play episodes
(``ppo``'s rollouts and evaluation, ``bon``), above nothing of theirs.

- ``environment.py``: the user's environment loaded by path; its calls, side by side in
  threads with a time limit; their returns checked (one line for anything wrong).
- ``rollout.py``: playing a batch of episodes with a model (:class:`rollout.EpisodeBatch`).
- ``branching.py``: episodes continued from inside others (trees at turn ends, Monte-Carlo
  continuations), their environments replayed and checked.
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
        from .rollout import as_batch

        episodes = self._started(model, chat, records, seeds, sampling=sampling, max_prompt_length=max_prompt_length, device=device)
        return as_batch(episodes, chat.tokenizer.pad_token_id, device)

    def continued(self, model, chat, records: Sequence[dict], starts: Sequence, *, sampling, max_prompt_length: int, device) -> list:
        """The episodes ``starts`` (cut from others: :func:`.branching.cut`) played to their ends,
        each against its environment replayed up to where it stands (``records``: theirs)."""
        from .branching import replayed

        environments = replayed(self.spec, self.factory, records, starts, timeout=self.timeout)
        return self._played(model, chat, environments, starts, sampling=sampling, max_prompt_length=max_prompt_length, device=device)

    def play_trees(self, model, chat, records: Sequence[dict], seeds: Sequence[int], *, branches: int, depth: int, sampling,
                   max_prompt_length: int, device):  # fmt: skip
        """``--advantage tree``: a tree of K^D episodes per record (``records`` and ``seeds``: one
        per tree; every episode of a tree plays the environment seeded with the tree's seed, so
        that a node is one state of one game), branching at turn ends
        (:func:`.branching.grow_trees`); an EpisodeBatch of the leaves with their
        ``branch_positions``."""
        import torch

        from .branching import grow_trees
        from .rollout import as_batch

        roots = self._started(model, chat, [r for r in records for _ in range(branches)], [s for s in seeds for _ in range(branches)],
                              sampling=sampling, max_prompt_length=max_prompt_length, device=device)  # fmt: skip
        leaves, starts = grow_trees(
            roots, records, branches=branches, depth=depth,
            continued=lambda at, starts: self.continued(model, chat, at, starts, sampling=sampling,
                                                        max_prompt_length=max_prompt_length, device=device),
        )  # fmt: skip
        batch = as_batch(leaves, chat.tokenizer.pad_token_id, device)
        batch.branch_positions = torch.tensor(starts, dtype=torch.long, device=device).reshape(len(leaves), depth - 1)
        return batch

    def _started(self, model, chat, records, seeds, *, sampling, max_prompt_length: int, device) -> list:
        """New episodes of ``records`` played to their ends."""
        from .environment import Environments
        from .rollout import started

        environments = Environments(self.spec, self.factory, records, seeds, timeout=self.timeout)
        episodes = started(chat, environments, max_prompt_length)
        return self._played(model, chat, environments, episodes, sampling=sampling, max_prompt_length=max_prompt_length, device=device)

    def _played(self, model, chat, environments, episodes: Sequence, *, sampling, max_prompt_length: int, device) -> list:
        """``episodes`` played to their ends against ``environments``, within this command's budgets."""
        from .rollout import play

        play(model, chat, environments, episodes, self._sampling(sampling, max_prompt_length), max_turns=self.max_turns,
             max_episode_tokens=self.max_episode_tokens, device=device)  # fmt: skip
        return list(episodes)

    def _sampling(self, sampling, max_prompt_length: int):
        # the static cache holds a whole episode's context, not a prompt and one response
        return dataclasses.replace(sampling, cache_length=max_prompt_length + self.max_episode_tokens)


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
