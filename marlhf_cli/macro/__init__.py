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
sampled continuations instead of a critic).

``parsing_lengths`` and ``token_offsets`` (the natural-language rule and the offset
alignment) pull in spaCy/stanza, so they are loaded on first access only.
"""

from __future__ import annotations

import importlib
from typing import Any

from .advantages import (
    VALUE_FUNCTIONS,
    SegmentLayout,
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

_LAZY = {"parsing_lengths": ".parsing", "token_offsets": ".alignment"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name], __name__)
        return getattr(module, name)
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
]
