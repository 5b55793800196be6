"""The PPO stage's models: actor and critic engines, the frozen reference, the reward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import engine as eng
from ...errors import UserError
from ..forward import TokenValues, disable_dropout
from .generation import GenerationModel
from .rewards import RewardFn, RewardModelReward
from .settings import is_critic_free, micro_batch, optimizer_steps


@dataclass
class Models:
    actor: Any  # DeepSpeed engine around the policy
    critic: Any  # DeepSpeed engine around TokenValues(reward-model copy); None for rloo/grpo
    reference: Any  # frozen policy copy
    reward: RewardFn
    tokenizer: Any
    device: Any
    sampler: GenerationModel  # the actor as a module that samples (a whole copy under ZeRO-3)



def build_models(config, policy: str, reward_model: str, reward_fn: RewardFn | None) -> Models:
    """Actor and critic engines (no critic for rloo/grpo), the frozen reference, the reward,
    and the tokenizer."""
    from ...models import load_causal_lm, load_reward_model, load_tokenizer

    tokenizer = load_tokenizer(policy, padding_side="left")
    dtype = config.dtype
    actor_model = load_causal_lm(policy, dtype=dtype)
    reference = load_causal_lm(policy, dtype=dtype)
    critic_model = None if is_critic_free(config) else load_reward_model(reward_model, dtype=dtype)
    for model in (actor_model, reference, critic_model):
        if model is not None:
            disable_dropout(model)
            model.config.pad_token_id = tokenizer.pad_token_id
    if critic_model is not None:
        _check_vocabulary(critic_model, tokenizer, reward_model, policy)
    total = optimizer_steps(config)
    actor = eng.build_engine(actor_model, config, lr=config.actor_lr, batch_size=config.mini_batch_size, total_steps=total)
    critic = None
    if critic_model is not None:
        critic = eng.build_engine(
            TokenValues(critic_model), config, lr=config.critic_lr, batch_size=config.mini_batch_size, total_steps=total
        )
    device = actor.device
    reference.eval().requires_grad_(False)
    reference.to("cpu" if config.offload_frozen else device)
    if reward_fn is None:
        rm = load_reward_model(reward_model, dtype=dtype)
        _check_vocabulary(rm, tokenizer, reward_model, policy)
        disable_dropout(rm)
        rm.eval().requires_grad_(False)
        rm.to("cpu" if config.offload_frozen else device)
        reward_fn = RewardModelReward(rm, batch_size=micro_batch(config))
    def whole_copy():
        model = load_causal_lm(policy, dtype=dtype)
        disable_dropout(model)
        return model

    return Models(actor, critic, reference, reward_fn, tokenizer, device, GenerationModel(actor, whole_copy))


def _check_vocabulary(model, tokenizer, source: str, policy: str) -> None:
    """The reward model (and the critic made from it) reads the policy's token ids."""
    if model.config.vocab_size < len(tokenizer):
        raise UserError(f"--reward-model '{source}' does not share the vocabulary of --policy '{policy}'")
