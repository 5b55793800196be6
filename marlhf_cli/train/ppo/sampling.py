"""Token-by-token sampling from the actor, with a KV cache and mask-derived positions.

Why not ``model.generate``: PPO needs the sampling distribution to be exactly the one its
log-probs are computed from (``logits / temperature``, then top-k/top-p filtering only
decides which tokens can be drawn), position ids derived from the attention mask at every
step, and a response mask that ends at the first EOS even when the pad token *is* the EOS
token. A forty-line loop states all of that; ``generate``'s defaults differ between
transformers versions and models (generation configs can carry their own temperature,
repetition penalty, or stop tokens).

Randomness comes from the global torch generator, which the stage seeds per step, so a
resumed run draws the same responses as an uninterrupted one; or, for the Monte-Carlo
continuations, from random numbers given per row (``uniforms``), so that a row's draws do not
depend on the other rows of its batch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from ..forward import position_ids_from_mask, unwrap


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 1.0
    max_new_tokens: int = 512
    generation: str = "eager"  # eager | compiled | auto (--generation; compiled_sampling.resolve)
    # compiled: the longest prompt + response of the run, so one static cache serves all its calls
    cache_length: int | None = None


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float | torch.Tensor, *, nucleus: bool | None = None) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. Logits are already /T.

    ``top_p`` may be a tensor (the compiled sampler keeps it in one, so that a new value needs
    no new recording); ``nucleus`` then says whether the nucleus filter runs (default: top_p < 1)."""
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if nucleus is None:
        nucleus = top_p < 1.0
    if nucleus:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def draw(probs: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from ``probs`` (need not sum to 1): the inverse of the cumulative
    distribution at one uniform draw per row, the first token whose cumulative mass exceeds
    it. Summed in float64, so it is the categorical draw up to ~1e-12 of probability mass;
    a token of probability 0 is never drawn. One random number per row, not one per
    vocabulary entry: ~7x faster than an exponential race and ~7x faster than
    ``torch.multinomial`` over a 50k vocabulary on a CPU, where the race was half of sampling.
    ``uniform``: [B] float64 draws in [0, 1) to use instead of the global generator's."""
    cumulative = probs.cumsum(dim=-1, dtype=torch.float64)
    if uniform is None:
        uniform = torch.rand((probs.shape[0],), dtype=torch.float64, device=probs.device)
    point = uniform.to(device=probs.device, dtype=torch.float64)[:, None] * cumulative[:, -1:]
    return torch.searchsorted(cumulative, point, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def cache_argument(net) -> str:
    """The forward's name for the KV cache: ``cache`` in transformers releases that renamed it
    (they warn on ``past_key_values``, and drop it in 5.40), ``past_key_values`` before
    (5.17 has no ``cache``). A forward that names neither (a wrapper taking ``**kwargs``)
    gets the name of the installed release's model outputs."""
    parameters = inspect.signature(net.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def stops(response_ids: torch.Tensor, eos_token_id: int | Sequence[int]) -> torch.Tensor:
    """Where ``response_ids`` holds a token that ends a response: EOS, or any of several ids
    (EOS and a chat template's end-of-turn token, marlhf_cli.chat)."""
    return torch.isin(response_ids, torch.as_tensor(eos_token_id, device=response_ids.device).reshape(-1))


def response_mask(response_ids: torch.Tensor, eos_token_id: int | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, has_eos): mask is 1 for tokens up to and including the first EOS (the first
    token of ``eos_token_id`` when it lists several).

    A response with no EOS (cut at the length limit) is real to its end.
    """
    is_eos = stops(response_ids, eos_token_id)
    eos_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return (~eos_before).long(), is_eos.any(dim=1)


@torch.no_grad()
def sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    *,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    with_logprobs: bool = False,
    uniforms: torch.Tensor | None = None,
    budgets: torch.Tensor | None = None,
    repeats: int = 1,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sample responses for left-padded prompts: [B, T] ids, ``pad_token_id`` after EOS.

    ``eos_token_id``: the id, or ids, that end a response (under a chat template EOS and the
    template's end-of-turn token). Stops early once every row has produced one. ``model`` must hold whole parameters (under
    ZeRO-3, sample with :class:`marlhf_cli.train.generation.GenerationModel`'s copy), so
    sampling runs no collective and each process may stop at its own length.

    ``with_logprobs``: also return [B, T] ``log softmax(logits / T)[token]``, the log-prob of
    each drawn token under the *unfiltered* temperature distribution, which is what PPO's
    old log-prob, reference log-prob and training forward all use (:mod:`.forward`); top-k
    and top-p only decide which tokens can be drawn. These are the log-probs a separate
    forward over [prompt | response] would give, up to float rounding (KV-cached steps
    against one full pass), so the rollout need not run that forward.

    ``uniforms``: [B, max_new_tokens] float64 random numbers in [0, 1), row b's draw at step t
    being ``uniforms[b, t]`` (the Monte-Carlo continuations give each row its own seeded
    numbers). ``budgets``: [B] the most tokens row b may draw (at most max_new_tokens); a
    row that reaches its budget is finished, and its later columns are padding (the caller
    masks them: without an EOS the mask cannot tell where the budget ended).
    ``repeats``: sample each prompt that many times (rows b*repeats .. b*repeats + repeats-1
    of the output, and of ``uniforms`` and ``budgets``), its prompt's forward run once and
    its KV cache shared by the copies.

    ``params.generation`` ``compiled``: the same draws through a static KV cache, each
    token's step recorded once as a CUDA graph and replayed (:mod:`.compiled_sampling`);
    where that cannot be had (a model or shape it does not cover, a cache that does not fit)
    this loop samples, and the reason is said once.
    """
    net = unwrap(model)
    generation = params.generation
    if generation == "auto":  # not resolved at a stage's start (a benchmark, a test): by the device
        generation = "compiled" if prompt_ids.device.type == "cuda" else "eager"
    if generation == "compiled":
        from .compiled_sampling import sampler_for

        compiled = sampler_for(net).sample(
            net, prompt_ids, prompt_mask, params, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
            with_logprobs=with_logprobs, uniforms=uniforms, budgets=budgets, repeats=repeats,
        )  # fmt: skip
        if compiled is not None:
            return compiled
    was_training = net.training
    net.eval()
    batch = prompt_ids.shape[0] * repeats
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
    mask = prompt_mask.long()
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    next_input = prompt_ids
    positions = position_ids_from_mask(mask)
    cache_name = cache_argument(net)
    cache = None
    try:
        for step in range(params.max_new_tokens):
            out = net(
                input_ids=next_input,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **({cache_name: cache} if cache is not None else {}),
            )
            # the output names it as the release does: reading the old name warns where it was renamed
            cache = out.cache if "cache" in getattr(out, "__dataclass_fields__", {}) else out.past_key_values
            logits = out.logits[:, -1].float() / params.temperature
            if step == 0 and repeats > 1:  # the prompts were read once; each copy goes on alone
                cache.batch_repeat_interleave(repeats)
                logits = logits.repeat_interleave(repeats, dim=0)
                mask = mask.repeat_interleave(repeats, dim=0)
            uniform = None if uniforms is None else uniforms[:, step]
            token = draw(torch.softmax(filter_logits(logits, params.top_k, params.top_p), dim=-1), uniform)
            if with_logprobs:  # of the unfiltered distribution, whatever top-k / top-p kept
                logprobs.append(torch.log_softmax(logits, dim=-1).gather(-1, token[:, None]).squeeze(-1))
            token = torch.where(finished, torch.full_like(token, pad_token_id), token)
            tokens.append(token)
            finished |= stops(token, eos_token_id)
            if budgets is not None:
                finished |= budgets.to(finished.device) <= step + 1
            if bool(finished.all()):
                break
            # Tokens after a row's EOS are fed as real too: causal attention keeps them
            # out of everything before them, and they are discarded (masked) afterwards.
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = position_ids_from_mask(mask)[:, -1:]
            next_input = token[:, None]
    finally:
        net.train(was_training)
    ids = torch.stack(tokens, dim=1)
    return (ids, torch.stack(logprobs, dim=1)) if with_logprobs else ids
