"""The fourth edition's statistics: gate 1 (the reward model against the length baseline) and
the decision rule's speedup with its bootstrap over seeds. Pure functions of numbers.

Gate 1 (PROTOCOL.md): on the test pairs (posts no stage trained on) the reward model is right
on a pair when it scores the chosen summary higher (a tie counts a half). The length baseline
picks the longer summary in tokens (a tie counts a half); the fifth edition's, the better of
that rule and its opposite on the same pairs. The gate passes when the reward
model's accuracy is at least the bar **and** it beats the length baseline on the same pairs:
an exact one-sided McNemar test (a binomial test on the discordant pairs, where exactly one of
the two is right; pairs where either is tied are left out of the test). The length-controlled
accuracy is the mean of the accuracies on the pairs whose chosen summary is the longer and on
those where it is the shorter: a judge of length alone scores 0.5 on it.

The speedup (PROTOCOL.md, "Decision rule") compares two arms' evaluation curves, each the mean
over seeds of the held-out score at the evaluation steps: with T the last step and y the
baseline's final mean, it is T / t*, t* the first step (linearly interpolated between
evaluations) at which the other arm's mean reaches y. An arm that never reaches y within T
gets the ratio of the two arms' gains over the shared start instead, which is below 1 and
meets T / t* at the boundary (both are 1 when it reaches y exactly at T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


# ---------------------------------------------------------------------------------------
# gate 1


@dataclass(frozen=True)
class GateOne:
    pairs: int
    accuracy: float
    accuracy_interval: tuple[float, float]  # Wilson, 95%
    length_accuracy: float
    rm_only: int  # discordant pairs: the reward model right, the length baseline wrong
    length_only: int  # the length baseline right, the reward model wrong
    p_value: float  # one-sided exact McNemar: the reward model beats length
    length_controlled: float
    strata: dict  # "chosen longer" / "chosen shorter" / "same length" -> (pairs, accuracy)
    bar: float
    alpha: float
    length_rule: str = "longer"  # the length baseline: "longer" (wins) or "shorter", the better of those asked for

    @property
    def passed(self) -> bool:
        return self.accuracy >= self.bar and self.p_value < self.alpha


def _right(a: float, b: float) -> float:
    """1 when a > b, a half on a tie, else 0."""
    return 0.5 if a == b else float(a > b)


def length_rule(chosen_tokens: Sequence[int], rejected_tokens: Sequence[int], rule: str) -> list[float]:
    """Per pair, whether a judge of length alone is right: ``longer`` picks the longer response,
    ``shorter`` the shorter (a tie counts a half either way)."""
    if rule not in ("longer", "shorter"):
        raise ValueError(f"no length rule called {rule!r}; choose longer or shorter")
    sign = 1 if rule == "longer" else -1
    return [_right(sign * c, sign * r) for c, r in zip(chosen_tokens, rejected_tokens)]


def gate_one(chosen_scores: Sequence[float], rejected_scores: Sequence[float], chosen_tokens: Sequence[int],
             rejected_tokens: Sequence[int], *, bar: float, alpha: float, length_rules: Sequence[str] = ("longer",)) -> GateOne:  # fmt: skip
    """Gate 1 against the better of ``length_rules`` on these pairs (the fourth edition: the
    longer response alone; the fifth: the better of longer and shorter, since HH's harmless
    pairs prefer the shorter response)."""
    from scipy.stats import binomtest

    from marlhf_cli.evaluate.stats import wilson

    rm = [_right(c, r) for c, r in zip(chosen_scores, rejected_scores)]
    rule = max(length_rules, key=lambda name: sum(length_rule(chosen_tokens, rejected_tokens, name)))
    length = length_rule(chosen_tokens, rejected_tokens, rule)
    decided = [(a, b) for a, b in zip(rm, length) if a != 0.5 and b != 0.5]
    rm_only = sum(1 for a, b in decided if a == 1 and b == 0)
    length_only = sum(1 for a, b in decided if a == 0 and b == 1)
    p = binomtest(rm_only, rm_only + length_only, 0.5, alternative="greater").pvalue if rm_only + length_only else 1.0
    strata = {}
    for name, keep in (("chosen longer", lambda c, r: c > r), ("chosen shorter", lambda c, r: c < r), ("same length", lambda c, r: c == r)):
        rows = [a for a, c, r in zip(rm, chosen_tokens, rejected_tokens) if keep(c, r)]
        strata[name] = (len(rows), sum(rows) / len(rows) if rows else math.nan)
    longer, shorter = strata["chosen longer"][1], strata["chosen shorter"][1]
    correct = sum(rm)
    return GateOne(
        pairs=len(rm), accuracy=correct / len(rm), accuracy_interval=tuple(wilson(round(correct), len(rm))),
        length_accuracy=sum(length) / len(length), rm_only=rm_only, length_only=length_only, p_value=float(p),
        length_controlled=(longer + shorter) / 2, strata=strata, bar=bar, alpha=alpha, length_rule=rule,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# the speedup


def crossing(steps: Sequence[float], curve: Sequence[float], level: float) -> float | None:
    """The first step at which ``curve`` reaches ``level``, linearly interpolated between
    evaluation steps; None if it never does."""
    for i, (step, value) in enumerate(zip(steps, curve)):
        if value >= level:
            if i == 0:
                return float(step)
            before, previous = steps[i - 1], curve[i - 1]
            return float(before + (step - before) * (level - previous) / (value - previous))
    return None


def speedup(steps: Sequence[float], arm: np.ndarray, baseline: np.ndarray) -> float:
    """``arm`` against ``baseline`` ([seeds, evaluations] held-out scores at ``steps``, the
    first the shared start): the module's speedup of their seed means."""
    a, b = np.asarray(arm, dtype=float).mean(axis=0), np.asarray(baseline, dtype=float).mean(axis=0)
    target, last = b[-1], float(steps[-1])
    reached = crossing(steps, a, target)
    if reached is not None and reached > 0:
        return last / reached
    if reached is not None:  # already there at the start: as fast as can be measured
        return math.inf
    start = (a[0] + b[0]) / 2
    gain_b = b[-1] - start
    return (a[-1] - start) / gain_b if gain_b > 0 else math.nan


@dataclass(frozen=True)
class Speedup:
    name: str
    point: float
    interval: tuple[float, float]  # percentile bootstrap, 95%
    p_value: float  # one-sided: the share of resamples with speedup <= 1
    adjusted: float = math.nan  # Holm over the edition's tests
    verdict: str = ""


def bootstrap_speedup(name: str, steps: Sequence[float], arm: np.ndarray, baseline: np.ndarray, *, resamples: int,
                      confidence: float, seed: int = 0) -> Speedup:  # fmt: skip
    """The speedup with a percentile bootstrap over seeds: the same seed indices are drawn for
    both arms, since seed s of every arm shares its prompts and first draws (paired)."""
    arm, baseline = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    rng = np.random.default_rng(seed)
    n = arm.shape[0]
    draws = []
    for _ in range(resamples):
        pick = rng.integers(0, n, n)
        draws.append(speedup(steps, arm[pick], baseline[pick]))
    draws = np.array(draws, dtype=float)
    finite = draws[~np.isnan(draws)]
    tail = (1 - confidence) / 2
    low, high = (np.quantile(finite, [tail, 1 - tail]) if len(finite) else (math.nan, math.nan))
    p = float(np.mean(finite <= 1.0)) if len(finite) else math.nan
    return Speedup(name, speedup(steps, arm, baseline), (float(low), float(high)), p)


def decide(results: list[Speedup], *, alpha: float, replicated: float, contradicted: float) -> list[Speedup]:
    """Holm over the tests, then each verdict: "replicated" (Holm-adjusted p < alpha and the
    point estimate >= ``replicated``), "contradicted" (the interval's upper bound <
    ``contradicted``), else "inconclusive"."""
    from .survival import holm

    adjusted = holm([r.p_value for r in results])
    out = []
    for r, p in zip(results, adjusted):
        if p < alpha and r.point >= replicated:
            verdict = "replicated"
        elif r.interval[1] < contradicted:
            verdict = "contradicted"
        else:
            verdict = "inconclusive"
        out.append(Speedup(r.name, r.point, r.interval, r.p_value, p, verdict))
    return out
