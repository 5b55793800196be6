"""Critic-free advantages: RLOO and GRPO, the baselines MA-PPO is measured against.

Both sample a *group* of K responses to the same prompt and take the baseline from the other
responses of the group instead of from a learned critic. Every token of response i gets the
same advantage A_i: credit is assigned to the response as a whole (one segment per
response, like MA-PPO with n = inf, but with a group baseline instead of a value).

Layout: a batch of B = G * K responses holds its groups as consecutive rows, rows
[g*K, (g+1)*K) answering prompt g. Formulas: docs/method.md "Critic-free baselines (RLOO, GRPO)".

* RLOO (Ahmadian et al., 2024): the sequence reward R_i = score_i - beta * sum_t KL_t (the
  per-token rewards summed, KL penalty included); A_i = R_i - mean_{j != i} R_j, which equals
  K / (K - 1) * (R_i - mean_j R_j).
* GRPO (Shao et al., 2024): A_i = (r_i - mean(r)) / (std(r) + eps) over the group, with r the
  score alone and std the sample standard deviation (Bessel's correction, K - 1); the KL to
  the reference is not in the reward but a separate loss term (:func:`.losses.kl_loss`).

A group whose rewards are all equal gets zero advantage in both (no NaN): there is nothing
to prefer within it.
"""

from __future__ import annotations

import torch

__all__ = [
    "ADVANTAGE_ESTIMATORS", "GRPO_EPS", "group_view", "grpo_advantages", "leave_one_out_means", "rloo_advantages",
    "sequence_to_tokens",
]  # fmt: skip

# gae: a critic and GAE over macro actions (PPO / MA-PPO); rloo and grpo: no critic; mc:
# no critic, segment values from sampled continuations (montecarlo.py); tree: no critic, values
# from a tree of responses branching at the macro actions' ends (tree.py)
ADVANTAGE_ESTIMATORS = ("gae", "rloo", "grpo", "mc", "tree")
GRPO_EPS = 1e-4  # keeps an all-equal group at exactly zero advantage


def group_view(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] -> [B // K, K], one row per group; a clear error when B is not a multiple of K
    or a group is too small to have a baseline."""
    if rewards.dim() != 1:
        raise ValueError(f"sequence rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"a group baseline needs at least 2 responses per prompt, got {group_size}")
    if rewards.shape[0] % group_size:
        raise ValueError(f"{rewards.shape[0]} responses do not split into groups of {group_size}")
    return rewards.reshape(-1, group_size)


def leave_one_out_means(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """The mean of the other K - 1 rewards of each response's group, in float64; [B] in, [B] out."""
    groups = group_view(rewards.double(), group_size)
    return ((groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)).reshape(-1)


def rloo_advantages(sequence_rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A_i = R_i - mean of the other K - 1 rewards of i's group; [B] in, [B] out."""
    others = leave_one_out_means(sequence_rewards, group_size)
    return (sequence_rewards.double() - others).to(sequence_rewards.dtype)


def grpo_advantages(scores: torch.Tensor, group_size: int, eps: float = GRPO_EPS) -> torch.Tensor:
    """A_i = (r_i - group mean) / (group sample std + eps); [B] in, [B] out."""
    groups = group_view(scores.double(), group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, unbiased=True)
    return (centred / (std + eps)).reshape(-1).to(scores.dtype)


def sequence_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Give every real token of response i the advantage A_i; zero at padding. [B] -> [B, T]."""
    values = advantages[:, None].to(mask.device).expand(mask.shape)
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
