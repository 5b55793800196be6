"""The critic's value head at step 0 (``--value-head-init``): the reward model's, zero, or random.

The critic is the reward model's backbone with its scalar ``score`` head read at every
position. Where that head was trained as a reward model (a folder ``marlhf rm`` wrote), it is
kept: the paper's initialisation, whose values already carry the score. Anywhere else (a
causal LM such as the policy, a random-init alias) the head would be freshly random, and its
noise is several times the spread of the returns it must fit (on ``tiny`` a value sd of
about 0.16 against returns of sd 0.05): such a critic explains less than a constant for
dozens of steps. So a new head starts at zero, weight and bias: the critic begins as the
constant 0, and GAE with a constant critic is plain discounted returns
(docs/method.md "Starting and fitting the critic"). ``random`` keeps the old behaviour (the
credit study's first three editions pin it, so their records re-execute bit for bit).
"""

from __future__ import annotations

import torch

from ...errors import UserError
from ...scoring.heads import VALUE_OFFSET_KEY, hugging_face_model

INITS = ("zero", "random", "reward-model")


def resolve(requested: str | None, trained: bool, source: str) -> str:
    """The head a run starts with: ``requested`` (``--value-head-init``), or by default the
    trained reward-model head where ``source`` has one and zero elsewhere."""
    if requested is None:
        return "reward-model" if trained else "zero"
    if requested == "reward-model" and not trained:
        raise UserError(
            f"--value-head-init reward-model: '{source}' has no trained score head (a causal LM or a random-init "
            "model: its head would be new); train one with marlhf rm, or use --value-head-init zero"
        )
    return requested


def score_head(model) -> torch.nn.Module:
    """The ``Linear`` that maps a hidden state to the value: under LoRA the trained copy
    (peft's ``modules_to_save``), so the original, which the reward with its adapter off
    reads, keeps its weights."""
    head = hugging_face_model(model).score
    copies = getattr(head, "modules_to_save", None)
    if copies is not None:
        return copies[head.active_adapters[0]]
    return head


@torch.no_grad()
def start(model, init: str, *, trained: bool, seed: int, scale: float = 1.0, offset: float = 0.0) -> None:
    """Set ``model``'s value head for ``init`` (a :func:`resolve` result), in place.

    ``reward-model`` keeps the trained head, multiplied by ``scale``, and adds ``offset``: the
    reward PPO optimises is the reward model's score s normalised by its held-out mean and
    spread, w (s - mean) / std (w its weight among several rewards), so a head in the reward's
    units is the raw head times w / std plus -w mean / std (:func:`reward_units`). Decoder
    heads have no bias, so the offset is stored in the model's config (``marlhf_value_offset``,
    which :class:`~marlhf_cli.train.forward.TokenValues` adds): it is saved with the exported
    critic, and it is a constant the head's training does not move. Every other start stores
    no offset. ``random`` on a head that is already random (not ``trained``) keeps it as
    loaded, the exact head earlier versions started from; on a trained head it draws a new one
    with the model's own initialiser scale (``initializer_range``), from ``seed``.
    """
    head = score_head(model)
    if init == "reward-model" and scale != 1.0:
        head.weight.mul_(scale)
        if head.bias is not None:
            head.bias.mul_(scale)
    config = hugging_face_model(model).config
    if init == "reward-model" and offset:
        setattr(config, VALUE_OFFSET_KEY, float(offset))
    elif hasattr(config, VALUE_OFFSET_KEY):  # a critic of an earlier run given as --reward-model
        delattr(config, VALUE_OFFSET_KEY)
    if init == "zero":
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()
    elif init == "random" and trained:
        std = float(getattr(hugging_face_model(model).config, "initializer_range", 0.02))
        generator = torch.Generator().manual_seed(seed)
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * std)
        if head.bias is not None:
            head.bias.zero_()


def carry_offset(model, export) -> None:
    """Give ``model`` (a LoRA critic rebuilt on its base to extend a finished run) the offset
    the exported critic's config.json stored; the base's own config has none."""
    import json
    from pathlib import Path

    stored = json.loads((Path(export) / "config.json").read_text(encoding="utf-8")).get(VALUE_OFFSET_KEY)
    if stored:
        setattr(hugging_face_model(model).config, VALUE_OFFSET_KEY, float(stored))


def reward_units(weight: float, mean: float, std: float) -> tuple[float, float]:
    """(scale, offset) that put a reward-model head's raw score s in the units of the reward
    the PPO stage assigns, ``weight * (s - mean) / std``: s * scale + offset. A spread of 0
    (or none stored) counts as 1, as the reward itself does (rewards.RewardModelReward)."""
    std = std if std > 1e-6 else 1.0
    return weight / std, -weight * mean / std


def describe(init: str, source: str, scale: float = 1.0, offset: float = 0.0) -> str:
    """The start-up line's words for the critic's start."""
    units = "" if scale == 1.0 and not offset else (
        f" (x {scale:.3g}" + (f" {'+' if offset > 0 else '-'} {abs(offset):.3g}" if offset else "") + ": in the reward's units)"
    )  # fmt: skip
    return {
        "reward-model": f"critic from {source} with its trained reward-model head{units}",
        "zero": f"critic from {source} with a zero value head",
        "random": f"critic from {source} with a random value head",
    }[init]
