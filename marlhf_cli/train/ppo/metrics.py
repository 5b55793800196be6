"""A step's metrics (averaged over every process's samples) and the run's summary in run.json."""

from __future__ import annotations

from typing import Any

import torch

from ... import engine as eng
from ...macro import discounted_reverse_cumsum, kl_per_token
from .critic_fit import VARIES


def q_values(experience, gamma: float) -> torch.Tensor:
    """The Q-values of the paper's Figure 11, [B, T]: the critic's targets where there is a
    critic (GAE's Q_k on each token of segment k), and without one the sampled return to go,
    sum_{t' >= t} gamma^(t' - t) r[t'] (the responses' real tokens come first in each row)."""
    if experience.returns is not None:
        return experience.returns
    mask = experience.mask.bool()
    return torch.where(mask, discounted_reverse_cumsum(torch.where(mask, experience.rewards, 0.0), gamma), 0.0)


def _row_norms(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each response's L2 norm of ``x`` over its real tokens: [B]."""
    return torch.sqrt(((x * mask) ** 2).sum(dim=1))


def reduce_metrics(experience, update_stats: dict[str, float], timings: dict[str, float], gamma: float = 1.0) -> dict[str, float]:
    """Rollout and update metrics averaged over every process's samples (``gamma``: the
    discount of the Q-values a critic-free estimator is given, :func:`q_values`)."""
    mask = experience.mask.float()
    lengths = mask.sum(dim=1)
    stats = experience.segment_stats
    sums = {
        "samples": float(experience.batch_size),
        "response_tokens": float(lengths.sum()),
        "score": float(experience.raw_scores.sum()),
        "placed_score": float(experience.scores.sum()),
        "reward": float(experience.rewards.sum()),
        **_kl_sums(experience, mask),
        "eos": float(experience.has_eos.float().sum()),
        "value": float((experience.values * mask).sum()),
        "advantage": float((experience.advantages * mask).sum()),
        "return": float((experience.returns * mask).sum()) if experience.returns is not None else 0.0,
        # Figure 11: each response's L2 norm of its advantages and Q-values, summed here
        "advantage_l2": float(_row_norms(experience.advantages, mask).sum()),
        "q_l2": float(_row_norms(q_values(experience, gamma), mask).sum()),
        "gae_lambda": float(experience.lambdas.sum()) if experience.lambdas is not None else 0.0,
        **_fit_sums(experience.returns, experience.values, mask),
        "segments": float(stats.segments),
        "segment_tokens": float(stats.tokens),
        "fallbacks": float(stats.fallbacks),
        "continuations": float(experience.continuations),
        "continuation_tokens": float(experience.continuation_tokens),
        "shared_prefix_tokens": float(experience.tree.shared_tokens if experience.tree is not None else 0),
        **_episode_sums(experience),
        **{f"part:{name}": float(part.sum()) for name, part in experience.score_parts.items()},
        **{f"update:{k}": v for k, v in update_stats.items()},
        **{f"time:{k}": v for k, v in timings.items()},
    }
    keys = sorted(sums)
    totals = eng.all_reduce_sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64)).tolist()
    total = dict(zip(keys, totals))
    samples, tokens, processes = total["samples"], max(total["response_tokens"], 1.0), eng.world_size()
    out = {
        "score": total["score"] / samples,  # the reward function's raw score (RM score)
        "placed_score": total["placed_score"] / samples,  # clipped, minus the missing-EOS penalty
        "reward": total["reward"] / samples,  # sum of per-token rewards: score - kl_coef * KL
        "response_length": total["response_tokens"] / samples,
        "eos_rate": total["eos"] / samples,
        "value": total["value"] / tokens,
        "advantage": total["advantage"] / tokens,
        "return": total["return"] / tokens,
        # the L2 norm of a response's per-token advantages, and of its Q-values, averaged over
        # the step's responses (the paper's Figure 11: their stability across steps)
        "advantage_l2": total["advantage_l2"] / samples,
        "q_l2": total["q_l2"] / samples,
        "segment_length": total["segment_tokens"] / max(total["segments"], 1.0),
        "segments_per_response": total["segments"] / samples,
        "responses": samples,  # generated this step, over all processes: prompts x K
        "parse_fallbacks": total["fallbacks"],
        "response_tokens": total["response_tokens"],
        # the step's sampling cost over all processes (mc samples continuations besides the
        # responses; a tree's leaves share the prefixes drawn once): real tokens, each
        # sequence up to and including its EOS
        "continuations": total["continuations"],
        "continuation_tokens": total["continuation_tokens"],
        "shared_prefix_tokens": total["shared_prefix_tokens"],
        "generated_tokens": total["response_tokens"] - total["shared_prefix_tokens"] + total["continuation_tokens"],
    }
    if "kl" in total:  # a run with a reference (RunPlan.reference)
        out["kl"] = total["kl"] / samples  # sequence KL(pi || ref), k1 estimate: unbiased, negative at times
        out["kl_k3"] = total["kl_k3"] / samples  # the same, k3 estimate: unbiased and never negative (the table's)
        out["kl_estimate"] = total["kl_estimate"] / samples  # the estimator used in the reward
    if "episode:turns" in total:  # --env: the episodes' shape
        out["turns"] = total["episode:turns"] / samples
        out["truncated_rate"] = total["episode:truncated"] / samples  # ended by a budget, not by the environment
        out["observation_tokens"] = total["episode:observation_tokens"] / samples
    if experience.lambdas is not None:  # gae: the actor's lambda, its mean over responses (--lam adaptive varies)
        out["gae_lambda"] = total["gae_lambda"] / samples
    if experience.returns is not None:
        out["explained_variance"] = explained_variance(total)
        # with "return" and "value" (the means), what a window of steps pools (pooled_explained_variance)
        out["return_variance"], out["residual_variance"] = _variances(total)
    for key, value in total.items():
        if key.startswith("part:"):  # one of several --reward's raw score, unweighted
            out["score_" + key.split(":", 1)[1]] = value / samples
        elif key.startswith("update:"):
            out[key.split(":", 1)[1]] = value / processes
        elif key.startswith("time:"):
            out[key.split(":", 1)[1]] = value / processes
    return out



def _kl_sums(experience, mask) -> dict[str, float]:
    """The sequence KL to the reference, three ways; nothing without a reference (--kl-coef 0:
    the update's approx_kl is then the only KL, the one to the sampling policy)."""
    if experience.ref_logp is None:
        return {}
    return {"kl": float(experience.kl_k1.sum()),
            "kl_k3": float((kl_per_token(experience.old_logp, experience.ref_logp, "k3") * mask).sum()),
            "kl_estimate": float(experience.kl.sum())}  # fmt: skip


def _fit_sums(returns, values, mask) -> dict[str, float]:
    """Sums over real tokens from which every process's explained variance is one figure:
    the critic's targets (``returns``) and the residuals of its values from them."""
    if returns is None:
        return {}
    residual = (returns - values) * mask
    target = returns * mask
    return {"fit:target": float(target.sum()), "fit:target2": float((target**2).sum()),
            "fit:residual": float(residual.sum()), "fit:residual2": float((residual**2).sum())}  # fmt: skip


def _variances(total: dict[str, float]) -> tuple[float, float]:
    """The variances over the step's real tokens of the critic's targets and of its residuals."""
    n = max(total["response_tokens"], 1.0)
    target = total["fit:target2"] / n - (total["fit:target"] / n) ** 2
    residual = total["fit:residual2"] / n - (total["fit:residual"] / n) ** 2
    return target, residual


def explained_variance(total: dict[str, float]) -> float:
    """1 - Var(target - value) / Var(target) over the step's real tokens: how much of its
    targets' variance the critic's values account for (1 a perfect fit, 0 no better than
    their mean, below 0 worse). The targets are the returns the value loss regresses on,
    the segment's Q_k on each of its tokens under macro actions. NaN when the targets do not vary."""
    variance, residual = _variances(total)
    return 1.0 - residual / variance if variance > VARIES else float("nan")


def live_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The few numbers the progress bar shows."""
    # without a reference (--kl-coef 0) there is no KL to show
    shown = {"score": metrics["score"]} | ({"kl": metrics["kl_k3"]} if "kl_k3" in metrics else {})
    if "segment_length" in metrics:  # (rloo and grpo cut no macro actions: nothing to show)
        shown["seg"] = metrics["segment_length"]
    return shown | {"s/step": metrics["step_time"]}



def final_metrics(last: dict, history: list[dict], durations: list[float], start: int) -> dict[str, Any]:
    """run.json's summary: the last step's rollout metrics and the eval curve's ends."""
    keys = ("score", "reward", "kl", "kl_k3", "response_length", "segment_length", "explained_variance",
            "explained_variance_pooled", "explained_variance_within", "advantage_l2", "q_l2", "gae_lambda",
            "parse_fallbacks", "generation_captures", "generation_replays")  # fmt: skip
    metrics: dict[str, Any] = {k: last[k] for k in keys if k in last}
    metrics |= {k: v for k, v in last.items() if k.startswith("score_")}  # several --reward: each one's
    metrics["steps"] = max((row["step"] for row in history), default=start + len(durations))
    timed = durations[1:] or durations  # the first step includes one-off warm-up
    if timed:
        metrics["seconds_per_step"] = round(sum(timed) / len(timed), 4)
    evals = [row for row in history if row.get("split") == "eval"]
    if evals:
        metrics["eval_score_start"] = evals[0]["score"]
        metrics["eval_score"] = evals[-1]["score"]
        metrics["eval_response_length"] = evals[-1]["response_length"]
    if start:
        metrics["resumed_from_step"] = start
    return metrics


def _episode_sums(experience) -> dict[str, float]:
    """An episode batch's turns, truncations and observation tokens (nothing for single responses)."""
    episode = getattr(experience, "episode", None)
    if episode is None:
        return {}
    return {"episode:turns": float(episode.turns.sum()), "episode:truncated": float(episode.truncated.float().sum()),
            "episode:observation_tokens": float((episode.attention - episode.mask).sum())}  # fmt: skip
