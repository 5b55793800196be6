"""The temperature-on-the-LM-head shortcut (forward.head_divides_by) applies only where
head(h / T) = head(h) / T, and never yields wrong log-probs silently."""

from __future__ import annotations

import pytest
import torch

from marlhf_cli.train.forward import head_divides_by


def _composite_config(softcap: float | None):
    """A composite model's config (Llava around Gemma-2): the soft-capping sits in the text
    config only, as in Gemma-3 or PaliGemma-2 checkpoints."""
    from transformers import Gemma2Config, LlavaConfig

    text = Gemma2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=4, final_logit_softcapping=softcap)  # fmt: skip
    return LlavaConfig(text_config=text)


class Head(torch.nn.Module):
    """The least a model needs for the shortcut: a config and an output embedding."""

    def __init__(self, config, through_module: bool = True):
        super().__init__()
        self.config = config
        self.lm_head = torch.nn.Linear(8, 16, bias=False)
        self.through_module = through_module

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, hidden):
        if self.through_module:
            return self.lm_head(hidden)
        return torch.nn.functional.linear(hidden, self.lm_head.weight)  # the head's weight, not the module


def test_soft_capping_in_the_text_config_turns_the_shortcut_off():
    config = _composite_config(30.0)
    assert getattr(config, "final_logit_softcapping", None) is None  # the top level does not say
    model, hidden = Head(config), torch.randn(3, 8)
    with torch.no_grad(), head_divides_by(model, 0.7) as divided:
        logits = model(hidden)
    assert not divided and torch.equal(logits, model(hidden))


def test_without_soft_capping_the_head_divides_its_input():
    model, hidden = Head(_composite_config(None)), torch.randn(3, 8)
    with torch.no_grad():
        plain = model(hidden)
        with head_divides_by(model, 0.7) as divided:
            scaled = model(hidden)
    assert divided and torch.allclose(scaled, plain / 0.7, atol=1e-6)


def test_a_forward_that_bypasses_the_head_module_fails_loudly():
    """The hook cannot divide what never goes through the head: an error, not logits taken
    for divided ones."""
    model, hidden = Head(_composite_config(None), through_module=False), torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="did not go through"):
        with torch.no_grad(), head_divides_by(model, 0.7):
            model(hidden)
