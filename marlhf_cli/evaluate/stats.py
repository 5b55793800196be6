"""Statistics of pairwise judgements: rates with intervals, position bias, length control.

A *verdict* is always stated for side A (the first file): ``win`` (A better), ``tie``,
``loss``; pairs whose reply could not be parsed (``unparsed``) or never came back
(``failed``) are counted but stay out of every rate, so nothing is guessed.

Choices made here, and why:

* **Wilson intervals** (``scipy.stats.binomtest(...).proportion_ci(method="wilson")``): with
  the paper's 50 pairs and rates near 0 or 1 the normal ("Wald") interval is too narrow and
  can leave [0, 1]; Wilson's keeps its coverage close to 95% there.
* **Sign test** of wins against losses (ties left out): does A beat B more often than chance?
* **Length-controlled win rate**, in the spirit of length-controlled AlpacaEval: a logistic
  regression of the verdict (win 1, tie 1/2, loss 0) on ``tanh`` of the standardised length
  difference (words of A minus words of B), fitted with ``scipy.optimize.minimize``; the
  predicted win rate at zero length difference is ``sigmoid(intercept)``. The ``tanh`` bounds
  the pull of a few very long answers. A weak Gaussian prior (ridge: 0.1 on the intercept, 1
  on the length coefficient) keeps the fit finite when one side wins every pair, or wins
  exactly when it is longer, where plain maximum likelihood has no optimum; it moves a 75%
  rate over 40 pairs by less than half a point.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Sequence

VERDICTS = ("win", "tie", "loss")
SCORE = {"win": 1.0, "tie": 0.5, "loss": 0.0}
CONFIDENCE = 0.95
RIDGE = (0.1, 1.0)  # intercept, length coefficient


def wilson(k: int, n: int, level: float = CONFIDENCE) -> list[float] | None:
    """Wilson score interval for k successes in n trials; None when n is 0."""
    if n <= 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return [float(ci.low), float(ci.high)]


def sign_test(wins: int, losses: int) -> float | None:
    """Two-sided binomial p-value of wins vs losses under 50/50 (ties excluded)."""
    if wins + losses == 0:
        return None
    from scipy.stats import binomtest

    return float(binomtest(int(wins), int(wins + losses), 0.5).pvalue)


def combine_orders(verdicts: Sequence[str]) -> str:
    """One verdict from a pair's judgements in both orders: the mean score (win 1, tie 1/2,
    loss 0) decides, so agreeing orders keep their verdict, win+loss becomes a tie (the
    judge followed the position, not the content) and win+tie stays a win."""
    mean = sum(SCORE[v] for v in verdicts) / len(verdicts)
    return "win" if mean > 0.5 else "loss" if mean < 0.5 else "tie"


def rates(counts: Counter) -> dict[str, Any]:
    """Counts, rates over decided pairs with Wilson intervals, ties-as-half win rate, sign test."""
    decided = sum(counts[v] for v in VERDICTS)
    out: dict[str, Any] = {"decided": decided, **{v: int(counts[v]) for v in VERDICTS}}
    for v in VERDICTS:
        out[f"{v}_rate"] = counts[v] / decided if decided else None
        out[f"{v}_rate_ci"] = wilson(counts[v], decided)
    out["win_rate_ties_half"] = (counts["win"] + 0.5 * counts["tie"]) / decided if decided else None
    out["sign_test_p"] = sign_test(counts["win"], counts["loss"])
    return out


def length_controlled(verdicts: Sequence[str], length_diffs: Sequence[float]) -> dict[str, float] | None:
    """Predicted win rate of A (ties as half) at zero length difference (module doc).

    None without decided pairs, and when every pair has the same non-zero length difference:
    then length and quality cannot be told apart, and any number would be made up.
    """
    pairs = [(SCORE[v], float(d)) for v, d in zip(verdicts, length_diffs) if v in SCORE]
    if not pairs:
        return None
    import numpy as np
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit

    y = np.array([p[0] for p in pairs])
    d = np.array([p[1] for p in pairs])
    scale = d.std()
    if scale == 0 and d.any():
        return None
    x = np.tanh(d / scale) if scale > 0 else np.zeros_like(d)
    ridge = np.array(RIDGE)

    def loss(theta):
        z = theta[0] + theta[1] * x
        nll = -(y * log_expit(z) + (1 - y) * log_expit(-z)).sum()
        return nll + 0.5 * float(ridge @ (theta * theta))

    def grad(theta):
        z = theta[0] + theta[1] * x
        residual = expit(z) - y
        return np.array([residual.sum(), (residual * x).sum()]) + ridge * theta

    fit = minimize(loss, np.zeros(2), jac=grad, method="BFGS")
    intercept, slope = (float(v) for v in fit.x)
    return {"win_rate": float(expit(intercept)), "intercept": intercept, "length_coef": slope, "length_scale_words": float(scale)}


def position_bias(pairs: Iterable[dict]) -> dict[str, Any] | None:
    """For pairs judged in both orders with both replies parsed: how often the verdict
    changed with the order (``inconsistent_rate``), and how often the judge picked the same
    *slot* twice (``same_slot_rate``, the purest sign of position bias), with Wilson CIs."""
    both = [p for p in pairs if len(p.get("orders", [])) == 2 and all(o.get("verdict") in SCORE for o in p["orders"])]
    if not both:
        return None
    changed = sum(p["orders"][0]["verdict"] != p["orders"][1]["verdict"] for p in both)
    same_slot = sum(p["orders"][0]["choice"] == p["orders"][1]["choice"] != "E" for p in both)
    first = sum(o["choice"] == "A" for p in both for o in p["orders"])
    return {
        "pairs": len(both),
        "inconsistent": changed,
        "inconsistent_rate": changed / len(both),
        "inconsistent_rate_ci": wilson(changed, len(both)),
        "same_slot": same_slot,
        "same_slot_rate": same_slot / len(both),
        "first_slot_choice_rate": first / (2 * len(both)),
    }


def words(text: str) -> int:
    return len(text.split())


def summarize(pairs: Sequence[dict]) -> dict[str, Any]:
    """Everything the judge reports for one judge over its pairs (see the module doc).

    Each pair: ``verdict``, ``response_a``, ``response_b``, optional ``orders`` and
    ``criteria`` (per-criterion verdicts for WebGPT).
    """
    counts = Counter(p["verdict"] for p in pairs)
    out: dict[str, Any] = {"pairs": len(pairs), **rates(counts)}
    out["unparsed"] = int(counts["unparsed"])
    out["failed"] = int(counts["failed"])
    decided = [p for p in pairs if p["verdict"] in SCORE]
    out["mean_words_a"] = sum(words(p["response_a"]) for p in pairs) / len(pairs) if pairs else None
    out["mean_words_b"] = sum(words(p["response_b"]) for p in pairs) / len(pairs) if pairs else None
    out["length_controlled"] = length_controlled(
        [p["verdict"] for p in decided], [words(p["response_a"]) - words(p["response_b"]) for p in decided]
    )
    out["position_bias"] = position_bias(pairs)
    criteria: dict[str, Counter] = {}
    for p in decided:
        for name, verdict in (p.get("criteria") or {}).items():
            criteria.setdefault(name, Counter())[verdict] += 1
    if criteria:
        out["criteria"] = {name: rates(c) for name, c in criteria.items()}
    return out


def agreement(first: dict[str, str], second: dict[str, str]) -> dict[str, Any] | None:
    """How two judges' verdicts on the same pairs (keyed alike) agree, as the paper's Table 1.

    ``table[v1][v2]`` counts pairs judged v1 by the first and v2 by the second judge;
    ``rate`` is the share of identical verdicts, ``rate_without_ties`` the same over pairs
    neither judge called a tie.
    """
    shared = [k for k in first if k in second and first[k] in SCORE and second[k] in SCORE]
    if not shared:
        return None
    table = {v1: {v2: 0 for v2 in VERDICTS} for v1 in VERDICTS}
    for key in shared:
        table[first[key]][second[key]] += 1
    same = sum(table[v][v] for v in VERDICTS)
    strict = [k for k in shared if "tie" not in (first[k], second[k])]
    strict_same = sum(first[k] == second[k] for k in strict)
    return {
        "pairs": len(shared),
        "table": table,
        "rate": same / len(shared),
        "rate_ci": wilson(same, len(shared)),
        "pairs_without_ties": len(strict),
        "rate_without_ties": strict_same / len(strict) if strict else None,
    }


def fmt_rate(rate: float | None, ci: Sequence[float] | None = None) -> str:
    """'62.0% [48.2, 74.1]' for tables."""
    if rate is None or (isinstance(rate, float) and math.isnan(rate)):
        return "-"
    text = f"{100 * rate:.1f}%"
    if ci:
        text += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return text
