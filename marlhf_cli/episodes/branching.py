"""Episodes continued from inside another: what ``--advantage tree`` (a branch at a turn's end)
and ``--advantage mc`` (continuations from a macro action's start) sample on ``--env``.

An environment is *replayed*, not copied: a fresh one is made from the same record and seed,
reset, and given the episode's replies up to the branching point, one turn at a time. The
seeding contract (module :mod:`.environment`) makes that deterministic for any environment
that draws its randomness from its seed, and it is checked: every observation, reward and
end flag of the replay must equal what the original episode was told, or the run stops with
one line naming the turn. Replaying needs nothing of the user's class (no ``copy``, no
pickling of open files or subprocesses); its cost is one ``step`` per replayed turn.

A branching point is a column of the episode's tokens where a macro action begins: a turn's
first token (the previous turns and their observations are the context), or a token inside
a turn (a rule cutting inside turns), whose turn is then finished by the continuation within
the same ``--max-new-tokens`` and sent to the environment whole.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ..errors import UserError
from ..macro.turns import turn_index
from .environment import FLAG, Environments
from .rollout import Episode


def cut(episode: Episode, column: int) -> Episode:
    """``episode`` up to ``column`` of its tokens (where a macro action begins), ready to be
    played on: its finished turns with what answered them, and the tokens of an unfinished
    turn before ``column`` (``partial``)."""
    if not 0 < column < len(episode.tokens) or not episode.actions[column]:
        raise ValueError(f"column {column} is not a policy token inside the episode ({len(episode.tokens)} tokens)")
    turns = _turn_of(episode)
    finished = turns[column]  # the column's turn: the ones before it are over
    partial = turns[:column].count(finished)  # its tokens before the column
    return Episode(
        episode.first, episode.prompt, list(episode.prompt_row), episode.seed, tokens=episode.tokens[:column],
        actions=episode.actions[:column], replies=episode.replies[:finished], observations=episode.observations[:finished],
        partial=partial,
    )  # fmt: skip


def turn_start(episode: Episode, turn: int) -> int:
    """The column where the episode's turn ``turn`` (0-based) begins, or its length when it has
    no such turn."""
    turns = _turn_of(episode)
    return turns.index(turn) if turn in turns else len(episode.tokens)


def _turn_of(episode: Episode) -> list[int]:
    """Each column's turn (0-based), -1 on the observations (:func:`marlhf_cli.macro.turns.turn_index`)."""
    return turn_index(torch.tensor([episode.actions], dtype=torch.long))[0].tolist()


def replayed(spec: str, factory, records: Sequence[dict], starts: Sequence[Episode], *, timeout: float) -> Environments:
    """Fresh environments, one per episode of ``starts`` (made from its record and its seed),
    brought to where that episode stands by replaying its finished turns; each replayed
    answer checked against the one the episode was given."""
    environments = Environments(spec, factory, records, [start.seed for start in starts], timeout=timeout)
    firsts = environments.reset()
    for index, (first, start) in enumerate(zip(firsts, starts)):
        if first != start.first:
            raise _not_replayable(spec, index, "its first message")
    for turn in range(max((len(start.replies) for start in starts), default=0)):
        replies = {i: start.replies[turn] for i, start in enumerate(starts) if turn < len(start.replies)}
        for index, seen in environments.step(replies, dict.fromkeys(replies, turn)).items():
            if seen != starts[index].observations[turn]:
                raise _not_replayable(spec, index, f"its answer to turn {turn + 1}")
    return environments


def _not_replayable(spec: str, index: int, what: str) -> UserError:
    return UserError(
        f"{FLAG} {spec}: replaying episode {index + 1} with the same record, seed and replies changed {what}: tree and mc "
        "branch an episode by replaying it, so an environment must draw its randomness from its seed only"
    )


def copies(episode: Episode, count: int) -> list[Episode]:
    """``count`` copies of a finished episode that drew nothing of their own (a tree's node that
    ended before it could branch: its children are copies with empty macro actions)."""
    return [dataclasses.replace(episode, drawn=0) for _ in range(count)]


def grow_trees(roots: Sequence[Episode], records: Sequence[dict], *, branches: int, depth: int, continued) -> tuple[list[Episode], list[list[int]]]:
    """The leaves of episode trees that branch at turn ends, and where each leaf's nodes after
    the first begin (a column; the episode's length where it ended before that turn).

    ``roots``: K finished episodes per tree, the trees one after another (``records``: one per
    tree); ``continued(records, starts)``: the episodes ``starts`` (cut from others) played to
    their ends. At level d = 1 .. D - 1 every path branches where its turn d + 1 begins: it
    goes on as child 0 and K - 1 continuations from there are its other children; a path that
    ended before that turn gets K - 1 copies of itself (empty macro actions below it). The
    leaves come in the order of their paths' base-K digits, as :mod:`marlhf_cli.macro.tree`
    reads them."""
    paths, starts = list(roots), [[] for _ in roots]
    for level in range(1, depth):
        per_tree = branches**level  # paths per tree at this level
        ends = [turn_start(path, level) for path in paths]
        branching = [i for i, end in enumerate(ends) if end < len(paths[i].tokens)]
        others = branches - 1
        fresh = continued([records[i // per_tree] for i in branching for _ in range(others)],
                          [cut(paths[i], ends[i]) for i in branching for _ in range(others)]) if branching else []  # fmt: skip
        children = {i: fresh[n * others : (n + 1) * others] for n, i in enumerate(branching)}
        grown, grown_starts = [], []
        for index, (path, end) in enumerate(zip(paths, ends)):
            grown += [path] + (children[index] if index in children else copies(path, others))
            grown_starts += [starts[index] + [end] for _ in range(branches)]
        paths, starts = grown, grown_starts
    return paths, starts
