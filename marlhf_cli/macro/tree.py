"""Tree advantages (``--advantage tree``), docs/method.md "Tree rollouts over macro actions":
the value of a macro action's ends read off a tree of sampled responses that branches at them.

A prompt's tree has branching factor K and depth D. Its root is the prompt; each node of
level d = 1 .. D is one macro action drawn from its parent's end; the K^D nodes of level D are
the leaves, each a whole response (its path of macro actions, then the rest to EOS). With R_l
a leaf's return (its KL-shaped sequence reward, as RLOO's: the score minus beta x sum of its
tokens' KL),

    V(node) = mean of R_l over the leaves below the node      (a leaf: its own R_l)
    A(node) = V(node) - V(parent)      for every token of the node's macro action

and leaf l, trained as a response of its own, gives each token of its level-d macro action
A(its level-d node): a path's advantages telescope to R_l - V(root). A shared prefix is
thereby trained on once per leaf below it (weight K^(D-d) for a level-d node), which is the
weight an unbiased tree policy gradient gives it (docs/method.md says why). With D = 1,
A = R_l - mean of the group's K returns (itself included), the group-mean baseline of GRPO
without the std: (K - 1)/K times RLOO's leave-one-out advantage.

Layout: the leaves of a tree are K^D consecutive rows, in the order the base-K digits of their
paths count (leaf l's level-d node is l // K^(D-d) within its tree), so a level-d node's
leaves are a contiguous block of K^(D-d) rows. A token's segment id is its level minus one
(0 .. D-1), over each row's real tokens (a prefix mask). Pure functions on tensors; the
sampling of the tree is the trainer's (``marlhf_cli.train.ppo.tree``).
"""

from __future__ import annotations

import torch

from .montecarlo import segment_differences

__all__ = ["leaves_per_tree", "subtree_means", "tree_advantages", "tree_segment_ids"]


def leaves_per_tree(branches: int, depth: int) -> int:
    """K^D, the responses one prompt's tree trains on; K >= 2 and D >= 1 (a clear error else)."""
    if branches < 2:
        raise ValueError(f"a tree needs at least 2 branches per node, got {branches}")
    if depth < 1:
        raise ValueError(f"a tree needs a depth of at least 1, got {depth}")
    return branches**depth


def subtree_means(returns: torch.Tensor, branches: int, depth: int) -> torch.Tensor:
    """[B] leaf returns in, [B, D + 1] float64 out: column d holds V of the row's level-d node
    (d = 0 the root: the mean over its tree; d = D the leaf's own return)."""
    leaves = leaves_per_tree(branches, depth)
    if returns.dim() != 1 or returns.shape[0] % leaves:
        raise ValueError(f"{tuple(returns.shape)} leaf returns do not split into trees of {leaves} leaves")
    values = returns.double()
    columns = []
    for level in range(depth + 1):
        block = branches ** (depth - level)  # leaves below one level-d node, consecutive rows
        means = values.reshape(-1, block).mean(dim=1, keepdim=True)
        columns.append(means.expand(-1, block).reshape(-1))
    return torch.stack(columns, dim=1)


def tree_advantages(returns: torch.Tensor, branches: int, depth: int, segment_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token advantages [B, T] (float64): a token of segment k (its level-(k + 1) macro
    action) gets V(level k + 1 node) - V(level k node); zero at padding."""
    if segment_ids.shape != mask.shape or segment_ids.shape[0] != returns.shape[0]:
        raise ValueError(f"segment ids {tuple(segment_ids.shape)}, mask {tuple(mask.shape)} and returns {tuple(returns.shape)} disagree")
    real = mask.bool()
    if bool((real & ((segment_ids < 0) | (segment_ids >= depth))).any()):
        raise ValueError(f"a tree of depth {depth} has segments 0 .. {depth - 1} only")
    return segment_differences(subtree_means(returns, branches, depth), segment_ids, mask)


def tree_segment_ids(branch_positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] segment ids from [B, D - 1] branch positions (the response position where each
    level's node after the first begins; non-decreasing along a row, a position at or past the
    row's end meaning its path ended earlier): the number of branch positions at or before
    the token. Zero at padding."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    if branch_positions.shape[1] == 0:
        ids = torch.zeros_like(mask, dtype=torch.long)
    else:
        starts = branch_positions.to(mask.device).long()
        ids = (positions[None, :, None] >= starts[:, None, :]).sum(dim=2)
    return torch.where(mask.bool(), ids, torch.zeros_like(ids))
