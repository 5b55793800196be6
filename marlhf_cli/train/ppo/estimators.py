"""The advantage estimators of ``marlhf ppo --advantage``: one registry, one signature.

Steps 4-5 of Algorithm 1 (credit assignment) are ``estimator.assign(experience, inputs)``
whatever the estimator: it fills the experience's ``segment_ids``, ``advantages``,
``returns`` (None without a critic) and ``segment_stats``. Everything else that differs
between estimators is data on its :class:`Estimator` entry, read where the stage needs it:
whether a critic is built (models, checkpoints, export), whether a termination rule cuts the
responses (the parse pool), where the KL to the reference goes (reward or loss), the default
group size and which estimator-specific options it reads. A new estimator is one function
and one :func:`register` line (the pattern of verl's ``core_algos`` registry).

=====  ======  ========  ===========  ===================================================
name   critic  segments  KL           advantage of a token of response i
=====  ======  ========  ===========  ===================================================
gae    yes     rule      reward (k1)  segment GAE over the critic's values (MA-PPO; PPO at n=1)
rloo   no      one       reward (k1)  R_i - mean of the group's other R (R = score - beta KL)
grpo   no      one       loss (k3)    (score_i - group mean) / (group std + eps)
mc     no      rule      loss (k3)    V(s_{k+1}) - V(s_k), V from sampled continuations
tree   no      tree      reward (k1)  V(node) - V(parent), V the mean R of the leaves below
=====  ======  ========  ===========  ===================================================

``tree`` also samples its own way: its ``draws`` entry replaces the rollout's one response per
prompt by a tree of K^D leaves per prompt (:mod:`.tree`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import torch

from ...macro import PendingSegments, SegmentStats, TerminationRule, boundary_plan, cap_segments, mc_advantages
from ...macro.tree import leaves_per_tree, tree_advantages, tree_segment_ids
from ...macro.turns import spread_segments
from . import credit, episodes, tree as trees
from .continuations import continuation_seed, sample_continuations

if TYPE_CHECKING:
    from .experience import Experience


class StepContext(Protocol):
    """What an estimator reads of the stage's :class:`.context.Context`. A protocol, not the
    class: settings.py reads this registry to plan a run, and the context is built from that
    plan, so naming the class here would close a circle (settings -> estimators -> context)."""

    config: Any  # the run's PPOConfig
    models: Any  # .models.Models
    plan: Any  # .settings.RunPlan (group_size)
    rollout: Any  # .experience.RolloutSettings
    executor: Any  # the parse pool, or None

    @property
    def rule(self) -> TerminationRule: ...


@dataclass
class CreditInputs:
    """What an estimator may read besides the experience."""

    ctx: StepContext  # the config, models, termination rule, rollout settings and parse pool
    step: int  # 0-based, for seeds
    sample_numbers: Sequence[int]  # the global number of every response (seeds per sample)
    sampler: Any = None  # the module that sampled the responses (mc samples continuations with it)
    pending: PendingSegments | None = None  # a text rule's parse started when the responses existed


AssignFn = Callable[["Experience", CreditInputs], None]

# options that only some estimators read; a run given one its estimator does not read on the
# command line stops with a one-line error (settings.plan_run)
RULE_OPTIONS = ("termination", "n", "cutoff")
CRITIC_OPTIONS = ("value_function", "critic_lr", "value_clip_range", "value_head_init", "critic_warmup_steps", "lam",
                  "lam_alpha", "critic_lambda")  # fmt: skip
GROUP_OPTIONS = ("samples_per_prompt",)  # every estimator but tree, whose K^D leaves are its group
MC_OPTIONS = ("mc_rollouts", "mc_max_boundaries")
TREE_OPTIONS = ("tree_branches", "tree_depth")


@dataclass(frozen=True)
class Estimator:
    name: str
    assign: AssignFn
    critic: bool  # a critic is built, trained, checkpointed and exported
    segments: bool  # a termination rule cuts the responses into macro actions
    kl_in_loss: bool  # beta * k3 KL added to the loss instead of -beta * KL in the reward
    group_size: int  # default K (--samples-per-prompt); without a critic K must be >= 2
    reads: tuple[str, ...]  # of RULE_OPTIONS + CRITIC_OPTIONS + GROUP_OPTIONS + MC_OPTIONS + TREE_OPTIONS
    describe: Callable[[Any, TerminationRule, int], str]  # (config, rule, K) -> the start-up line
    what_it_is: str  # for the error naming options it does not read
    # the responses per prompt when the estimator's own options fix them (tree: K^D), else None
    # (--samples-per-prompt, or group_size)
    leaves: Callable[[Any], int] | None = None
    # (ctx, step, sample numbers) -> draw(model, prompts): its own sampling in place of one
    # response per prompt (experience.make_experience), or None
    draws: Callable[[StepContext, int, Sequence[int]], Callable] | None = None


ESTIMATORS: dict[str, Estimator] = {}


def register(name: str, **entry: Any) -> Callable[[AssignFn], AssignFn]:
    """Decorator: add the function as estimator ``name`` with ``entry``'s fields."""

    def add(assign: AssignFn) -> AssignFn:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ESTIMATORS[name] = Estimator(name=name, assign=assign, **entry)
        return assign

    return add


def _ratio(config, unit: str) -> str:
    """How the policy loss is formed: its ratios, and its aggregation when not the default."""
    return (f"one ratio per {unit}" if config.ratio == "macro" else "token ratios") + _aggregation(config)


def _lambdas(config, rule: TerminationRule) -> str:
    """GAE's lambdas where they are not the one number of the paper: the length-adaptive one
    (--lam adaptive, per response from its GAE steps) and the critic's own (--critic-lambda,
    decoupled GAE)."""
    steps = "tokens" if credit.is_vanilla(rule) else "segments"
    actor = f"adaptive, 1 - 1 / ({config.lam_alpha:g} x {steps})" if config.lam == "adaptive" else f"{config.lam:g}"
    if config.lam != "adaptive" and config.critic_lambda in (None, config.lam):
        return ""
    critic = "the same" if config.critic_lambda is None else f"{config.critic_lambda:g}"
    return f"; actor lambda {actor}, critic lambda {critic}"


def _aggregation(config) -> str:
    return "" if config.loss_aggregation == "token-mean" else f", {config.loss_aggregation} loss"


@register(
    "gae", critic=True, segments=True, kl_in_loss=False, group_size=1, reads=RULE_OPTIONS + CRITIC_OPTIONS + GROUP_OPTIONS,
    what_it_is="samples no continuations",
    describe=lambda config, rule, k: credit.describe(rule, config.value_function, config.ratio)
    + _lambdas(config, rule) + (f", {k} responses per prompt" if k > 1 else "") + _aggregation(config),
)  # fmt: skip
def gae(experience, inputs: CreditInputs) -> None:
    """Macro actions from the termination rule, GAE over them with the critic's values."""
    ctx, config = inputs.ctx, inputs.ctx.config
    credit.assign_credit(
        experience, ctx.rule, tokenizer=ctx.models.tokenizer, gamma=config.gamma, lam=config.lam, lam_alpha=config.lam_alpha,
        critic_lam=config.critic_lambda, value_function=config.value_function, whiten_advantages=config.whiten_advantages,
        sample_seeds=inputs.sample_numbers, executor=ctx.executor, pending=inputs.pending,
    )  # fmt: skip


_GROUP = "termination rules and value functions do not apply"


@register(
    "rloo", critic=False, segments=False, kl_in_loss=False, group_size=4, reads=GROUP_OPTIONS,
    what_it_is="trains no critic and assigns credit per response",
    describe=lambda config, rule, k: f"RLOO (no critic: {k} responses per prompt, leave-one-out baseline, "
    f"KL penalty in the reward; {_ratio(config, 'response')}; {_GROUP})",
)  # fmt: skip
def rloo(experience, inputs: CreditInputs) -> None:
    """One advantage per response: its KL-penalised reward minus the group's others' mean."""
    config = inputs.ctx.config
    credit.assign_group_credit(experience, "rloo", inputs.ctx.plan.group_size, whiten_advantages=config.whiten_advantages)


@register(
    "grpo", critic=False, segments=False, kl_in_loss=True, group_size=4, reads=GROUP_OPTIONS,
    what_it_is="trains no critic and assigns credit per response",
    describe=lambda config, rule, k: f"GRPO (no critic: {k} responses per prompt, group-normalised score, "
    f"KL loss k3 x {config.kl_coef:g}; {_ratio(config, 'response')}; {_GROUP})",
)  # fmt: skip
def grpo(experience, inputs: CreditInputs) -> None:
    """One advantage per response: its score normalised within the group."""
    config = inputs.ctx.config
    credit.assign_group_credit(experience, "grpo", inputs.ctx.plan.group_size, whiten_advantages=config.whiten_advantages)


def _describe_mc(config, rule: TerminationRule, k: int) -> str:
    cap = "" if config.mc_max_boundaries is None else f", at most {config.mc_max_boundaries} boundaries per response"
    return (
        f"Monte-Carlo segment advantages (no critic: macro actions {credit.rule_summary(rule)}{cap}; "
        f"{config.mc_rollouts} continuations per boundary; {k} responses per prompt, leave-one-out baseline at "
        f"the prompt; KL loss k3 x {config.kl_coef:g}; {_ratio(config, 'segment')})"
    )


def mc_cost(config, rule: TerminationRule, responses: int) -> str:
    """The start-up line on what ``mc`` samples per step: at most one continuation per
    boundary and rollout, the boundaries per response bounded by the rule (fixed n: one every
    n tokens; the text rules and ppl: as often as every token) and by --mc-max-boundaries."""
    longest = config.max_new_tokens
    if getattr(config, "env", None):  # an episode: --max-turns turns of up to --max-new-tokens each, cut turn by turn
        if rule.name == "turn" or (rule.name == "fixed" and math.isinf(rule.n)):
            per_turn = 1
        else:
            per_turn = math.ceil(longest / rule.n) if rule.name == "fixed" else longest
        per_response = config.max_turns * per_turn - 1
    elif rule.name == "fixed":
        per_response = 0 if math.isinf(rule.n) else math.ceil(longest / rule.n) - 1
    else:
        per_response = longest - 1
    if config.mc_max_boundaries is not None:
        per_response = min(per_response, config.mc_max_boundaries)
    most = responses * per_response * config.mc_rollouts
    what, each = ("episodes", "each played to its end") if getattr(config, "env", None) else ("responses", f"each up to {longest} tokens")
    line = (
        f"mc: up to {most:,} continuations per step ({responses} {what} x at most {per_response} boundaries x "
        f"{config.mc_rollouts} rollouts), {each}, beside the {responses} {what}"
    )
    if config.mc_max_boundaries is None and rule.name not in ("fixed", "turn"):
        line += f"; --mc-max-boundaries B caps the boundaries {rule.name} makes per response"
    return line


@register(
    "mc", critic=False, segments=True, kl_in_loss=True, group_size=4, reads=RULE_OPTIONS + GROUP_OPTIONS + MC_OPTIONS,
    what_it_is="trains no critic", describe=_describe_mc,
)  # fmt: skip
def mc(experience, inputs: CreditInputs) -> None:
    """Macro actions from the rule (capped at --mc-max-boundaries); each boundary's value the
    mean score of --mc-rollouts continuations sampled from it (docs/method.md "Monte-Carlo
    segment advantages"); segment k's advantage V(s_{k+1}) - V(s_k)."""
    ctx, config, models = inputs.ctx, inputs.ctx.config, inputs.ctx.models
    mask = experience.mask
    rule_ids, rule_stats = credit.segment_responses(
        experience, ctx.rule, tokenizer=models.tokenizer, sample_seeds=inputs.sample_numbers, executor=ctx.executor,
        pending=inputs.pending,
    )  # fmt: skip
    episode = experience.episode
    real = mask if episode is None else episode.attention  # an episode's boundaries are columns among its observations
    if episode is not None:
        rule_ids = spread_segments(rule_ids, mask, real)
    segment_ids = cap_segments(rule_ids, real, config.mc_max_boundaries)
    plan = boundary_plan(segment_ids, real)
    rollouts = config.mc_rollouts
    model = inputs.sampler if inputs.sampler is not None else models.sampler.model()
    if episode is not None:  # each continuation plays the episode to its end against a replayed environment
        scores, tokens, seconds = episodes.continuation_scores(ctx, model, experience, plan.rows.tolist(), plan.positions.tolist(), rollouts)
    else:
        seeds = [
            continuation_seed(config.seed, inputs.step, inputs.sample_numbers[row], position, rollout)
            for row, position in zip(plan.rows.tolist(), plan.positions.tolist())
            for rollout in range(rollouts)
        ]
        continuations = sample_continuations(
            model, models.tokenizer, models.reward, experience, plan, ctx.rollout, rollouts=rollouts, seeds=seeds,
            rows_per_batch=experience.batch_size * rollouts,
        )  # fmt: skip
        scores, tokens, seconds = continuations.scores, continuations.tokens, continuations.seconds
    advantages = mc_advantages(experience.scores, ctx.plan.group_size, scores, plan, segment_ids, mask)
    advantages = advantages.to(device=mask.device, dtype=experience.rewards.dtype)
    if config.whiten_advantages:
        advantages = credit.whiten(advantages, mask)
    experience.segment_ids = segment_ids
    experience.advantages = advantages
    experience.returns = None
    experience.segment_stats = dataclasses.replace(rule_stats, segments=int(plan.segments.sum()))
    experience.continuations = len(plan) * rollouts
    experience.continuation_tokens = tokens
    experience.continuation_seconds = seconds


def _describe_tree(config, rule: TerminationRule, k: int) -> str:
    inner = config.tree_depth - 1  # macro actions whose ends branch
    where = "at the prompt" + ("" if inner == 0 else " and the end of the first macro action" if inner == 1 else
                               f" and the ends of the first {inner} macro actions")  # fmt: skip
    return (
        f"tree rollouts (no critic: {config.tree_branches} branches per node {where} ({credit.rule_summary(rule)}), "
        f"{k} leaves per prompt, each trained on; "
        f"V(node) the mean KL-shaped return of its leaves, a macro action's advantage V(node) - V(parent); "
        f"KL penalty in the reward; {_ratio(config, 'segment')})"
    )


def _draw_trees(ctx: StepContext, step: int, sample_numbers: Sequence[int]) -> Callable:
    """Sampling for one step of ``tree``: each group of K^D rows is one prompt's tree; a tree
    is named by its first response's global sample number (its seeds, and its randomized
    rule's, so that a resumed run draws and cuts the same tree)."""
    config, models, leaves = ctx.config, ctx.models, ctx.plan.group_size
    firsts = list(sample_numbers[::leaves])
    segmenter = trees.rule_segmenter(
        ctx.rule, models.tokenizer, reference=models.reference, settings=ctx.rollout, tree_seeds=firsts,
        device=models.device, executor=ctx.executor,
    )  # fmt: skip

    def draw(model, prompts):
        return trees.sample_tree(
            model, models.tokenizer, prompts, ctx.rollout, branches=config.tree_branches, depth=config.tree_depth,
            segmenter=segmenter, device=models.device,
            seeds=lambda tree, level, node, child: trees.tree_seed(config.seed, step, firsts[tree], level, node, child),
        )  # fmt: skip

    return draw


@register(
    "tree", critic=False, segments=True, kl_in_loss=False, group_size=4, reads=RULE_OPTIONS + TREE_OPTIONS,
    what_it_is="trains no critic", describe=_describe_tree,
    leaves=lambda config: leaves_per_tree(config.tree_branches, config.tree_depth), draws=_draw_trees,
)  # fmt: skip
def tree(experience, inputs: CreditInputs) -> None:
    """Each leaf's tokens of its level-d macro action get V(level-d node) - V(its parent), V the
    mean KL-shaped return of the leaves below (docs/method.md "Tree rollouts over macro
    actions"); a leaf is a response like any other, so a shared prefix is trained on once per
    leaf below it."""
    config, mask = inputs.ctx.config, experience.mask
    drawn = experience.tree
    segment_ids = tree_segment_ids(drawn.branch_positions, mask)
    returns = torch.where(mask.bool(), experience.rewards, torch.zeros_like(experience.rewards)).sum(dim=1)
    advantages = tree_advantages(returns, config.tree_branches, config.tree_depth, segment_ids, mask)
    advantages = advantages.to(device=mask.device, dtype=experience.rewards.dtype)
    if config.whiten_advantages:
        advantages = credit.whiten(advantages, mask)
    lengths = mask.sum(dim=1)
    segments = torch.where(lengths > 0, segment_ids.amax(dim=1) + 1, torch.zeros_like(lengths))
    experience.segment_ids = segment_ids
    experience.advantages = advantages
    experience.returns = None
    experience.segment_stats = SegmentStats(
        samples=int(mask.shape[0]), segments=int(segments.sum()), tokens=int(lengths.sum()), fallbacks=drawn.fallbacks
    )
