"""Rollout: prompts in, the per-token quantities of docs/method.md "Rollout quantities" out.

For a batch of prompts this samples responses with the actor and computes, per response
token a_t (t = 0 .. T-1):

* ``old_logp[t]`` / ``ref_logp[t]``: log pi(a_t) under the sampling actor and the frozen
  reference, from ``logits / temperature`` (the transform sampling used). With an fp32
  actor ``old_logp`` is taken from the sampling pass (no separate actor forward): the
  log-softmax of the very logits the token was drawn from, *before* top-k/top-p filtering
  (in bf16/fp16 a forward computes it, see :func:`make_experience`). So old, reference and
  training log-probs are all of the unfiltered temperature distribution (filtering only
  narrows what can be drawn), the first update's ratio is 1 up to float rounding, and the
  KL compares the two models' unfiltered distributions;
* ``values[t]``: the critic's V(state before a_t), read at the column of the token
  preceding a_t (the last prompt token for a_0), see :mod:`.forward`;
* ``mask[t]``: 1 for real tokens up to and including the first EOS (or the chat template's
  end-of-turn token, ``RolloutSettings.stop_token_ids``); a response cut at the length limit
  has no EOS and is real to its end;
* ``kl[t]``: the per-token KL estimate (k1 = old_logp - ref_logp by default, k3 optional);
* ``rewards[t] = -kl_coef * kl[t]``, plus the clipped score at the last real token only.

Segmentation and advantages come after (:mod:`.credit`), since the termination rules read
``ref_logp`` and the response text computed here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

import torch

from ...episodes.rollout import transcript_text
from ...macro import kl_per_token
from ...macro.turns import place_turn_rewards
from ..forward import critic_values, policy_forward, resident, unwrap
from ...scoring.rewards import RewardFn, scoring_batch
from ...generation import SamplingParams, texts


@dataclass
class RolloutSettings:
    """The knobs of one rollout (a subset of PPOConfig, so tests can build it directly)."""

    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 1.0
    max_prompt_length: int = 512
    max_new_tokens: int = 512
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    reward_clip: float = 5.0
    missing_eos_penalty: float | None = None
    offload_frozen: bool = False
    forward_batch_size: int = 8
    stop_token_ids: tuple[int, ...] = ()  # beside EOS: a chat template's end-of-turn token (marlhf_cli.chat)
    generation: str = "eager"  # eager | compiled (--generation, resolved at the stage's start)

    @classmethod
    def from_config(cls, config, forward_batch_size: int, stop_token_ids: tuple[int, ...] = ()) -> "RolloutSettings":
        names = {f.name for f in fields(cls)} - {"forward_batch_size", "stop_token_ids"}
        return cls(forward_batch_size=forward_batch_size, stop_token_ids=tuple(stop_token_ids), **{n: getattr(config, n) for n in names})

    @property
    def sampling(self) -> SamplingParams:
        return self.sampling_for(self.max_new_tokens)

    def sampling_for(self, max_new_tokens: int) -> SamplingParams:
        """The rollout's sampling settings for calls of at most ``max_new_tokens`` new tokens
        (mc's continuations draw fewer); every call of a run fits one static-cache length."""
        return SamplingParams(
            self.temperature, self.top_k, self.top_p, max_new_tokens, generation=self.generation,
            cache_length=self.max_prompt_length + self.max_new_tokens,
        )  # fmt: skip


@dataclass
class Experience:
    """One rollout batch; [B, T] tensors are aligned with the response columns."""

    prompts: list[str]
    responses: list[str]
    records: list[dict]
    prompt_length: int
    sequences: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    response_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] long
    has_eos: torch.Tensor  # [B] bool
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None  # None: no reference (nothing reads it: RunPlan.reference)
    values: torch.Tensor
    kl: torch.Tensor  # the estimator used in the reward (zero without a reference)
    kl_k1: torch.Tensor | None  # always logged, whatever the estimator; None without a reference
    rewards: torch.Tensor
    raw_scores: torch.Tensor  # [B] what the reward function returned
    scores: torch.Tensor  # [B] clipped, minus the missing-EOS penalty: what is placed
    # [B] each part's raw score when --reward names several (WeightedRewards.last), by name
    score_parts: dict[str, torch.Tensor] = field(default_factory=dict)
    generation_seconds: float = 0.0
    scoring_seconds: float = 0.0
    # filled by credit assignment
    segment_ids: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    lambdas: torch.Tensor | None = None  # [B] the actor's GAE lambda of each response (gae only)
    segment_stats: object | None = None
    # filled by mc's credit assignment (estimators.mc): the sampled continuations' count,
    # real tokens and seconds
    continuations: int = 0
    continuation_tokens: int = 0
    continuation_seconds: float = 0.0
    # --advantage tree: the TreeRollout the responses (its leaves) came from
    tree: object | None = None
    # --env: the EpisodeBatch the rows came from (mask: the policy's turns; attention_mask also
    # covers the observations between them), None for single responses
    episode: object | None = None

    @property
    def batch_size(self) -> int:
        return self.sequences.shape[0]

    def lengths(self) -> torch.Tensor:
        return self.mask.sum(dim=1)


def final_scores(raw: torch.Tensor, has_eos: torch.Tensor, clip: float, missing_eos_penalty: float | None) -> torch.Tensor:
    """The score PPO places: clipped to [-clip, clip], then minus the penalty for no EOS.

    The penalty is applied after clipping so it always bites, even on a score at the clip.
    """
    scores = raw.float().clamp(-clip, clip)
    if missing_eos_penalty:
        scores = scores - float(missing_eos_penalty) * (~has_eos.bool()).float()
    return scores


def place_rewards(kl: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """r[t] = -kl_coef * kl[t] on real tokens, plus the score at the last real token exactly.

    The mask is a prefix (real tokens, then padding), so the last real index is
    ``mask.sum() - 1``: the EOS when the response has one, the final column when it was cut.
    """
    mask = mask.bool()
    rewards = torch.where(mask, -kl_coef * kl, torch.zeros_like(kl))
    last = (mask.long().sum(dim=1) - 1).clamp(min=0)
    rewards = rewards.clone()
    rewards[torch.arange(rewards.shape[0], device=rewards.device), last] += scores.to(rewards.dtype).to(rewards.device)
    return rewards


def _chunks(size: int, chunk: int):
    chunk = max(1, int(chunk))
    for start in range(0, size, chunk):
        yield slice(start, min(size, start + chunk))


@torch.no_grad()
def batched_forward(fn: Callable[[slice], torch.Tensor], size: int, chunk: int) -> torch.Tensor:
    return torch.cat([fn(part) for part in _chunks(size, chunk)], dim=0)


def generate(model, tokenizer, prompts: Sequence[str], settings: RolloutSettings, *, device, with_logprobs: bool = False):
    """Sample a rollout's responses (:func:`marlhf_cli.generation.texts.generate` with its settings)."""
    return texts.generate(
        model, tokenizer, prompts, settings.sampling, max_prompt_length=settings.max_prompt_length,
        stop_token_ids=settings.stop_token_ids, device=device, with_logprobs=with_logprobs,
    )  # fmt: skip


def _parameter_dtype(model) -> torch.dtype | None:
    parameter = next(iter(unwrap(model).parameters()), None)
    return None if parameter is None else parameter.dtype


@torch.no_grad()
def make_experience(
    actor,
    reference,
    critic,
    reward_fn: RewardFn,
    tokenizer,
    prompts: Sequence[str],
    records: Sequence[dict],
    settings: RolloutSettings,
    *,
    device="cpu",
    sampler=None,
    on_sampled: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    draw: Callable | None = None,
) -> Experience:
    """Sample one batch and compute every token-level quantity PPO needs (module docstring).

    ``sampler``: the module that samples, when it is not ``actor`` itself (under ZeRO-3, a
    whole-parameter copy of it). ``critic``: None for the critic-free baselines (values are
    then zero). ``reference``: None where nothing reads its log-probs (``ref_logp`` and
    ``kl_k1`` are then None, the KL zero). ``on_sampled(response_ids, mask)``: called once the
    responses exist, before the scoring forwards (PPO starts the parser there).
    ``draw(model, prompts)``: an estimator's own sampling in place of one response per
    prompt (``--advantage tree``: the leaves of a tree per group, a :class:`.tree.TreeRollout`);
    the old log-probs then come from an actor forward.
    """
    started = time.perf_counter()
    sampling_model = sampler if sampler is not None else actor
    # fp32: the old log-probs come from the sampling pass itself (sample(with_logprobs=True)),
    # the same logits / T a separate actor forward over [prompt | response] computes, to
    # ~1e-5. In bf16/fp16 the KV-cached steps and the full pass differ by ~0.06 in log-prob
    # (0.26 at worst, SmolLM2-135M in bf16), enough to clip the first update's ratio, so
    # there the old log-probs come from a forward shaped like the training one, as before.
    from_sampling = _parameter_dtype(sampling_model) == torch.float32
    tree = episode = None
    if draw is None:
        prompt_ids, prompt_mask, response_ids, mask, has_eos, old_logp = generate(
            sampling_model, tokenizer, prompts, settings, device=device, with_logprobs=from_sampling
        )
    else:  # a leaf's or an episode's tokens were drawn by several sampler calls: one forward gives their log-probs
        drawn = draw(sampling_model, prompts)
        prompt_ids, prompt_mask, response_ids, mask, has_eos = (
            drawn.prompt_ids, drawn.prompt_mask, drawn.response_ids, drawn.mask, drawn.has_eos
        )
        old_logp = None
        if hasattr(drawn, "turn_rewards"):
            episode, prompts = drawn, drawn.prompts
        if getattr(drawn, "branch_positions", None) is not None:  # a tree's leaves (of episodes or responses)
            tree = drawn
    generated = time.perf_counter()
    if on_sampled is not None:
        on_sampled(response_ids, mask)
    batch = scoring_batch(
        tokenizer, prompts, records, prompt_ids, prompt_mask, response_ids, mask, has_eos,
        attention=None if episode is None else episode.attention,
        responses=None if episode is None else [transcript_text(t) for t in episode.transcripts],
    )  # fmt: skip
    seq, att, plen = batch.sequences, batch.attention_mask, batch.prompt_length
    size, chunk = seq.shape[0], settings.forward_batch_size
    temperature = settings.temperature

    def logp_of(model):
        return batched_forward(lambda s: policy_forward(model, seq[s], att[s], plen, temperature)[0], size, chunk)

    if old_logp is None:
        old_logp = logp_of(actor)
    ref_logp = None
    if reference is not None:  # None where nothing reads it (--kl-coef 0, no ppl rule): one forward fewer
        with resident(reference, device, settings.offload_frozen):
            ref_logp = logp_of(reference)
    if critic is not None:
        values = batched_forward(lambda s: critic_values(critic, seq[s], att[s], plen), size, chunk)
    else:  # rloo / grpo: no critic, the baseline comes from the group
        values = torch.zeros_like(old_logp)
    turn_rewards = None
    if episode is not None:  # the environment scored each turn: clipped one by one, placed at each turn's end
        raw_scores = episode.returns().float().to(old_logp.device)
        turn_rewards = episode.clipped_turn_rewards(settings.reward_clip).to(old_logp.device)
        score_parts, scores = {}, turn_rewards.sum(dim=1)
    else:
        with resident(getattr(reward_fn, "model", None), device, settings.offload_frozen):
            raw_scores = reward_fn(batch).float().to(old_logp.device)
        score_parts = {name: part.clone() for name, part in getattr(reward_fn, "last", {}).items()}  # mc's calls overwrite it
        scores = final_scores(raw_scores, has_eos.to(raw_scores.device), settings.reward_clip, settings.missing_eos_penalty)

    real = mask.bool()
    zero = torch.zeros((), device=old_logp.device)
    old_logp = torch.where(real, old_logp, zero)
    values = torch.where(real, values, zero)
    kl_k1, kl = None, torch.zeros_like(old_logp)
    if ref_logp is not None:
        ref_logp = torch.where(real, ref_logp, zero)
        kl_k1 = torch.where(real, kl_per_token(old_logp, ref_logp, "k1"), zero)
        kl = torch.where(real, kl_per_token(old_logp, ref_logp, settings.kl_estimator), zero)
    if turn_rewards is None:
        rewards = place_rewards(kl, scores, mask, settings.kl_coef)
    else:
        rewards = place_turn_rewards(place_rewards(kl, torch.zeros_like(scores), mask, settings.kl_coef), turn_rewards, mask)
    return Experience(
        prompts=list(prompts),
        responses=batch.responses,
        records=list(records),
        prompt_length=plen,
        sequences=seq,
        attention_mask=att,
        response_ids=response_ids,
        mask=mask,
        has_eos=has_eos,
        old_logp=old_logp,
        ref_logp=ref_logp,
        values=values,
        kl=kl,
        kl_k1=kl_k1,
        rewards=rewards,
        raw_scores=raw_scores,
        scores=scores,
        score_parts=score_parts,
        generation_seconds=generated - started,
        scoring_seconds=time.perf_counter() - generated,
        tree=tree,
        episode=episode,
    )
