"""The paper's SFT/RM/PPO split, deterministic by seed, that never cuts a group in two.

Groups (for TL;DR the Reddit post, elsewhere the prompt or the APPS question) are shuffled
with ``random.Random(seed)`` in first-appearance order, then dealt out in that order so that
each split's share of *rows* comes as close to its fraction as whole groups allow: a group
lands in the split whose interval holds the group's midpoint. The same rows in the same
order and the same seed give the same split on every machine and Python version; another
seed gives another split. Within a split, rows keep the shuffled group order, so taking the
first N rows of a split is a random sample of it.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, Callable, Hashable, Sequence

PAPER_FRACTIONS = {"sft": 0.2, "rm": 0.4, "ppo": 0.4}
APPS_FRACTIONS = {"sft": 0.2, "ppo": 0.8}
DEMONSTRATION_FRACTIONS = {"sft": 1.0}  # rows no reward model can use: not shared out (loader)
EVAL_FRACTION = 0.1
SPLITS = ("sft", "rm", "ppo", "eval")
TRAINING_SPLITS = ("sft", "rm", "ppo")

GroupKey = str | Callable[[Any], Hashable] | None


def parse_split_shares(text: str) -> dict[str, float]:
    """``--split-shares``: 'SFT/RM/PPO' (e.g. '20/40/40'; commas work too) -> the three
    shares normalised to sum to 1; 'SFT/RM/PPO/EVAL' (e.g. '0/0/2/1') also holds out the
    fourth's share of the whole source for evaluation, under ``"eval"`` (where the source
    has no eval split of its own; :data:`EVAL_FRACTION` otherwise). Raises ValueError
    unless three or four finite numbers, none negative, the first three not all 0."""
    parts = [p.strip() for p in str(text).replace(",", "/").split("/")]
    values = [float(p) for p in parts] if len(parts) in (len(TRAINING_SPLITS), len(TRAINING_SPLITS) + 1) else []
    training = values[: len(TRAINING_SPLITS)]
    if not values or not all(math.isfinite(v) and v >= 0 for v in values) or sum(training) <= 0:
        raise ValueError(text)
    shares = {name: value / sum(training) for name, value in zip(TRAINING_SPLITS, training)}
    if len(values) > len(TRAINING_SPLITS):
        shares["eval"] = values[-1] / sum(values)
    return shares


def eval_share(shares: dict[str, float] | None) -> float:
    """The share of a source held out for evaluation: the fourth --split-shares number's,
    or :data:`EVAL_FRACTION`."""
    return (shares or {}).get("eval", EVAL_FRACTION)


def with_eval(fractions: dict[str, float], eval_fraction: float = EVAL_FRACTION) -> dict[str, float]:
    """Hold out ``eval_fraction`` for evaluation and scale the training splits into the rest.

    Used when a source has no validation split of its own (local files, embedded samples,
    WebGPT), so that SFT/RM/PPO keep the paper's 20/40/40 proportions among themselves.
    """
    scale = (1.0 - eval_fraction) / sum(fractions.values())
    return {**{name: share * scale for name, share in fractions.items()}, "eval": eval_fraction}


def assign_splits(groups: Sequence[Hashable], fractions: dict[str, float], seed: int) -> list[str]:
    """The split name of each item, given each item's group, the fractions and the seed."""
    if not fractions or any(share < 0 for share in fractions.values()) or sum(fractions.values()) <= 0:
        raise ValueError(f"split fractions must be non-negative and sum to more than 0, got {fractions}")
    sizes = Counter(groups)
    order = list(dict.fromkeys(groups))
    random.Random(seed).shuffle(order)
    total = len(groups)
    names = list(fractions)
    norm = sum(fractions.values())
    bounds, running = [], 0.0
    for name in names:
        running += fractions[name] / norm
        # rounded: shares that sum to 0.9 in one order and 0.8999999999999999 in another
        # must hold out the same rows for evaluation
        bounds.append(round(running * total, 9))
    where: dict[Hashable, str] = {}
    position = 0
    for group in order:
        middle = position + sizes[group] / 2
        index = next((i for i, bound in enumerate(bounds) if middle < bound), len(names) - 1)
        where[group] = names[index]
        position += sizes[group]
    return [where[g] for g in groups]


def split_records(
    records: Sequence[dict], fractions: dict[str, float], seed: int, group_key: GroupKey = None
) -> dict[str, list[dict]]:
    """Split ``records`` into ``{name: rows}`` by ``fractions`` (e.g. :data:`PAPER_FRACTIONS`).

    ``group_key`` keeps related rows together: a field name, a function of the record, or
    ``None`` for one group per record. Every split named in ``fractions`` is present in the
    result, possibly empty when there are fewer groups than splits.
    """
    groups = [_group_of(record, index, group_key) for index, record in enumerate(records)]
    return split_by_groups(records, groups, fractions, seed)


def split_by_groups(
    records: Sequence[Any], groups: Sequence[Hashable], fractions: dict[str, float], seed: int
) -> dict[str, list]:
    """:func:`split_records` with the groups given beside the records, in shuffled group order."""
    names = assign_splits(groups, fractions, seed)
    order = list(dict.fromkeys(groups))
    random.Random(seed).shuffle(order)
    rank = {group: i for i, group in enumerate(order)}
    out: dict[str, list] = {name: [] for name in fractions}
    for index in sorted(range(len(records)), key=lambda i: (rank[groups[i]], i)):
        out[names[index]].append(records[index])
    return out


def _group_of(record: dict, index: int, group_key: GroupKey) -> Hashable:
    if group_key is None:
        return index
    if callable(group_key):
        return group_key(record)
    return record[group_key]
