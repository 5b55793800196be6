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

Each turn reads its whole context again (no KV cache is kept between turns: an observation
is several new columns, which the cache-rows start of :mod:`marlhf_cli.generation` does not
feed); the draws come from the global torch generator, which the stage seeds per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..chat import ChatFormat
from ..generation import SamplingParams, response_mask, sample
from ..generation.texts import tokenize_prompts
from .environment import Environments


@dataclass
class EpisodeBatch:
    """A batch of finished episodes; [B, T] tensors are aligned with the columns after the prompt."""

    prompts: list[str]  # each episode's prompt as the policy read it (the first user message, rendered)
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor  # [B, T] turns and observations, then padding
    mask: torch.Tensor  # [B, T] long: 1 on the assistant's tokens (the actions)
    attention: torch.Tensor  # [B, T] long: 1 on every real token, observations included
    has_eos: torch.Tensor  # [B] bool: the last turn ended at a stop token
    turn_rewards: torch.Tensor  # [B, K] float: the environment's reward for each turn, 0 past a row's last
    transcripts: list[list[dict]] = field(default_factory=list)  # [{"role", "content"}, ...] per episode
    truncated: torch.Tensor | None = None  # [B] bool: ended by a budget, not by the environment

    @property
    def turns(self) -> torch.Tensor:
        """[B] the number of assistant turns of each episode."""
        return torch.tensor([sum(1 for message in t if message["role"] == "assistant") for t in self.transcripts])

    def returns(self) -> torch.Tensor:
        """[B] each episode's return: the sum of its turn rewards."""
        return self.turn_rewards.sum(dim=1)


def transcript_text(transcript: Sequence[dict]) -> str:
    """An episode after its first message, as a reader sees it: each turn on its own lines,
    named by its role."""
    return "\n".join(f"[{m['role']}] {m['content']}" for m in transcript[1:])


@torch.no_grad()
def sample_episodes(
    model, chat: ChatFormat, environments: Environments, sampling: SamplingParams, *, max_prompt_length: int,
    max_turns: int, max_episode_tokens: int, device,
) -> EpisodeBatch:  # fmt: skip
    """Play one episode per environment with ``model`` (module docstring)."""
    tokenizer = chat.tokenizer
    firsts = environments.reset()
    prompts = [chat.episode_prompt(message) for message in firsts]
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, max_prompt_length, device)
    size = len(prompts)
    prompt_rows = [row[mask.bool()].tolist() for row, mask in zip(prompt_ids.cpu(), prompt_mask.cpu())]
    tokens: list[list[int]] = [[] for _ in range(size)]  # after the prompt
    actions: list[list[int]] = [[] for _ in range(size)]
    rewards: list[list[float]] = [[] for _ in range(size)]
    transcripts = [[{"role": "user", "content": message}] for message in firsts]
    done, truncated, ended = [False] * size, [False] * size, [False] * size
    stop = chat.stop_ids
    for turn in range(max_turns):
        active = [b for b in range(size) if not done[b]]
        if not active:
            break
        ids, mask = _left_padded([prompt_rows[b] + tokens[b] for b in active], tokenizer.pad_token_id, device)
        budgets = torch.tensor([min(sampling.max_new_tokens, max_episode_tokens - len(tokens[b])) for b in active])
        drawn = sample(model, ids, mask, sampling, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id, budgets=budgets)
        turn_mask, stopped = response_mask(drawn, stop)
        replies = {}
        for j, b in enumerate(active):
            length = min(int(turn_mask[j].sum()), int(budgets[j]))
            reply = drawn[j, :length].tolist()
            tokens[b] += reply
            actions[b] += [1] * length
            ended[b] = bool(stopped[j]) and length == int(turn_mask[j].sum())
            replies[b] = tokenizer.decode(reply, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            transcripts[b].append({"role": "assistant", "content": replies[b]})
        for b, seen in environments.step(replies, turn).items():
            rewards[b].append(seen.reward)
            if seen.text is not None:
                transcripts[b].append({"role": seen.role, "content": seen.text})
            if seen.done:
                done[b] = True
                continue
            cut = [] if ended[b] else [chat.end_id]  # a turn cut by its limit is closed, as a template would
            observed = cut + tokenizer(chat.observation_text(seen.text, seen.role), add_special_tokens=False)["input_ids"]
            if turn + 1 == max_turns or len(tokens[b]) + len(observed) >= max_episode_tokens:
                done[b] = truncated[b] = True  # no room for another turn: the message is not read
                continue
            tokens[b] += observed
            actions[b] += [0] * len(observed)
    width = max(1, max(len(row) for row in tokens))
    response_ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    action_mask = torch.zeros((size, width), dtype=torch.long)
    attention = torch.zeros((size, width), dtype=torch.long)
    for b in range(size):
        n = len(tokens[b])
        response_ids[b, :n] = torch.tensor(tokens[b], dtype=torch.long)
        action_mask[b, :n] = torch.tensor(actions[b], dtype=torch.long)
        attention[b, :n] = 1
    most = max(len(r) for r in rewards)
    turn_rewards = torch.zeros((size, most))
    for b, row in enumerate(rewards):
        turn_rewards[b, : len(row)] = torch.tensor(row)
    return EpisodeBatch(
        prompts=prompts, prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids.to(device),
        mask=action_mask.to(device), attention=attention.to(device), has_eos=torch.tensor(ended), turn_rewards=turn_rewards,
        transcripts=transcripts, truncated=torch.tensor(truncated),
    )  # fmt: skip


def _left_padded(rows: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[index, width - len(row) :] = 1
    return ids.to(device), mask.to(device)
