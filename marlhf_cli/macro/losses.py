"""PPO losses for MA-PPO, docs/method.md "Losses".

Policy: the advantages are segment-level (each token carries its segment's A_k), but by
default the ratio is per token, as in the authors' code. ``ratio="macro"`` is the equation
the paper writes: one ratio per segment, exp(sum of the segment's token log-ratios), clipped
once per segment.

How the macro objective is averaged. Each segment's clipped objective is given to every
token of the segment and the result is averaged over all real tokens of the batch, i.e. a
per-segment objective weighted by the segment's length. With one token per segment this is
the token loss exactly (tested), and a long segment weighs what its tokens would weigh in
the token loss, so switching ``ratio`` does not change the effective step size per token.
(An unweighted mean over segments would up-weight short segments; it is not offered.)

Critic: every token value regresses to its segment's return Q_k, with PPO value clipping
around the old value: 0.5 * max((v - Q)^2, (clip(v, old - eps, old + eps) - Q)^2), averaged
over real tokens.

KL to the reference: :func:`kl_per_token` is the per-token estimate PPO puts in the reward
(k1 by default); GRPO instead adds :func:`kl_loss`, beta times the k3 estimate averaged over
real tokens, to the policy loss, with the gradient flowing through the current log-probs.

How per-token losses become one number (:func:`aggregate`, ``--loss-aggregation``,
docs/method.md "Loss aggregation"): ``token-mean`` (the default) averages over every real
token of the batch, so a long response weighs more; ``sequence-mean`` averages each
response's tokens, then the responses (DeepSeekMath's GRPO objective); ``token-sum`` sums
every real token and divides by a constant, responses x the generation budget (Dr. GRPO).
The policy loss and GRPO's KL term use it; the critic's loss and the logged diagnostics
stay token means.

Masked positions are inert everywhere (``torch.where``, not multiplication, so NaN/inf in
padding cannot leak into a loss or its gradient).
"""

from __future__ import annotations

import torch

from .advantages import segment_broadcast

__all__ = [
    "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "RATIO_MODES", "aggregate", "kl_loss", "kl_per_token", "masked_mean",
    "policy_loss", "value_loss",
]  # fmt: skip

RATIO_MODES = ("token", "macro")
KL_ESTIMATORS = ("k1", "k3")
LOSS_AGGREGATIONS = ("token-mean", "sequence-mean", "token-sum")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is nonzero (0 if there are none).

    Masked entries are replaced by 0 before summing, so their values (even NaN) and their
    gradients are inert.
    """
    real = mask.bool()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    total = torch.where(real, x, zero)
    if dim is None:
        return total.sum() / real.sum().clamp(min=1).to(x.dtype)
    return total.sum(dim=dim) / real.sum(dim=dim).clamp(min=1).to(x.dtype)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, how: str = "token-mean", max_length: int | None = None
) -> torch.Tensor:
    """One loss from per-token losses [B, T] over the real tokens of ``mask``.

    - ``token-mean``: sum over real tokens / number of real tokens (every token weighs the
      same, so a response weighs by its length);
    - ``sequence-mean``: each response's mean over its real tokens, then the mean over the
      responses that have any (every response weighs the same; Shao et al. 2024, eq. 3);
    - ``token-sum``: sum over real tokens / (B * ``max_length``), a constant that does not
      depend on the responses' lengths (Liu et al. 2025, Dr. GRPO; ``max_length`` is the
      generation budget).

    Masked entries are inert (``torch.where``), as in :func:`masked_mean`.
    """
    if how not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {how!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}")
    if how == "token-mean":
        return masked_mean(per_token, mask)
    real = mask.bool()
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    values = torch.where(real, per_token, zero)
    if how == "sequence-mean":
        lengths = real.sum(dim=1)
        per_response = values.sum(dim=1) / lengths.clamp(min=1).to(per_token.dtype)
        return per_response.sum() / (lengths > 0).sum().clamp(min=1).to(per_token.dtype)
    if max_length is None or max_length < 1:
        raise ValueError(f"token-sum needs the generation budget max_length >= 1, got {max_length}")
    return values.sum() / float(per_token.shape[0] * max_length)


def kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi.

    k1 = log pi - log ref (unbiased, can be negative per token); k3 = (r - 1) - log r with
    r = ref / pi (unbiased, never negative, lower variance).
    """
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1 or k3")


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = "token-mean",
    max_length: int | None = None,
) -> torch.Tensor:
    """GRPO's KL term: the k3 estimate of KL(pi || ref) over real tokens, aggregated as the
    policy loss is (:func:`aggregate`, a token mean by default); the caller multiplies it by beta."""
    _check_shapes(mask, logprobs=logprobs, ref_logprobs=ref_logprobs)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(mask.bool(), logprobs - ref_logprobs.to(logprobs.dtype), zero)
    return aggregate(kl_per_token(log_ratio, torch.zeros_like(log_ratio), "k3"), mask, aggregation, max_length)


def _check_shapes(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} shape {tuple(tensor.shape)} differs from mask shape {tuple(mask.shape)}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    ratio: str = "token",
    segment_ids: torch.Tensor | None = None,
    aggregation: str = "token-mean",
    max_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO policy loss; returns (loss, stats).

    - ``logprobs``: [B, T] under the current policy (with gradient); ``old_logprobs``: under
      the sampling policy; ``advantages``: [B, T] (segment advantages broadcast to tokens).
    - ``ratio="token"``: ratio_t = exp(logp_t - old_logp_t).
      ``ratio="macro"``: every token of segment k uses exp(sum_{t in S_k} (logp_t -
      old_logp_t)); needs ``segment_ids``. Averaging: see the module docstring.
    - ``aggregation`` / ``max_length``: how the per-token objectives become the loss
      (:func:`aggregate`; ``max_length`` is needed by ``token-sum`` only).
    - stats (detached scalars): ``clip_fraction``, the share of real tokens whose objective
      took the clipped branch; ``approx_kl``, mean over real tokens of
      (ratio_t - 1) - log ratio_t with the *token* ratio (the k3 estimate of
      KL(old || new), the same in both ratio modes).
    """
    if ratio not in RATIO_MODES:
        raise ValueError(f"unknown ratio mode {ratio!r}; choose one of {', '.join(RATIO_MODES)}")
    _check_shapes(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    real = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    token_log_ratio = torch.where(real, logprobs - old_logprobs.to(logprobs.dtype), zero)
    if ratio == "macro":
        if segment_ids is None:
            raise ValueError('ratio="macro" needs segment_ids')
        _check_shapes(mask, segment_ids=segment_ids)
        log_ratio = segment_broadcast(token_log_ratio, mask, segment_ids)
    else:
        log_ratio = token_log_ratio
    ratios = torch.exp(log_ratio)
    adv = torch.where(real, advantages.to(logprobs.dtype), zero)
    unclipped = -adv * ratios
    clipped = -adv * torch.clamp(ratios, 1.0 - clip, 1.0 + clip)
    loss = aggregate(torch.maximum(unclipped, clipped), mask, aggregation, max_length)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).to(logprobs.dtype), mask)
        token_ratio = torch.exp(token_log_ratio)
        approx_kl = masked_mean((token_ratio - 1.0) - token_log_ratio, mask)
    return loss, {"clip_fraction": clip_fraction.detach(), "approx_kl": approx_kl.detach()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss 0.5 * max((v - R)^2, (clip(v, old +- clip) - R)^2) over real tokens.

    stats (detached scalars): ``clip_fraction``, the share of real tokens where the clipped
    error was the larger one.
    """
    _check_shapes(mask, values=values, old_values=old_values, returns=returns)
    real = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    old = torch.where(real, old_values.to(values.dtype), zero)
    target = torch.where(real, returns.to(values.dtype), zero)
    current = torch.where(real, values, zero)
    clipped_values = old + torch.clamp(current - old, -clip, clip)
    unclipped_error = (current - target) ** 2
    clipped_error = (clipped_values - target) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_error, clipped_error), mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_error > unclipped_error).to(values.dtype), mask)
    return loss, {"clip_fraction": clip_fraction.detach()}
