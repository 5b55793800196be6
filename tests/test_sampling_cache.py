"""The sampler's KV cache goes through the forward's supported argument: no deprecation
warning (transformers 5.2x renamed ``past_key_values`` to ``cache`` and removes the old name
in 5.40), and the cached steps still give the full forward's log-probs.

pyproject.toml also turns the deprecation into an error for the whole suite, so no other
forward can bring it back.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from marlhf_cli.train.forward import policy_forward
from marlhf_cli.generation import SamplingParams, cache_argument, response_mask, sample

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config).eval()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_sampling_uses_the_supported_cache_argument(llama):
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers").warning_once.cache_clear()  # said once per process otherwise
    said = _Records()
    root = logging.getLogger("transformers")
    root.addHandler(said)
    prompt = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            ids = sample(llama, prompt, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]), SamplingParams(1.0, 0, 1.0, 6),
                         eos_token_id=63, pad_token_id=0)  # fmt: skip
    finally:
        root.removeHandler(said)
    assert ids.shape == (2, 6)
    assert not [m for m in said.messages if "deprecated" in m], said.messages


def test_the_cache_argument_is_the_one_the_forward_takes(llama):
    import inspect

    name = cache_argument(llama)
    assert name in inspect.signature(llama.forward).parameters


@pytest.mark.parametrize("top_k", [0, 5])
def test_cached_steps_give_the_full_forwards_log_probs(llama, top_k):
    prompt = torch.tensor([[0, 0, 5, 6], [8, 9, 10, 11]])
    mask = (prompt != 0).long()
    torch.manual_seed(1)
    ids, logp = sample(llama, prompt, mask, SamplingParams(0.7, top_k, 1.0, 10), eos_token_id=63, pad_token_id=0, with_logprobs=True)
    real, _ = response_mask(ids, 63)
    seq, att = torch.cat([prompt, ids], 1), torch.cat([mask, real], 1)
    with torch.no_grad():
        full, _ = policy_forward(llama, seq, att, prompt.shape[1], 0.7)
    assert torch.allclose(logp[real.bool()], full[real.bool()], atol=2e-5, rtol=0)
