"""Termination rules that need no parser: ``fixed``, ``randomized`` and ``ppl``.

A termination rule turns one response into a list of macro-action (segment) lengths.
Every function here works on a single sample, so the boundaries of one response never
depend on another response in the batch (docs/method.md "Termination rules", invariant 5), and every
function returns lengths that are all >= 1 and sum to the response length (invariant 4).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

__all__ = [
    "RANDOMIZED_POOL",
    "check_n",
    "fixed_lengths",
    "randomized_lengths",
    "ppl_lengths",
]

# docs/method.md "Termination rules", `randomized`: lengths drawn from {2, 3, 5, 10}, each repeated three times.
RANDOMIZED_POOL: tuple[int, ...] = (2, 3, 5, 10) * 3


def _check_length(length: int) -> int:
    if isinstance(length, bool) or not isinstance(length, int):
        raise ValueError(f"length must be an int, got {length!r}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    return length


def check_n(n: int | float) -> int | float:
    """Validate a fixed segment length: a whole number >= 1, or ``math.inf``.

    Returns ``n`` as an ``int`` when finite (so 5.0 becomes 5) and ``math.inf`` otherwise.
    """
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        raise ValueError(f"n must be a whole number >= 1 or inf, got {n!r}")
    if math.isinf(n) and n > 0:
        return math.inf
    if math.isnan(n) or n < 1 or n != int(n):
        raise ValueError(f"n must be a whole number >= 1 or inf, got {n!r}")
    return int(n)


def fixed_lengths(length: int, n: int | float) -> list[int]:
    """Consecutive groups of ``n`` tokens; the last group may be shorter.

    ``n == 1`` is token-level PPO, ``n == math.inf`` makes the whole response one segment
    (a bandit / REINFORCE-with-baseline update).
    """
    length = _check_length(length)
    n = check_n(n)
    if length == 0:
        return []
    if n >= length:
        return [length]
    full, rest = divmod(length, int(n))
    return [int(n)] * full + ([rest] if rest else [])


def randomized_lengths(length: int, seed: int) -> list[int]:
    """Lengths drawn without replacement from a shuffled pool {2,3,5,10} x 3.

    The pool is shuffled by ``random.Random(seed)`` (seeded per sample, so a run is
    reproducible and a sample's segmentation does not depend on its neighbours) and
    consumed in order. A drawn length larger than what is left is cut to what is left;
    whatever remains once the pool (60 tokens) is used up becomes one final segment.
    """
    length = _check_length(length)
    pool = list(RANDOMIZED_POOL)
    random.Random(seed).shuffle(pool)
    lengths: list[int] = []
    remaining = length
    for drawn in pool:
        if remaining == 0:
            break
        take = min(drawn, remaining)
        lengths.append(take)
        remaining -= take
    if remaining:
        lengths.append(remaining)
    return lengths


def ppl_lengths(ref_logprobs: Sequence[float]) -> list[int]:
    """Grow a segment while the next token does not raise the segment's perplexity.

    With nll = -ref_logp, token t+1 joins the current segment iff
    nll[t+1] <= mean(nll over the current segment) (docs/method.md "Termination rules"). Adding a token whose
    nll is at most the running mean cannot raise the mean, i.e. cannot raise the segment
    perplexity exp(mean nll). A NaN log-prob never satisfies the comparison, so it opens a
    new segment (and the segment after it, whose mean is NaN, too): lengths stay valid.
    """
    nll = [-float(x) for x in ref_logprobs]
    if not nll:
        return []
    lengths = [1]
    segment_sum = nll[0]
    for value in nll[1:]:
        # Compare with the mean itself (not value * count <= sum) to follow the definition.
        if value <= segment_sum / lengths[-1]:
            lengths[-1] += 1
            segment_sum += value
        else:
            lengths.append(1)
            segment_sum = value
    return lengths
