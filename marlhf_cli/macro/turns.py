"""Turns of a multi-turn episode as macro actions: pure functions of the action mask.

An episode is one row: the first user message (the prompt), then the assistant's turns with
the environment's observations between them. Its ``action_mask`` [B, T] is 1 on the tokens
the policy drew (every assistant turn, its end-of-turn token included) and 0 on observation
tokens and padding: observations are context the policy reads, never actions it is trained
on. A *turn* is a maximal run of 1s in a row of the action mask.

* :func:`turn_index`: which turn each action token belongs to (``--termination turn``: each
  turn one macro action);
* :func:`place_turn_rewards`: the environment's reward for turn k added at turn k's last token;
* :func:`split_turns` and :class:`TurnSplit`: the turns as rows of their own, so that any
  termination rule cuts *inside* turns (a segment never crosses a turn's end) and the cuts
  come back to the episode's columns with :meth:`TurnSplit.join_segments`;
* :func:`spread_segments`: an episode's macro actions numbered 0, 1, ... over all its real
  columns, each observation in the macro action before it: the layout of a response (a
  prefix mask), which ``mc``'s boundary plans read.

GAE needs nothing of its own here: :func:`marlhf_cli.macro.macro_advantages` packs each
row's action tokens together, so the segment after an observation follows the segment
before it, and delta = R_k + gamma V_{k+1} - V_k reads V_{k+1} at the first token of the next
turn, the state that has seen the observation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TurnSplit", "turn_index", "turn_counts", "turn_ends", "place_turn_rewards", "split_turns", "spread_segments"]


def _starts(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the first token of each turn (an action token whose left neighbour is not one)."""
    real = mask.bool()
    before = torch.zeros_like(real)
    before[:, 1:] = real[:, :-1]
    return real & ~before


def turn_index(action_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] long: k (0-based) on the tokens of a row's k-th turn, -1 on every other column."""
    real = action_mask.bool()
    index = _starts(action_mask).long().cumsum(dim=1) - 1
    return torch.where(real, index, torch.full_like(index, -1))


def turn_counts(action_mask: torch.Tensor) -> torch.Tensor:
    """[B] the number of turns in each row."""
    return _starts(action_mask).long().sum(dim=1)


def turn_ends(action_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the last token of each turn (an action token whose right neighbour is not one)."""
    real = action_mask.bool()
    after = torch.zeros_like(real)
    after[:, :-1] = real[:, 1:]
    return real & ~after


def place_turn_rewards(rewards: torch.Tensor, turn_rewards: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """``rewards`` [B, T] plus ``turn_rewards[b, k]`` at the last token of row b's turn k.

    ``turn_rewards`` is [B, K] with K at least the most turns of a row; a row's entries past
    its own turns must be 0 (they have no token to land on, and a non-zero one is an error,
    not a reward silently dropped).
    """
    ends = turn_ends(action_mask)
    index = turn_index(action_mask)
    counts = turn_counts(action_mask)
    width = turn_rewards.shape[1]
    if width and bool((counts > width).any()):
        raise ValueError(f"a row has {int(counts.max())} turns, the turn rewards {width}")
    beyond = torch.arange(width, device=turn_rewards.device)[None, :] >= counts.to(turn_rewards.device)[:, None]
    if bool((turn_rewards[beyond] != 0).any()):
        raise ValueError("a turn reward past a row's last turn has no token to land on")
    gathered = torch.zeros_like(rewards)
    if width:
        safe = index.clamp(min=0, max=width - 1).to(turn_rewards.device)
        gathered = turn_rewards.to(rewards.dtype).gather(1, safe).to(rewards.device)
    return rewards + torch.where(ends, gathered, torch.zeros_like(gathered))


@dataclass(frozen=True)
class TurnSplit:
    """The turns of a batch as rows of their own (N turns in all, the longest L tokens).

    ``row[i]``, ``start[i]``, ``length[i]``, ``turn[i]``: turn i is columns start .. start +
    length - 1 of episode ``row`` and is that row's ``turn``-th turn.
    """

    row: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    turn: torch.Tensor
    shape: tuple[int, int]  # the episodes' [B, T]

    @property
    def width(self) -> int:
        return int(self.length.max()) if self.length.numel() else 0

    def _columns(self) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = torch.arange(max(self.width, 1), device=self.start.device)
        columns = self.start[:, None] + offsets[None, :]
        inside = offsets[None, :] < self.length[:, None]
        return columns.clamp(max=self.shape[1] - 1), inside

    def gather(self, x: torch.Tensor, fill=0) -> torch.Tensor:
        """[N, L]: each turn's columns of ``x`` [B, T], left-aligned, ``fill`` past its end."""
        columns, inside = self._columns()
        taken = x[self.row.to(x.device)[:, None], columns.to(x.device)]
        return torch.where(inside.to(x.device), taken, torch.full_like(taken, fill))

    def mask(self) -> torch.Tensor:
        """[N, L] long: 1 on each turn's tokens (a prefix: a turn is a run)."""
        return self._columns()[1].long()

    def join_segments(self, turn_segment_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] segment ids of the episodes from [N, L] ids cut inside each turn: a segment of
        turn i keeps its own id, offset so that no two turns share one (any labels will do:
        :func:`marlhf_cli.macro.segment_layout` renumbers runs); -1 off the action tokens."""
        columns, inside = self._columns()
        ids = turn_segment_ids.long().to(columns.device)
        span = int(ids.max()) + 1 if ids.numel() else 1
        global_ids = ids + (torch.arange(len(self.row), device=columns.device)[:, None] * span)
        out = torch.full(self.shape, -1, dtype=torch.long, device=columns.device)
        rows = self.row.to(columns.device)[:, None].expand_as(columns)
        out[rows[inside], columns[inside]] = global_ids[inside]
        return out


def split_turns(action_mask: torch.Tensor) -> TurnSplit:
    """Every turn of every row, in row order then time order."""
    starts = _starts(action_mask)
    ends = turn_ends(action_mask)
    row, start = starts.nonzero(as_tuple=True)
    _, end = ends.nonzero(as_tuple=True)  # the same order: a row's turns left to right
    turn = turn_index(action_mask)[row, start]
    return TurnSplit(row=row, start=start, length=end - start + 1, turn=turn, shape=tuple(action_mask.shape))


def spread_segments(segment_ids: torch.Tensor, action_mask: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """[B, T] long: k on the tokens of a row's k-th macro action (0-based, in time order; a
    macro action is a run of equal ids among the row's action tokens, whatever the labels),
    the number of the macro action before it on each observation column, 0 on padding
    (``attention`` 0). A segment that starts after an observation starts at its first action
    token, so the real columns read as a response's do: segments 0 .. S-1 over a prefix mask."""
    real = action_mask.bool()
    ids = segment_ids.long()
    columns = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    # the column of the action token before each column (-1: none yet)
    latest = torch.where(real, columns, torch.full_like(columns, -1)).cummax(dim=1).values
    before = torch.full_like(latest, -1)
    before[:, 1:] = latest[:, :-1]
    previous_id = ids.gather(1, before.clamp(min=0))
    starts = real & ((before < 0) | (previous_id != ids))
    numbers = (starts.long().cumsum(dim=1) - 1).clamp(min=0)
    return torch.where(attention.bool(), numbers, torch.zeros_like(numbers))
