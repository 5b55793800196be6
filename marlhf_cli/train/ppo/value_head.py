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
from ..scoring import hugging_face_model

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
def start(model, init: str, *, trained: bool, seed: int) -> None:
    """Set ``model``'s value head for ``init`` (a :func:`resolve` result), in place.

    ``random`` on a head that is already random (not ``trained``) keeps it as loaded, the
    exact head earlier versions started from; on a trained head it draws a new one with the
    model's own initialiser scale (``initializer_range``), from ``seed``.
    """
    head = score_head(model)
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


def describe(init: str, source: str) -> str:
    """The start-up line's words for the critic's start."""
    return {
        "reward-model": f"critic from {source} with its trained reward-model head",
        "zero": f"critic from {source} with a zero value head",
        "random": f"critic from {source} with a random value head",
    }[init]
