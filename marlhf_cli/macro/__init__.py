"""The MA-PPO method core: termination rules, segment-level advantages, PPO losses.

Pure functions on tensors and token lists. This package imports torch and the standard
library only (nothing else of marlhf), so any trainer (TRL, OpenRLHF, your own) can call
it::

    from marlhf_cli.macro import TerminationRule, segment_batch, macro_advantages, policy_loss

    segment_ids, stats = segment_batch(TerminationRule("fixed", n=5), response_mask)
    advantages, returns = macro_advantages(rewards, values, response_mask, segment_ids,
                                           gamma=1.0, lam=0.95, value_function="equal")

The critic-free baselines (``rloo_advantages``, ``grpo_advantages``, ``kl_loss``) live here
too, so a comparison with them uses the same losses, and so do the Monte-Carlo segment
advantages (``cap_segments``, ``boundary_plan``, ``mc_advantages``: segment values from
sampled continuations instead of a critic), and a multi-turn episode's turns (``turn_index``,
``place_turn_rewards``, ``split_turns``: a turn as a macro action, or a rule cutting inside
turns).

Every name loads its module on first use, so code that only segments imports no torch, and
``parsing_lengths`` (the natural-language rule) pulls in spaCy/stanza only when called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
    from .advantages import (
        VALUE_FUNCTIONS,
        SegmentLayout,
        adaptive_lambda,
        discounted_reverse_cumsum,
        macro_advantages,
        num_segments,
        segment_broadcast,
        segment_layout,
        segment_sums,
        segment_weights,
        token_gae,
    )
    from .baselines import ADVANTAGE_ESTIMATORS, grpo_advantages, leave_one_out_means, rloo_advantages, sequence_to_tokens
    from .code import DEFAULT_CODE_CUTOFF, code_lengths
    from .losses import (
        KL_ESTIMATORS,
        LOSS_AGGREGATIONS,
        RATIO_MODES,
        aggregate,
        kl_loss,
        kl_per_token,
        masked_mean,
        policy_loss,
        value_loss,
    )
    from .montecarlo import BoundaryPlan, boundary_plan, cap_segments, kept_boundaries, mc_advantages
    from .turns import TurnSplit, place_turn_rewards, split_turns, turn_counts, turn_ends, turn_index
    from .rules import fixed_lengths, ppl_lengths, randomized_lengths
    from .segmentation import (
        DEFAULT_PARSING_CUTOFF,
        RULE_NAMES,
        PendingSegments,
        SegmentStats,
        TerminationRule,
        lengths_to_segment_ids,
        missing_parser,
        segment_batch,
        segment_lengths,
        start_segment_batch,
    )

# Each name is imported from its module on first use: the rules and the segmentation need no
# torch (`marlhf segment` with fixed, randomized or code starts in about a second), the advantages
# and losses do, and ``parsing_lengths`` pulls in spaCy or stanza.
_SOURCES = {
    "ADVANTAGE_ESTIMATORS": ".baselines",
    "BoundaryPlan": ".montecarlo",
    "DEFAULT_CODE_CUTOFF": ".code",
    "DEFAULT_PARSING_CUTOFF": ".segmentation",
    "KL_ESTIMATORS": ".losses",
    "LOSS_AGGREGATIONS": ".losses",
    "PendingSegments": ".segmentation",
    "RATIO_MODES": ".losses",
    "RULE_NAMES": ".segmentation",
    "SegmentLayout": ".advantages",
    "SegmentStats": ".segmentation",
    "TerminationRule": ".segmentation",
    "VALUE_FUNCTIONS": ".advantages",
    "adaptive_lambda": ".advantages",
    "aggregate": ".losses",
    "boundary_plan": ".montecarlo",
    "cap_segments": ".montecarlo",
    "code_lengths": ".code",
    "discounted_reverse_cumsum": ".advantages",
    "fixed_lengths": ".rules",
    "grpo_advantages": ".baselines",
    "kept_boundaries": ".montecarlo",
    "kl_loss": ".losses",
    "kl_per_token": ".losses",
    "leave_one_out_means": ".baselines",
    "lengths_to_segment_ids": ".segmentation",
    "macro_advantages": ".advantages",
    "masked_mean": ".losses",
    "mc_advantages": ".montecarlo",
    "missing_parser": ".segmentation",
    "num_segments": ".advantages",
    "parsing_lengths": ".parsing",
    "policy_loss": ".losses",
    "ppl_lengths": ".rules",
    "randomized_lengths": ".rules",
    "rloo_advantages": ".baselines",
    "segment_batch": ".segmentation",
    "segment_broadcast": ".advantages",
    "segment_layout": ".advantages",
    "segment_lengths": ".segmentation",
    "segment_sums": ".advantages",
    "segment_weights": ".advantages",
    "sequence_to_tokens": ".baselines",
    "start_segment_batch": ".segmentation",
    "token_gae": ".advantages",
    "token_offsets": ".alignment",
    "TurnSplit": ".turns",
    "place_turn_rewards": ".turns",
    "split_turns": ".turns",
    "turn_counts": ".turns",
    "turn_ends": ".turns",
    "turn_index": ".turns",
    "value_loss": ".losses",
}


def __getattr__(name: str) -> Any:
    if name in _SOURCES:
        value = getattr(importlib.import_module(_SOURCES[name], __name__), name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "BoundaryPlan",
    "DEFAULT_CODE_CUTOFF",
    "DEFAULT_PARSING_CUTOFF",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "RATIO_MODES",
    "RULE_NAMES",
    "VALUE_FUNCTIONS",
    "PendingSegments",
    "SegmentLayout",
    "SegmentStats",
    "TerminationRule",
    "adaptive_lambda",
    "aggregate",
    "boundary_plan",
    "cap_segments",
    "code_lengths",
    "discounted_reverse_cumsum",
    "fixed_lengths",
    "grpo_advantages",
    "kept_boundaries",
    "kl_loss",
    "kl_per_token",
    "leave_one_out_means",
    "lengths_to_segment_ids",
    "macro_advantages",
    "masked_mean",
    "mc_advantages",
    "num_segments",
    "policy_loss",
    "ppl_lengths",
    "randomized_lengths",
    "rloo_advantages",
    "segment_batch",
    "segment_broadcast",
    "segment_layout",
    "segment_lengths",
    "segment_sums",
    "sequence_to_tokens",
    "start_segment_batch",
    "segment_weights",
    "token_gae",
    "value_loss",
    "TurnSplit",
    "place_turn_rewards",
    "split_turns",
    "turn_counts",
    "turn_ends",
    "turn_index",
]
