"""The PPO stage's models: actor and critic engines, the frozen reference, the reward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ... import engine as eng, lora
from .. import common, extending
from ...errors import UserError
from ..forward import TokenValues, disable_dropout
from . import value_head
from .sampling_copy import GenerationModel
from ...scoring.rewards import RewardFn, RewardModelReward, WeightedRewards, score_statistics
from ..sources import reward_specs, reward_weights
from ...episodes import episode_tokens
from .settings import RunPlan, make_rewards, micro_batch, optimizer_steps


@dataclass
class Models:
    actor: Any  # DeepSpeed engine around the policy
    critic: Any  # DeepSpeed engine around TokenValues(reward-model copy); None for rloo/grpo
    reference: Any  # frozen policy copy; with LoRA the actor with its adapter off (lora.WithoutAdapter); None: nothing reads it
    reward: RewardFn
    tokenizer: Any
    device: Any
    sampler: GenerationModel  # the actor as a module that samples (a whole copy under ZeRO-3)
    # with LoRA: how the actor and the critic export (merged weights and adapter/); None: as they are
    actor_save: Callable | None = None
    critic_save: Callable | None = None
    # --value-head-init as resolved (value_head.INITS); None: no critic, or one that continues
    # an earlier run's (an extension)
    value_head: str | None = None
    value_head_scale: float = 1.0  # a reward-model head's factor to the reward's units
    value_head_offset: float = 0.0  # and the constant added to it (value_head.reward_units)


def build_models(
    config, plan: RunPlan, policy: str, reward_model: str, rewards: RewardFn | list | None,
    extension: extending.Extension | None = None,
) -> Models:  # fmt: skip
    """Actor and critic engines (no critic for rloo/grpo), the frozen reference, the reward,
    and the tokenizer.

    ``rewards``: :func:`.settings.make_rewards`' list (the reward model's entry None: built
    here), weighted by ``--reward-weights`` when there are several; None for that list; or one
    RewardFn that replaces ``--reward`` (tests, benchmarks).

    ``extension`` (a finished run made longer): the actor and the critic start from its
    exports (ppo/<name>/, critic/; with LoRA their adapters), the reference and the reward
    model stay what they were.

    With ``--lora-rank`` the actor and the critic get fresh adapters (B = 0), the reference
    is the actor with its adapter off and, where the critic exists and the reward is the
    reward model, the reward model is the critic with its adapter off (the critic starts from
    it): two models' weights instead of four (marlhf_cli/lora.py).
    """
    from ...models import load_causal_lm, load_reward_model, load_score_model, load_tokenizer

    tokenizer = load_tokenizer(policy, padding_side="left")
    dtype = config.dtype
    adapted = lora.enabled(config)
    starts = list(extension.exports) if extension else []  # ppo/<name>/ and (with a critic) its critic/
    actor_start, critic_start = (starts + [None, None])[:2]
    whole_start = extension is not None and not adapted  # no adapters: the exported weights themselves
    actor_model = load_causal_lm(actor_start if whole_start else policy, dtype=dtype)
    # no reference where nothing reads it (--kl-coef 0 and no ppl rule: settings.RunPlan.reference)
    reference = load_causal_lm(policy, dtype=dtype) if plan.reference and not adapted else None
    critic_model, head, scale, offset = None, None, 1.0, 0.0
    if plan.critic:
        critic_model, trained = load_score_model(critic_start if whole_start else reward_model, dtype=dtype)
        if extension is None:  # an extension's critic goes on from the finished run's
            head = value_head.resolve(config.value_head_init, trained, reward_model)
        if head == "reward-model" and (rewards is None or isinstance(rewards, list)):  # the reward is --reward's
            scale, offset = _reward_units(config, critic_model)
    for model in (actor_model, reference, critic_model):
        if model is not None:
            disable_dropout(model)
            model.config.pad_token_id = tokenizer.pad_token_id
    if critic_model is not None:
        _check_vocabulary(critic_model, tokenizer, reward_model, policy)
    saves: dict[str, Callable | None] = {"actor_save": None, "critic_save": None}
    if adapted:
        actor_model = lora.add_adapters(actor_model, config, task="causal", base=policy)
        if extension:
            extending.start_adapters(actor_model, actor_start)
        common.say("actor: " + lora.trainable_summary(actor_model))
        saves["actor_save"] = lora.merged_saver(lambda: load_causal_lm(policy, dtype=dtype), stage=f"ppo/{plan.name} actor")
        if critic_model is not None:
            critic_model = lora.add_adapters(critic_model, config, task="score", base=reward_model)
            if extension:
                extending.start_adapters(critic_model, critic_start)
                value_head.carry_offset(critic_model, critic_start)  # the base's config has none
            common.say("critic: " + lora.trainable_summary(critic_model))
            saves["critic_save"] = lora.merged_saver(lambda: load_reward_model(reward_model, dtype=dtype), stage=f"ppo/{plan.name} critic")
    if head is not None:  # after LoRA: only the critic's trained copy of the head, not the reward's
        value_head.start(critic_model, head, trained=trained, seed=config.seed, scale=scale, offset=offset)
    actor = eng.build_engine(
        actor_model, config, lr=config.actor_lr, batch_size=config.mini_batch_size, total_steps=optimizer_steps(config, plan, "actor")
    )
    critic = None
    if critic_model is not None:
        critic = eng.build_engine(
            TokenValues(critic_model), config, lr=config.critic_lr, batch_size=config.mini_batch_size,
            total_steps=optimizer_steps(config, plan, "critic"),
        )
    device = actor.device
    if adapted and plan.reference:
        reference = lora.WithoutAdapter(actor)
    elif reference is not None:
        reference.eval().requires_grad_(False)
        reference.to("cpu" if config.offload_frozen else device)
    if rewards is None or isinstance(rewards, list):
        parts = make_rewards(config) if rewards is None else rewards
        weights = reward_weights(config)
    else:  # one reward in place of --reward's
        parts, weights = [("reward", rewards)], [1.0]
    built = []
    for name, reward in parts:
        if reward is None:  # the reward model's score
            if adapted and critic_model is not None:  # the critic with its adapter off: no second copy
                reward = BaseModelReward(critic_model, batch_size=micro_batch(config))
            else:
                rm = load_reward_model(reward_model, dtype=dtype)
                _check_vocabulary(rm, tokenizer, reward_model, policy)
                disable_dropout(rm)
                rm.eval().requires_grad_(False)
                rm.to("cpu" if config.offload_frozen else device)
                reward = RewardModelReward(rm, batch_size=micro_batch(config))
        built.append((name, reward))
    reward_fn = built[0][1] if len(built) == 1 and weights == [1.0] else WeightedRewards(built, weights)

    def whole_copy():
        model = load_causal_lm(policy, dtype=dtype)
        disable_dropout(model)
        return lora.add_adapters(model, config, task="causal") if adapted else model

    return Models(actor, critic, reference, reward_fn, tokenizer, device, GenerationModel(actor, whole_copy), **saves,
                  value_head=head, value_head_scale=scale, value_head_offset=offset)  # fmt: skip


def check_rollout_memory(config, plan: RunPlan, policy: str) -> None:
    """A step whose responses cannot fit is one line before any weight loads (``--tree-branches
    1000`` announced 4,000,000 responses a step and ran out of memory after 224 s): a process
    samples its share of the step's responses at once, and their KV cache and the sampler's
    per-row buffers alone (generation.compiled.bucket_bytes, a lower bound) must fit in the
    memory the device has free."""
    import torch

    from ...generation.compiled import bucket_bytes, free_bytes
    from ...models import model_config

    architecture = model_config(policy)
    rows = max(plan.responses_per_step // eng.world_size(), 1)
    length = config.max_prompt_length + (episode_tokens(config) if config.env else config.max_new_tokens)
    dtype = torch.bfloat16 if config.dtype == "bf16" else torch.float32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    need, free = bucket_bytes(architecture, rows, length, dtype, architecture.vocab_size), free_bytes(device)
    if need > free:
        raise UserError(
            f"a step samples {rows:,} responses of up to {length} tokens on each process: their KV cache and sampling buffers "
            f"alone need about {need / 2**30:,.1f} GiB, and {free / 2**30:,.1f} GiB is free on the {device.type}: lower "
            "--rollout-batch-size, --samples-per-prompt, --tree-branches or --tree-depth (or the lengths)"
        )


def _reward_units(config, critic_model) -> tuple[float, float]:
    """(scale, offset) taking the reward model's raw score to its part of the reward PPO
    optimises, weight * (s - mean) / std (RewardModelReward normalises by the held-out mean and
    spread marlhf rm stored): (weight / std, -weight * mean / std); (1, 0) without the reward
    model among --reward."""
    specs = reward_specs(config)
    if "model" not in specs:
        return 1.0, 0.0
    weight = reward_weights(config)[specs.index("model")]
    return value_head.reward_units(weight, *score_statistics(critic_model))


class BaseModelReward(RewardModelReward):
    """The reward model a LoRA critic was initialised from: the critic with its adapter off
    (its score head's original copy included), so no second copy of the reward model is held.
    ``.model`` holds no weights of its own, so ``--offload-frozen`` never moves the critic."""

    def __init__(self, critic_model, *, batch_size: int):
        super().__init__(lora.WithoutAdapter(critic_model), batch_size=batch_size)

    @torch.no_grad()
    def __call__(self, batch):
        with lora.adapter_off(self.model):
            return super().__call__(batch)


def _check_vocabulary(model, tokenizer, source: str, policy: str) -> None:
    """The reward model (and the critic made from it) reads the policy's token ids."""
    if model.config.vocab_size < len(tokenizer):
        raise UserError(f"--reward-model '{source}' does not share the vocabulary of --policy '{policy}'")
