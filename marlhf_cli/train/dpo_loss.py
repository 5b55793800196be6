"""DPO's losses as pure functions of summed response log-probs (``marlhf dpo``, docs/dpo.md).

For a pair (prompt x, chosen y_w, rejected y_l) with the policy's and the frozen reference's
summed log-probs of each response, the implicit reward of a response is
``r(y) = beta * (log pi(y | x) - log pi_ref(y | x))`` and the log-ratio margin is
``h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))``. With ``d`` the
length difference |y_w| - |y_l| in tokens and ``alpha`` the length penalty, ``z = beta * h +
alpha * d``. The length term is R-DPO's (Park et al. 2024): a penalty of alpha per token in the
objective makes the implicit reward ``beta * log-ratio + alpha * |y|``, so a preference is
partly explained by the responses' lengths, and a pair won by the longer response pushes the
policy's log-ratio less (its loss is already lower); a pair won by the shorter one pushes more:

* ``sigmoid`` (DPO, Rafailov et al. 2023, the paper's baseline): ``-log sigmoid(z)``; with
  label smoothing ``eps`` (conservative DPO: each label flipped with probability eps)
  ``-(1 - eps) log sigmoid(z) - eps log sigmoid(-z)``;
* ``ipo`` (Azar et al. 2023): ``(z / beta - 1 / (2 beta))^2``, the squared distance of the
  margin from 1 / (2 beta), on summed log-probs as the IPO paper writes it (TRL averages
  them over tokens instead). Label smoothing is sigmoid's alone.

Nothing here reads a model: the stage gives the four log-probs and the lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOSS_TYPES = ("sigmoid", "ipo")


@dataclass(frozen=True)
class PreferenceLoss:
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    length_penalty: float = 0.0  # R-DPO's alpha, per token of length difference

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss type {self.loss_type!r}; choose one of {', '.join(LOSS_TYPES)}")
        if not self.beta > 0:
            raise ValueError(f"beta must be above 0, got {self.beta!r}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label smoothing must be in [0, 0.5), got {self.label_smoothing!r}")
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError("label smoothing is the sigmoid loss's (conservative DPO)")


def pair_losses(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    loss: PreferenceLoss,
) -> torch.Tensor:
    """One loss per pair, [B] float32 (module docstring); every argument is [B]."""
    margin = (policy_chosen.float() - reference_chosen.float()) - (policy_rejected.float() - reference_rejected.float())
    z = loss.beta * margin + loss.length_penalty * (chosen_lengths.float() - rejected_lengths.float())
    if loss.loss_type == "ipo":
        return (z / loss.beta - 1.0 / (2.0 * loss.beta)) ** 2
    eps = loss.label_smoothing
    if not eps:
        return -F.logsigmoid(z)
    return -(1.0 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)


def implicit_rewards(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's implicit reward of each response, beta * (log pi - log pi_ref): [B]."""
    return beta * (policy.float() - reference.float())
