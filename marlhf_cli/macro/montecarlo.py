"""Monte-Carlo segment advantages (``--advantage mc``), docs/method.md "Monte-Carlo segment
advantages": the value of a macro action's boundary estimated by sampling, not by a critic.

Response i of a group of K is cut by a termination rule into segments 0 .. S-1 with
boundaries s_0 = 0 < s_1 < ... < s_S = L_i (token positions in the response). Then

    V(s_0) = mean score of the other K-1 responses of i's group   (RLOO's baseline)
    V(s_k) = mean score of M continuations sampled from prompt + response[:s_k], 0 < k < S
    V(s_S) = the response's own score
    A_k    = V(s_{k+1}) - V(s_k), given to every token of segment k (0-based)

so a response's segment advantages telescope to score_i - V(s_0), its leave-one-out
advantage; with one segment (``fixed --n inf``) A_0 is exactly RLOO's advantage of the score.

``cap`` (``--mc-max-boundaries B``) bounds the sampling cost of a fine rule: of the rule's
S - 1 inner boundaries only B are kept, spread evenly over the segment index
(:func:`kept_boundaries`), and the rule's segments between two kept boundaries merge into one
macro action (:func:`cap_segments`).

Layout: segment ids as :func:`.segmentation.lengths_to_segment_ids` writes them, 0, 1, ...
over each row's real tokens (a prefix mask: real tokens, then padding). Everything here is a
pure function on tensors; the sampling and scoring of continuations is the trainer's
(``marlhf_cli.train.ppo.continuations``).
"""

from __future__ import annotations

import dataclasses

import torch

from .baselines import leave_one_out_means

__all__ = ["BoundaryPlan", "boundary_plan", "boundary_values", "cap_segments", "kept_boundaries", "mc_advantages", "segment_differences"]


def kept_boundaries(segments: int, cap: int | None) -> list[int]:
    """The inner boundaries k (1 <= k < ``segments``) continuations start from.

    All of them when there are at most ``cap`` (or no cap). Otherwise the m-th kept one,
    m = 1 .. cap, is k_m = floor(m * S / (cap + 1)): the kept boundaries split the S segments
    into cap + 1 runs whose lengths (in segments) differ by at most one. They are distinct
    and inner because S / (cap + 1) > 1 whenever S - 1 > cap.
    """
    if cap is not None and cap < 0:
        raise ValueError(f"the boundary cap must be >= 0, got {cap}")
    inner = list(range(1, max(segments, 1)))
    if cap is None or len(inner) <= cap:
        return inner
    return [m * segments // (cap + 1) for m in range(1, cap + 1)]


def cap_segments(segment_ids: torch.Tensor, mask: torch.Tensor, cap: int | None) -> torch.Tensor:
    """Segment ids after keeping at most ``cap`` inner boundaries per row ([B, T] -> [B, T]).

    Rule segment j of a row with S segments lands in merged segment #{m : k_m <= j}, which
    for the kept k_m of :func:`kept_boundaries` is min(cap, ceil((j + 1)(cap + 1) / S) - 1)
    (k_m <= j  <=>  m < (j + 1)(cap + 1) / S); rows with S - 1 <= cap keep their ids.
    Vectorised; 0 at padding, as the input.
    """
    real = mask.bool()
    if cap is None:
        return torch.where(real, segment_ids, torch.zeros_like(segment_ids))
    ids = torch.where(real, segment_ids, torch.zeros_like(segment_ids)).long()
    segments = ids.amax(dim=1, keepdim=True) + 1
    merged = torch.minimum(((ids + 1) * (cap + 1) + segments - 1) // segments - 1, torch.full_like(ids, cap))
    capped = torch.where(segments - 1 > cap, merged, ids)
    return torch.where(real, capped, torch.zeros_like(capped))


@dataclasses.dataclass(frozen=True)
class BoundaryPlan:
    """The inner boundaries of a batch, one entry each (row-major, in time order).

    ``rows``: the response; ``boundaries``: k (1 <= k < S, the segment that starts there);
    ``positions``: s_k, the number of response tokens before it (the prefix length);
    ``segments``: [B] S per response (0 for an empty response).
    """

    rows: torch.Tensor
    boundaries: torch.Tensor
    positions: torch.Tensor
    segments: torch.Tensor

    def __len__(self) -> int:
        return int(self.rows.shape[0])


def boundary_plan(segment_ids: torch.Tensor, mask: torch.Tensor) -> BoundaryPlan:
    """Where each inner boundary is: the first token of every segment but the first."""
    real = mask.bool()
    ids = torch.where(real, segment_ids, torch.zeros_like(segment_ids)).long()
    starts = torch.zeros_like(real)
    starts[:, 1:] = real[:, 1:] & (ids[:, 1:] != ids[:, :-1])
    rows, positions = starts.nonzero(as_tuple=True)
    segments = torch.where(real.any(dim=1), ids.amax(dim=1) + 1, torch.zeros_like(ids[:, 0]))
    return BoundaryPlan(rows=rows, boundaries=ids[rows, positions], positions=positions, segments=segments)


def boundary_values(first: torch.Tensor, last: torch.Tensor, inner: torch.Tensor, plan: BoundaryPlan) -> torch.Tensor:
    """[B, S_max + 1] V(s_0) .. V(s_S) per row: ``first`` [B] at k = 0, ``inner`` [N] (one per
    plan entry) at its boundary, ``last`` [B] at k = S; zero beyond a row's S."""
    width = int(plan.segments.max()) + 1 if plan.segments.numel() else 1
    values = torch.zeros((first.shape[0], width), dtype=torch.float64, device=first.device)
    values[:, 0] = first.double()
    values[plan.rows, plan.boundaries] = inner.double().to(values.device)
    ends = plan.segments.to(values.device)
    has_tokens = ends > 0
    values[has_tokens.nonzero(as_tuple=True)[0], ends[has_tokens]] = last.double()[has_tokens]
    return values


def segment_differences(values: torch.Tensor, segment_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every real token of segment k gets values[k + 1] - values[k]; zero at padding. [B, T]."""
    real = mask.bool()
    ids = torch.where(real, segment_ids, torch.zeros_like(segment_ids)).long().to(values.device)
    ahead = values.gather(1, (ids + 1).clamp(max=values.shape[1] - 1))
    differences = ahead - values.gather(1, ids)
    return torch.where(real.to(values.device), differences, torch.zeros((), dtype=values.dtype, device=values.device))


def mc_advantages(
    scores: torch.Tensor,
    group_size: int,
    continuation_scores: torch.Tensor,
    plan: BoundaryPlan,
    segment_ids: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Per-token advantages [B, T] (float64) from the responses' scores [B] (groups of
    ``group_size`` consecutive rows), the continuations' scores [N, M] (row n continues
    ``plan``'s n-th boundary) and the segment ids the plan was made from."""
    if continuation_scores.shape[0] != len(plan):
        raise ValueError(f"{continuation_scores.shape[0]} rows of continuation scores for {len(plan)} boundaries")
    inner = continuation_scores.double().mean(dim=1) if len(plan) else scores.new_zeros(0, dtype=torch.float64)
    values = boundary_values(leave_one_out_means(scores, group_size), scores, inner, plan)
    return segment_differences(values, segment_ids, mask)
