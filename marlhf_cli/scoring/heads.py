"""Scalar scores of a reward model (or values of a critic), read where the sequence really ends.

Why not ``model(...).logits`` of a Hugging Face ``...ForSequenceClassification``: it finds
the last token by looking for ``pad_token_id`` in ``input_ids``. Many tokenizers (SmolLM2,
Llama-3, GPT-2 with pad set to EOS) pad with the EOS token, and marlhf ends every response
with EOS, so the model would read the score one token early -- at the token before the EOS
-- and in a left-padded batch with pad == EOS it cannot tell padding from content at all.
Here the index comes from the attention mask: the last position whose mask is 1, whatever
the padding side. Position ids also come from the mask (as in PPO's forwards), so a
left-padded sequence scores exactly like the same sequence unpadded.

``normalized_score`` applies the reward model's held-out mean and standard deviation that
``marlhf rm`` stores in its ``config.json`` (``marlhf_reward_mean``/``marlhf_reward_std``), so
later stages can put rewards on a unit scale.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ..generation.draw import hugging_face_model, position_ids_from_mask, unwrap

MEAN_KEY = "marlhf_reward_mean"
STD_KEY = "marlhf_reward_std"
POSITION_KEY = "marlhf_score_position"
# a critic's constant added to its head's output (train/ppo/value_head.py): the reward model's
# -weight * mean / std, so that its values start in the units of the normalised reward
VALUE_OFFSET_KEY = "marlhf_value_offset"
POSITION = "last attention-mask token (marlhf_cli.scoring.heads.sequence_scores)"


def last_token_index(attention_mask):
    """Index of the last position with mask 1 in each row (right or left padding)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (positions * attention_mask.long()).argmax(dim=-1)


position_ids = position_ids_from_mask  # the name the stages and tests know


def is_decoder_head(model) -> bool:
    """Decoder-style classification models (Llama, Gemma, Qwen, GPT-2, ...) keep their head in ``.score``."""
    model = hugging_face_model(model)
    return hasattr(model, "score") and hasattr(model, "base_model_prefix") and hasattr(model, model.base_model_prefix)


def check_head(model) -> None:
    """A one-line error unless ``model`` has a decoder's per-token score head."""
    if not is_decoder_head(model):
        raise UserError(
            f"{type(model).__name__} has no per-token score head ('score'): critic and reward "
            "model must be decoder *ForSequenceClassification models (what 'marlhf rm' writes)"
        )


def token_values(model, input_ids, attention_mask):
    """The head applied at every position: [B, T] (a critic's per-token values)."""
    model = hugging_face_model(model)
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask), use_cache=False
    ).last_hidden_state
    return model.score(hidden).squeeze(-1)


def sequence_scores(model, input_ids, attention_mask):
    """One score per sequence, at its last real token: [B] float.

    Encoder models (BERT-style, whose head reads the first token's pooled output) fall back
    to their own ``logits``, for which padding side does not matter.
    """
    model = hugging_face_model(model)
    if not is_decoder_head(model):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[..., 0]
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask), use_cache=False
    ).last_hidden_state
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    last = hidden[rows, last_token_index(attention_mask)]
    return model.score(last).squeeze(-1).float()


def last_token_scores(model, sequences: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A reward model's score at each sequence's last real token (EOS when present): [B].
    ``model`` may be a DeepSpeed engine around it.

    ``attention_mask`` is [prompt mask | response mask], so its last 1 is the response's
    last real token, as in ``marlhf rm`` (:func:`sequence_scores`).
    """
    check_head(unwrap(model))
    return sequence_scores(unwrap(model), sequences, attention_mask).float()


def reward_stats(config: Any) -> tuple[float, float]:
    """The (mean, std) stored with a reward model; (0, 1) when it has none."""
    mean = getattr(config, MEAN_KEY, None)
    std = getattr(config, STD_KEY, None)
    return (float(mean) if mean is not None else 0.0, float(std) if std else 1.0)


def value_offset(config: Any) -> float:
    """The constant a critic adds to its head's output (0 when none is stored)."""
    return float(getattr(config, VALUE_OFFSET_KEY, None) or 0.0)


def normalized_score(scores, config: Any, eps: float = 1e-6):
    """``(scores - mean) / std`` with the held-out statistics stored in the model's config."""
    mean, std = reward_stats(config)
    return (scores - mean) / max(std, eps)


class SequenceScorer(torch.nn.Module):
    """A module whose forward is :func:`sequence_scores` of the wrapped model.

    DeepSpeed trains a module through that module's forward; wrapping keeps ZeRO-3's
    parameter gathering on its normal path. ``.model`` is the Hugging Face model to save.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask):
        return sequence_scores(self.model, input_ids, attention_mask)

    def gradient_checkpointing_enable(self, **kwargs):
        self.model.gradient_checkpointing_enable(**kwargs)
