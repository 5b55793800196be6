"""Attention for the static cache's one-token steps: grouped-query attention without copying
the cache.

Transformers' attention functions give each query head its own keys and values: with fewer
key-value heads (grouped-query attention, SmolLM2-135M's 9 query heads over 3) ``repeat_kv``
copies the keys and values of every cache column for every query head, in every layer, for
every token, and attention then reads the copies. transformers 5.24's ``sdpa`` path regroups
a single query token instead (``pack_gqa``), but 5.17's (the GPU machine's) copies as soon as
a mask is given, and the ``eager`` path always copies. At PPO's default 256 rows x 1,024
columns with SmolLM2-1.7B's shape that is tens of GB moved per token
(:func:`.static_cache.attention_bytes_per_token`).

Here, while the compiled sampler runs its decoding step (:func:`decoding`), every attention
layer of the model calls :func:`attention`: for one query token per row, the query heads are
regrouped as ``[rows, key-value heads, group, dim]`` (a view) and attend to the cache as it is,
with the step's additive mask broadcast over the group, through ``scaled_dot_product_attention``
(with a float mask on CUDA that is the memory-efficient kernel: flash attention takes no mask;
no kernel needs the heads repeated). The cache is read once per layer and token. Anything
else (the prefill's many query tokens, a soft-capped or biased attention, no grouping) goes to
the model's own implementation unchanged, so the numbers are the same as before to float
rounding (tests/test_compiled_sampling.py compares the draws with the eager sampler's).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

NAME = "marlhf_decode"  # its name in transformers' attention registry
_own: contextvars.ContextVar[str] = contextvars.ContextVar("marlhf_own_attention", default="sdpa")


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """A transformers attention function: ``query`` [B, H, Q, D], ``key``/``value`` [B, KV, L, D],
    ``attention_mask`` additive [B, 1, Q, L]; returns ([B, Q, H, D], None)."""
    rows, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    extras = any(kwargs.get(name) is not None for name in ("softcap", "sinks", "position_bias", "s_aux"))
    if queries != 1 or heads == kv_heads or extras or dropout:
        return _own_function(module)(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # head h = kv head h // group, as repeat_kv orders them
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(rows, 1, heads, dim), None


def _own_function(module):
    """The attention the model would have called: its registered implementation, or for
    ``eager`` the eager function of the module's own modelling file (each family has its own)."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    own = _own.get()
    if own != "eager":
        return ALL_ATTENTION_FUNCTIONS[own]
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward")


def _register() -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if NAME not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(NAME, attention)


@contextlib.contextmanager
def decoding(config):
    """Within the block, the model of ``config`` (its text config) attends through
    :func:`attention`; its own implementation is restored after."""
    _register()
    getter = getattr(config, "get_text_config", None)
    text = getter(decoder=True) if callable(getter) else config
    own = getattr(text, "_attn_implementation", None) or "eager"
    token = _own.set(own)
    text._attn_implementation = NAME
    try:
        yield
    finally:
        text._attn_implementation = own
        _own.reset(token)

