"""Sampling responses from a causal language model, below every stage that samples (ppo's
rollouts and Monte-Carlo continuations, bon, pass@k rewards) and above nothing of theirs.

- ``draw.py``: what every sampler shares: the settings, the top-k/top-p filter, the draw, where
  a response ends, the model facts a sampler reads. Pure functions of tensors.
- ``eager.py``: the token-by-token loop with a growing KV cache (``--generation eager``).
- ``compiled.py``: the same draws through a static cache, one recorded step per token on CUDA
  (``--generation compiled``), with its buckets, memory checks and fallbacks.
- ``static_cache.py``: the cache whose tensors never move and one bucket's step.
- ``attention.py``: the decoding step's attention over that cache.
- ``cache_rows.py``: keys and values kept from one call and given to the next (a tree's
  children start from their parent's rows).
"""

from .draw import SamplingParams, cache_argument, draw, filter_logits, response_mask, stops
from .eager import sample

__all__ = ["SamplingParams", "cache_argument", "draw", "filter_logits", "response_mask", "sample", "stops"]
