"""What every sampler shares: the sampling settings, the filters and the draw, where a
response ends, and the few facts about a model a sampler reads (its cache argument's name, its
positions from the attention mask). Pure functions of tensors; nothing of the package above.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch


def unwrap(model):
    """The Hugging Face model inside a DeepSpeed engine (or the model itself)."""
    return getattr(model, "module", model)


def hugging_face_model(model):
    """A peft model's Hugging Face model (its LoRA layers in place), or ``model`` itself: code
    that reaches into the backbone by the Hugging Face attribute names starts here."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens of each row; padding gets 0 (``cumsum(mask) - 1``
    clamped at 0): a token sees the same position whether its row was padded or not."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 1.0
    max_new_tokens: int = 512
    generation: str = "eager"  # eager | compiled | auto (--generation; generation.compiled.resolve)
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
