"""The power of a decided comparison: how often it would detect a stated difference.

Two figures per comparison, at the seeds it has and the level its first Holm step uses
(alpha divided by the number of tasks, the strictest level any task's test faces):

* reach rates, exactly: the probability that Fisher's exact test (two-sided) rejects when the
  two arms reach the threshold with probabilities p_a and p_b, summed over every pair of
  binomial outcomes;
* the log-rank test, by simulation from the bimodal outcome model: a run either learns
  (probability ``reach``) and reaches the threshold at a cost drawn from the task's observed
  steps-to-threshold (the tuning runs that reached it), or never learns and is censored at the
  budget; the faster arm's costs are the drawn ones divided by ``speedup``.
"""

from __future__ import annotations

import numpy as np

from .survival import Outcomes, logrank


def fisher_power(p_a: float, p_b: float, n_a: int, n_b: int, alpha: float) -> float:
    """Exact power of the two-sided Fisher test of reach rates."""
    from scipy import stats

    pmf_a = stats.binom.pmf(np.arange(n_a + 1), n_a, p_a)
    pmf_b = stats.binom.pmf(np.arange(n_b + 1), n_b, p_b)
    power = 0.0
    for k_a in range(n_a + 1):
        for k_b in range(n_b + 1):
            table = [[k_a, n_a - k_a], [k_b, n_b - k_b]]
            if stats.fisher_exact(table).pvalue <= alpha:
                power += pmf_a[k_a] * pmf_b[k_b]
    return float(power)


def simulate(reach: float, speedup: float, n: int, observed: np.ndarray, budget: float, rng) -> Outcomes:
    """``n`` runs of the bimodal outcome model."""
    learns = rng.random(n) < reach
    cost = np.maximum(1.0, np.ceil(rng.choice(observed, size=n) / speedup))
    return Outcomes(np.where(learns, np.minimum(cost, budget), budget), learns)


def logrank_power(reach: tuple[float, float], speedup: float, n: tuple[int, int], observed, budget: float,
                  alpha: float, simulations: int, seed: int = 0) -> float:  # fmt: skip
    """Share of simulated studies in which the log-rank test rejects at ``alpha``; arm a is the
    one ``speedup`` times faster. ``observed``: costs to threshold to draw from (steps)."""
    observed = np.asarray(observed, dtype=float)
    if observed.size == 0:  # nothing reached it in tuning: a cost uniform over the budget
        observed = np.arange(1.0, budget + 1.0)
    rng = np.random.default_rng(seed)
    rejected = 0
    for _ in range(simulations):
        a = simulate(reach[0], speedup, n[0], observed, budget, rng)
        b = simulate(reach[1], 1.0, n[1], observed, budget, rng)
        rejected += logrank(a, b)[1] <= alpha
    return rejected / simulations
