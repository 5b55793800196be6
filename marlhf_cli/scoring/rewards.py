"""Sequence-level rewards for PPO, behind one small interface.

The PPO stage only needs "one number per response". A :class:`RewardFn` gets a
:class:`ScoringBatch` (texts, ids, masks and the source records) and returns a float tensor
[B]. Three kinds fit that:

* :class:`RewardModelReward`: a learned reward model (what ``marlhf rm`` writes), read at the
  last real response token and normalised with the score mean/std the RM stage stored;
* :class:`TokenFractionReward`: a synthetic, instantly computed reward (the fraction of
  response tokens in a chosen set) that a tiny model can learn on a CPU, for tests and demos;
* a program-synthesis reward (APPS, docs/method.md "Program rewards") that runs the response against the
  record's tests: it needs only ``batch.responses`` and ``batch.records``.

:class:`WeightedRewards` makes one of several (``--reward model,py:f.py:g``).

The stage clips the score and places it at the last real token; reward functions just score.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch

from ..generation.texts import decode_responses
from .heads import last_token_scores, reward_stats


@dataclass
class ScoringBatch:
    """Everything a reward function may look at for a batch of responses.

    ``sequences``/``attention_mask``: [B, P + T] left-padded prompt then response;
    ``response_ids``/``response_mask``: [B, T]; ``has_eos``: [B] bool.
    """

    prompts: list[str]
    responses: list[str]
    sequences: torch.Tensor
    attention_mask: torch.Tensor
    prompt_length: int
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    has_eos: torch.Tensor
    records: Sequence[dict] = field(default_factory=list)


def scoring_batch(tokenizer, prompts, records, prompt_ids, prompt_mask, response_ids, mask, has_eos, *,
                  attention=None, responses=None) -> ScoringBatch:  # fmt: skip
    """What a reward function reads of sampled responses: [prompt | response] ids and mask, texts.

    ``attention`` [B, T]: the response columns the model reads where it is not ``mask`` (an
    episode's observations are read, not drawn); ``responses``: their texts where decoding the
    masked ids would not give them (an episode's transcript)."""
    sequences = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, (mask if attention is None else attention).to(prompt_mask.dtype)], dim=1)
    return ScoringBatch(
        prompts=list(prompts),
        responses=list(responses) if responses is not None else decode_responses(tokenizer, response_ids, mask),
        sequences=sequences,
        attention_mask=attention_mask,
        prompt_length=prompt_ids.shape[1],
        response_ids=response_ids,
        response_mask=mask,
        has_eos=has_eos,
        records=list(records),
    )


@runtime_checkable
class RewardFn(Protocol):
    """One score per response; ``name`` is shown in logs and the eval table."""

    name: str

    def __call__(self, batch: ScoringBatch) -> torch.Tensor: ...


def score_statistics(model) -> tuple[float, float]:
    """(mean, std) of held-out scores that ``marlhf rm`` stored in config.json; (0, 1) if none."""
    return reward_stats(getattr(getattr(model, "module", model), "config", None))


class RewardModelReward:
    """A reward model's normalised score, ``(s - mean) / std``, at the last real token."""

    def __init__(self, model, *, normalize: bool = True, name: str = "rm", batch_size: int = 8):
        self.model = model
        self.name = name
        self.batch_size = max(1, int(batch_size))
        self.mean, self.std = score_statistics(model) if normalize else (0.0, 1.0)
        self.std = self.std if self.std > 1e-6 else 1.0

    @torch.no_grad()
    def __call__(self, batch: ScoringBatch) -> torch.Tensor:
        size = batch.sequences.shape[0]
        scores = torch.cat([
            last_token_scores(self.model, batch.sequences[i : i + self.batch_size], batch.attention_mask[i : i + self.batch_size])
            for i in range(0, size, self.batch_size)
        ])  # fmt: skip
        return ((scores - self.mean) / self.std).float().cpu()


class WeightedRewards:
    """Several rewards as one, as TRL's ``reward_funcs`` with ``reward_weights``: the score is
    sum_i w_i r_i. Each part's scores of the last call stay in ``last`` (name -> [B]), which
    the step logs as score_<name>. ``model`` (the reward model's, for --offload-frozen),
    ``check_records`` and ``close`` reach the parts that have them."""

    def __init__(self, parts: Sequence[tuple[str, "RewardFn"]], weights: Sequence[float]):
        if len(parts) != len(weights):
            raise ValueError(f"{len(parts)} rewards, {len(weights)} weights")
        self.parts, self.weights = list(parts), [float(w) for w in weights]
        self.name = " + ".join(f"{w:g} x {reward.name}" for (_, reward), w in zip(self.parts, self.weights))
        self.model = next((r.model for _, r in self.parts if getattr(r, "model", None) is not None), None)
        self.last: dict[str, torch.Tensor] = {}

    def __call__(self, batch: ScoringBatch) -> torch.Tensor:
        total = torch.zeros(len(batch.responses))
        for (name, reward), weight in zip(self.parts, self.weights):
            scores = reward(batch).float().cpu()
            self.last[name] = scores
            total = total + weight * scores
        return total

    def check_records(self, records, where: str) -> None:
        for _, reward in self.parts:
            if hasattr(reward, "check_records"):
                reward.check_records(records, where)

    def close(self) -> None:
        for _, reward in self.parts:
            if hasattr(reward, "close"):
                reward.close()


class TokenFractionReward:
    """The fraction of real response tokens whose id is in ``token_ids`` (EOS not counted).

    Given once, at the end, like a reward model's score. Chosen for learning tests: with a set
    covering a few percent of the vocabulary a random policy already earns a little, so the
    signal is there from the first step, and the best policy (always such tokens) is far away.
    """

    def __init__(self, token_ids: Sequence[int] | torch.Tensor, *, eos_token_id: int | None = None, name: str = "token-fraction"):
        self.token_ids = torch.as_tensor(list(token_ids) if not isinstance(token_ids, torch.Tensor) else token_ids)
        self.eos_token_id = eos_token_id
        self.name = name

    def __call__(self, batch: ScoringBatch) -> torch.Tensor:
        ids = batch.response_ids.cpu()
        mask = batch.response_mask.cpu().bool()
        if self.eos_token_id is not None:
            mask = mask & (ids != self.eos_token_id)
        hits = torch.isin(ids, self.token_ids) & mask
        return hits.sum(dim=1).float() / mask.sum(dim=1).clamp(min=1).float()
