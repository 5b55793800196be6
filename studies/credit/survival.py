"""Cost-to-threshold as censored data: events, Kaplan-Meier, log-rank, restricted means, reach rates.

A run's outcome is the cost it had spent when its trailing mean training score first reached
the threshold (an event), or the cost of the whole run if it never did (censored at its
end). Cost is counted on three axes: PPO steps, responses generated, and tokens generated
(responses plus the continuations the ``mc`` arms sample). scipy does the estimation where
it can: the Kaplan-Meier estimate (``stats.ecdf`` of ``CensoredData``), the log-rank test
(``stats.logrank``), exact binomial intervals (``stats.binomtest``) and the bootstrap. The
restricted mean (the area under the Kaplan-Meier curve up to a horizon) and Holm's
correction are written here and tested against their definitions (tests/test_credit_stats.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np


def trailing_mean(values: list[float], window: int = 5) -> list[float]:
    """Each step's mean over it and the ``window`` - 1 steps before it (fewer at the start)."""
    return [statistics.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def reached_step(score: list[float], threshold: float, window: int) -> int | None:
    """First step (1-based) whose trailing ``window``-step mean reaches ``threshold``; None if none."""
    for index, value in enumerate(trailing_mean(score, window)):
        if value >= threshold:
            return index + 1
    return None


def cumulative_cost(record: dict, axis: str) -> np.ndarray:
    """Cost spent by the end of each step of a run, on ``axis``."""
    if axis == "steps":
        return np.arange(1, len(record["score"]) + 1, dtype=float)
    key = {"responses": "responses", "tokens": "generated_tokens"}[axis]
    return np.cumsum(np.asarray(record[key], dtype=float))


@dataclass
class Outcomes:
    """Times on one axis and whether each is an event (reached) or censored (never reached)."""

    times: np.ndarray
    events: np.ndarray  # bool

    @property
    def reached(self) -> int:
        return int(self.events.sum())

    def __len__(self) -> int:
        return len(self.times)

    def censored_data(self):
        from scipy.stats import CensoredData

        return CensoredData(uncensored=self.times[self.events], right=self.times[~self.events])


def outcomes(records: list[dict], axis: str, threshold: float, window: int) -> Outcomes:
    times, events = [], []
    for r in records:
        cost = cumulative_cost(r, axis)
        step = reached_step(r["score"], threshold, window)
        times.append(cost[-1] if step is None else cost[step - 1])
        events.append(step is not None)
    return Outcomes(np.asarray(times, dtype=float), np.asarray(events, dtype=bool))


def kaplan_meier(o: Outcomes) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier survival estimate (share of runs not yet at the threshold) as a step
    function: it is ``survival[i]`` from ``times[i]`` on, and 1 before ``times[0]``."""
    from scipy import stats

    if not o.events.any():  # no event: the curve stays at 1 (scipy needs no special case, but be explicit)
        return np.array([o.times.max()]), np.array([1.0])
    sf = stats.ecdf(o.censored_data()).sf
    return np.asarray(sf.quantiles, dtype=float), np.asarray(sf.probabilities, dtype=float)


def restricted_mean(o: Outcomes, horizon: float) -> float:
    """Area under the Kaplan-Meier curve from 0 to ``horizon``: the mean cost to threshold
    when every run is stopped at ``horizon`` (runs that never reach count as ``horizon``)."""
    times, survival = kaplan_meier(o)
    edges = np.concatenate([[0.0], times[times < horizon], [horizon]])
    levels = np.concatenate([[1.0], survival[times < horizon]])
    return float(np.sum(np.diff(edges) * levels))


def _indices(outcome: Outcomes):
    return np.arange(len(outcome), dtype=float)


def _take(o: Outcomes, index) -> Outcomes:
    index = np.asarray(index, dtype=int)
    return Outcomes(o.times[index], o.events[index])


def bootstrap(statistic, samples: list[Outcomes], resamples: int, confidence: float) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(*outcomes)``, resampling the runs of each
    arm independently (scipy, seed 0). A statistic that does not vary has a point interval."""
    from scipy import stats

    value = statistic(*samples)
    if all(len(s) < 2 for s in samples):
        return value, value
    result = stats.bootstrap([_indices(s) for s in samples], lambda *idx: statistic(*(_take(s, i) for s, i in zip(samples, idx))),
                             vectorized=False, paired=False, n_resamples=resamples, confidence_level=confidence,
                             method="percentile", random_state=0)  # fmt: skip
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if np.isnan(low) or np.isnan(high):  # every resample the same value
        return value, value
    return low, high


def logrank(a: Outcomes, b: Outcomes) -> tuple[float, float]:
    """(z, two-sided p) of the log-rank test; z > 0: ``a`` reaches the threshold sooner than
    ``b`` (more events than expected under equal hazards). No event at all, or no variance
    to test (every run ended at the same time): (0, 1)."""
    from scipy import stats

    if not (a.events.any() or b.events.any()):
        return 0.0, 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        result = stats.logrank(a.censored_data(), b.censored_data())
    if not np.isfinite(result.pvalue):  # no variance: every run ended at one time, nothing to tell apart
        return 0.0, 1.0
    return float(result.statistic), float(result.pvalue)


def reach_interval(reached: int, runs: int, confidence: float) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a reach rate."""
    from scipy import stats

    ci = stats.binomtest(reached, runs).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
