"""Credit assignment: cut each response into macro actions, then run GAE over them.

This is the only place where MA-PPO differs from PPO (docs/method.md "Termination rules", "Segment GAE"): the termination
rule turns each response into segments, :func:`marlhf_cli.macro.macro_advantages` computes
segment values, rewards, GAE and returns, and broadcasts them back to every token. With
``fixed`` and n = 1 every token is its own segment and this is token-level PPO exactly.

What each rule reads, all already computed by the rollout (no extra forward pass):
``ppl`` the reference log-probs, ``parsing``/``code`` the response text with the character
span of every *generated* id (:func:`marlhf_cli.macro.alignment.token_offsets`, never a
re-tokenization), ``randomized`` a per-sample seed derived from the sample's global index,
so a resumed run cuts the same sample the same way.

The critic-free baselines (``--advantage rloo|grpo``) replace all of this with one advantage
per response from its group (:func:`assign_group_credit`); ``--advantage mc`` keeps the
segments (:func:`segment_responses`) and estimates their values by sampling
(:mod:`.estimators`, :mod:`.continuations`). Which of these a run uses: :mod:`.estimators`.
"""

from __future__ import annotations

import math

import torch

from ...macro import (
    PendingSegments,
    SegmentStats,
    TerminationRule,
    adaptive_lambda,
    grpo_advantages,
    macro_advantages,
    masked_mean,
    num_segments,
    rloo_advantages,
    sequence_to_tokens,
    start_segment_batch,
)


def make_rule(config) -> TerminationRule:
    """The TerminationRule of a PPOConfig (cutoff only where the rule reads it)."""
    return TerminationRule(
        config.termination,
        n=config.n,
        cutoff=config.cutoff if config.termination in ("parsing", "code") else None,
        seed=config.seed,
        backend=config.parser_backend,
    )


def is_vanilla(rule: TerminationRule) -> bool:
    """One token per segment: MA-PPO reduces to token-level PPO."""
    return rule.name == "fixed" and not math.isinf(rule.n) and int(rule.n) == 1


def rule_summary(rule: TerminationRule) -> str:
    """The rule and its parameters in a few words: 'fixed n=5', 'parsing C=5, fallback fixed n=5'."""
    if rule.name == "fixed":
        return "one segment per response" if math.isinf(rule.n) else f"fixed n={int(rule.n)}"
    if rule.name in ("parsing", "code"):
        return f"{rule.name} C={rule.cutoff}, fallback fixed n={rule.n:g}"
    return rule.name


def describe(rule: TerminationRule, value_function: str, ratio: str) -> str:
    """One line saying what credit assignment this run does."""
    if is_vanilla(rule):
        return "vanilla PPO (token-level credit assignment: fixed n=1)"
    return f"MA-PPO (macro actions: {rule_summary(rule)}; value function {value_function}; {ratio} ratio)"


def response_texts(tokenizer, response_ids: torch.Tensor, mask: torch.Tensor):
    """(texts, spans) of each response's real ids, EOS included (it gets an empty span)."""
    from ...macro.alignment import token_offsets

    texts, spans = [], []
    for row, count in zip(response_ids.cpu(), mask.sum(dim=1).cpu()):
        text, offsets = token_offsets(tokenizer, row[: int(count)].tolist())
        texts.append(text)
        spans.append(offsets)
    return texts, spans


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the real tokens of this process's rollout batch; zero at padding."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def start_segmentation(
    rule: TerminationRule, response_ids: torch.Tensor, mask: torch.Tensor, *, tokenizer, sample_seeds=None, executor=None
) -> PendingSegments | None:
    """Hand a text rule's parse to ``executor`` (the ``--parse-workers`` pool) as soon as the
    responses exist, so that it runs while the scoring forwards do: the paper's "no extra
    cost" holds only if parsing overlaps model work. ``None`` where there is nothing to gain
    (no pool, or a rule that is cheap or needs the reference log-probs: ``ppl``)."""
    if executor is None or not rule.needs_text:
        return None
    texts, spans = response_texts(tokenizer, response_ids, mask)
    return start_segment_batch(rule, mask.cpu(), texts=texts, offsets=spans, sample_seeds=sample_seeds, executor=executor)


def segment_responses(
    experience,
    rule: TerminationRule,
    *,
    tokenizer=None,
    sample_seeds=None,
    executor=None,
    workers: int = 0,
    pending: PendingSegments | None = None,
) -> tuple[torch.Tensor, SegmentStats]:
    """(segment ids [B, T] on the experience's device, stats): the termination rule's macro
    actions of every response. ``pending``: the segmentation :func:`start_segmentation` began
    for these responses (waited for here); without it the rule runs now. An episode's turns
    are cut one by one (:func:`segment_episodes`)."""
    if getattr(experience, "episode", None) is not None:
        return segment_episodes(experience, rule, tokenizer=tokenizer, sample_seeds=sample_seeds, executor=executor, workers=workers)
    mask = experience.mask
    if pending is None:
        texts = spans = None
        if rule.needs_text:
            texts, spans = response_texts(tokenizer, experience.response_ids, mask)
        pending = start_segment_batch(
            rule,
            mask.cpu(),
            texts=texts,
            offsets=spans,
            ref_logprobs=experience.ref_logp.cpu() if rule.name == "ppl" else None,
            sample_seeds=sample_seeds,
            workers=workers,
            executor=executor,
        )
    segment_ids, stats = pending.result()
    return segment_ids.to(mask.device), stats


def segment_episodes(experience, rule: TerminationRule, *, tokenizer=None, sample_seeds=None, executor=None, workers: int = 0
                     ) -> tuple[torch.Tensor, SegmentStats]:  # fmt: skip
    """An episode's macro actions: each assistant turn one (``turn``), or any other rule run on
    each turn as a response of its own, so that no segment crosses a turn's end (an observation
    lies between). Turn t of the episode numbered s draws the ``randomized`` rule's lengths
    from the seed (s, t)."""
    from types import SimpleNamespace

    from ...macro.turns import split_turns, turn_counts, turn_index
    from ...seeding import derived_seed

    mask = experience.mask
    if rule.name == "turn":
        counts = turn_counts(mask)
        return turn_index(mask), SegmentStats(samples=int(mask.shape[0]), segments=int(counts.sum()), tokens=int(mask.sum()), fallbacks=0)
    split = split_turns(mask)
    numbers = list(range(mask.shape[0])) if sample_seeds is None else list(sample_seeds)
    turns = SimpleNamespace(
        mask=split.mask(), response_ids=split.gather(experience.response_ids, fill=tokenizer.pad_token_id if tokenizer else 0),
        ref_logp=None if experience.ref_logp is None else split.gather(experience.ref_logp, fill=0.0),
    )  # fmt: skip
    seeds = [derived_seed(numbers[int(row)], int(turn)) for row, turn in zip(split.row, split.turn)]
    turn_ids, stats = segment_responses(turns, rule, tokenizer=tokenizer, sample_seeds=seeds, executor=executor, workers=workers)
    return split.join_segments(turn_ids).to(mask.device), SegmentStats(
        samples=int(mask.shape[0]), segments=stats.segments, tokens=stats.tokens, fallbacks=stats.fallbacks
    )


def assign_credit(
    experience,
    rule: TerminationRule,
    *,
    tokenizer=None,
    gamma: float = 1.0,
    lam: float | str = 0.95,
    lam_alpha: float = 0.05,
    critic_lam: float | None = None,
    value_function: str = "equal",
    whiten_advantages: bool = False,
    sample_seeds=None,
    executor=None,
    workers: int = 0,
    pending: PendingSegments | None = None,
):
    """Fill ``segment_ids``, ``advantages``, ``returns``, ``lambdas`` and ``segment_stats`` of
    an Experience (segments from :func:`segment_responses`, then GAE over them with the
    critic's values). ``lam``: the actor's lambda, or ``"adaptive"`` (one per response from
    its number of segments and ``lam_alpha``: :func:`~marlhf_cli.macro.adaptive_lambda`);
    ``critic_lam``: the critic's targets' lambda, None for the actor's (decoupled GAE)."""
    mask = experience.mask
    segment_ids, stats = segment_responses(
        experience, rule, tokenizer=tokenizer, sample_seeds=sample_seeds, executor=executor, workers=workers, pending=pending
    )
    # the adaptive lambda counts GAE's steps, which are segments (tokens at n = 1):
    # docs/method.md "Decoupled and length-adaptive lambda"
    actor_lam = adaptive_lambda(num_segments(mask, segment_ids), lam_alpha).to(mask.device) if lam == "adaptive" else lam
    advantages, returns = macro_advantages(
        experience.rewards, experience.values, mask, segment_ids,
        gamma=gamma, lam=actor_lam, value_function=value_function,
        critic_lam=critic_lam,
    )
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    experience.segment_ids = segment_ids
    experience.advantages = advantages
    experience.returns = returns
    experience.lambdas = actor_lam if isinstance(actor_lam, torch.Tensor) else torch.full((mask.shape[0],), float(actor_lam))
    experience.segment_stats = stats
    return experience


def assign_group_credit(experience, method: str, group_size: int, *, whiten_advantages: bool = False):
    """rloo / grpo: one advantage per response from the other responses to its prompt (the
    experience holds groups of ``group_size`` consecutive rows), given to each of its tokens.

    RLOO's sequence reward is the sum of the per-token rewards (the score minus the KL
    penalty); GRPO's is the placed score alone (its KL is a loss term). There are no values,
    so no returns; every response is one segment, which the segment metrics show.
    """
    mask = experience.mask
    if method == "rloo":
        per_response = rloo_advantages(torch.where(mask.bool(), experience.rewards, 0.0).sum(dim=1), group_size)
    elif method == "grpo":
        per_response = grpo_advantages(experience.scores.to(experience.rewards.dtype), group_size)
    else:
        raise ValueError(f"no group baseline called {method!r}; choose rloo or grpo")
    advantages = sequence_to_tokens(per_response.to(mask.device), mask)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    lengths = mask.sum(dim=1)
    experience.segment_ids = torch.zeros_like(mask)  # one segment per response
    experience.advantages = advantages
    experience.returns = None
    experience.segment_stats = SegmentStats(
        samples=int(mask.shape[0]), segments=int((lengths > 0).sum()), tokens=int(lengths.sum()), fallbacks=0
    )
    return experience
