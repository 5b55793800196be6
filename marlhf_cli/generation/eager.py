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

from typing import Sequence

import torch

from .cache_rows import CacheRows, from_dynamic, to_dynamic
from .compiled import sampler_for
from .draw import SamplingParams, cache_argument, draw, filter_logits, position_ids_from_mask, stops, unwrap


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
    start: CacheRows | None = None,
    keep_cache: bool = False,
):
    """Sample responses for left-padded prompts: [B, T] ids, ``pad_token_id`` after EOS.

    ``eos_token_id``: the id, or ids, that end a response (under a chat template EOS and the
    template's end-of-turn token). Stops early once every row has produced one. ``model`` must hold whole parameters (under
    ZeRO-3, sample with :class:`marlhf_cli.train.ppo.sampling_copy.GenerationModel`'s copy), so
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

    ``start``: the keys and values of every column of ``prompt_ids`` but the last
    (:mod:`.cache_rows`), from an earlier call: the prompts' forward then reads only their last
    column. ``keep_cache``: return ``(result, cache)``, ``cache`` the :class:`.cache_rows.CacheRows`
    of the columns this call wrote (prompt, then each fed token; one row per output row), or
    None where the model's cache is not one that travels.

    ``params.generation`` ``compiled``: the same draws through a static KV cache, each
    token's step recorded once as a CUDA graph and replayed (:mod:`.compiled`);
    where that cannot be had (a model or shape it does not cover, a cache that does not fit)
    this loop samples, and the reason is said once.
    """
    net = unwrap(model)
    if start is not None and (start.columns != prompt_ids.shape[1] - 1 or start.rows != prompt_ids.shape[0]):
        raise ValueError(f"a start cache of {start.rows} x {start.columns} for prompts of {tuple(prompt_ids.shape)}")
    generation = params.generation
    if generation == "auto":  # not resolved at a stage's start (a benchmark, a test): by the device
        generation = "compiled" if prompt_ids.device.type == "cuda" else "eager"
    if generation == "compiled":
        compiled = sampler_for(net).sample(
            net, prompt_ids, prompt_mask, params, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
            with_logprobs=with_logprobs, uniforms=uniforms, budgets=budgets, repeats=repeats, start=start,
            keep_cache=keep_cache,
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
    if start is not None:  # the columns before the last were read by an earlier call
        cache = to_dynamic(start)
        next_input, positions = prompt_ids[:, -1:], positions[:, -1:]
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
    result = (ids, torch.stack(logprobs, dim=1)) if with_logprobs else ids
    return (result, from_dynamic(cache)) if keep_cache else result
