"""Sampling multi-turn episodes: the policy writes a turn, the environment answers, until the
episode ends or a budget does.

An episode is one row of the tensors PPO reads: the first user message, rendered as a
prompt and left-padded like every prompt, then every assistant turn and observation in
order, right-padded. ``mask`` marks the tokens the policy drew (each turn, its end-of-turn
token included: the actions), ``attention`` every real token (the observations are context
the next turn reads). A turn cut by its token limit has no end-of-turn token of its own: the
observation after it starts with one, not an action, so the transcript stays well formed.

Budgets: ``--max-new-tokens`` per turn, ``--max-turns`` turns, and ``--max-episode-tokens``
for everything after the prompt (turns and observations). An observation that would leave no
room for another turn ends the episode there (``truncated``), as does the last turn; the
environment's reward for that turn still counts, its message goes to the transcript only.

An :class:`Episode` is played (:func:`play`) from wherever it stands: from its first message
(:func:`started`), or from a point inside another episode (``--advantage tree`` and
``mc`` continue episodes from a macro action's end: :mod:`.branching` replays a fresh
environment up to there), even from inside a turn, whose drawn tokens the continuation
extends within the same per-turn budget.

No turn reads what an earlier turn of its episode read: each sampler call keeps its keys and
values, and the next turn's call starts from them with the columns it has not seen (the
previous turn's last token and the environment's message) read by one forward onto the kept
rows (:func:`marlhf_cli.generation.cache_rows.extended`). The draws are those of reading the
whole context again up to float rounding (tested: the same episodes); where the model's cache
does not travel (a sliding-window or recurrent layer) each turn reads its context again, which
is said once. The draws come from the global torch generator, which the stage seeds per step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .. import console
from ..chat import ChatFormat
from ..generation import SamplingParams, response_mask, sample
from ..generation.cache_rows import CacheRows, Slice, extended, realigned
from ..generation.texts import tokenize_prompts
from .environment import Environments, Observation


@dataclass
class EpisodeBatch:
    """A batch of finished episodes; [B, T] tensors are aligned with the columns after the prompt."""

    episodes: list["Episode"]  # the episodes themselves (what a branch replays; the rest is read off them)
    prompts: list[str]  # each episode's prompt as the policy read it (the first user message, rendered)
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor  # [B, T] turns and observations, then padding
    mask: torch.Tensor  # [B, T] long: 1 on the assistant's tokens (the actions)
    attention: torch.Tensor  # [B, T] long: 1 on every real token, observations included
    has_eos: torch.Tensor  # [B] bool: the last turn ended at a stop token
    turn_rewards: torch.Tensor  # [B, K] float: the environment's reward for each turn, 0 past a row's last
    # --advantage tree: [B, D - 1] the column where each level's node after the first begins
    # (the first token of the turn after the branching turn end; at or past the row's end when
    # the episode ended before it), as :class:`marlhf_cli.train.ppo.tree.TreeRollout` has
    branch_positions: torch.Tensor | None = None
    fallbacks: int = 0  # a tree's rule fallbacks: none, turn ends are never guessed

    @property
    def transcripts(self) -> list[list[dict]]:
        """[{"role", "content"}, ...] per episode."""
        return [episode.transcript for episode in self.episodes]

    @property
    def turns(self) -> torch.Tensor:
        """[B] the number of assistant turns of each episode."""
        return torch.tensor([len(episode.replies) for episode in self.episodes])

    @property
    def truncated(self) -> torch.Tensor:
        """[B] bool: ended by a budget, not by the environment."""
        return torch.tensor([episode.truncated for episode in self.episodes])

    @property
    def sampled_tokens(self) -> int:
        """Tokens the policy drew for these rows (a tree's shared turns once)."""
        return sum(episode.drawn for episode in self.episodes)

    @property
    def shared_tokens(self) -> int:
        """Action tokens of the rows that were not drawn for them (a tree's shared turns)."""
        return int(self.mask.sum()) - self.sampled_tokens

    def returns(self) -> torch.Tensor:
        """[B] each episode's return: the sum of its turn rewards."""
        return self.turn_rewards.sum(dim=1)

    def clipped_turn_rewards(self, clip: float) -> torch.Tensor:
        """[B, K] each turn's reward clipped to [-clip, clip], as PPO places it (the episode's
        score is their sum)."""
        return self.turn_rewards.float().clamp(-clip, clip)


@dataclass
class Episode:
    """One episode as it is played: its tokens after the prompt, which of them are the policy's,
    and what the environment said after each turn."""

    first: str  # the environment's first message
    prompt: str  # the first message rendered as the policy's prompt
    prompt_row: list[int]  # its token ids (no padding)
    seed: int = 0  # its environment's seed (a branch's environment is made with the same)
    tokens: list[int] = field(default_factory=list)  # after the prompt: turns and observations
    actions: list[int] = field(default_factory=list)  # 1 on the policy's tokens
    replies: list[str] = field(default_factory=list)  # each finished turn's text, as the environment read it
    observations: list[Observation] = field(default_factory=list)  # the environment's answer to each turn
    partial: int = 0  # tokens of an unfinished turn at the end of ``tokens`` (a continuation from inside a turn)
    ended: bool = False  # the last turn ended at a stop token
    done: bool = False
    truncated: bool = False  # ended by a budget, not by the environment
    drawn: int = 0  # tokens the policy drew for this episode (not counting those it was started with)

    @property
    def rewards(self) -> list[float]:
        return [seen.reward for seen in self.observations]

    @property
    def transcript(self) -> list[dict]:
        """[{"role", "content"}, ...]: the first message, then each turn and what answered it."""
        messages = [{"role": "user", "content": self.first}]
        for reply, seen in zip(self.replies, self.observations):
            messages.append({"role": "assistant", "content": reply})
            if seen.text is not None:
                messages.append({"role": seen.role, "content": seen.text})
        return messages


def transcript_text(transcript: Sequence[dict]) -> str:
    """An episode after its first message, as a reader sees it: each turn on its own lines,
    named by its role."""
    return "\n".join(f"[{m['role']}] {m['content']}" for m in transcript[1:])


def started(chat: ChatFormat, environments: Environments, max_prompt_length: int) -> list[Episode]:
    """A new episode per environment, at its first message."""
    firsts = environments.reset()
    prompts = [chat.episode_prompt(message) for message in firsts]
    prompt_ids, prompt_mask = tokenize_prompts(chat.tokenizer, prompts, max_prompt_length, "cpu")
    rows = [row[mask.bool()].tolist() for row, mask in zip(prompt_ids, prompt_mask)]
    return [Episode(first, prompt, row, seed) for first, prompt, row, seed in zip(firsts, prompts, rows, environments.seeds)]


@torch.no_grad()
def play(
    model, chat: ChatFormat, environments: Environments, episodes: Sequence[Episode], sampling: SamplingParams, *,
    max_turns: int, max_episode_tokens: int, device, keep_cache: bool = True,
) -> None:  # fmt: skip
    """Play ``episodes`` (episode i talks to ``environments``' i-th) to their ends, in place.
    ``keep_cache``: start each turn from the keys and values of the ones before (module
    docstring); False reads every turn's whole context again (the benchmark's baseline)."""
    tokenizer, stop, pad = chat.tokenizer, chat.stop_ids, chat.tokenizer.pad_token_id
    kept: dict[int, Slice] = {}  # episode -> where the keys and values of its sequence so far are (all but its last token)
    while active := [i for i, e in enumerate(episodes) if not e.done]:
        contexts = [episodes[i].prompt_row + episodes[i].tokens for i in active]
        ids, mask = _left_padded(contexts, pad, device)
        start = _start(model, [kept.get(i) for i in active], contexts, pad, device) if keep_cache else None
        budgets = torch.tensor(
            [min(sampling.max_new_tokens - episodes[i].partial, max_episode_tokens - len(episodes[i].tokens)) for i in active]
        )  # fmt: skip
        drawn = sample(model, ids, mask, sampling, eos_token_id=stop, pad_token_id=pad, budgets=budgets, start=start,
                       keep_cache=keep_cache)  # fmt: skip
        drawn, cache = drawn if keep_cache else (drawn, None)
        if keep_cache and cache is None:
            _say_once("episodes: this model's KV cache is not one that travels between sampler calls (a sliding-window or "
                      "recurrent layer): each turn reads its whole context again")  # fmt: skip
        turn_mask, stopped = response_mask(drawn, stop)
        replies, turns = {}, {}
        kept = {}
        for j, i in enumerate(active):
            episode = episodes[i]
            length = min(int(turn_mask[j].sum()), int(budgets[j]))
            if cache is not None:  # the context and the turn but its last token (which was not always fed)
                kept[i] = Slice(cache, j, end=ids.shape[1] + length - 1, length=len(contexts[j]) + length - 1)
            new = drawn[j, :length].tolist()
            turn = episode.tokens[len(episode.tokens) - episode.partial :] + new  # an unfinished turn's tokens go first
            episode.tokens += new
            episode.actions += [1] * length
            episode.drawn += length
            episode.partial = 0
            episode.ended = bool(stopped[j]) and length == int(turn_mask[j].sum())
            replies[i] = tokenizer.decode(turn, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            turns[i] = len(episode.observations)
        for i, seen in environments.step(replies, turns).items():
            episode = episodes[i]
            episode.replies.append(replies[i])
            episode.observations.append(seen)
            if seen.done:
                episode.done = True
                continue
            cut = [] if episode.ended else [chat.end_id]  # a turn cut by its limit is closed, as a template would
            observed = cut + tokenizer(chat.observation_text(seen.text, seen.role), add_special_tokens=False)["input_ids"]
            if len(episode.observations) == max_turns or len(episode.tokens) + len(observed) >= max_episode_tokens:
                episode.done = episode.truncated = True  # no room for another turn: the message is not read
                continue
            episode.tokens += observed
            episode.actions += [0] * len(observed)


def _start(model, slices: Sequence[Slice | None], contexts: Sequence[list[int]], pad: int, device) -> CacheRows | None:
    """The sampler's ``start`` for ``contexts`` (every column but the last of each), from the
    keys and values kept for the first ``slices[i].length`` tokens of each and one forward over
    the rest; None when one of them has none kept (a first turn, a cache that did not travel)."""
    if not slices or any(piece is None for piece in slices):
        return None
    widest = max(piece.length for piece in slices)
    rows = realigned(slices, widest)
    rows_mask = (torch.arange(widest)[None, :] >= torch.tensor([widest - piece.length for piece in slices])[:, None]).long()
    new_ids, new_mask = _left_padded([context[piece.length :] for piece, context in zip(slices, contexts)], pad, device)
    return extended(model, rows, rows_mask.to(device), new_ids, new_mask)


@functools.cache
def _say_once(message: str) -> None:
    console.say(message)


def as_batch(episodes: Sequence[Episode], pad_token_id: int, device) -> EpisodeBatch:
    """Finished episodes as the tensors of an :class:`EpisodeBatch`."""
    size = len(episodes)
    prompt_ids, prompt_mask = _left_padded([e.prompt_row for e in episodes], pad_token_id, device)
    width = max(1, max(len(e.tokens) for e in episodes))
    response_ids = torch.full((size, width), pad_token_id, dtype=torch.long)
    action_mask = torch.zeros((size, width), dtype=torch.long)
    attention = torch.zeros((size, width), dtype=torch.long)
    for b, episode in enumerate(episodes):
        n = len(episode.tokens)
        response_ids[b, :n] = torch.tensor(episode.tokens, dtype=torch.long)
        action_mask[b, :n] = torch.tensor(episode.actions, dtype=torch.long)
        attention[b, :n] = 1
    most = max(1, max(len(e.observations) for e in episodes))
    turn_rewards = torch.zeros((size, most))
    for b, episode in enumerate(episodes):
        turn_rewards[b, : len(episode.observations)] = torch.tensor(episode.rewards)
    return EpisodeBatch(
        episodes=list(episodes), prompts=[e.prompt for e in episodes], prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        response_ids=response_ids.to(device), mask=action_mask.to(device), attention=attention.to(device),
        has_eos=torch.tensor([e.ended for e in episodes]), turn_rewards=turn_rewards,
    )  # fmt: skip


def _left_padded(rows: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[index, width - len(row) :] = 1
    return ids.to(device), mask.to(device)
