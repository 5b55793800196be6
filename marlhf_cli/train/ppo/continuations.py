"""Monte-Carlo continuations for ``--advantage mc`` (docs/method.md "Monte-Carlo segment advantages").

For every inner boundary s_k of every response (a :class:`marlhf_cli.macro.BoundaryPlan`),
M continuations are sampled by the current policy from prompt + response[:s_k] and scored
exactly as responses are:

* sampling: the rollout's temperature, top-k and top-p, through the same KV-cached sampler;
  a continuation may draw at most ``max_new_tokens - s_k`` tokens, so prefix + continuation
  never exceeds the longest response a rollout can sample;
* scoring: the reward function sees [prompt | response[:s_k] + continuation] as it would a
  response, and the score is what the stage places for a response (clipped to
  ``--reward-clip``, minus ``--missing-eos-penalty`` when there is no EOS). A continuation
  that reaches its budget without EOS is scored like a response cut at the length limit:
  the reward function scores whatever text there is. No KL enters the score: ``mc`` puts the
  KL to the reference in the loss, as GRPO does.

Randomness: continuation (response, boundary position, rollout) draws its tokens from its
own generator, seeded with derived_seed(seed, step, the response's global sample number,
s_k, rollout). Its random numbers therefore depend neither on the other rows of its batch,
nor on how the batch is chunked, nor on the process it runs in; a resumed run draws the same
continuations. (The tokens equal those of the row sampled alone up to the float rounding of
a batched forward, which decides a draw only when a random number falls within ~1e-6 of a
cumulative-probability boundary.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from ...macro import BoundaryPlan
from ...seeding import derived_seed
from ..forward import resident
from .experience import RolloutSettings, final_scores
from ...scoring.rewards import scoring_batch
from ...scoring.rewards import RewardFn
from ...generation import sample, stops


@dataclass
class Continuations:
    """The continuations of one rollout batch."""

    scores: torch.Tensor  # [N, M] placed scores, row n continuing the plan's n-th boundary
    tokens: int  # real tokens sampled (each continuation up to and including its EOS)
    seconds: float


def continuation_seed(seed: int, step: int, sample_number: int, position: int, rollout: int) -> int:
    """The seed of one continuation: of the run, the step, the response (its global sample
    number), the boundary (its token position s_k) and the rollout (0 .. M-1)."""
    return derived_seed(seed, step, sample_number, position, rollout, "continuation")


def _prefixes(experience, plan: BoundaryPlan, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, W] left-padded prompt + response[:s_k] of each plan entry, and its mask."""
    prompt_length = experience.prompt_length
    rows = []
    for row, position in zip(plan.rows.tolist(), plan.positions.tolist()):
        prompt = experience.sequences[row, :prompt_length][experience.attention_mask[row, :prompt_length].bool()]
        rows.append(torch.cat([prompt, experience.response_ids[row, :position]]))
    return left_padded(rows, pad_token_id, experience.sequences.device)


def left_padded(rows: Sequence[torch.Tensor], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, W] ids of token rows of any lengths, left-padded (the sampler's prompt layout), and their mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = row
        mask[index, width - len(row) :] = 1
    return ids, mask


def row_uniforms(seeds: Sequence[int], budgets: Sequence[int], width: int) -> torch.Tensor:
    """[R, width] float64: row r's first budgets[r] numbers from its own generator, then 0
    (never used: the row is finished by then)."""
    out = torch.zeros((len(seeds), width), dtype=torch.float64)
    for index, (seed, budget) in enumerate(zip(seeds, budgets)):
        out[index, :budget] = torch.rand(budget, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return out


def budgeted_mask(ids: torch.Tensor, budgets: torch.Tensor, stop_ids: int | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, has_eos) of sampled continuations: real up to the first stop token (EOS, or a
    chat template's end of turn) within the budget; columns past the budget are padding
    (possibly the pad id = EOS, which must not count)."""
    within = torch.arange(ids.shape[1], device=ids.device)[None, :] < budgets[:, None]
    is_eos = stops(ids, stop_ids) & within
    eos_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return (within & ~eos_before).long(), is_eos.any(dim=1)


@torch.no_grad()
def sample_continuations(
    model,
    tokenizer,
    reward_fn: RewardFn,
    experience,
    plan: BoundaryPlan,
    settings: RolloutSettings,
    *,
    rollouts: int,
    seeds: Sequence[int],
    rows_per_batch: int,
) -> Continuations:
    """Sample and score ``rollouts`` continuations of every boundary of ``plan``.

    ``seeds``: one per continuation, boundary-major (entry n's rollouts at n*M .. n*M+M-1);
    ``rows_per_batch``: continuations per sampler call, rounded down to whole boundaries
    (bounds memory; results do not depend on it beyond float rounding). The M continuations
    of a boundary share one forward over their prefix (its KV cache is copied M times)."""
    started = time.perf_counter()
    count = len(plan) * rollouts
    if count == 0:
        return Continuations(torch.zeros((0, rollouts)), 0, time.perf_counter() - started)
    if len(seeds) != count:
        raise ValueError(f"{len(seeds)} seeds for {count} continuations")
    stop, pad = (tokenizer.eos_token_id, *settings.stop_token_ids), tokenizer.pad_token_id
    prefix_ids, prefix_mask = _prefixes(experience, plan, pad)
    budgets = (settings.max_new_tokens - plan.positions).clamp(min=1)  # per boundary
    per_call = max(1, rows_per_batch // rollouts)  # boundaries per sampler call
    scores, tokens = [], 0
    for first in range(0, len(plan), per_call):
        entries = slice(first, min(len(plan), first + per_call))
        ids, mask = prefix_ids[entries], prefix_mask[entries]
        keep = int(mask.sum(dim=1).max())  # drop the columns that are padding in every row
        ids, mask = ids[:, ids.shape[1] - keep :], mask[:, mask.shape[1] - keep :]
        budget = budgets[entries].repeat_interleave(rollouts)  # one row per continuation from here on
        width = int(budget.max())
        rows = slice(entries.start * rollouts, entries.stop * rollouts)
        sampled = sample(
            model, ids, mask, settings.sampling_for(width),
            eos_token_id=stop, pad_token_id=pad, uniforms=row_uniforms(seeds[rows], budget.tolist(), width).to(ids.device),
            budgets=budget.to(ids.device), repeats=rollouts,
        )  # fmt: skip
        continuation_mask, has_eos = budgeted_mask(sampled, budget.to(sampled.device), stop)
        tokens += int(continuation_mask.sum())
        owners = plan.rows[entries].repeat_interleave(rollouts)  # the response each continuation extends
        starts = plan.positions[entries].repeat_interleave(rollouts)  # its s_k
        scores.append(_score(tokenizer, reward_fn, experience, owners, starts, sampled, continuation_mask, has_eos, settings))
    return Continuations(torch.cat(scores).reshape(len(plan), rollouts), tokens, time.perf_counter() - started)


def _score(tokenizer, reward_fn, experience, owners, starts, sampled, continuation_mask, has_eos, settings) -> torch.Tensor:
    """Placed scores of [prompt | response[:s_k] + continuation], as a response's are made."""
    lengths = starts.to(sampled.device) + continuation_mask.sum(dim=1)
    width = int(lengths.max())
    responses = torch.full((len(owners), width), tokenizer.pad_token_id, dtype=torch.long, device=sampled.device)
    for index, (owner, start, length) in enumerate(zip(owners.tolist(), starts.tolist(), lengths.tolist())):
        responses[index, :start] = experience.response_ids[owner, :start]
        responses[index, start:length] = sampled[index, : length - start]
    response_mask = (torch.arange(width, device=sampled.device)[None, :] < lengths[:, None]).long()
    plen = experience.prompt_length
    batch = scoring_batch(
        tokenizer, [experience.prompts[o] for o in owners.tolist()], [experience.records[o] for o in owners.tolist()],
        experience.sequences[owners, :plen], experience.attention_mask[owners, :plen], responses, response_mask, has_eos,
    )  # fmt: skip
    with resident(getattr(reward_fn, "model", None), responses.device, settings.offload_frozen):
        raw = reward_fn(batch).float()
    return final_scores(raw, has_eos.to(raw.device), settings.reward_clip, settings.missing_eos_penalty).cpu()
