"""Segment-level (macro-action) advantage estimation, docs/method.md "Segment GAE".

For one sample with segments k = 1..K over token sets S_k:

    V_k     = sum_{t in S_k} sigma_t * v[t]          (sigma from the value function)
    R_k     = sum_{t in S_k} r[t]                    (a sum, never a mean: docs/method.md "Segment GAE")
    delta_k = R_k + gamma * V_{k+1} - V_k,  V_{K+1} = 0
    A_k     = sum_{l >= 0} (gamma * lam)^l * delta_{k+l}
    Q_k     = A_k + V_k                              (the critic's target)

and every token of S_k gets A_k and Q_k. With one token per segment this is exactly the
token-level GAE of :func:`token_gae` (same kernel, bit for bit).

Decoupled GAE (VAPO, Yue et al. 2025): the critic's target may use its own lambda,
Q_k = A_k(critic_lam) + V_k, while the actor's advantage keeps ``lam`` (VAPO: critic 1, actor
0.95); ``critic_lam=None`` is the one lambda of the paper, the same tensors bit for bit.
Either lambda may be one number for the batch or one per response ([B]): the length-adaptive
lambda of :func:`adaptive_lambda` is one per response.

Relation to the paper (Chai et al., ICLR 2025): this follows docs/method.md where the two
differ. R_k is the paper's segment reward with rho = 1 (rewards are summed, never averaged:
averaging would shrink the KL penalty by the segment length and dilute the final score);
sigma offers the paper's ``equal`` (default), ``unit`` and ``position`` and, in addition,
``first`` (the value of the state where the segment starts, the semi-MDP option value; not
in the paper, see docs/method.md "Segment GAE" for why it is offered).

Implementation. Everything is vectorised over the batch. Real tokens of each row are first
*packed* to the left (a stable sort on the mask), so any 0/1 mask (right padding, left
padding, holes) is handled the same way and masked positions never take part: their
rewards, values and segment ids are replaced before any arithmetic (``torch.where``, so
even NaN/inf there is inert). A segment is a maximal run of equal ``segment_ids`` among a
row's consecutive real tokens; runs are renumbered 0..K-1 ("canonical" ids), so callers may
use any labels. Per-segment sums are ``scatter_add`` into K <= T buckets; the GAE recursion
A_k = delta_k + c * A_{k+1} (c = gamma * lam) is evaluated by a log-depth doubling scan
(after step s every A_k holds sum_{l < 2^s} c^l delta_{k+l}), i.e. ceil(log2 T) tensor
operations and no per-sample or per-step Python work.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

__all__ = [
    "VALUE_FUNCTIONS",
    "SegmentLayout",
    "segment_layout",
    "segment_weights",
    "segment_sums",
    "segment_broadcast",
    "num_segments",
    "discounted_reverse_cumsum",
    "adaptive_lambda",
    "macro_advantages",
    "token_gae",
]

VALUE_FUNCTIONS = ("equal", "unit", "position", "first")


@dataclasses.dataclass(frozen=True)
class SegmentLayout:
    """The segment structure of a batch, in the packed layout (real tokens first).

    - ``perm``: [B, T]; packed position j of row b holds original position ``perm[b, j]``.
    - ``real``: [B, T] bool; packed mask (a prefix of each row).
    - ``segment``: [B, T]; canonical segment index of each packed real token, ``T`` (a
      dummy bucket that is dropped) at packed padding.
    - ``length``: [B, T]; length of the token's segment (1 at padding).
    - ``position``: [B, T]; index of the token within its segment (0 at padding).
    - ``segment_real``: [B, T] bool; whether segment index k exists in row b.
    """

    perm: torch.Tensor
    real: torch.Tensor
    segment: torch.Tensor
    length: torch.Tensor
    position: torch.Tensor
    segment_real: torch.Tensor

    def pack(self, x: torch.Tensor, original_real: torch.Tensor) -> torch.Tensor:
        """Zero ``x`` at masked positions (inertly) and move real tokens to the left."""
        x = torch.where(original_real, x, torch.zeros((), dtype=x.dtype, device=x.device))
        return x.gather(1, self.perm)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`pack`, with zeros at masked positions."""
        packed = torch.where(self.real, packed, torch.zeros((), dtype=packed.dtype, device=packed.device))
        return torch.zeros_like(packed).scatter(1, self.perm, packed)


def _check_2d(name: str, x: torch.Tensor, shape: torch.Size | None = None) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} must be [batch, time], got shape {tuple(x.shape)}")
    if shape is not None and x.shape != shape:
        raise ValueError(f"{name} shape {tuple(x.shape)} differs from mask shape {tuple(shape)}")


def segment_layout(mask: torch.Tensor, segment_ids: torch.Tensor) -> SegmentLayout:
    """Compute the packed segment layout of a batch (see :class:`SegmentLayout`)."""
    _check_2d("mask", mask)
    _check_2d("segment_ids", segment_ids, mask.shape)
    batch, time = mask.shape
    real = mask.bool()
    # Stable sort on "is padding" puts each row's real tokens first, in time order.
    perm = torch.argsort((~real).to(torch.uint8), dim=1, stable=True)
    packed_real = real.gather(1, perm)
    ids = segment_ids.long().gather(1, perm)

    starts = packed_real.clone()
    if time > 1:
        # A real token opens a segment when its id differs from the previous real token's
        # (packed: the previous position). Padding never opens one: starts &= packed_real.
        starts[:, 1:] &= ids[:, 1:] != ids[:, :-1]
    segment = starts.long().cumsum(dim=1) - 1
    segment = torch.where(packed_real, segment, torch.full_like(segment, time))

    counts = torch.zeros(batch, time + 1, dtype=torch.long, device=mask.device)
    counts.scatter_add_(1, segment, torch.ones_like(segment))
    length = torch.where(packed_real, counts.gather(1, segment), torch.ones_like(segment))

    index = torch.arange(time, device=mask.device).expand(batch, time)
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    position = torch.where(packed_real, index - start_index, torch.zeros_like(index))

    segment_real = counts[:, :time] > 0
    return SegmentLayout(perm, packed_real, segment, length, position, segment_real)


def _packed_weights(layout: SegmentLayout, value_function: str, dtype: torch.dtype) -> torch.Tensor:
    """sigma per packed token (docs/method.md "Segment GAE"), zero at padding."""
    length = layout.length.to(dtype)
    position = layout.position
    if value_function == "equal":
        # The segment's mean value: 1/|S_k| for each token.
        sigma = 1.0 / length
    elif value_function == "unit":
        # The value of the segment's last token.
        sigma = (position == layout.length - 1).to(dtype)
    elif value_function == "first":
        # Not in the paper (docs/method.md "Segment GAE"): the value of the state where the segment starts,
        # i.e. the option value V(s_tau) of the semi-MDP.
        sigma = (position == 0).to(dtype)
    elif value_function == "position":
        # i-th token of a segment of length L: (1/(L-i)) / H_L, H_L = sum_{m=1..L} 1/m
        # (the sum over i of 1/(L-i) is the harmonic number H_L): later tokens weigh more.
        time = layout.length.shape[1]
        harmonic = torch.cumsum(
            1.0 / torch.arange(1, time + 2, dtype=torch.float64, device=length.device), dim=0
        )
        h_of_length = harmonic[layout.length - 1].to(dtype)
        sigma = 1.0 / ((length - position.to(dtype)) * h_of_length)
    else:
        raise ValueError(
            f"unknown value function {value_function!r}; choose one of {', '.join(VALUE_FUNCTIONS)}"
        )
    return torch.where(layout.real, sigma, torch.zeros_like(sigma))


def _working_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if not dtype.is_floating_point or torch.finfo(dtype).bits < 32:
        return torch.float32
    return dtype


def segment_weights(
    mask: torch.Tensor, segment_ids: torch.Tensor, value_function: str = "equal"
) -> torch.Tensor:
    """sigma_t of every token, [B, T] float32 in the original layout, zero where masked.

    ``equal``/``position`` sum to 1 over each segment; ``unit``/``first`` put 1 on the
    segment's last/first token.
    """
    layout = segment_layout(mask, segment_ids)
    return layout.unpack(_packed_weights(layout, value_function, torch.float32))


def _packed_segment_sums(layout: SegmentLayout, packed: torch.Tensor) -> torch.Tensor:
    """Sum of packed per-token values over each segment: [B, T], zero for absent segments."""
    batch, time = packed.shape
    sums = torch.zeros(batch, time + 1, dtype=packed.dtype, device=packed.device)
    sums.scatter_add_(1, layout.segment, packed)
    return sums[:, :time]


def _packed_broadcast(layout: SegmentLayout, per_segment: torch.Tensor) -> torch.Tensor:
    """Give every packed token its segment's value; zero at padding (the dummy bucket)."""
    padded = F.pad(per_segment, (0, 1))
    return padded.gather(1, layout.segment)


def segment_sums(x: torch.Tensor, mask: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Per-segment sums of ``x``: [B, T] indexed by canonical segment k (0..K_b-1), zero
    beyond a row's last segment. Masked positions of ``x`` are ignored."""
    _check_2d("x", x, mask.shape)
    layout = segment_layout(mask, segment_ids)
    return _packed_segment_sums(layout, layout.pack(x, mask.bool()))


def segment_broadcast(x: torch.Tensor, mask: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Per-token sum of ``x`` over the token's segment, [B, T], zero where masked."""
    _check_2d("x", x, mask.shape)
    layout = segment_layout(mask, segment_ids)
    sums = _packed_segment_sums(layout, layout.pack(x, mask.bool()))
    return layout.unpack(_packed_broadcast(layout, sums))


def num_segments(mask: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Number of segments per sample, LongTensor [B]."""
    return segment_layout(mask, segment_ids).segment_real.sum(dim=1)


def discounted_reverse_cumsum(x: torch.Tensor, discount: float | torch.Tensor) -> torch.Tensor:
    """out[:, k] = sum_{l >= 0} discount^l * x[:, k + l] along dim 1 (zero beyond the end).

    ``discount``: one number, or one per row ([B]). Log-depth doubling scan: after the step
    with shift d, out[k] covers l < 2d; the factor discount^d is formed by repeated squaring
    and is <= 1, so nothing grows.
    """
    out = x
    length = x.shape[1]
    if isinstance(discount, torch.Tensor):
        factor = discount.to(device=x.device, dtype=x.dtype).reshape(-1, 1)
    else:
        factor = float(discount)
    shift = 1
    while shift < length:
        out = out + factor * F.pad(out[:, shift:], (0, shift))
        shift *= 2
        factor = factor * factor
    return out


def adaptive_lambda(steps: torch.Tensor, alpha: float) -> torch.Tensor:
    """The length-adaptive lambda of VAPO (Yue et al. 2025), one per response:
    ``1 - 1 / (alpha * l)`` clipped to [0, 1], ``l`` the response's GAE steps (its tokens for
    token PPO, its macro actions for MA-PPO), so that the horizon 1 / (1 - lambda) is the
    share ``alpha`` of the response's own steps. float32 [B]; 0 for an empty response."""
    if not float(alpha) > 0.0:
        raise ValueError(f"alpha must be above 0, got {alpha!r}")
    steps = steps.to(torch.float32)
    return (1.0 - 1.0 / (float(alpha) * steps)).clamp(0.0, 1.0)


def _check_discounts(gamma: float, lam, critic_lam=None, batch: int | None = None) -> None:
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    for name, value in (("lam", lam), ("critic_lam", critic_lam)):
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            if value.dim() != 1 or (batch is not None and value.shape[0] != batch):
                raise ValueError(f"{name} per response must be [batch] = [{batch}], got shape {tuple(value.shape)}")
            if bool(((value < 0) | (value > 1) | value.isnan()).any()):
                raise ValueError(f"{name} must be in [0, 1], got values from {float(value.min())} to {float(value.max())}")
        elif not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def _discount(gamma: float, lam):
    """gamma * lambda: one number, or one per row."""
    return gamma * lam if isinstance(lam, torch.Tensor) else gamma * float(lam)


def _critic_advantages(deltas: torch.Tensor, actor: torch.Tensor, gamma: float, lam, critic_lam) -> torch.Tensor:
    """The GAE the critic's targets are built from: the actor's own (``critic_lam`` None, or
    the same number: the very tensor, so one lambda is bit for bit what it always was), or a
    second scan at ``critic_lam``."""
    same = critic_lam is None or (not isinstance(critic_lam, torch.Tensor) and not isinstance(lam, torch.Tensor)
                                  and float(critic_lam) == float(lam))  # fmt: skip
    return actor if same else discounted_reverse_cumsum(deltas, _discount(gamma, critic_lam))


def macro_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    segment_ids: torch.Tensor,
    gamma: float = 1.0,
    lam: float | torch.Tensor = 0.95,
    value_function: str = "equal",
    critic_lam: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Segment GAE broadcast to tokens: (advantages, returns), both [B, T], zero where masked.

    ``rewards``/``values``: per-token r[t] and v[t]; ``segment_ids``: per-token segment
    labels (see :func:`marlhf_cli.macro.segmentation.lengths_to_segment_ids`). ``lam``: the
    actor's lambda, one number or one per response; ``critic_lam``: the returns' (None: the
    same). The computation runs in float32 or wider (float64 inputs stay float64).
    """
    _check_2d("mask", mask)
    _check_2d("rewards", rewards, mask.shape)
    _check_2d("values", values, mask.shape)
    _check_discounts(gamma, lam, critic_lam, mask.shape[0])
    if value_function not in VALUE_FUNCTIONS:
        raise ValueError(
            f"unknown value function {value_function!r}; choose one of {', '.join(VALUE_FUNCTIONS)}"
        )
    dtype = _working_dtype(rewards, values)
    real = mask.bool()
    layout = segment_layout(mask, segment_ids)
    r = layout.pack(rewards.to(dtype), real)
    v = layout.pack(values.to(dtype), real)

    sigma = _packed_weights(layout, value_function, dtype)
    segment_values = _packed_segment_sums(layout, sigma * v)  # V_k
    segment_rewards = _packed_segment_sums(layout, r)  # R_k: a sum, not a mean (docs/method.md "Segment GAE")
    # V_{k+1}; absent segments hold 0, so the last segment's successor value is 0.
    next_values = F.pad(segment_values[:, 1:], (0, 1))
    deltas = segment_rewards + gamma * next_values - segment_values
    segment_advantages = discounted_reverse_cumsum(deltas, _discount(gamma, lam))
    # Q_k, the critic's target: from its own lambda where it has one (decoupled GAE)
    segment_returns = _critic_advantages(deltas, segment_advantages, gamma, lam, critic_lam) + segment_values

    advantages = layout.unpack(_packed_broadcast(layout, segment_advantages))
    returns = layout.unpack(_packed_broadcast(layout, segment_returns))
    return advantages, returns


def token_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float | torch.Tensor = 0.95,
    critic_lam: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Classic token-level GAE (vanilla PPO): (advantages, returns), [B, T], zero where masked.

    delta_t = r_t + gamma * v_{t+1} - v_t with v after the last real token = 0; "next" is
    the next real token, so any 0/1 mask works. Same packing and scan as
    :func:`macro_advantages`, which therefore equals this exactly when every segment has
    one token; ``lam`` and ``critic_lam`` as there.
    """
    _check_2d("mask", mask)
    _check_2d("rewards", rewards, mask.shape)
    _check_2d("values", values, mask.shape)
    _check_discounts(gamma, lam, critic_lam, mask.shape[0])
    dtype = _working_dtype(rewards, values)
    real = mask.bool()
    batch, time = mask.shape
    perm = torch.argsort((~real).to(torch.uint8), dim=1, stable=True)
    packed_real = real.gather(1, perm)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    r = torch.where(real, rewards.to(dtype), zero).gather(1, perm)
    v = torch.where(real, values.to(dtype), zero).gather(1, perm)

    next_values = F.pad(v[:, 1:], (0, 1))
    deltas = r + gamma * next_values - v
    advantages = discounted_reverse_cumsum(deltas, _discount(gamma, lam))
    returns = _critic_advantages(deltas, advantages, gamma, lam, critic_lam) + v

    def unpack(packed: torch.Tensor) -> torch.Tensor:
        packed = torch.where(packed_real, packed, zero)
        return torch.zeros_like(packed).scatter(1, perm, packed)

    return unpack(advantages), unpack(returns)
