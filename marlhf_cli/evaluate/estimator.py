"""The expected best-of-N score estimated from M >= N samples of one prompt.

Why an estimator instead of sampling N responses for every N: sampling the largest N (= M)
once and deriving every smaller N from the same samples makes a sweep over N cost one
generation per temperature, and it is also *less* noisy than drawing fresh N-subsets.

For the sorted scores s_(1) <= ... <= s_(M), the maximum of a uniformly random N-subset
(drawn without replacement) is s_(i) exactly when s_(i) is in the subset and the other N-1
members come from the i-1 scores below it, so

    E[max of N] = sum_i s_(i) * C(i-1, N-1) / C(M, N)

which is unbiased for the best-of-N score of the M samples' distribution (the same
argument gives the usual pass@k estimator). Ties do not matter: tied scores give the same
maximum whichever of them is "the" maximum. Weights are computed with exact integers, so
they are correct for any M (no overflowing factorials).
"""

from __future__ import annotations

import math
from typing import Sequence


def expected_max_weights(m: int, n: int) -> list[float]:
    """w_i = C(i-1, n-1) / C(m, n) for i = 1..m (ascending order); they sum to 1."""
    if not 1 <= n <= m:
        raise ValueError(f"best-of-{n} needs 1 <= N <= M, got M={m}")
    total = math.comb(m, n)
    return [math.comb(i - 1, n - 1) / total for i in range(1, m + 1)]


def expected_best_of(scores: Sequence[float], n: int) -> float:
    """Unbiased E[max of n scores drawn without replacement from ``scores``]."""
    ordered = sorted(float(s) for s in scores)
    weights = expected_max_weights(len(ordered), n)
    return math.fsum(w * s for w, s in zip(weights, ordered))


def best_of_curve(per_prompt: Sequence[Sequence[float]], ns: Sequence[int]) -> dict[int, dict[str, float]]:
    """Mean over prompts of the expected best-of-N score, and its standard error, per N.

    Every prompt must have the same number of samples M >= max(ns).
    """
    out: dict[int, dict[str, float]] = {}
    for n in ns:
        values = [expected_best_of(scores, n) for scores in per_prompt]
        mean = math.fsum(values) / len(values)
        var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
        out[int(n)] = {"mean": mean, "sem": math.sqrt(var / len(values))}
    return out
