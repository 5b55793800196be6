"""The PPO update: epochs over shuffled minibatches, actor and critic each one step per minibatch.

The engines only need ``engine(...)`` (forward), ``engine.backward(loss)`` and
``engine.step()``: DeepSpeed engines have exactly that, and so does any small adapter around
a torch optimizer (the tests use one). A minibatch is split into micro-batches; the engine
accumulates their gradients and steps the optimizer once per minibatch (DeepSpeed does this
when ``gradient_accumulation_steps`` = micro-batches per minibatch, scaling each loss by
1/steps itself). Gradient clipping is the engine's (``max_grad_norm``).

Losses are the macro ones (docs/method.md "Losses"): every token carries its segment's advantage and
return; ``ratio="macro"`` uses one ratio per segment. Each micro-batch's policy loss is
aggregated over its own real tokens by ``loss_aggregation`` (docs/method.md "Loss
aggregation": a token mean by default; with one micro-batch per minibatch, over the
minibatch's tokens); the critic's loss is a token mean.

Critic-free runs (rloo, grpo) pass ``critic=None``: only the actor is trained; the critic's
warm-up (``--critic-warmup-steps``) passes ``train_actor=False``: only the critic is, on the
same minibatches in the same order. GRPO sets
``kl_loss_coef`` (beta): the loss becomes the clipped surrogate plus beta times the k3 KL to
the reference, both token means over the micro-batch's real tokens.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from ...macro import kl_loss, masked_mean, policy_loss, value_loss
from ..forward import critic_values, policy_forward


@dataclass
class UpdateSettings:
    epochs: int = 1
    mini_batch_size: int = 32  # per process
    micro_batch_size: int = 32  # per process; mini_batch_size is a multiple of it
    clip_range: float = 0.2
    value_clip_range: float = 0.2
    ratio: str = "token"
    temperature: float = 0.8
    kl_loss_coef: float = 0.0  # GRPO's beta: KL to the reference as a loss term (0: none)
    loss_aggregation: str = "token-mean"  # token-mean | sequence-mean | token-sum (macro.aggregate)
    max_new_tokens: int | None = None  # the generation budget: token-sum's constant normaliser


def _select(experience, index: torch.Tensor) -> dict[str, torch.Tensor]:
    keep = {
        "sequences": experience.sequences, "attention_mask": experience.attention_mask,
        "mask": experience.mask, "old_logp": experience.old_logp, "ref_logp": experience.ref_logp,
        "values": experience.values, "advantages": experience.advantages, "returns": experience.returns,
        "segment_ids": experience.segment_ids,
    }  # fmt: skip
    return {key: value[index] for key, value in keep.items() if value is not None}


def ppo_update(actor, critic, experience, settings: UpdateSettings, *, generator: torch.Generator | None = None,
               train_actor: bool = True) -> dict[str, float]:  # fmt: skip
    """Run the PPO epochs on one Experience; return mean losses and diagnostics."""
    size = experience.batch_size
    prompt_length = experience.prompt_length
    sums: dict[str, float] = defaultdict(float)
    count = 0
    for model in (actor if train_actor else None, critic):
        if model is not None:
            model.train()
    for _ in range(settings.epochs):
        order = torch.randperm(size, generator=generator).to(experience.mask.device)
        for start in range(0, size, settings.mini_batch_size):
            minibatch = order[start : start + settings.mini_batch_size]
            for micro_start in range(0, len(minibatch), settings.micro_batch_size):
                part = _select(experience, minibatch[micro_start : micro_start + settings.micro_batch_size])
                mask = part["mask"]

                if train_actor:
                    logp, entropy = policy_forward(
                        actor, part["sequences"], part["attention_mask"], prompt_length,
                        settings.temperature, with_entropy=True,
                    )
                    actor_loss, actor_stats = policy_loss(
                        logp, part["old_logp"], part["advantages"], mask,
                        clip=settings.clip_range, ratio=settings.ratio, segment_ids=part["segment_ids"],
                        aggregation=settings.loss_aggregation, max_length=settings.max_new_tokens,
                    )
                    sums["policy_loss"] += float(actor_loss.detach())
                    if settings.kl_loss_coef:
                        reference_kl = kl_loss(
                            logp, part["ref_logp"], mask, settings.loss_aggregation, settings.max_new_tokens
                        )
                        actor_loss = actor_loss + settings.kl_loss_coef * reference_kl
                        sums["kl_loss"] += float(reference_kl.detach())
                    actor.backward(actor_loss)
                    actor.step()
                    sums["clip_fraction"] += float(actor_stats["clip_fraction"])
                    sums["approx_kl"] += float(actor_stats["approx_kl"])
                    sums["entropy"] += float(masked_mean(entropy, mask))

                if critic is not None:
                    values = critic_values(critic, part["sequences"], part["attention_mask"], prompt_length)
                    critic_loss, critic_stats = value_loss(
                        values, part["values"], part["returns"], mask, clip=settings.value_clip_range
                    )
                    critic.backward(critic_loss)
                    critic.step()
                    sums["value_loss"] += float(critic_loss.detach())
                    sums["value_clip_fraction"] += float(critic_stats["clip_fraction"])
                count += 1
    return {key: value / max(count, 1) for key, value in sums.items()}
